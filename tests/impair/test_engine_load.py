"""The engine's load per case (impair/load.py), judged by its work, its lateness and its drops: hand-made
pairs of stats samples (the fields native/impaird writes) with known answers."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from tunnelbench.impair.load import EngineLoad, engine_load


def stats(**kw: float) -> dict[str, Any]:
    base: dict[str, Any] = {
        "pid": 42,
        "cpu_s": 0.0,
        "spin_s": 0.0,
        "busy_poll_idle_s": 0.0,
        "dropped_overflow": 0,
        "kernel_queue_dropped": 0,
        "kernel_user_dropped": 0,
        "releases_held": 0,
        "release_late_us_sum": 0.0,
    }
    return base | kw


def test_a_slow_vpn_through_an_idle_busy_polling_engine_is_not_bound():
    """10 s of a case: the engine on its own core read 96% CPU, but 9.1 s of it was polling an empty queue and
    0.2 s spinning for release times: 3% work; 20,000 packets held, 4 s late in all: 200 us each."""
    s0 = stats(cpu_s=100.0, spin_s=10.0, busy_poll_idle_s=50.0, releases_held=1000, release_late_us_sum=1e5)
    s1 = stats(
        cpu_s=109.6, spin_s=10.2, busy_poll_idle_s=59.1, releases_held=21_000, release_late_us_sum=4.1e6
    )
    load = engine_load(s0, s1, 10.0)
    assert load is not None
    assert round(load.cpu_pct, 1) == 96.0 and round(load.work_pct or 0, 1) == 3.0 and load.late_us == 200.0
    assert not load.bound and load.why == ""


def test_an_engine_that_cannot_release_on_time_is_bound():
    """Work 40% of a core, but its held packets left 3 ms late on average (300 packets, 0.9 s late in all)."""
    s1 = stats(cpu_s=4.0, releases_held=300, release_late_us_sum=9e5)
    load = engine_load(stats(), s1, 10.0)
    assert load is not None and load.bound and load.why == "released held packets 3.0 ms late on average"


def test_an_engine_with_no_time_left_or_dropping_is_bound():
    load = engine_load(stats(), stats(cpu_s=9.0, spin_s=0.1), 10.0)  # 89% of a core working
    assert load is not None and load.bound and "worked 89% of a core" in load.why
    load = engine_load(stats(), stats(cpu_s=1.0, kernel_queue_dropped=3, dropped_overflow=2), 10.0)
    assert load is not None and load.bound and load.drops == 5


def test_old_stats_fall_back_to_the_cpu_share_and_a_restart_is_not_compared():
    old = {"pid": 1, "cpu_s": 0.0, "dropped_overflow": 0}
    load = engine_load(old, {"pid": 1, "cpu_s": 9.0, "dropped_overflow": 0}, 10.0)
    assert load is not None and load.work_pct is None and load.bound
    assert engine_load(stats(), stats(pid=43, cpu_s=1.0), 10.0) is None
    assert engine_load(stats(), stats(cpu_s=1.0), 0.0) is None


@pytest.mark.lab
def test_a_real_engine_idle_under_slow_traffic_and_bound_when_it_cannot_release_on_time(lab_factory):
    """The native engine in a lab router, 50 ms each way, pings every 10 ms: left alone it is idle (not bound,
    little work, releases on time); stopped for 0.4 s (SIGSTOP, by the PID its stats give) while it holds
    packets, it releases them hundreds of ms late: bound, by its lateness. Stats are the engine's own file
    (written every 200 ms)."""
    from tunnelbench.impair.backend import NativeBackend, make_backend
    from tunnelbench.impair.profiles import Profile

    lab = lab_factory(2)
    h1, h2 = lab.hosts
    be = make_backend("native", lab.router, lab.hosts, lab.run_dir / "impair")
    assert isinstance(be, NativeBackend)
    be.apply(Profile(name="d50", delay_ms=50))
    ping = ["ping", "-n", "-q", "-c", "150", "-i", "0.01", h2.underlay_ip]

    def measure(during: Callable[[], object]) -> EngineLoad:
        time.sleep(0.45)  # a fresh stats sample
        s0, t0 = be.stats(), time.monotonic()
        p = subprocess.Popen(h1.argv(ping), stdout=subprocess.DEVNULL)
        during()
        p.wait(timeout=30)
        time.sleep(0.45)
        s1, t1 = be.stats(), time.monotonic()
        load = engine_load(s0, s1, t1 - t0)
        assert load is not None, (s0, s1)
        return load

    def stall() -> None:
        time.sleep(0.5)
        pid = int(be.stats()["pid"])
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(0.4)
        finally:
            os.kill(pid, signal.SIGCONT)

    try:
        idle = measure(lambda: None)
        stalled = measure(stall)
    finally:
        be.clear()
    assert not idle.bound and idle.late_us is not None and idle.late_us < 1000, idle
    assert idle.work_pct is not None and idle.work_pct < 50, idle
    assert stalled.bound and stalled.late_us is not None and stalled.late_us >= 1000, stalled
    assert "late on average" in stalled.why
