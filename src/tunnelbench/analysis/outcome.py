"""What a finished run tells a CI job: its exit code and the one line that says why.

0  every planned case measured (a case that does not apply to the VPN, status "n/a", counts as planned
   and answered: the user chose that VPN and that workload)
1  some cases failed or were skipped for a reason the user did not ask for (a VPN unavailable here or
   whose mesh did not come up, a condition it could not reach, a case whose every attempt failed)
2  bad input: nothing ran (the CLI exits before a run exists)
3  nothing measured: not one case ok
130 interrupted: the finished cases are kept and `tunnelbench run --resume` goes on

A case is judged by its best attempt: a failed attempt whose retry was ok is a measured case."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunnelbench.analysis.analyze import RunData
    from tunnelbench.store import CaseRow, Store

OK, SOME_MISSING, BAD_INPUT, NOTHING_MEASURED, INTERRUPTED = 0, 1, 2, 3, 130
PLANNED_KEY = "run.planned_cases_per_vpn"  # the runner records its plan here (environment table)

# a case's statuses from best to worst: the best attempt of a (vpn, profile, label, repetition) decides
_RANK = {"ok": 0, "n/a": 1, "skipped": 2, "failed": 3, "error": 3, "interrupted": 4, "running": 4}


@dataclass
class Outcome:
    code: int
    measured: int  # cases with an ok attempt
    planned: int  # distinct (vpn, profile, label, repetition) the run recorded
    missing: dict[str, int] = field(default_factory=dict)  # VPN -> cases not measured (n/a aside)
    reasons: dict[str, str] = field(default_factory=dict)  # VPN -> why it was out of the run

    def line(self) -> str:
        if self.code == OK:
            return f"exit 0: all {self.planned} planned case(s) measured"
        if self.code == NOTHING_MEASURED:
            head = f"exit 3: nothing measured ({self.planned} planned case(s))"
        else:
            n = sum(self.missing.values())
            head = f"exit 1: {n} of {self.planned} planned case(s) not measured"
        parts = [
            f"{v}: {k} case(s)" + (f" ({self.reasons[v]})" if v in self.reasons else "")
            for v, k in sorted(self.missing.items())
        ]
        parts += [f"{v}: no case ({r})" for v, r in sorted(self.reasons.items()) if v not in self.missing]
        return head + (": " + "; ".join(parts) if parts else "")


@dataclass(frozen=True)
class CaseStatus:
    vpn: str
    profile: str
    label: str
    repetition: int
    status: str


def _short(text: str, n: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= n else line[: n - 1] + "…"


def judge(
    cases: Iterable[CaseStatus], vpns: Mapping[str, tuple[str, str | None]], per_vpn: int | None = None
) -> Outcome:
    """The outcome of a run that ended (not interrupted) from its cases' statuses, its VPNs'
    (name -> (status, reason)) and the cases it planned per VPN (conditions x workloads x repetitions;
    None: what the store recorded). A skipped record stands for every repetition it covers, so a VPN's
    missing cases are its planned ones less those measured or n/a. A VPN that is not ok is a reason for
    exit 1 even when it recorded no case."""
    best: dict[tuple[str, str, str, int], str] = {}
    for c in cases:
        k = (c.vpn, c.profile, c.label, c.repetition)
        if k not in best or _RANK.get(c.status, 4) < _RANK.get(best[k], 4):
            best[k] = c.status
    answered: dict[str, int] = dict.fromkeys(vpns, 0)
    recorded: dict[str, int] = dict.fromkeys(vpns, 0)
    for (vpn, *_), st in best.items():
        recorded[vpn] = recorded.get(vpn, 0) + 1
        answered[vpn] = answered.get(vpn, 0) + (st in ("ok", "n/a"))
    measured = sum(st == "ok" for st in best.values())
    plan = {v: recorded[v] if per_vpn is None else max(per_vpn, answered[v]) for v in answered}
    missing = {v: plan[v] - answered[v] for v in plan if plan[v] > answered[v]}
    reasons = {v: _short(f"{st}: {why}" if why else st) for v, (st, why) in vpns.items() if st != "ok"}
    if measured == 0:
        code = NOTHING_MEASURED
    elif missing or reasons:
        code = SOME_MISSING
    else:
        code = OK
    return Outcome(code, measured, sum(plan.values()), missing, reasons)


def judge_store(store: Store, run_id: str) -> Outcome:
    return _judge_recorded(store.cases(run_id), [dict(v) for v in store.vpns(run_id)], store.env(run_id))


def judge_run(run: RunData) -> Outcome:
    """judge_store of a run already read (analysis/analyze.py): nothing is read again."""
    return _judge_recorded(run.cases, run.vpns, run.env)


def _judge_recorded(
    cases: Iterable[CaseRow], vpns: Iterable[Mapping[str, Any]], env: Mapping[str, str]
) -> Outcome:
    statuses = [CaseStatus(c.vpn, c.profile, c.label, c.repetition, c.status) for c in cases]
    raw = env.get(PLANNED_KEY)
    return judge(statuses, {v["name"]: (v["status"], v["reason"]) for v in vpns}, int(raw) if raw else None)


def suite_code(codes: list[int]) -> int:
    """A suite's exit code from its parts': interrupted wins; nothing measured only when no part measured
    anything; any part short of 0 makes the suite 1."""
    if INTERRUPTED in codes:
        return INTERRUPTED
    if BAD_INPUT in codes:
        return BAD_INPUT
    if codes and all(c == NOTHING_MEASURED for c in codes):
        return NOTHING_MEASURED
    return SOME_MISSING if any(codes) else OK
