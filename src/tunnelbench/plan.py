"""How long a scenario takes before it runs (`tunnelbench plan`), each figure with where it came from:

- "measured (n)": the median wall time of earlier finished cases on this machine (the run folders under
  results/) of the same VPN, workload label and parameters;
- "scaled (n)": earlier cases of the same VPN and label with other parameters (tcp for 3 s, now 8 s), each
  times the ratio of the workload's typical times for the two parameter sets;
- "expected": none: the workload's typical time from its parameters (`typical_seconds`) and the runner's
  own time per case;
- "upper bound": a workload with no typical model (its time is the tunnel's): the bound its case timeout
  comes from (`expected_seconds`), which a case rarely takes.

Adds each VPN's mesh start-ups and teardowns (its median session in earlier runs, else a typical session and
the driver's settle time) and the drift reference of each round. A VPN that cannot run here is listed and left
out of the total."""

from __future__ import annotations

import json
import sqlite3
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tunnelbench.catalog import resolve
from tunnelbench.scenario import Scenario
from tunnelbench.store import DB_NAME
from tunnelbench.workloads.base import TOOL_START_S, Workload

# Typical, measured on a shared 2-CPU machine (runs 20261128-165704-tba4bb, 20261128-165852-tb1159):
# the runner's own time per case (monitor, counters, path check) beyond its workload: tcp cases of 4 s of
# iperf3 took 4.13-4.26 s, of 9 s 9.15-9.25 s
CASE_OVERHEAD_S = 0.2
# a session's mesh set-up, wait and teardown without settle time: 0.14 (internal) to 2.3 s (openvpn)
MESH_START_S = 1.0


@dataclass
class Line:
    vpn: str
    label: str
    cases: int
    per_case_s: float
    source: str  # "measured (n=12)" | "scaled (n=4)" | "expected" | "upper bound" | "skipped: ..."

    @property
    def seconds(self) -> float:
        return self.cases * self.per_case_s


@dataclass
class Plan:
    lines: list[Line] = field(default_factory=list)
    sessions_s: float = 0.0  # mesh start-ups and teardowns
    sessions_from: dict[str, str] = field(default_factory=dict)  # per VPN: "measured (n=2)" | "expected"
    drift_s: float = 0.0  # the drift reference measurements
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def cases(self) -> int:
        return sum(x.cases for x in self.lines)

    @property
    def seconds(self) -> float:
        return sum(x.seconds for x in self.lines) + self.sessions_s + self.drift_s


Past = list[tuple[dict[str, Any], float]]  # earlier cases of one VPN and label: (parameters, wall seconds)


def history(results: Path) -> tuple[dict[tuple[str, str], Past], dict[str, list[float]]]:
    """Finished cases' parameters and wall seconds per (vpn, label), and per VPN the seconds one session took
    to set its mesh up, wait for it and tear it down (each run's mean), from every run folder under `results`."""
    cases: dict[tuple[str, str], Past] = {}
    sessions: dict[str, list[float]] = {}
    for db in sorted(results.glob(f"*/{DB_NAME}")):
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
            rows = con.execute(
                'SELECT vpn, label, params, ended - started FROM "case" '
                "WHERE status = 'ok' AND ended IS NOT NULL"
            ).fetchall()
            phases = con.execute(
                "SELECT vpn, SUM(seconds), SUM(phase = 'vpn_setup') FROM phase WHERE vpn IS NOT "
                "NULL AND phase IN ('vpn_setup', 'tunnel_wait', 'teardown') GROUP BY vpn"
            ).fetchall()
            con.close()
        except sqlite3.Error:  # an older or half-written store: no history from it
            continue
        for vpn, label, params, s in rows:
            try:
                p = json.loads(params or "{}")
            except ValueError:
                continue  # parameters nobody can compare with
            if isinstance(p, dict) and isinstance(s, int | float):
                cases.setdefault((vpn, label), []).append((p, float(s)))
        for vpn, s, n in phases:  # n sessions (one vpn_setup each) in this run
            if n:
                sessions.setdefault(vpn, []).append(s / n)
    return cases, sessions


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def _typical(wl: Workload, params: dict[str, Any], cases: int) -> float | None:
    """The typical case time of `wl`'s workload run with `params` (None: not valid parameters of it now)."""
    try:
        other = type(wl)(type(wl).Params.model_validate(params))
    except (ValidationError, TypeError, ValueError):
        return None
    t = other.typical_seconds(cases)
    return t + CASE_OVERHEAD_S if t is not None else None


def per_case(wl: Workload, past: Past, cases: int) -> tuple[float, str]:
    """Seconds per case of `wl` (one of `cases` of a VPN and condition) and where the figure comes from."""
    mine = wl.params.model_dump()
    same = [s for p, s in past if _same(p, mine)]
    if same:
        return statistics.median(same), f"measured (n={len(same)})"
    typical = wl.typical_seconds(cases)
    if typical is None:
        return wl.expected_seconds() + CASE_OVERHEAD_S, "upper bound (no typical model)"
    want = typical + CASE_OVERHEAD_S
    scaled = [s * want / t for p, s in past if (t := _typical(wl, p, cases))]
    if scaled:
        return statistics.median(scaled), f"scaled (n={len(scaled)}, other parameters)"
    return want, "expected"


def session_s(vpn: str, wls: list[Workload], cases_per_session: int) -> float:
    """A session never measured here: typical set-up, wait and teardown, and the driver's settle time after
    the mesh starts and after every case that restarts it (connect)."""
    restarts = sum(wl.restarts_mesh for wl in wls) * cases_per_session
    return MESH_START_S + resolve(vpn).settle_s * (1 + restarts)


def make_plan(sc: Scenario, results: Path, available: Callable[[str], str | None] | None = None) -> Plan:
    """`available(vpn) -> reason | None` decides which VPNs count (default: every one)."""
    past, sessions = history(results)
    conditions = len(sc.profiles) * max(1, len(sc.tunings))
    interleaved = sc.run.order == "interleaved"
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
            per, src = per_case(wl, past.get((vpn, wl.label()), []), sc.run.repetitions)
            plan.lines.append(Line(vpn, wl.label(), sc.run.repetitions * conditions, per, src))
        # one session per VPN and condition in block order; per round and condition when interleaved
        n = conditions * (sc.run.repetitions if interleaved else 1)
        s = sessions.get(vpn)
        if s:
            plan.sessions_s += n * statistics.median(s)
            plan.sessions_from[vpn] = f"measured (n={len(s)})"
        else:
            plan.sessions_s += n * session_s(vpn, wls, 1 if interleaved else sc.run.repetitions)
            plan.sessions_from[vpn] = "expected"
    if sc.run.drift_check_s and sc.lab.backend != "ssh":  # before every round, or every VPN in block order
        counted = len(sc.vpns) - len(plan.unavailable)
        checks = sc.run.repetitions if interleaved else counted
        plan.drift_s = checks * (sc.run.drift_check_s + TOOL_START_S) if counted else 0.0
    return plan
