"""The monitor's CPU and RSS accounting against known loads: a busy loop pinned to one CPU reads ~100% of a
core, a sleeping process ~0%, a process holding 200 MiB of touched memory ~200 MiB more than its baseline,
and a daemon born during the case is counted from its own start.

The reference for each is the process itself as the kernel sees it, read independently of the monitor
(utime + stime in /proc/<pid>/stat over the same window, VmRSS in /proc/<pid>/status)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunnelbench.core.results import Outcome
from tunnelbench.lab.host import Host, Process
from tunnelbench.monitor import Monitor

TICK = os.sysconf("SC_CLK_TCK")


class LocalHost(Host):
    def __init__(self, name: str):
        self.name, self.underlay_ip, self.journal, self.workdir = name, "127.0.0.1", None, Path("/tmp")

    def argv(self, argv):
        return list(argv)


def spawn(host: Host, code: str, cpu: int | None = None) -> Process:
    """A python process running `code`; with `cpu`: pinned to that CPU, in a session of its own whose
    scheduler autogroup gets nice -15 (with autogroups, a process's own nice only counts inside its session),
    so that the tests sharing this 2-core machine take little of its core."""
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    p = subprocess.Popen(
        [*pin, sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=cpu is not None,
    )
    if cpu is not None:
        with contextlib.suppress(
            OSError
        ):  # no autogroups on this kernel: the process's own nice is what counts
            Path(f"/proc/{p.pid}/autogroup").write_text("-15")
        os.setpriority(os.PRIO_PROCESS, p.pid, -15)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"  # set up before measuring
    return Process(host, "daemon", [], p.pid, None, p)


def cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    f = stat[stat.rfind(")") + 2 :].split()
    return (int(f[11]) + int(f[12])) / TICK


def vmrss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def metrics(out: Outcome) -> dict[tuple[str, str | None], float]:
    return {(s.name, s.host): s.value for s in out.samples}


# ends by itself after 60 s: a test run killed before its teardown leaves no core busy for long
BUSY = (
    "import time\nend = time.monotonic() + 60\nprint('ready', flush=True)\nwhile time.monotonic() < end: pass"
)
SLEEP = "import time; print('ready', flush=True); time.sleep(60)"


@pytest.fixture
def procs():
    made: list[Process] = []
    yield made
    for p in made:
        p.popen.kill()
        p.popen.wait()


@pytest.mark.root
def test_busy_loop_reads_one_core_and_a_sleeper_none(procs):
    h1, h2 = LocalHost("h1"), LocalHost("h2")
    busy = spawn(h1, BUSY, cpu=0)
    idle_same_host = spawn(h1, SLEEP)
    sleeper = spawn(h2, SLEEP)
    procs += [busy, idle_same_host, sleeper]
    mon = Monitor({"h1": [busy, idle_same_host], "h2": [sleeper]}, interval_s=0.2)
    c0, t0 = cpu_s(busy.pid), time.monotonic()
    with mon:
        time.sleep(2.5)
    c1, t1 = cpu_s(busy.pid), time.monotonic()
    out = Outcome()
    mon.add_to(out)
    m = metrics(out)
    reference = 100 * (c1 - c0) / (t1 - t0)  # the busy loop's share of one core, as the kernel counted it
    # the monitor agrees with the kernel's count, and that count is about one core
    assert abs(m[("daemon_cpu_pct", "h1")] - reference) < 5, (m, reference)
    assert reference > 85, f"the busy loop got only {reference:.0f}% of a core: machine overloaded"
    assert 85 < m[("daemon_cpu_pct", "h1")] <= 105, m
    assert m[("daemon_cpu_pct", "h2")] < 2, m
    assert m[("daemon_cpu_peak_pct", "h1")] <= 115, m  # a sample is one core at most (+ tick jitter)
    assert m[("daemon_cpu_peak_pct", "h2")] < 10, m
    series = next(s for s in out.series if s.name == "daemon_cpu_pct" and s.host == "h1")
    assert len(series.points) >= 8  # 2.5 s at 0.2 s
    mean = sum(v for _, v in series.points) / len(series.points)
    assert abs(mean - reference) < 10, (mean, reference)


def test_rss_of_a_process_holding_200_mib(procs):
    h = LocalHost("h1")
    base = spawn(h, SLEEP)
    held = spawn(h, "import time\nb = b'\\x01' * (200 << 20)\nprint('ready', flush=True)\ntime.sleep(60)")
    procs += [base, held]
    baseline = vmrss_mib(base.pid)  # the same interpreter without the 200 MiB
    mon = Monitor({"h1": [held]}, interval_s=0.1)
    with mon:
        time.sleep(0.5)
    reference = vmrss_mib(held.pid)
    out = Outcome()
    mon.add_to(out)
    rss = metrics(out)[("daemon_rss_mb", "h1")]
    assert abs(rss - reference) <= 0.02 * reference, (rss, reference)  # the same pages, read twice
    assert abs(rss - baseline - 200) <= 20, (rss, baseline)  # 200 MiB held, within 10%


@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
def test_a_daemon_born_during_the_case_counts_from_its_own_start(procs):
    """A daemon restarted mid-case (the monitor asks for the daemons at every sample): the CPU it used before
    the monitor first saw it counts too, so its share is its whole CPU time over the case."""
    h = LocalHost("h1")
    current: list[Process] = []
    mon = Monitor(lambda: {"h1": list(current)}, interval_s=0.2)
    code = "import time\nwhile time.process_time() < 0.6: pass\nprint('ready', flush=True)\ntime.sleep(60)"
    t0 = time.monotonic()
    with mon:
        time.sleep(0.3)
        late = spawn(h, code)  # burns 0.6 s of CPU, then sleeps; seen by the monitor only afterwards
        procs.append(late)
        current.append(late)
        time.sleep(1.0)
    wall = time.monotonic() - t0
    out = Outcome()
    mon.add_to(out)
    used = cpu_s(late.pid)
    assert used >= 0.55, used  # nearly all of it before the monitor could see the process
    reference = 100 * used / wall
    got = metrics(out)[("daemon_cpu_pct", "h1")]
    assert abs(got - reference) < 5, (got, reference)
