"""What a run does about a busy machine (scenario `[interference]`): every case is read by the interference
guard (lab/interference.py); a case that something outside the lab disturbed is measured again once the
machine is quiet, within a time budget; one that stays disturbed keeps its value with the verdict
`disturbed` (not ranked). Load that does not go away (a wait for a quiet second that timed out) is "steady":
later cases are labelled without waiting until the machine is seen quiet again, so a machine that is always
busy costs one wait, not one per case. The run's totals (how many cases, how much was taken, by which
processes) go to the environment table under `interference` for the headline."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunnelbench.core.files import write_atomic
from tunnelbench.lab.interference import Guard, Mark, Reading
from tunnelbench.runner.context import RunContext
from tunnelbench.scenario import InterferenceCfg

ENV_KEY = "interference"


@dataclass
class Tally:
    """The run's interference, as the headline reads it (env `interference`)."""

    mode: str
    threshold_pct: float
    cases: int = 0  # attempts read by the guard
    disturbed: int = 0  # attempts at or above the threshold
    remeasured: int = 0  # disturbed attempts measured again
    kept: int = 0  # cases kept with the verdict disturbed
    waited_s: float = 0.0  # waiting for a quiet machine
    spent_s: float = 0.0  # waiting + the disturbed attempts measured again (against the budget)
    steady: int = 0  # waits that timed out: load that stayed
    max_taken_pct: float = 0.0
    taken_pct_sum: float = 0.0  # over the disturbed attempts (their mean is this / disturbed)
    top_s: dict[str, float] = field(default_factory=dict)  # process name -> CPU seconds in disturbed attempts
    before_run: dict[str, Any] | None = None
    unwatched: str = ""  # why no case was read (hosts over SSH: their CPUs are not this machine's)

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["top_s"] = dict(sorted(self.top_s.items(), key=lambda kv: -kv[1])[:10])
        return d


class CaseGuard:
    def __init__(
        self, ctx: RunContext, cfg: InterferenceCfg, guard: Guard | None, unwatched: str = ""
    ) -> None:
        self.ctx, self.cfg, self.guard = ctx, cfg, guard
        self.tally = Tally(cfg.mode, cfg.max_taken_pct, unwatched=unwatched if guard is None else "")
        self.steady = False  # the last wait for quiet timed out: label, do not wait, until quiet is seen

    @property
    def active(self) -> bool:
        return self.guard is not None and self.cfg.mode != "off"

    def _budget_left(self) -> float:
        return self.cfg.budget_s - self.tally.spent_s

    def _wait(self) -> bool:
        """Wait for one quiet second (bounded by quiet_wait_s and the budget); True when it came."""
        assert self.guard is not None
        limit = min(self.cfg.quiet_wait_s, self._budget_left())
        if limit <= 0:
            return False
        self.ctx.status(f"waiting for a quiet machine (at most {limit:.0f} s)")
        quiet, waited = self.guard.wait_quiet(self.cfg.max_taken_pct, limit, self.cfg.interval_s)
        self.tally.waited_s += waited
        self.tally.spent_s += waited
        self.ctx.phase(None, "quiet_wait", waited)
        if not quiet:
            self.steady = True
            self.tally.steady += 1
            self.ctx.say(
                f"the machine stayed busy for {waited:.0f} s: cases are measured on and labelled disturbed "
                "until it is quiet again",
                "yellow",
            )
        self._store()
        return quiet

    def before_case(self) -> None:
        """A machine busy right now: wait for it to be quiet before measuring (remeasure mode only)."""
        if not self.active or self.cfg.mode != "remeasure":
            return
        assert self.guard is not None
        now = self.guard.recent(self.cfg.interval_s)
        if now is None or not now.disturbed(self.cfg.max_taken_pct):
            self.steady = False  # quiet again: disturbed cases are worth measuring again
            return
        if not self.steady:
            self._wait()

    def mark(self) -> Mark | None:
        return self.guard.mark() if self.active and self.guard is not None else None

    def reading(self, m0: Mark | None) -> Reading | None:
        if m0 is None or self.guard is None:
            return None
        return self.guard.between(m0, self.guard.mark())

    def decide(self, r: Reading | None, remeasured: int, adir: Path) -> str:
        """'ok' (not disturbed), 'remeasure' (wait for quiet, measure again) or 'keep' (disturbed, labelled)."""
        if r is None:
            return "ok"
        write_atomic(adir / "interference.json", json.dumps(r.to_json()))
        t = self.tally
        t.cases += 1
        if not r.disturbed(self.cfg.max_taken_pct):
            self._store()  # one row per case: the headline's count is the run's, even when it is killed
            return "ok"
        t.disturbed += 1
        t.taken_pct_sum += r.taken_pct
        t.max_taken_pct = max(t.max_taken_pct, r.taken_pct)
        for name, s in r.top:
            t.top_s[name] = t.top_s.get(name, 0.0) + s
        if (
            self.cfg.mode == "remeasure"
            and remeasured < self.cfg.remeasures
            and not self.steady
            and self._budget_left() > 0
        ):
            return "remeasure"
        t.kept += 1
        self._store()
        return "keep"

    def remeasure(self, attempt_s: float) -> None:
        """A disturbed attempt is set aside: count it against the budget, then wait for a quiet machine."""
        self.tally.remeasured += 1
        self.tally.spent_s += attempt_s
        self._wait()

    def check_before_run(self, seconds: float = 1.0) -> None:
        """Say when the machine is already busy before anything is measured (the lab is not up yet)."""
        if self.cfg.mode == "off":
            return
        if self.guard is None:
            if self.tally.unwatched:  # said in the headline: nothing here says the hosts were quiet
                self._store()
            return
        m0 = self.guard.mark()
        time.sleep(seconds)
        r = self.guard.between(m0, self.guard.mark())
        self.tally.before_run = r.to_json()
        if r.disturbed(self.cfg.max_taken_pct):
            what = {
                "remeasure": "cases measured while it lasts are measured again when it is quiet, or kept "
                "and labelled disturbed",
                "label": "cases measured while it lasts are labelled disturbed",
            }[self.cfg.mode]
            self.ctx.say(f"the machine is busy before the run: {r.text()}; {what}", "yellow")
        self._store()

    def resume(self, env: dict[str, str]) -> None:
        """A resumed run goes on counting from what the killed process recorded."""
        try:
            prior = json.loads(env.get(ENV_KEY, "null"))
        except ValueError:
            return
        if not isinstance(prior, dict):
            return
        for k, v in prior.items():
            if (
                k in self.tally.__dict__
                and k not in ("mode", "threshold_pct")
                and isinstance(v, type(getattr(self.tally, k)))
            ):
                setattr(self.tally, k, v)

    def _store(self) -> None:
        self.ctx.store.set_env(self.ctx.run_id, {ENV_KEY: self.tally.to_json()})
