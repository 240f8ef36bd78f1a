"""The run's plan: which cases (VPN x condition x workload x repetition) in which order, and what is left.

Interleaved order: repetition r of every VPN before r+1 of any, each round's VPN order a fresh shuffle from
one recorded seed (a resumed run plans as the killed one did). Adaptive repetitions: more rounds, only for the
groups whose headline metric is not yet precise enough. A resumed run skips the cases already ok."""

from __future__ import annotations

import random

from tunnelbench.runner.context import RunContext
from tunnelbench.runner.resume import PriorPlan, ResumeError
from tunnelbench.workloads.base import Workload


def round_orders(vpns: list[str], rounds: int, seed: int) -> list[list[str]]:
    """The VPN order of every round: each round a fresh shuffle from one generator seeded with `seed`, so the
    same seed gives the same plan (a resumed or repeated run) and every VPN appears once per round."""
    rng = random.Random(seed)
    out = []
    for _ in range(rounds):
        order = list(vpns)
        rng.shuffle(order)
        out.append(order)
    return out


def eta_text(elapsed_s: float, completed: float, total: float | None, free: float = 0) -> str:
    """The progress line's estimate of the time left: this process's seconds per case it measured (`free`
    cases, kept from before a resume, took none) times the cases still to come; "" before the first case."""
    done = completed - free
    if done <= 0 or not total:
        return ""
    left = elapsed_s / done * max(total - completed, 0)
    return f" · ~{left / 60:.0f} min left" if left >= 60 else f" · ~{left:.0f} s left"


Only = set[tuple[str, str]] | None  # (condition label, workload label) pairs a session measures; None = all


class Schedule:
    def __init__(self, ctx: RunContext, workloads: list[Workload]) -> None:
        self.ctx = ctx
        self.sc = ctx.sc
        self.workloads = workloads
        # resume: cases already ok, (vpn, condition label, workload label, rep)
        self.done: set[tuple[str, str, str, int]] = set()

    @property
    def max_reps(self) -> int:
        """The most repetitions a group gets: run.max_repetitions (adaptive), else run.repetitions."""
        return self.sc.run.max_repetitions or self.sc.run.repetitions

    @property
    def adaptive(self) -> bool:
        return self.max_reps > self.sc.run.repetitions

    def conditions(self) -> list[tuple[str, str, str]]:
        """(profile, tuning, stored label) for every profile x host tuning of the run."""
        tunings = self.sc.tunings or ["default"]
        return [(p, t, p if t == "default" else f"{p}+{t}") for p in self.sc.profiles for t in tunings]

    def total(self) -> int:
        return len(self.conditions()) * len(self.sc.vpns) * self.sc.run.repetitions * len(self.workloads)

    def per_round(self) -> int:
        """Cases of one VPN in one fixed round."""
        return len(self.conditions()) * len(self.workloads)

    def check_prior(self, prior: PriorPlan) -> None:
        """A resumed run: the killed run's seed must give back its stored round orders."""
        if prior.seed is None or prior.orders is None or self.sc.run.order != "interleaved":
            return
        again = round_orders(self.sc.vpns, self.sc.run.repetitions, prior.seed)
        if prior.orders[: len(again)] != again:
            raise ResumeError(
                f"run {self.ctx.run_id}: seed {prior.seed} no longer gives the stored round "
                f"orders ({prior.orders} vs {again}); this tunnelbench plans rounds "
                "differently, so the run cannot be continued: start a new run"
            )

    def is_done(self, vpn: str, label: str, wl: Workload, rep: int) -> bool:
        return (vpn, label, wl.label(), rep) in self.done

    def session_needed(self, vpn: str, reps: list[int], only: Only, adaptive: bool = False) -> bool:
        """Has a session of this VPN anything left to measure? (A resumed run does not bring up a VPN whose
        cases of the round are all ok.)"""
        if not self.done:
            return True
        for _p, _t, label in self.conditions():
            for wl in self.workloads:
                if only is not None and (label, wl.label()) not in only:
                    continue
                if any(not self.is_done(vpn, label, wl, rep) for rep in reps):
                    return True
        if adaptive and self.adaptive:
            # block order's adaptive repetitions, planned as the session plans them (adaptive_reps)
            for _p, _t, label in self.conditions():
                pending = [wl for wl in self.workloads if wl.headline]
                for rep in range(max(reps) + 1, self.max_reps + 1):
                    pending = [wl for wl in pending if not self.precise(vpn, label, wl, rep)]
                    if any(not self.is_done(vpn, label, wl, rep) for wl in pending):
                        return True
        return False

    def remaining_cases(self, vpn: str, reps: list[int]) -> int:
        """Cases of a VPN not yet counted by the progress bar: this round's and all later fixed rounds'."""
        later = self.sc.run.repetitions - max(reps) if self.sc.run.order == "interleaved" else 0
        return self.per_round() * (len(reps) + max(later, 0))

    def precise(self, vpn: str, profile: str, wl: Workload, before_rep: int) -> bool:
        """Is the 95% bootstrap CI of the mean of the workload's first headline metric within
        target_ci_pct of the mean (over this run's successful repetitions before `before_rep`, the one being
        planned: a resumed run plans as the interrupted one did)?"""
        from tunnelbench.analysis.stats import describe

        values = self.ctx.store.case_values(
            self.ctx.run_id, vpn, profile, wl.label(), wl.headline[0], before_rep
        )
        if len(values) < 2:
            return False
        d = describe(values)
        if d.mean == 0:
            return d.mean_ci_hi == d.mean_ci_lo
        return 100 * (d.mean_ci_hi - d.mean_ci_lo) / 2 / abs(d.mean) <= self.sc.run.target_ci_pct

    def adaptive_pending(self, vpns: list[str], dead: set[str], rep: int) -> dict[str, set[tuple[str, str]]]:
        """Interleaved adaptive round `rep`: per VPN, the (condition label, workload label) groups whose
        headline metric is not yet precise enough."""
        pending: dict[str, set[tuple[str, str]]] = {}
        for vpn in vpns:
            if vpn in dead:
                continue
            for _p, _t, label in self.conditions():
                for wl in self.workloads:
                    if wl.headline and not self.precise(vpn, label, wl, rep):
                        pending.setdefault(vpn, set()).add((label, wl.label()))
        return pending
