"""calibrate()'s loss, loss-burst and reorder checks on hand-made probe sequences (no lab: the probe and ping
are replaced by the sequences), against intervals worked out here: statsmodels' Wilson interval, stretched
by the variance factor of a correlated 0/1 series worked out by hand ((1 + lambda) / (1 - lambda), lambda
the lag-1 correlation: 1 - p - r for a Gilbert-Elliott chain, the profile's correlation for correlated
reorder), and scipy's negative binomial for the mean of geometric burst lengths. Each check is tried on a
sequence it must pass only because of the correlation, and on one it must flag."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats as sst
from statsmodels.stats.proportion import proportion_confint

from tunnelbench.impair import calibrate as cal_mod
from tunnelbench.impair.calibrate import Base, calibrate
from tunnelbench.impair.profiles import GilbertElliott, Profile

N = 20_000  # probes sent
ONE_WAY_MS, RTT_MS = 0.05, 0.1  # the raw path's (Base)
GE = GilbertElliott(p_pct=1, r_pct=25)  # bad state 1% of steps in, 25% out, everything lost in it
PI_BAD = 0.01 / (0.01 + 0.25)  # the chain's stationary loss: 3.846%
LAMBDA_GE = 1 - 0.01 - 0.25  # its second eigenvalue: the loss series' lag-1 correlation, 0.74


def records(sent: int, lost: set[int], swaps: int = 0, delay_ms: float = 0.0) -> list[tuple[int, int, int]]:
    """The probe's (seq, send ns, receive ns) in arrival order: every datagram but `lost`, each `delay_ms` late;
    the first `swaps` pairs (20k, 20k + 1) arrive the other way round (one datagram overtook one)."""
    order = [s for s in range(sent) if s not in lost]
    for k in range(swaps):
        i = order.index(20 * k)
        order[i], order[i + 1] = order[i + 1], order[i]
    return [(s, s * 500_000, s * 500_000 + int((delay_ms + ONE_WAY_MS) * 1e6)) for s in order]


def run(monkeypatch, profile: Profile, recs: list[tuple[int, int, int]], sent: int = N) -> dict[str, object]:
    monkeypatch.setattr(cal_mod, "run_probe", lambda *a, **k: cal_mod.analyse(recs, sent))
    monkeypatch.setattr(cal_mod, "ping_rtt", lambda *a, **k: np.full(100, RTT_MS + 2 * profile.delay_ms))
    h1, h2 = SimpleNamespace(name="h1"), SimpleNamespace(name="h2")
    cal = calibrate(
        SimpleNamespace(name="native"), profile, h1, h2, None, Base(ONE_WAY_MS, RTT_MS), count=sent
    )  # type: ignore[arg-type]
    return {c.quantity: c for c in cal.checks}


def bursts_of(lengths: list[int], every: int, sent: int = N) -> tuple[set[int], list[int]]:
    """Loss bursts starting every `every` probes, their lengths `lengths` in turn: the lost probes and the
    bursts' lengths."""
    starts = range(10, sent - max(lengths), every)
    runs = [lengths[i % len(lengths)] for i in range(len(starts))]
    return {s for start, n in zip(starts, runs, strict=True) for s in range(start, start + n)}, runs


def stretched(lost: int, n: int, alpha: float, lam: float) -> tuple[float, float]:
    """statsmodels' Wilson interval of lost / n, each side stretched by sqrt((1 + lam) / (1 - lam))."""
    lo, hi = proportion_confint(lost, n, alpha=alpha, method="wilson")
    f, mid = math.sqrt((1 + lam) / (1 - lam)), lost / n
    return max(0.0, mid - (mid - lo) * f), min(1.0, mid + (hi - mid) * f)


@pytest.mark.parametrize(
    ("length", "every", "ok"),
    [
        (4, 100, True),  # 4.0%: inside even the plain interval
        (4, 80, True),  # 5.0%: outside the plain 99.9% interval (+-0.51%), inside the stretched one (+-1.31%)
        (4, 50, False),  # 8.0%: outside both
    ],
)
def test_gilbert_elliott_loss_interval_is_wilsons_stretched_by_the_chains_correlation(
    monkeypatch, length, every, ok
):
    lost, _ = bursts_of([length], every)
    c = run(monkeypatch, Profile(name="ge", gemodel=GE), records(N, lost))["loss"]
    lo95, hi95 = stretched(len(lost), N, 0.05, LAMBDA_GE)
    assert (c.configured, c.measured) == pytest.approx((100 * PI_BAD, 100 * len(lost) / N))
    assert (c.ci_low, c.ci_high) == pytest.approx((100 * lo95, 100 * hi95), rel=1e-6), c
    lo_f, hi_f = stretched(len(lost), N, 0.001, LAMBDA_GE)  # the flag: 99.9% (3.29 s.e.)
    assert bool(lo_f <= PI_BAD <= hi_f) is ok
    plain_lo, plain_hi = proportion_confint(len(lost), N, alpha=0.001, method="wilson")
    if every == 80:  # the case the correlation decides
        assert not bool(plain_lo <= PI_BAD <= plain_hi)
    assert c.ok is ok, c


