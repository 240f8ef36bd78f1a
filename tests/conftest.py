from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# the strict-skip guard's hooks (tests/skipguard.py)
from skipguard import (  # noqa: F401
    pytest_collection_modifyitems,
    pytest_collectreport,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

import tunnelbench.catalog  # noqa: F401 - every workload declares its metrics, as the CLI has them (a test file run alone)
from tunnelbench.lab import tools
from tunnelbench.lab.journal import Journal
from tunnelbench.lab.netns import NetnsLab
from tunnelbench.lab.tags import new_run_id, new_tag

LAB_TOOLS = tools.LAB_TOOLS  # one list: lab/tools.py


@dataclass(frozen=True)
class TimerLateness:
    """How late this machine's timers wake right now (ms past the asked-for time): the reference a timing
    assertion adds to its bound, so a loaded host or an emulated CPU (the kernel lane's TCG) widens it by what
    that machine measurably does, and a quiet real CPU keeps it tight."""

    p50: float
    p95: float
    mean: float


def timer_lateness(n: int = 200, period_s: float = 0.002) -> TimerLateness:
    """n sleeps of period_s on the monotonic clock: a netem or engine release is a timer too, so it is late by
    about as much (a user-space wake-up adds the scheduler, so this errs on the wide side)."""
    late = []
    for _ in range(n):
        t0 = time.monotonic()
        time.sleep(period_s)
        late.append(max(0.0, (time.monotonic() - t0 - period_s) * 1000))
    q = statistics.quantiles(late, n=20)
    return TimerLateness(statistics.median(late), q[18], statistics.fmean(late))


def emulated_cpu() -> bool:
    """True under QEMU's TCG (the full-kernel lane on a machine without usable KVM): every instruction is
    emulated, so timers fire late; timing tolerances get an explicit allowance there, nothing else does."""
    try:
        return "QEMU TCG" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def tb(
    *args: str,
    timeout: float = 300,
    columns: int = 250,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
) -> subprocess.CompletedProcess:
    """The CLI as a user runs it (`python -m tunnelbench.cli`), output captured, with a wide fixed terminal
    (COLUMNS; rich's default without a terminal is 80) so that no table cuts a name and no line is folded.
    env adds to (or overrides) this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "tunnelbench.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": str(columns), **(env or {})},
        cwd=cwd,
    )


@pytest.fixture(scope="session", autouse=True)
def _session_leaves_no_lab():
    """With TB_SESSION_LEFTOVERS=1 (scripts/test's lab lane, alone on the machine): the session fails if it
    left a lab namespace, a run registration or a process in a namespace of its own behind."""
    if os.environ.get("TB_SESSION_LEFTOVERS") != "1":
        yield
        return
    from leftovers import lab_state, left_behind

    before = lab_state()
    yield
    left = left_behind(before, lab_state())
    if left:
        pytest.fail(f"the test session left lab state behind: {left}", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _private_ansible_temp(tmp_path_factory):
    """Ansible makes its local temp folder (~/.ansible/tmp) when it is imported: the session's own instead,
    so the inventory tests run for a user whose HOME is not writable (nobody, CI's service users) and write
    nothing in anyone's home. The CLI the tests start inherits it."""
    if "ANSIBLE_LOCAL_TEMP" in os.environ:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ANSIBLE_LOCAL_TEMP", str(tmp_path_factory.mktemp("ansible")))
        yield


@pytest.fixture(autouse=True)
def _private_probe_record(tmp_path_factory, monkeypatch):
    """No test writes the machine's probes.json, which real runs read into their feature records: every
    test (and the CLI it starts, through the environment) records probes in a file of its own."""
    if "TUNNELBENCH_PROBES" not in os.environ:
        monkeypatch.setenv("TUNNELBENCH_PROBES", str(tmp_path_factory.mktemp("probes") / "probes.json"))


def ping_scenario(name: str, vpns: list[str], repetitions: int = 1) -> str:
    """The smallest real scenario: a 2-host lab, 5 pings at 50 ms per case, no drift check."""
    return (
        f'name = "{name}"\nvpns = {vpns!r}\n[run]\nrepetitions = {repetitions}\ndrift_check_s = 0\n'
        '[lab]\nhosts = 2\n[[workloads]]\nname = "ping"\ncount = 5\ninterval_s = 0.05\n'
    ).replace("'", '"')


# One real run that several tests read (the run's own output and store, its report in Chromium, its export):
# two VPNs, three labels (one of them two streams), three interleaved rounds with the default's drift reference
REAL_RUN_SCENARIO = """
name = "report-e2e"
vpns = ["internal", "wireguard-go"]
[run]
repetitions = 3
[lab]
hosts = 2
[[workloads]]
name = "tcp"
duration_s = 1
omit_s = 0
[[workloads]]
name = "tcp"
streams = 2
duration_s = 1
omit_s = 0
[[workloads]]
name = "ping"
count = 20
interval_s = 0.01
"""


@pytest.fixture(scope="session")
def real_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """REAL_RUN_SCENARIO run once per session by the CLI (a 120-column terminal): (its result, its run
    folder). Tests that share it only read the run, or rewrite what `report` writes anyway."""
    why = lab_missing()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("real-run")
    (base / "s.toml").write_text(REAL_RUN_SCENARIO)
    env = {"TUNNELBENCH_PROBES": str(base / "probes.json")}  # the session has no monkeypatch: its own record
    res = tb("run", str(base / "s.toml"), "--results", str(base / "results"), columns=120, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    (run_dir,) = (base / "results").iterdir()
    return res, run_dir


def through_a_tunnel_long(fixture: str) -> pytest.MarkDecorator:
    """Parametrize a mesh FIXTURE (indirect): the no-VPN path in CI, through wireguard-go in --long. For
    workloads whose own semantics the no-VPN path checks; the e2e runs carry workloads over a tunnel in CI."""
    return pytest.mark.parametrize(
        fixture, ["internal", pytest.param("wireguard-go", marks=pytest.mark.long)], indirect=True
    )


def lab_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    missing = [t for t in LAB_TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing tools: {', '.join(missing)}"
    return None


def _build_lab(
    base: Path,
    n_hosts: int = 3,
    path: str = "direct",
    relay: str | None = None,
    nat_type: str = "port-restricted",
    nat_types: dict[str, str] | None = None,
) -> NetnsLab:
    tag = new_tag()
    run_dir = base / new_run_id(tag)
    journal = Journal(run_dir, run_dir.name)
    lab = NetnsLab(tag, n_hosts, run_dir, journal, path, relay, nat_type, nat_types)
    try:
        lab.build()
        lab.wait_links()
    except BaseException:
        lab.destroy()
        lab.journal.end()
        raise
    return lab


@pytest.fixture
def lab_factory(tmp_path: Path):
    why = lab_missing()
    if why:
        pytest.skip(why)
    made: list[NetnsLab] = []

    def make(*args, **kwargs) -> NetnsLab:
        lab = _build_lab(tmp_path, *args, **kwargs)
        made.append(lab)
        return lab

    yield make
    for lab in made:
        lab.destroy()
        lab.journal.end()


@pytest.fixture(scope="module")
def module_lab(tmp_path_factory):
    """One direct 3-host lab for a module's tests that bring meshes up one after another on it, as a run
    brings its VPNs up on one lab (under the kernel lane's TCG a lab takes 10-14 s to build). A test on it
    must leave it as it found it: `lab_state` before and after."""
    why = lab_missing()
    if why:
        pytest.skip(why)
    lab = _build_lab(tmp_path_factory.mktemp("lab"))
    yield lab
    lab.destroy()
    lab.journal.end()


def lab_state(lab: NetnsLab) -> dict[str, list[str]]:
    """What a mesh could leave behind, read from the kernel on each host: links (not the fallback devices a
    tunnel module makes in every namespace when it loads), addresses, routes, XFRM states and policies. One
    shell and `ip -n` for the whole lab: under the kernel lane's TCG, 15 `ip netns exec` from Python took
    longer than the lab they were to save."""
    from tunnelbench.lab.kernel import FALLBACK_LINKS

    queries = ["-o link show", "-o addr show", "route show table all", "xfrm state", "xfrm policy"]
    script = "; ".join(f"echo '@@ {h.name}'; ip -n {h.netns} {q}" for h in lab.hosts for q in queries)
    out: dict[str, list[str]] = {h.name: [] for h in lab.hosts}
    name = ""
    for line in subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, check=True
    ).stdout.splitlines():
        if line.startswith("@@ "):
            name = line[3:]
            continue
        # IPv6 link-local addresses, their routes and the multicast route come when duplicate address
        # detection ends, on the lab's own links too: a moment after the lab is built, whatever a mesh does
        if "fe80:" in line or "ff00::/8" in line:
            continue
        fields = line.split()
        if (
            len(fields) > 1
            and fields[0].endswith(":")
            and fields[1].split("@")[0].rstrip(":") in FALLBACK_LINKS
        ):
            continue  # "N: gre0@NONE: <...>" (link) or "N: gre0 inet ..." (addr)
        if len(fields) > 2 and fields[2].startswith(
            "<"
        ):  # a link: its name and MTU (its state flags follow the carrier)
            line = f"link {fields[1].rstrip(':')} mtu {fields[fields.index('mtu') + 1]}"
        out[name].append(line)
    return {h: sorted(lines) for h, lines in out.items()}


@pytest.fixture
def mesh_factory(lab_factory):
    """A running mesh of `vpn` on a fresh lab of `n_hosts` (skipped when the VPN is unavailable here), its
    run folder as `.run_dir`; stopped at the end, and nothing of it may be left."""
    from tunnelbench.catalog import DRIVERS
    from tunnelbench.vpns.base import MeshSpec
    from tunnelbench.vpns.mesh import Mesh

    made = []

    def make(vpn: str = "internal", n_hosts: int = 2, ready_s: float = 60):
        cls = DRIVERS[vpn]
        a = cls.availability()
        if not a.ok:
            pytest.skip(f"{vpn}: {a.reason}")
        lab = lab_factory(n_hosts)
        driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir))
        driver.configure()
        m = Mesh(driver)
        made.append(m)
        m.start()
        m.wait_ready(ready_s)
        m.run_dir = lab.run_dir  # type: ignore[attr-defined]
        return m

    yield make
    for m in made:
        m.stop()
        assert m.leftovers() == []


@pytest.fixture
def cluster_parts() -> None:
    """The Kubernetes lab tests' precondition: the lab, and the opt-in build (`tunnelbench install kubernetes`);
    skips with exactly why (build.NOT_CACHED)."""
    from tunnelbench.kube import build

    why = lab_missing()
    if why:
        pytest.skip(why)
    if not build.installed():
        pytest.skip(build.NOT_CACHED)
