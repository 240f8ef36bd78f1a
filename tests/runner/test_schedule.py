"""The run's plan (runner/schedule.py) without a lab: which conditions and how many cases, what a resumed run
still has to measure, and adaptive repetitions' precision rule, on a hand-made store. The precision
reference: scipy's BCa interval of the mean (drawn as the run draws: its seed and resample count)."""

from __future__ import annotations

import tomllib
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats as sst
from synthetic_runs import hand_store

from tunnelbench.analysis.stats import N_RESAMPLES, SEED
from tunnelbench.catalog import WORKLOADS
from tunnelbench.core.results import Outcome, Sample
from tunnelbench.runner.resume import PriorPlan, ResumeError
from tunnelbench.runner.schedule import Schedule, round_orders
from tunnelbench.scenario import parse_scenario

SCENARIO = """
name = "plan"
vpns = ["internal", "wireguard-go", "vxlan"]
profiles = ["baseline", "low"]
tunings = ["default", "r10"]
[run]
repetitions = 3
max_repetitions = 6
target_ci_pct = 5
[hosts.tunings.r10]
"net.ipv4.tcp_reordering" = 10
[[workloads]]
name = "ping"
[[workloads]]
name = "connect"
"""


def schedule(store=None, text: str = SCENARIO) -> Schedule:
    sc = parse_scenario(tomllib.loads(text), "t")
    ping, connect = (
        WORKLOADS["ping"](WORKLOADS["ping"].Params()),
        WORKLOADS["connect"](WORKLOADS["connect"].Params()),
    )
    return Schedule(SimpleNamespace(sc=sc, run_id="r1", store=store), [ping, connect])  # type: ignore[arg-type]


def test_conditions_and_counts():
    s = schedule()
    assert s.conditions() == [
        ("baseline", "default", "baseline"),
        ("baseline", "r10", "baseline+r10"),
        ("low", "default", "low"),
        ("low", "r10", "low+r10"),
    ]
    assert (s.per_round(), s.total(), s.max_reps, s.adaptive) == (4 * 2, 4 * 2 * 3 * 3, 6, True)
    fixed = schedule(text=SCENARIO.replace("max_repetitions = 6\n", ""))
    assert (fixed.max_reps, fixed.adaptive) == (3, False)
    # this round's cases and every later fixed round's (interleaved); block order counts only this session's
    assert s.remaining_cases("vxlan", [2]) == 8 * (1 + 1)
    block = schedule(text=SCENARIO.replace("[run]\n", '[run]\norder = "block"\n'))
    assert block.remaining_cases("vxlan", [1, 2, 3]) == 8 * 3


def test_a_resumed_run_brings_up_only_a_vpn_with_something_left():
    s = schedule()
    assert s.session_needed("vxlan", [1], None)  # nothing done yet
    s.done = {("vxlan", label, wl, 1) for _, _, label in s.conditions() for wl in ("ping", "connect")}
    assert not s.session_needed("vxlan", [1], None)
    assert s.session_needed("vxlan", [1, 2], None) and s.session_needed("internal", [1], None)
    s.done.discard(("vxlan", "low+r10", "connect", 1))
    assert s.session_needed("vxlan", [1], None)
    # a session that measures only some groups needs only those
    assert not s.session_needed("vxlan", [1], {("baseline", "ping"), ("low+r10", "ping")})
    assert s.session_needed("vxlan", [1], {("low+r10", "connect")})


def test_the_seed_must_give_back_the_stored_round_orders():
    s = schedule()
    orders = round_orders(s.sc.vpns, 3, 7)
    s.check_prior(PriorPlan(seed=7, orders=orders))  # the same plan: nothing to say
    s.check_prior(PriorPlan(seed=None, orders=orders))
    other = round_orders(s.sc.vpns, 3, 8)
    assert other != orders
    with pytest.raises(ResumeError, match=r"run r1: seed 7 no longer gives the stored round orders"):
        s.check_prior(PriorPlan(seed=7, orders=other))
    block = schedule(text=SCENARIO.replace("[run]\n", '[run]\norder = "block"\n'))
    block.check_prior(PriorPlan(seed=7, orders=other))  # block order keeps no round orders to check


