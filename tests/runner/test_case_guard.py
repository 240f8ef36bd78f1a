"""What the run does with a busy machine (runner/guard.py): measure again once quiet, within the budget; load
that stays is labelled without a wait per case; the tally the headline reads. A scripted guard stands in for
the machine (its readings are the test's)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from tunnelbench.lab.interference import Mark, Reading
from tunnelbench.runner.guard import ENV_KEY, CaseGuard
from tunnelbench.scenario import InterferenceCfg

QUIET = Reading(1.0, 2, 0.0, 0.0)
BUSY = Reading(2.0, 2, 1.9, 0.0, (("stress-ng", 1.9),))


class Script:
    """The guard's readings, in order: `recent()` answers the next of `now`; `wait_quiet` the next of `waits`."""

    def __init__(self, now: list[Reading | None], waits: list[tuple[bool, float]]) -> None:
        self.now, self.waits = now, waits
        self.waited = 0

    def recent(self, _w: float) -> Reading | None:
        return self.now.pop(0) if self.now else QUIET

    def mark(self) -> Mark:
        return Mark(0.0, {}, 0.0)

    def between(self, _a: Mark, _b: Mark) -> Reading:
        return QUIET

    def wait_quiet(self, _t: float, limit: float, _w: float) -> tuple[bool, float]:
        self.waited += 1
        quiet, s = self.waits.pop(0)
        return quiet, min(s, limit)


def _ctx() -> Any:
    env: dict[str, Any] = {}
    said: list[str] = []
    phases: list[tuple[str, float]] = []
    store = SimpleNamespace(set_env=lambda _r, d: env.update(d))
    return SimpleNamespace(
        run_id="r",
        store=store,
        env=env,
        said=said,
        phases=phases,
        say=lambda m, _s="": said.append(m),
        status=lambda _m: None,
        phase=lambda _v, p, s: phases.append((p, s)),
    )


def test_a_disturbed_case_is_measured_again_once_quiet(tmp_path):
    ctx = _ctx()
    g = Script([], [(True, 7.0)])
    cg = CaseGuard(ctx, InterferenceCfg(), g)  # type: ignore[arg-type]
    assert cg.decide(BUSY, 0, tmp_path) == "remeasure"
    cg.remeasure(4.0)
    assert g.waited == 1 and ctx.phases == [("quiet_wait", 7.0)]
    assert cg.decide(QUIET, 1, tmp_path) == "ok"
    t = json.loads(json.dumps(ctx.env[ENV_KEY]))
    assert (t["cases"], t["disturbed"], t["remeasured"], t["kept"]) == (2, 1, 1, 0)
    assert t["spent_s"] == 11.0 and t["waited_s"] == 7.0 and t["top_s"] == {"stress-ng": 1.9}
    assert json.loads((tmp_path / "interference.json").read_text())["other_pct"] == 0.0  # the last reading


def test_remeasures_stop_at_the_limit_and_the_case_is_kept_disturbed(tmp_path):
    ctx = _ctx()
    cg = CaseGuard(ctx, InterferenceCfg(remeasures=2), Script([], [(True, 1.0)] * 5))  # type: ignore[arg-type]
    assert [cg.decide(BUSY, n, tmp_path) for n in range(3)] == ["remeasure", "remeasure", "keep"]
    assert cg.tally.kept == 1 and cg.tally.disturbed == 3


def test_load_that_stays_costs_one_wait_not_one_per_case(tmp_path):
    """A wait that times out marks the load steady: later cases are kept (labelled) without waiting, until
    the machine is seen quiet before a case."""
    ctx = _ctx()
    g = Script([BUSY, BUSY, BUSY, QUIET], [(False, 30.0)])
    cg = CaseGuard(ctx, InterferenceCfg(quiet_wait_s=30), g)  # type: ignore[arg-type]
    cg.before_case()  # busy now: waits 30 s, in vain
    assert g.waited == 1 and cg.steady and cg.tally.steady == 1
    assert cg.decide(BUSY, 0, tmp_path) == "keep"
    cg.before_case()  # still busy: no second wait
    cg.before_case()
    assert g.waited == 1 and cg.decide(BUSY, 0, tmp_path) == "keep"
    cg.before_case()  # quiet again: disturbed cases are worth measuring again
    assert not cg.steady and cg.decide(BUSY, 0, tmp_path) == "remeasure"
    assert any("stayed busy for 30 s" in m for m in ctx.said)


def test_the_budget_bounds_waiting_and_remeasuring(tmp_path):
    ctx = _ctx()
    cg = CaseGuard(ctx, InterferenceCfg(budget_s=10), Script([], [(True, 6.0)] * 3))  # type: ignore[arg-type]
    assert cg.decide(BUSY, 0, tmp_path) == "remeasure"
    cg.remeasure(3.0)  # 3 s measuring + 6 s waiting: 1 s of budget left
    assert cg.decide(BUSY, 0, tmp_path) == "remeasure"
    cg.remeasure(3.0)  # over
    assert cg.decide(BUSY, 0, tmp_path) == "keep"


def test_label_mode_never_waits_and_off_reads_nothing(tmp_path):
    ctx = _ctx()
    g = Script([BUSY], [])
    cg = CaseGuard(ctx, InterferenceCfg(mode="label"), g)  # type: ignore[arg-type]
    cg.before_case()
    assert cg.decide(BUSY, 0, tmp_path) == "keep" and g.waited == 0
    off = CaseGuard(ctx, InterferenceCfg(mode="off"), g)  # type: ignore[arg-type]
    assert off.mark() is None and off.reading(None) is None and off.decide(None, 0, tmp_path) == "ok"


