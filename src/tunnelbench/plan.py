"""How long a scenario takes before it runs (`tunnelbench plan`): cases per workload, and seconds per case
from what this machine measured in earlier runs of the same VPN and workload label (the median of their
finished cases' wall time under results/), else the workload's own declared upper bound
(`expected_seconds`, marked "declared"). Adds each VPN's measured mesh start-up per condition. A VPN that
cannot run here is listed and left out of the total."""

from __future__ import annotations

import sqlite3
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tunnelbench.scenario import Scenario
from tunnelbench.store import DB_NAME

CASE_OVERHEAD_S = 1.0  # a declared estimate's own start-up, monitor and bookkeeping per case
MESH_START_S = 5.0  # a VPN session's start, wait and teardown when no earlier run measured it


@dataclass
class Line:
    vpn: str
    label: str
    cases: int
    per_case_s: float
    source: str  # "measured (n=12)" | "declared"

    @property
    def seconds(self) -> float:
        return self.cases * self.per_case_s


@dataclass
class Plan:
    lines: list[Line] = field(default_factory=list)
    sessions_s: float = 0.0  # mesh start-ups and teardowns
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def cases(self) -> int:
        return sum(x.cases for x in self.lines)

    @property
    def seconds(self) -> float:
        return sum(x.seconds for x in self.lines) + self.sessions_s


def history(results: Path) -> tuple[dict[tuple[str, str], list[float]], dict[str, list[float]]]:
    """Finished cases' wall seconds per (vpn, label), and per VPN the seconds one session took to set its mesh
    up, wait for it and tear it down (each run's mean), from every run folder under `results`."""
    cases: dict[tuple[str, str], list[float]] = {}
    sessions: dict[str, list[float]] = {}
    for db in sorted(results.glob(f"*/{DB_NAME}")):
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
            rows = con.execute(
                "SELECT vpn, label, ended - started FROM \"case\" WHERE status = 'ok' AND ended IS NOT NULL"
            ).fetchall()
            phases = con.execute(
                "SELECT vpn, SUM(seconds), SUM(phase = 'vpn_setup') FROM phase WHERE vpn IS NOT "
                "NULL AND phase IN ('vpn_setup', 'tunnel_wait', 'teardown') GROUP BY vpn"
            ).fetchall()
            con.close()
        except sqlite3.Error:  # an older or half-written store: no history from it
            continue
        for vpn, label, s in rows:
            cases.setdefault((vpn, label), []).append(s)
        for vpn, s, n in phases:  # n sessions (one vpn_setup each) in this run
            if n:
                sessions.setdefault(vpn, []).append(s / n)
    return cases, sessions


def make_plan(sc: Scenario, results: Path, available: Callable[[str], str | None] | None = None) -> Plan:
    """`available(vpn) -> reason | None` decides which VPNs count (default: every one)."""
    past, sessions = history(results)
    conditions = len(sc.profiles) * max(1, len(sc.tunings))
    plan = Plan()
    wls = sc.build_workloads()
    for vpn in sc.vpns:
        why = available(vpn) if available else None
        if why:
            plan.unavailable[vpn] = why
            continue
        for wl in wls:
            if wl.hosts_needed() > sc.mesh_hosts(vpn):  # the runner skips it, saying why
                plan.lines.append(
                    Line(vpn, wl.label(), 0, 0.0, f"skipped: lab.hosts_per_vpn = {sc.mesh_hosts(vpn)}")
                )
                continue
            seen = past.get((vpn, wl.label()), [])
            if seen:
                per, src = statistics.median(seen), f"measured (n={len(seen)})"
            else:
                per, src = wl.expected_seconds() + CASE_OVERHEAD_S, "declared"
            plan.lines.append(Line(vpn, wl.label(), sc.run.repetitions * conditions, per, src))
        # one session per VPN and condition in block order; per round and condition when interleaved
        n = conditions * (sc.run.repetitions if sc.run.order == "interleaved" else 1)
        s = sessions.get(vpn)
        plan.sessions_s += n * (statistics.median(s) if s else MESH_START_S)
    return plan
