"""The metrics the runner adds to every case beside the workload's own, declared like a workload's `metrics`:
the monitor's (the VPN daemons' CPU and memory, the machine's CPU), the impairment engine's (its CPU and the
packets it dropped on its own), the path check's, and the kernel's drop counters. `Outcome.add` takes their
units here and analysis their direction: no metric is special-cased by where it comes from."""

from __future__ import annotations

from tunnelbench.core.metrics import MetricSpec, declare
from tunnelbench.lab.counters import HOST_COUNTERS, MACHINE_COUNTERS, PREFIX

# the daemon_* metrics carry the host they were sampled on; machine_cpu_pct carries none
MONITOR_METRICS = (
    MetricSpec("daemon_cpu_pct", "%", "lower", "daemon CPU over the case, % of one core (per host)"),
    MetricSpec("daemon_cpu_peak_pct", "%", "lower", "highest sampled daemon CPU, % of one core (per host)"),
    MetricSpec("daemon_rss_mb", "MiB", "lower", "peak sampled daemon resident memory (per host)"),
    MetricSpec("daemon_rss_mean_mb", "MiB", "lower", "mean sampled daemon resident memory (per host)"),
    MetricSpec("machine_cpu_pct", "%", "none", "whole-machine CPU during the case"),
)
# the per-host metrics of the VPN daemons (analysed as CPU and memory, not as workload results)
DAEMON_METRICS = tuple(m.name for m in MONITOR_METRICS if m.name.startswith("daemon_"))

# the native impairment engine on the router, per case (runner._add_engine_stats)
ENGINE_METRICS = (
    MetricSpec("engine_overflow_drops", "packets", "lower", "packets the engine's own queue dropped"),
    MetricSpec(
        "engine_kernel_drops", "packets", "lower", "packets the kernel's NFQUEUE dropped before the engine"
    ),
    MetricSpec("engine_packets", "packets", "none", "packets the engine handled"),
    MetricSpec("engine_realtime", "bool", "none", "1: the engine ran with SCHED_FIFO as asked"),
    MetricSpec(
        "engine_cpu_pct", "%", "lower", "the engine's CPU over the case, % of one core (spinning included)"
    ),
    MetricSpec(
        "engine_work_pct",
        "%",
        "lower",
        "the engine's CPU doing work (not spinning or idle polling), % of a core",
    ),
    MetricSpec("engine_late_us", "us", "lower", "mean time a held packet left after its scheduled release"),
    MetricSpec(
        "engine_bound",
        "bool",
        "lower",
        "1: the emulator set the pace (drops, >= 85% of a core working, >= 1 ms late)",
    ),
)

# the underlay path the case's traffic took (lab/pathcheck.py)
PATH_METRICS = (
    MetricSpec("path_changes", "count", "lower", "times the path changed within the case, second by second"),
    MetricSpec("path_underlay_bytes", "B", "none", "underlay bytes the router counted during the case"),
    MetricSpec(
        "path_direct_pct", "%", "none", "share of those bytes sent straight between client and server"
    ),
)

# what the machine did outside the lab while the case ran (lab/interference.py), and the verdicts the
# runner kept the case with instead of failing it (disturbed: re-measuring did not find a quiet machine;
# off_path: the VPN carried the traffic another way than the scenario asked, path_direct_pct says how)
GUARD_METRICS = (
    MetricSpec(
        "interference_pct",
        "%",
        "lower",
        "CPU taken by processes outside the lab, % of the lab's CPU capacity (wall time x lab CPUs)",
    ),
    MetricSpec("steal_pct", "%", "lower", "the VM's steal time on the lab's CPUs, % of their capacity"),
    MetricSpec("disturbed", "bool", "lower", "1: kept although something outside the lab disturbed it"),
    MetricSpec("off_path", "bool", "lower", "1: the traffic did not take the path the scenario asked for"),
)

# the kernel's drop counters, per host (lab/counters.py), as deltas over the case
COUNTER_METRICS = tuple(
    MetricSpec(PREFIX + c, "count", "lower", f"kernel counter {c}: increase over the case")
    for c in (*HOST_COUNTERS, *MACHINE_COUNTERS)
)

CASE_METRICS = (*MONITOR_METRICS, *ENGINE_METRICS, *PATH_METRICS, *GUARD_METRICS, *COUNTER_METRICS)
declare(CASE_METRICS, "the runner")