@pytest.mark.parametrize(("lengths", "ok"), [([4], True), ([3, 4], True), ([2], False), ([6], False)])
def test_loss_burst_length_against_the_geometric_model(monkeypatch, lengths, ok):
    """Bursts from the model are geometric (success r = 25%: mean 4); the mean of k of them is (k + F) / k with
    F negative binomial (k, r) (scipy): a mean inside its 99.9% interval passes, one far outside fails."""
    lost, runs = bursts_of(lengths, 100)
    c = run(monkeypatch, Profile(name="ge", gemodel=GE), records(N, lost))["mean loss burst"]
    k, mean = len(runs), sum(runs) / len(runs)
    assert c.measured == pytest.approx(mean) and c.configured == pytest.approx(4.0)
    assert c.detail.startswith(f"{k} bursts, longest {max(lengths)}"), c.detail
    lo, hi = (k + sst.nbinom.ppf([0.0005, 0.9995], k, 0.25)) / k
    assert bool(lo <= mean <= hi) is ok, (lo, hi)
    assert c.ok is ok, c


@pytest.mark.parametrize(("swaps", "ok"), [(100, True), (140, True), (200, False)])
def test_correlated_reorder_tolerance_is_widened_by_the_correlation(monkeypatch, swaps, ok):
    """2.5% reorder at 50% correlation: the share of 4000 datagrams within 3.29 s.e. of a binomial share, times
    sqrt((1 + 0.5) / (1 - 0.5)) (hand: 3.29 x 0.2469% x 1.732 = +-1.41%), at least 0.2%; 3.5% passes only
    because of the correlation (plain: +-0.81%)."""
    p = Profile(name="rc", delay_ms=4, reorder_pct=2.5, reorder_correlation_pct=50)
    n = 4000  # as the lab test probes it
    c = run(monkeypatch, p, records(n, set(), swaps, delay_ms=4), sent=n)["reorder share"]
    share = swaps / n
    tol = 3.290527 * math.sqrt(0.025 * 0.975 / n) * math.sqrt(1.5 / 0.5)
    assert tol == pytest.approx(0.01407, abs=1e-5)
    assert c.measured == pytest.approx(100 * share) and c.configured == pytest.approx(2.5)
    assert f"±{100 * tol:.2f}%" in c.detail, c.detail
    assert bool(abs(share - 0.025) <= tol) is ok
    assert c.ok is ok, c


def test_delay_duplicate_rtt_and_rate_checks_with_their_tolerances(monkeypatch):
    """Delays alternating 8 and 12 ms over the base (mean 10, sd 2: a 10 ms ± 2 ms normal profile), every 100th
    datagram twice (1%: tolerance 3.29 x sqrt(0.01 x 0.99 / 20000) = 0.23%), ping at 2 x 10 ms + the base."""
    p = Profile(name="d", delay_ms=10, jitter_ms=2, distribution="normal", duplicate_pct=1)
    recs = [(s, s * 500_000, s * 500_000 + int((ONE_WAY_MS + (8 if s % 2 else 12)) * 1e6)) for s in range(N)]
    recs += [r for r in recs if r[0] % 100 == 0]  # the copies arrive after the originals
    got = run(monkeypatch, p, recs)
    mean, sd, dup, rtt = (
        got["one-way delay mean"],
        got["one-way delay sd"],
        got["duplicate share"],
        got["ping RTT median"],
    )
    assert (mean.configured, mean.measured, mean.ok) == (10.0, pytest.approx(10.0), True)
    assert mean.detail == "p50 10.00, p95 12.00, p99 12.00; tolerance ±0.25"
    assert (sd.configured, sd.measured, sd.ok, sd.detail) == (
        2.0,
        pytest.approx(2 * math.sqrt(N / (N - 1))),
        True,
        "tolerance ±15%",
    )
    assert (dup.configured, dup.measured, dup.ok) == (
        1.0,
        pytest.approx(1.0),
        True,
    ) and dup.detail == "tolerance ±0.23%"
    # jitter: the median RTT is reported, not judged
    assert (rtt.configured, rtt.measured, rtt.ok) == (pytest.approx(20.1), pytest.approx(20.1), None)
    assert rtt.detail == "100 replies; base RTT 0.100 ms; tolerance ±0.40"
    # uniform jitter's sd is jitter / sqrt(3); 20% off is out of its 15%
    u = run(monkeypatch, Profile(name="u", delay_ms=10, jitter_ms=2 * math.sqrt(3)), recs[:N])[
        "one-way delay sd"
    ]
    assert u.configured == pytest.approx(2.0) and u.ok is True
    far = [(s, a, b + (int(0.5e6) if s % 2 else -int(0.5e6))) for s, a, b in recs[:N]]  # sd 2.5
    assert (
        run(monkeypatch, Profile(name="n", delay_ms=10, jitter_ms=2, distribution="normal"), far)[
            "one-way delay sd"
        ].ok
        is False
    )


def test_a_profile_out_of_scope_expects_nothing_and_a_rate_is_held_to_90_to_100_percent(monkeypatch):
    # the profile applies to h3 only: between h1 and h2 nothing is expected (0 delay, 0 loss)
    p = Profile(name="h3", delay_ms=10, loss_pct=5, hosts=["h3"])
    got = run(monkeypatch, p, records(N, set()))
    assert (got["one-way delay mean"].configured, got["loss"].configured, got["loss"].ok) == (0.0, 0.0, True)
    assert got["ping RTT median"].configured == pytest.approx(RTT_MS)
    for rate, ok in ((95.0, True), (100.0, True), (89.0, False), (101.0, False)):
        monkeypatch.setattr(cal_mod, "tcp_rate", lambda *a, r=rate, **k: r)
        checks = run(monkeypatch, Profile(name="r", rate_mbit=100), [])
        assert list(checks) == ["TCP goodput at the rate limit"]  # a rate alone needs no probe
        c = checks["TCP goodput at the rate limit"]
        assert (c.configured, c.measured, c.ok, c.detail) == (100, rate, ok, "expected 90-100% of the rate")