def test_a_resumed_run_goes_on_counting():
    ctx = _ctx()
    cg = CaseGuard(ctx, InterferenceCfg(), None)
    cg.resume({ENV_KEY: json.dumps({"cases": 40, "disturbed": 3, "spent_s": 50.0, "mode": "label"})})
    assert (cg.tally.cases, cg.tally.disturbed, cg.tally.spent_s, cg.tally.mode) == (40, 3, 50.0, "remeasure")


def test_adaptive_rounds_stop_at_the_time_budget(monkeypatch):
    """run.time_budget_s: no adaptive round starts when the time so far plus the mean round would pass it."""
    import time as _time

    from tunnelbench.runner.loop import Runner

    said: list[str] = []
    env: dict[str, Any] = {}
    fake = SimpleNamespace(
        sc=SimpleNamespace(run=SimpleNamespace(time_budget_s=600.0)),
        t_start=1000.0,
        _say=lambda m, _s="": said.append(m),
        store=SimpleNamespace(set_env=lambda _r, d: env.update(d)),
        run_id="r",
    )
    monkeypatch.setattr(_time, "monotonic", lambda: 1000.0 + 500.0)  # 500 s for 6 rounds: ~83 s a round
    assert not Runner._over_budget(fake, 7)  # type: ignore[arg-type]
    monkeypatch.setattr(_time, "monotonic", lambda: 1000.0 + 560.0)  # 560 + 80 > 600
    assert Runner._over_budget(fake, 8)  # type: ignore[arg-type]
    assert "adaptive round 8 not started: 560 s so far plus a round's 80 s" in said[0]
    assert env["run.adaptive_stopped"] == said[0]
    fake.sc.run.time_budget_s = None
    assert not Runner._over_budget(fake, 8)  # type: ignore[arg-type]


def _machine_line(env: dict[str, Any]) -> list[tuple[str, str]]:
    from tunnelbench.report.headline import _machine

    run = SimpleNamespace(records=SimpleNamespace(interference=env[ENV_KEY]))
    return _machine(run)  # type: ignore[arg-type]


def test_hosts_the_guard_cannot_read_are_said_unwatched_not_quiet():
    # over SSH the hosts' CPUs are not this machine's: the headline must not call them quiet
    ctx = _ctx()
    cg = CaseGuard(ctx, InterferenceCfg(), None, unwatched="hosts over SSH: their CPUs are not read here")
    cg.check_before_run(0)
    ((text, tone),) = _machine_line(ctx.env)
    assert text.startswith("machine load not watched: hosts over SSH") and "quiet" not in text.split(":")[0]
    assert tone == "warn"
    # the same guard with its readings: quiet, counted
    ctx = _ctx()
    cg = CaseGuard(ctx, InterferenceCfg(), Script([], []), unwatched="hosts over SSH")  # type: ignore[arg-type]
    cg.check_before_run(0)
    ((text, tone),) = _machine_line(ctx.env)
    assert text.startswith("machine quiet") and tone == "ok"


def test_the_tally_adds_up_over_many_cases(tmp_path):
    """The headline's counts are sums over the run, each worked out by hand: four disturbed attempts (two
    measured again, one kept over the limit, one kept under steady load), two waits that came quiet (4 s and 6 s) and two that timed out (steady load),
    the mean share the disturbed attempts lost, the top process summed and sorted by seconds."""
    ctx = _ctx()
    busy_b = Reading(2.0, 2, 1.0, 0.0, (("cc1", 0.6), ("stress-ng", 0.4)))
    g = Script([BUSY, BUSY], [(True, 4.0), (True, 6.0), (False, 5.0), (False, 5.0)])
    cg = CaseGuard(ctx, InterferenceCfg(remeasures=2, quiet_wait_s=30, budget_s=300), g)  # type: ignore[arg-type]
    assert cg.decide(BUSY, 0, tmp_path) == "remeasure"
    cg.remeasure(2.0)  # waits 4 s, quiet
    assert cg.decide(busy_b, 1, tmp_path) == "remeasure"
    cg.remeasure(3.0)  # waits 6 s, quiet
    assert cg.decide(BUSY, 2, tmp_path) == "keep"  # the third attempt is over the limit: kept
    cg.before_case()  # busy: waits 5 s in vain: steady
    cg.steady = False  # seen quiet, then busy again before the next case
    cg.before_case()  # a second wait in vain
    assert cg.decide(BUSY, 0, tmp_path) == "keep"  # steady load: kept without measuring again
    t = json.loads(json.dumps(ctx.env[ENV_KEY]))
    assert (t["cases"], t["disturbed"], t["remeasured"], t["kept"], t["steady"]) == (4, 4, 2, 2, 2)
    assert t["waited_s"] == 4.0 + 6.0 + 5.0 + 5.0
    assert t["spent_s"] == 2.0 + 3.0 + 20.0
    # BUSY: 1.9 CPU-s of 2 CPUs x 2 s = 47.5%; busy_b: 1.0 of 4 = 25%; summed over the four attempts
    assert cg.tally.taken_pct_sum == 47.5 + 25.0 + 47.5 + 47.5 and cg.tally.max_taken_pct == 47.5
    assert t["top_s"] == pytest.approx({"stress-ng": 1.9 * 3 + 0.4, "cc1": 0.6})
    assert list(t["top_s"]) == ["stress-ng", "cc1"]  # the largest first
