"""Impairment profiles, their translation for netem and the engine, and the calibration arithmetic."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tunnelbench.impair.backend import engine_rule, netem_args
from tunnelbench.impair.calibrate import analyse, burst_check, wilson
from tunnelbench.impair.profiles import PROFILES, FourState, GilbertElliott, Profile


def test_library_has_the_seed_profiles():
    low, med, high = PROFILES["low"], PROFILES["medium"], PROFILES["high"]
    assert (low.delay_ms, low.jitter_ms, low.loss_pct, low.reorder_pct, low.reorder_correlation_pct) == (
        2,
        2,
        0.25,
        0.5,
        25,
    )
    assert (med.delay_ms, med.loss_pct, med.reorder_pct, med.loss_correlation_pct) == (4, 1, 2.5, 50)
    assert (high.delay_ms, high.loss_pct, high.reorder_pct, high.reorder_correlation_pct) == (6, 2.5, 5, 50)
    assert {f"loss-{x}" for x in (1, 5, 10)} | {f"delay-{x}" for x in (50, 250, 350)} <= set(PROFILES)
    assert PROFILES["xloss-100"].loss_pct == 100 and PROFILES["xdelay-5000"].delay_ms == 5000
    assert PROFILES["edge-100"].rate_mbit == 100
    assert PROFILES["baseline"].is_baseline and PROFILES["edge-100"].needs_engine
    assert not Profile(rate_mbit=100).needs_engine and not Profile(rate_mbit=100).is_baseline


def test_profile_validation():
    with pytest.raises(ValidationError, match="reorder_pct needs delay_ms"):
        Profile(reorder_pct=5)
    with pytest.raises(ValidationError, match="one loss model"):
        Profile(loss_pct=1, gemodel=GilbertElliott(p_pct=1))
    with pytest.raises(ValidationError):
        Profile(loss_pct=101)


def test_gilbert_elliott_closed_form():
    g = GilbertElliott(p_pct=1, r_pct=25)
    assert g.expected_loss() == pytest.approx(0.01 / 0.26)
    assert g.expected_burst() == pytest.approx(4.0)
    assert g.burst_sd() == pytest.approx(0.75**0.5 / 0.25)  # geometric: sqrt(1 - r) / r
    # the 4-state model with only isolated losses (p14) loses p14 / (1 + p14)
    assert Profile(loss_state=FourState(p13=0, p14=5)).expected_loss() == pytest.approx(0.05 / 1.05)


def test_netem_gemodel_args_follow_tc_netem_man_page():
    # tc-netem(8): loss gemodel p r 1-h 1-k; 1-h = loss probability in the bad state, 1-k in the good one
    args = netem_args(Profile(gemodel=GilbertElliott(p_pct=1, r_pct=25, bad_loss_pct=90, good_loss_pct=2)))
    assert args == ["loss", "gemodel", "1.0%", "25.0%", "90.0%", "2.0%"]


def test_netem_args_and_engine_rule():
    p = PROFILES["medium"]
    # markov correlation on netem: loss becomes the rate-preserving Gilbert chain
    assert (
        netem_args(p)
        == [
            "delay",
            "4.0ms",
            "loss",
            "gemodel",
            "0.5%",
            "49.5%",
            "100%",  # tc-netem(8) "1-h": loss in the bad state (a run of netem in the kernel lane found it swapped)
            "0%",  # "1-k": loss in the good state
            "reorder",
            "2.5%",  # no correlation: netem's would make 2.5% reorder ~0% (measured in the kernel lane)
        ]
    )
    netem_like = p.model_copy(update={"correlation_model": "netem"})
    assert netem_args(netem_like)[2:6] == ["loss", "random", "1.0%", "50.0%"]
    assert netem_args(netem_like)[-3:] == ["reorder", "2.5%", "50.0%"]  # netem's own semantics, as asked
    r = engine_rule("to-h2", "10.100.0.0/14", "10.100.2.0/24", p)
    assert r["delay_us"] == 4000 and r["loss"] == {"model": "random", "p": 0.01, "correlation": 0.5}
    assert r["correlation_model"] == "markov"
    assert r["reorder"] == {"p": 0.025, "correlation": 0.5}
    ge = engine_rule("x", "a", "b", Profile(gemodel=GilbertElliott(p_pct=1, r_pct=25)))["loss"]
    assert ge == {"model": "gemodel", "p": 0.01, "r": 0.25, "h": 0.0, "k": 1.0}


def test_probe_analysis_counts_loss_bursts_reorder_and_duplicates():
    # sent 0..9; 3,4 lost (one burst of 2), 7 lost; 6 overtakes 5; 8 arrives twice
    arrivals = [0, 1, 2, 6, 5, 8, 8, 9]
    recs = [(s, 1_000_000 * s, 1_000_000 * s + 2_000_000) for s in arrivals]
    pr = analyse(recs, 10)
    assert pr.received == 7 and pr.duplicates == 1
    assert pr.loss_bursts == [2, 1]
    assert pr.reordered == 1
    assert pr.delays_ms.tolist() == [2.0] * 7


def test_wilson_interval():
    lo, hi = wilson(50, 1000)
    assert lo < 0.05 < hi and hi - lo == pytest.approx(0.0273, abs=0.001)
    assert wilson(0, 100)[0] == 0.0


def test_burst_check_flags_by_the_models_standard_error_not_the_samples():
    # r = 25%: geometric run lengths, mean 4, sd sqrt(0.75) / 0.25 = 3.4641; 192 bursts: the model's s.e.
    # 0.25000, flagged beyond 3.290527 of them: +-0.8226 (by hand)
    ge = GilbertElliott(p_pct=1, r_pct=25)
    # mean 3.25 with a small sample sd (0.856: its own s.e. 0.062): the old rule (3 sample s.e., at least 5% of
    # the mean) flagged it, as it flagged kernel-lane run 2 of 2026-11-27 (3.28 against +-0.59); 0.75 from 4 is
    # inside the model's +-0.82
    c = burst_check([3] * 40 + [4] * 100 + [2] * 52, ge)  # (120 + 400 + 104) / 192 = 3.25
    assert c.measured == pytest.approx(3.25) and c.ok and "±0.82" in c.detail, c
    low = [1] + [2] * 95 + [4] * 96  # (1 + 190 + 384) / 192 = 2.9948: 1.005 below 4, beyond 0.8226
    c = burst_check(low, ge)
    assert c.measured == pytest.approx(2.9948, abs=1e-4) and c.ok is False, c
    # no Gilbert-Elliott model in scope: the mean is reported, nothing is judged
    c = burst_check([1, 2, 3], None)
    assert c.configured is None and c.ok is None and c.measured == pytest.approx(2.0)
