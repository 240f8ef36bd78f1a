"""The engine's load per case (impair/load.py), judged by its work, its lateness and its drops: hand-made
pairs of stats samples (the fields native/impaird writes) with known answers."""

from __future__ import annotations

from typing import Any

from tunnelbench.impair.load import engine_load


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