def half_width_pct(values: list[float]) -> float:
    ci = sst.bootstrap(
        (np.asarray(values),), np.mean, method="BCa", n_resamples=N_RESAMPLES, rng=np.random.default_rng(SEED)
    ).confidence_interval
    return 100 * (ci.high - ci.low) / 2 / abs(np.mean(values))


def test_adaptive_repetitions_go_on_until_the_mean_is_precise(tmp_path):
    """The first headline metric's 95% CI half-width within target_ci_pct (5%) of the mean, over the
    repetitions before the one being planned: a tight group is done, a loose one pending."""
    tight = [10.0, 10.1, 9.9, 10.05]
    loose = [10.0, 14.0, 7.0, 12.0]
    assert half_width_pct(tight) <= 5 < half_width_pct(loose)
    with hand_store(tmp_path, ("internal", "wireguard-go", "vxlan")) as (st, run_dir):
        for vpn, values in (("internal", tight), ("wireguard-go", loose)):
            for rep, x in enumerate(values, 1):
                adir = run_dir / vpn / f"r{rep}"
                adir.mkdir(parents=True)
                cid = st.start_case("r1", vpn, "baseline", "ping", "ping", {}, rep, 0, "h1", "h2", adir)
                st.finish_case(cid, "ok", Outcome(samples=[Sample("rtt_p50_ms", x, "ms")]))
    from tunnelbench.store import Store

    store = Store.open_run_dir(run_dir)
    try:
        s = schedule(store)
        ping = s.workloads[0]
        assert s.precise("internal", "baseline", ping, 5) and not s.precise(
            "wireguard-go", "baseline", ping, 5
        )
        assert not s.precise("internal", "baseline", ping, 2)  # one value before repetition 2: nothing known
        assert s.precise("internal", "baseline", ping, 4) is bool(half_width_pct(tight[:3]) <= 5)
        pending = s.adaptive_pending(["internal", "wireguard-go", "vxlan"], {"vxlan"}, 5)
        # internal's ping is precise; everything else (no values: not precise) is pending; vxlan is dead
        everything = {(label, wl) for _, _, label in s.conditions() for wl in ("ping", "connect")}
        assert pending == {"internal": everything - {("baseline", "ping")}, "wireguard-go": everything}
    finally:
        store.close()


SMALL = """
name = "small"
vpns = ["internal", "wireguard-go"]
[run]
order = "block"
repetitions = 3
max_repetitions = 5
target_ci_pct = 5
[[workloads]]
name = "ping"
"""


def test_a_resumed_block_run_brings_up_a_vpn_for_its_adaptive_repetitions_only_while_imprecise(tmp_path):
    with hand_store(tmp_path, ("internal", "wireguard-go")) as (st, run_dir):
        for vpn, values in (("internal", [10.0, 10.1, 9.9]), ("wireguard-go", [10.0, 14.0, 7.0])):
            for rep, x in enumerate(values, 1):
                adir = run_dir / vpn / f"r{rep}"
                adir.mkdir(parents=True)
                cid = st.start_case("r1", vpn, "baseline", "ping", "ping", {}, rep, 0, "h1", "h2", adir)
                st.finish_case(cid, "ok", Outcome(samples=[Sample("rtt_p50_ms", x, "ms")]))
    assert half_width_pct([10.0, 10.1, 9.9]) <= 5 < half_width_pct([10.0, 14.0, 7.0])
    from tunnelbench.store import Store

    store = Store.open_run_dir(run_dir)
    try:
        s = schedule(store, SMALL)
        s.workloads = s.workloads[:1]  # ping only
        s.done = {(v, "baseline", "ping", r) for v in ("internal", "wireguard-go") for r in (1, 2, 3)}
        assert not s.session_needed("internal", [1, 2, 3], None)  # the fixed repetitions are done
        assert not s.session_needed("internal", [1, 2, 3], None, adaptive=True)  # and its mean is precise
        assert s.session_needed("wireguard-go", [1, 2, 3], None, adaptive=True)  # repetition 4 is still owed
        s.done |= {("wireguard-go", "baseline", "ping", r) for r in (4, 5)}
        assert not s.session_needed("wireguard-go", [1, 2, 3], None, adaptive=True)  # up to max_repetitions
    finally:
        store.close()
