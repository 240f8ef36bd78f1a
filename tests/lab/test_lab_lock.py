"""One lab per machine (lab/lock.py): a second holder is refused with the first one named; the kernel drops
the lock when its holder dies, SIGKILL included; a refused `run` exits 2 and writes nothing; a run holds the lab
before its first-use builds. One writer of the build cache (a second waits), one process per run folder, one
run per SSH host. References: the lock files' contents, PIDs of processes this test started, the folders on
disk."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
from conftest import tb

from tunnelbench.lab import journal
from tunnelbench.lab.lock import LabBusy, LabLock


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "REGISTRY", tmp_path / "registry")
    return tmp_path / "registry"


def test_a_second_holder_is_refused_naming_the_first(registry, tmp_path):
    first = LabLock("run").acquire()
    first.describe("20261127-000000-tb1234", tmp_path / "r" / "20261127-000000-tb1234")
    with pytest.raises(LabBusy) as e:
        LabLock("calibrate").acquire()
    msg = str(e.value)
    assert (
        f"`tunnelbench run` (run 20261127-000000-tb1234 in {tmp_path}/r/20261127-000000-tb1234), pid {os.getpid()}"
        in msg
    )
    assert "kill " in msg and "wait for it to end" in msg
    first.release()
    second = LabLock("calibrate").acquire()  # free again once released
    second.release()
    lock = registry.with_name("registry.lock")
    assert lock.stat().st_mode & 0o777 == 0o600 and lock.read_text() == ""  # idle: names nobody
    assert not registry.exists() or "registry.lock" not in [p.name for p in registry.iterdir()]


def test_the_lock_dies_with_its_holder(registry):
    """A holder SIGKILLed: no stale lock (the kernel releases a dead process's flock), whatever the file says."""
    code = (
        "import sys, time; from tunnelbench.lab import journal; from pathlib import Path; "
        f"journal.REGISTRY = Path({str(registry)!r}); "
        "from tunnelbench.lab.lock import LabLock; LabLock('up').acquire(); print('held', flush=True); time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        with pytest.raises(LabBusy, match=rf"`tunnelbench up`, pid {p.pid}, .*`tunnelbench down`"):
            LabLock("run").acquire()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    LabLock("run").acquire().release()


@pytest.mark.lab
@pytest.mark.slow
def test_a_run_while_the_lab_is_held_exits_2_and_writes_nothing(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    reg = tmp_path / "registry"
    code = (
        "import time; from tunnelbench.lab import journal; from pathlib import Path; "
        f"journal.REGISTRY = Path({str(reg)!r}); from tunnelbench.lab.lock import LabLock; "
        "l = LabLock('run').acquire(); l.describe('20261127-010203-tbholder', Path('/r/x')); "
        "print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        res = tb("run", "--results", str(tmp_path / "r"), "--no-html", env={"TUNNELBENCH_REGISTRY": str(reg)})
        assert res.returncode == 2, res.stderr[-2000:]
        assert f"run 20261127-010203-tbholder in /r/x), pid {holder.pid}" in res.stderr, res.stderr
        assert not (tmp_path / "r").exists()  # refused before the run folder existed
        assert time.monotonic() - t0 < 60  # refused at once, not after waiting
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)


# -- a run takes the lab before it builds --------------------------------------------------------------------
def test_a_run_holds_the_lab_before_its_first_use_builds(registry, monkeypatch):
    """The builds of a run's first use change the cache another run's VPNs start from: they run under the lab
    lock, which names this process while they do."""
    from tunnelbench import builds
    from tunnelbench.cli import run as run_cli
    from tunnelbench.scenario import parse_scenario

    seen: list[str] = []

    def first_use(_sc, _err):
        with pytest.raises(LabBusy) as e:  # another process asking for the lab now is refused
            LabLock("up").acquire()
        seen.append(str(e.value))

    monkeypatch.setattr(builds, "first_use", first_use)
    monkeypatch.setattr(run_cli, "need_root", lambda: None)
    lock = run_cli._before_run(
        parse_scenario({"vpns": ["internal"], "workloads": [{"name": "connect"}]}, "t"), True
    )
    try:
        assert len(seen) == 1 and f"`tunnelbench run`, pid {os.getpid()}" in seen[0], seen
    finally:
        assert lock is not None
        lock.release()


# -- a run folder: one process at a time ----------------------------------------------------------------------
def test_a_second_process_on_a_run_folder_is_refused_before_it_writes(registry, tmp_path, monkeypatch):
    """`--resume` of a run another process is running (or resuming): exit 2, the holder named, nothing run;
    the store as it was."""
    from rich.console import Console

    from tunnelbench.lab.lock import RunLock
    from tunnelbench.runner import execute as ex
    from tunnelbench.runner.resume import load_resume, scenario_sha256
    from tunnelbench.scenario import parse_scenario
    from tunnelbench.store import DB_NAME, Store

    text = 'vpns = ["internal"]\n[[workloads]]\nname = "connect"\n'
    run_id = "20261128-120000-tbfolder"
    d = tmp_path / "r" / run_id
    d.mkdir(parents=True)
    (d / "scenario.toml").write_text(text)
    st = Store(d / DB_NAME)
    st.begin_run(run_id, "tbfolder", text, "0")
    st.set_env(run_id, {"run.scenario_sha256": scenario_sha256(text), "run.overrides": {}})
    st.end_run(run_id, "interrupted")
    st.close()
    ran: list[str] = []
    monkeypatch.setattr(ex.Runner, "run", lambda self: ran.append(self.run_id))
    holder = RunLock(d, "run --resume").acquire()  # the first resume (its own open file: a flock of its own)
    try:
        buf = io.StringIO()
        out = Console(file=buf, width=400)
        x = ex.execute(
            parse_scenario(tomllib.loads(text), "t"), text, {}, load_resume(d), None, False, out, out
        )
        assert x.code == 2 and ran == []
        said = buf.getvalue()
        assert f"run {run_id} is in use:" in said and f"pid {os.getpid()}" in said, said
    finally:
        holder.release()
    st = Store(d / DB_NAME)
    assert st.runs()[0]["status"] == "interrupted"
    st.close()


# -- the build cache: one writer -------------------------------------------------------------------------------
class _Lines(io.StringIO):
    """A console's file that tells when a line with `marker` was written."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker, self.seen = marker, threading.Event()

    def write(self, s: str) -> int:
        if self.marker in s:
            self.seen.set()
        return super().write(s)


def test_a_second_writer_of_the_build_cache_waits_for_the_first(tmp_path, monkeypatch):
    from rich.console import Console

    from tunnelbench import builds

    cache = tmp_path / "cache"
    monkeypatch.setenv("TUNNELBENCH_CACHE", str(cache))
    code = (
        "import sys, time; from pathlib import Path; from tunnelbench.lab.lock import BuildLock; "
        f"BuildLock(Path({str(cache)!r}), 'install').acquire(); print('held', flush=True); time.sleep(60)"
    )
    first = subprocess.Popen(
        [sys.executable, "-c", code, "install", "nebula"], stdout=subprocess.PIPE, text=True
    )
    lines = _Lines("is being written by")
    entered = threading.Event()

    def second() -> None:
        with builds.building(Console(file=lines, width=400)):
            entered.set()

    t = threading.Thread(target=second)
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "held"
        t.start()
        assert lines.seen.wait(30), "the second writer neither waited nor said so"
        assert not entered.is_set()  # it waits for the lock the first process holds
        said = lines.getvalue()
        assert f"`tunnelbench install nebula`, pid {first.pid}" in said and str(cache) in said, said
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    t.join(30)
    assert entered.is_set()  # the first gone, the second builds


def test_install_writes_the_cache_under_the_build_lock(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tunnelbench.cli import machines
    from tunnelbench.cli.app import main
    from tunnelbench.lab.lock import BuildLock
    from tunnelbench.vpns import install as vinstall

    monkeypatch.setenv("TUNNELBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(machines, "need_root", lambda: None)
    seen: list[str] = []

    def install_source(src, _log, force=False):
        with pytest.raises(LabBusy) as e:  # a second writer now would have to wait
            BuildLock(tmp_path / "cache", "install").acquire()
        seen.append(str(e.value))
        return vinstall.InstallResult(src.label, "cached", 0.0, "here")

    monkeypatch.setattr(vinstall, "install_source", install_source)
    res = CliRunner().invoke(main, ["install", "tinc"])
    assert res.exit_code == 0, res.output
    assert seen and f"pid {os.getpid()}" in seen[0], seen


# -- an SSH host: one run drives it at a time -------------------------------------------------------------------
class LocalHost:
    """An SSH host stand-in whose commands run on this machine (a folder of this test as its workdir_root)."""

    def __init__(self, root: Path, name: str = "h1") -> None:
        self.name = name
        self.inv = type(
            "Inv", (), {"workdir_root": str(root), "describe": lambda _s: f"{name} (root@192.0.2.1:22)"}
        )()
        self.journal = _Entries()

    def run(self, argv, check=True, **_kw):
        return subprocess.run(argv, capture_output=True, text=True, timeout=30)


class _Entries:
    def __init__(self) -> None:
        self.entries: list[dict] = []

    def add(self, e: dict) -> dict:
        self.entries.append(e)
        return e


def _holder(root: Path) -> dict:
    return json.loads((root / "lab.lock" / "holder").read_text())


def test_a_second_run_on_an_ssh_host_is_refused_naming_the_first(tmp_path):
    from tunnelbench.lab.ssh_host import _release_lab_lock, take_lab_lock

    root = tmp_path / "wd"
    root.mkdir(mode=0o700)
    a, b = LocalHost(root), LocalHost(root)
    take_lab_lock(a, "20261128-100000-tba")
    got = _holder(root)
    assert (got["run_id"], got["pid"], got["controller"]) == (
        "20261128-100000-tba",
        os.getpid(),
        socket.gethostname(),
    )
    with pytest.raises(LabBusy) as e:
        take_lab_lock(b, "20261128-100001-tbb")
    assert f"is in use by run 20261128-100000-tba from {socket.gethostname()} (pid {os.getpid()})" in str(
        e.value
    )
    assert _holder(root)["run_id"] == "20261128-100000-tba"  # the refused run changed nothing
    # the refused run's teardown leaves the holder's lock; the holder's releases it
    (eb,) = b.journal.entries
    assert _release_lab_lock(b, eb) is None and (root / "lab.lock").is_dir()
    (ea,) = a.journal.entries
    assert "lock" in (_release_lab_lock(a, ea) or "") and not (root / "lab.lock").exists()
    take_lab_lock(b, "20261128-100001-tbb")  # free again
    assert _holder(root)["run_id"] == "20261128-100001-tbb"


def test_a_host_lock_whose_run_ended_on_this_controller_is_taken_over(tmp_path):
    """A killed run's lock (this controller, its PID gone) is replaced; one from another controller never is."""
    from tunnelbench.lab.lock import controller
    from tunnelbench.lab.ssh_host import take_lab_lock

    root = tmp_path / "wd"
    (root / "lab.lock").mkdir(parents=True)
    ended = subprocess.Popen(["true"])
    ended.wait(10)  # a PID of this machine whose process has ended
    dead = controller("20261128-090000-tbkilled") | {"pid": ended.pid}
    (root / "lab.lock" / "holder").write_text(json.dumps(dead) + "\n")
    take_lab_lock(LocalHost(root), "20261128-090000-tbkilled")  # the resume of the killed run
    assert _holder(root)["pid"] == os.getpid()
    other = dead | {"machine_id": "0" * 32, "controller": "elsewhere"}
    (root / "lab.lock" / "holder").write_text(json.dumps(other) + "\n")
    with pytest.raises(LabBusy, match="in use by run 20261128-090000-tbkilled from elsewhere"):
        take_lab_lock(LocalHost(root), "20261128-090001-tbnext")
