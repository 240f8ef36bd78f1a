"""Was the impairment engine the bottleneck of a case? Judged by what it did, not by its CPU share: given a
CPU of its own the engine busy-polls, so its CPU reads near 100% at any load (tinc at 125 Mbit/s read 94-97%
while the no-VPN baseline, with the most packets, read 74-82%). From two samples of the engine's stats
(native/impaird, stats_path) around a case:

  work       CPU time not spent waiting: cpu_s minus spin_s (spinning for an exact release time) minus
             busy_poll_idle_s (polls that found nothing), % of one core over the case;
  lateness   mean time a held packet left after its scheduled release (releases_held, release_late_us_sum);
  drops      packets its own queue or the kernel's NFQUEUE dropped (the profile did not ask for them).

Bound when it dropped anything, its work reached WORK_PCT of a core (it had no time left), or its held
packets left LATE_US late on average (it could not release them on time). An engine without the newer
counters (an older build) is judged by its CPU share as before."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WORK_PCT = 85.0  # % of one core doing work: no headroom left
LATE_US = 1000.0  # mean release lateness over a case: 1 ms is far beyond timer wake-up (50-200 us here)
CPU_PCT = 85.0  # the old rule, for stats without the work counters


@dataclass(frozen=True)
class EngineLoad:
    cpu_pct: float  # the engine's CPU share over the case, % of one core (spinning included)
    work_pct: float | None  # of which doing work
    late_us: float | None  # mean release lateness of the packets it held during the case
    drops: int  # its own and the kernel queue's drops during the case

    @property
    def bound(self) -> bool:
        if self.drops > 0:
            return True
        if self.work_pct is None:
            return self.cpu_pct >= CPU_PCT
        return self.work_pct >= WORK_PCT or (self.late_us is not None and self.late_us >= LATE_US)

    @property
    def why(self) -> str:
        parts = []
        if self.drops:
            parts.append(f"dropped {self.drops} packets on its own")
        if self.work_pct is not None and self.work_pct >= WORK_PCT:
            parts.append(f"worked {self.work_pct:.0f}% of a core")
        if self.work_pct is None and self.cpu_pct >= CPU_PCT:
            parts.append(f"used {self.cpu_pct:.0f}% of a core")
        if self.late_us is not None and self.late_us >= LATE_US:
            parts.append(f"released held packets {self.late_us / 1000:.1f} ms late on average")
        return ", ".join(parts)


def _delta(s0: dict[str, Any], s1: dict[str, Any], key: str) -> float | None:
    a, b = s0.get(key), s1.get(key)
    return None if a is None or b is None else float(b) - float(a)


def engine_load(s0: dict[str, Any], s1: dict[str, Any], wall_s: float) -> EngineLoad | None:
    """The engine's load between two stats samples `wall_s` seconds apart; None when they cannot be compared
    (no CPU figure, no time between them, or the engine restarted in between)."""
    cpu = _delta(s0, s1, "cpu_s")
    if cpu is None or wall_s <= 0 or s0.get("pid") != s1.get("pid"):
        return None
    drops = int(_delta(s0, s1, "dropped_overflow") or 0)
    for k in ("kernel_queue_dropped", "kernel_user_dropped"):
        drops += int(_delta(s0, s1, k) or 0)
    spin, idle = _delta(s0, s1, "spin_s"), _delta(s0, s1, "busy_poll_idle_s")
    work = None if spin is None or idle is None else max(0.0, cpu - spin - idle)
    n, late_sum = _delta(s0, s1, "releases_held"), _delta(s0, s1, "release_late_us_sum")
    late = late_sum / n if n and late_sum is not None else None
    return EngineLoad(
        cpu_pct=100 * cpu / wall_s,
        work_pct=None if work is None else 100 * work / wall_s,
        late_us=late,
        drops=drops,
    )
