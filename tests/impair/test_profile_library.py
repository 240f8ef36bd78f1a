"""The built-in profile library (impair/profiles.py PROFILES) against the sources it cites, written out here by
hand: the ten-VPN thesis's Low/Medium/High, an edge uplink, a Gilbert-Elliott burst model, Kjorveziroski et
al.'s loss and delay sweeps, Goethals et al.'s extreme sweeps; each profile's one-line summary, which the
report and the calibration print; and the long-run loss of each loss model worked out by hand."""

from __future__ import annotations

import pytest

from tunnelbench.impair.profiles import PROFILES, FourState, GilbertElliott, Profile

FIELDS = (
    "delay_ms",
    "jitter_ms",
    "loss_pct",
    "loss_correlation_pct",
    "reorder_pct",
    "reorder_correlation_pct",
    "rate_mbit",
)
LIBRARY = {
    "baseline": (0, 0, 0, 0, 0, 0, None),
    "low": (2, 2, 0.25, 25, 0.5, 25, None),
    "medium": (4, 0, 1, 50, 2.5, 50, None),
    "high": (6, 0, 2.5, 50, 5, 50, None),
    "edge-100": (20, 0, 0, 0, 0, 0, 100),
    "gemodel-1": (0, 0, 0, 0, 0, 0, None),
    **{f"loss-{x}": (0, 0, x, 0, 0, 0, None) for x in (1, 5, 10)},
    **{f"delay-{d}": (d, 0, 0, 0, 0, 0, None) for d in (50, 250, 350)},
    **{f"xloss-{x}": (0, 0, x, 0, 0, 0, None) for x in range(10, 101, 10)},
    **{f"xdelay-{d}": (d, 0, 0, 0, 0, 0, None) for d in range(1000, 5001, 1000)},
}
SUMMARIES = {
    "baseline": "no impairment",
    "low": "delay 2 ms ± 2 ms uniform, loss 0.25% 25% corr, reorder 0.5% 25% corr",
    "medium": "delay 4 ms, loss 1% 50% corr, reorder 2.5% 50% corr",
    "high": "delay 6 ms, loss 2.5% 50% corr, reorder 5% 50% corr",
    "edge-100": "delay 20 ms, rate 100 Mbit/s",
    "gemodel-1": "loss gemodel p 0.5% r 25% (≈2%)",  # 0.5 / 25.5 = 1.96%
    "loss-5": "loss 5%",
    "xdelay-3000": "delay 3000 ms",
}


def test_the_library_holds_the_cited_profiles_and_nothing_else():
    assert set(PROFILES) == set(LIBRARY)
    for name, want in LIBRARY.items():
        p = PROFILES[name]
        assert p.name == name and tuple(getattr(p, f) for f in FIELDS) == want, (name, p)
    g = PROFILES["gemodel-1"].gemodel
    assert g is not None and (g.p_pct, g.r_pct, g.bad_loss_pct, g.good_loss_pct) == (0.5, 25, 100, 0)
    assert PROFILES["low"].distribution == "uniform" and all(p.description for p in PROFILES.values())
    assert [n for n, p in PROFILES.items() if p.is_baseline] == ["baseline"]
    assert (
        not PROFILES["edge-100"].per_wire
        and PROFILES["medium"].per_wire
        and PROFILES["edge-100"].needs_engine
    )


def test_each_summary_in_words():
    for name, want in SUMMARIES.items():
        assert PROFILES[name].summary() == want, name
    p = Profile(
        delay_ms=5, jitter_ms=1.5, distribution="normal", delay_correlation_pct=30, loss_state=FourState(p13=1, p31=50),
        duplicate_pct=1, corrupt_pct=0.1, hosts=["h1", "h2"],
    )  # fmt: skip
    assert p.summary() == (
        "delay 5 ms ± 1.5 ms normal 30% corr, loss 4-state (≈2%), duplicate 1%, corrupt 0.1% [hosts h1, h2]"
    )
    assert Profile(rate_mbit=20, pairs=[("h1", "h3")]).summary() == "rate 20 Mbit/s [pairs [('h1', 'h3')]]"


def test_the_long_run_loss_of_each_model_by_hand():
    # Gilbert-Elliott: pi_bad = p / (p + r); loss = pi_bad (1 - h) + (1 - pi_bad)(1 - k)
    assert GilbertElliott(p_pct=1, r_pct=25).expected_loss() == pytest.approx(1 / 26)
    mixed = GilbertElliott(p_pct=10, r_pct=30, bad_loss_pct=50, good_loss_pct=2)
    assert mixed.expected_loss() == pytest.approx(0.25 * 0.5 + 0.75 * 0.02)
    assert GilbertElliott(p_pct=0, r_pct=0, good_loss_pct=3).expected_loss() == pytest.approx(0.03)
    assert (
        GilbertElliott(p_pct=1, r_pct=25, bad_loss_pct=90).expected_burst() is None
    )  # bursts only when h = 0
    assert Profile(gemodel=GilbertElliott(p_pct=1, r_pct=20)).expected_loss() == pytest.approx(1 / 21)
    # netem's 4 states (1 good, 2 burst rx, 3 burst loss, 4 isolated loss): with p32 = p23 = 0 and p14 = 0 the
    # chain is 1 <-> 3: pi3 = p13 / (p13 + p31) = 1 / 51
    assert Profile(loss_state=FourState(p13=1, p31=50)).expected_loss() == pytest.approx(1 / 51)
    # isolated losses too: from 1, p14 to 4 (lost) and straight back: pi4 = pi1 p14, pi3 = pi1 p13 / p31
    four = Profile(loss_state=FourState(p13=2, p31=40, p14=1))
    pi1 = 1 / (1 + 0.02 / 0.40 + 0.01)
    assert four.expected_loss() == pytest.approx(pi1 * (0.02 / 0.40 + 0.01))
    assert Profile(loss_state=FourState(p13=5, p31=0, p32=0)).expected_loss() == 1.0  # never leaves loss
    assert Profile(loss_pct=7).expected_loss() == pytest.approx(0.07) and Profile().expected_loss() == 0
