"""Files a workload needs on a remote host, put there through the host API (no path of this machine's):
built tools (hey, quicperf) copied into the host's work folder when the architectures are equal, the host's
own otherwise, a clear error when it has none; http_download's file set sent whole. Fake remote hosts answer
from hand-set values, or run their commands in a folder of the test's standing in for the machine."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest

from tunnelbench.core.results import WorkloadError
from tunnelbench.instruments import common
from tunnelbench.lab.host import Result


class FakeRemote:
    remote = True

    def __init__(self, arch: str, on_path: str = "") -> None:
        self.name, self.arch, self.on_path = "h1", arch, on_path
        self.workdir = Path("/var/tmp/tunnelbench/run/h1")
        self.written: dict[Path, tuple[bytes, int]] = {}
        self.commands: list[list[str]] = []

    def run(self, argv: list[str], check: bool = True, **_: object) -> Result:
        self.commands.append(argv)
        out = self.arch if argv == ["uname", "-m"] else self.on_path
        return Result(argv, 0 if out else 1, out + "\n" if out else "", "", 0.0)

    def write_file(self, path: Path, data: bytes, mode: int = 0o644) -> None:
        self.written[path] = (data, mode)


@pytest.fixture
def local_hey(tmp_path, monkeypatch) -> Path:
    exe = tmp_path / "hey"
    exe.write_bytes(b"\x7fELF hey build")
    real = common.tool
    monkeypatch.setattr(common, "tool", lambda name: str(exe) if name == "hey" else real(name))
    return exe


def test_the_local_build_is_copied_once_per_host_when_the_architecture_is_equal(local_hey):
    h = FakeRemote(platform.machine())
    dest = Path("/var/tmp/tunnelbench/run/h1/tools/hey")
    assert common.tool_on(h, "hey") == str(dest)  # type: ignore[arg-type]
    assert h.written == {dest: (b"\x7fELF hey build", 0o755)}
    assert common.tool_on(h, "hey") == str(dest)  # type: ignore[arg-type]
    assert h.commands == [["uname", "-m"]]  # the second case asks nothing


def test_another_architecture_uses_the_hosts_own_or_says_what_to_do(local_hey):
    h = FakeRemote("riscv64", on_path="/usr/local/bin/hey")
    assert common.tool_on(h, "hey") == "/usr/local/bin/hey" and not h.written  # type: ignore[arg-type]
    bare = FakeRemote("riscv64")
    with pytest.raises(WorkloadError, match=f"hey is not on h1 .this machine's build is for {platform.machine()}, "
                                            "the host is riscv64.: put a hey for riscv64 on its PATH"):  # fmt: skip
        common.tool_on(bare, "hey")  # type: ignore[arg-type]


class FolderHost:
    """A remote host whose file system is a folder of the test's (commands run there with sh)."""

    remote = True
    name = "h2"

    def __init__(self, root: Path) -> None:
        self.workdir = root / "work"
        self.writes = 0

    def exists(self, path: Path) -> bool:
        return path.exists()

    def read_file(self, path: Path) -> bytes:
        return path.read_bytes()

    def write_file(self, path: Path, data: bytes, mode: int = 0o644) -> None:
        self.writes += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def run(self, argv: list[str], check: bool = True, **_: object) -> Result:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=check)
        return Result(argv, p.returncode, p.stdout, p.stderr, 0.0)


def test_the_file_set_reaches_a_remote_server_whole_and_once(tmp_path):
    from tunnelbench.workloads.http_download import HttpDownloadParams, fileset_on, make_fileset

    p = HttpDownloadParams(small_files=7, small_kib=2, large_files=1, large_mib=0.25, seed=5)
    h = FolderHost(tmp_path)
    d, files = fileset_on(h, p)  # type: ignore[arg-type]
    assert d.parent == h.workdir / "filesets" and len(files) == 8
    assert {str(f.relative_to(d)): f.stat().st_size for f in d.rglob("*.nar.xz")} == dict(files)
    assert sorted(x.name for x in d.parent.iterdir()) == [d.name]  # no part-made set or tar left beside it
    ref, ref_files = make_fileset(tmp_path / "here", p)  # the same bytes as made on this machine
    assert ref_files == files and all((d / r).read_bytes() == (ref / r).read_bytes() for r, _ in files)
    again = fileset_on(h, p)  # type: ignore[arg-type]
    assert again == (d, files) and h.writes == 1  # the next case finds it there


class ClockHost:
    """A remote host whose `date +%s.%N` answers a fake clock's time plus a set offset, each reading taking a
    set round trip on that clock (no real sleep: the answer depends on no scheduler). The shortest reading is
    the only one split evenly between the two ways; a slow one is slow on the way there (its midpoint is off by
    half its round trip)."""

    remote = True
    name = "h3"

    def __init__(self, offset: float, delays: list[float]) -> None:
        self.offset, self.delays, self.calls = offset, delays, 0
        self.now = 1_700_000_000.0  # the fake clock, as time.time() of this machine
        self._clock_offset: float | None = None  # SshHost's cache

    def time(self) -> float:
        return self.now

    def run(self, argv: list[str], check: bool = True, **_: object) -> Result:
        assert argv == ["date", "+%s.%N"]
        d = self.delays[self.calls]
        self.calls += 1
        before = d / 2 if d == min(self.delays) else d
        self.now += before
        answer = self.now + self.offset
        self.now += d - before
        return Result(argv, 0, f"{answer:.9f}\n", "", d)


def test_a_remote_hosts_clock_offset_is_its_shortest_round_trip_reading(monkeypatch):
    from types import SimpleNamespace

    from tunnelbench.lab import ssh_host
    from tunnelbench.lab.ssh_host import CLOCK_SAMPLES, SshHost

    h = ClockHost(offset=-250.0, delays=[0.08, 0.06, 0.004, 0.05, 0.07])
    monkeypatch.setattr(ssh_host, "time", SimpleNamespace(time=h.time))
    off = SshHost.clock_offset(h)  # type: ignore[arg-type]  # the method, on a host that answers by hand
    assert h.calls == CLOCK_SAMPLES == 5
    assert off == pytest.approx(-250.0, abs=1e-6)  # the other readings' midpoints are 25-40 ms off
    assert SshHost.clock_offset(h) == off and h.calls == 5  # once per host


def test_ping_stamps_of_a_remote_probe_are_set_on_this_machines_clock(tmp_path):
    """resilience's Probe (also revoke's): ping -D stamps a reply with its host's clock; a host 100 s ahead
    gives replies 100 s later than this machine's time.time() of the same moment."""
    from types import SimpleNamespace

    from tunnelbench.workloads.resilience import Probe

    log = "[1700000100.500000] 64 bytes from 10.0.0.2: icmp_seq=1 ttl=64 time=0.5 ms\n"
    proc = SimpleNamespace(log_text=lambda: log)
    host = SimpleNamespace(clock_offset=lambda: 100.0, spawn=lambda argv, label, log_path: proc)
    ctx = SimpleNamespace(artifact_dir=tmp_path, client=host, server_ip="10.0.0.2")
    probe = Probe(ctx, "p", 0.01)  # type: ignore[arg-type]
    assert probe.replies_seq() == [(1700000000.5, 1)]
