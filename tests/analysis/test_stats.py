"""The statistical building blocks against known answers."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest
from scipy import stats as sst

from tunnelbench.analysis.stats import (
    bootstrap_ci,
    cliffs_delta,
    describe,
    holm,
    mann_whitney,
    min_attainable_p,
    pairwise,
    ratio_ci,
    tiers,
)


def test_mann_whitney_matches_scipy_and_the_exact_distribution():
    x = [1.1, 2.3, 2.9, 4.0, 5.2]
    y = [6.0, 7.5, 8.1, 9.9, 10.2]
    u, p = mann_whitney(x, y)
    assert u == 0.0
    assert p == pytest.approx(2 / math.comb(10, 5))  # complete separation, exact two-sided: 2/252
    # fixed samples with overlap: same U and p as scipy's two-sided test
    a = [19.2, 21.5, 22.0, 23.8, 25.1, 26.4, 18.7]
    b = [20.1, 24.9, 27.3, 28.8, 29.5, 30.2]
    ref = sst.mannwhitneyu(a, b, alternative="two-sided")
    assert mann_whitney(a, b) == pytest.approx((ref.statistic, ref.pvalue))
    assert 0.01 < mann_whitney(a, b)[1] < 0.1  # a known, moderate difference
    # identical constants: no evidence of a difference
    assert mann_whitney([5, 5, 5], [5, 5, 5])[1] == 1.0


def _exact_mw_p(x: list[float], y: list[float]) -> tuple[float, float]:
    """(U of x, two-sided exact p) by enumerating every way to split the pooled, tie-free samples: the
    null distribution of U written out, no library involved."""
    pooled = sorted(x + y)
    m, n = len(x), len(y)
    us = []
    for xs in combinations(range(m + n), m):
        chosen = set(xs)
        xv, yv = [pooled[i] for i in xs], [pooled[i] for i in range(m + n) if i not in chosen]
        us.append(sum(a > b for a in xv for b in yv))
    u = sum(a > b for a in x for b in y)
    lo, hi = sum(v <= u for v in us) / len(us), sum(v >= u for v in us) / len(us)
    return float(u), min(1.0, 2 * min(lo, hi))


def test_mann_whitney_small_samples_give_the_exact_p():
    # by hand: 3 vs 3, U = 1 (only 4 > 3); of the C(6,3) = 20 splits, U <= 1 in two ({0} and {1}): p = 2 * 2/20
    assert mann_whitney([1.0, 2.0, 4.0], [3.0, 5.0, 6.0]) == pytest.approx((1.0, 0.2))
    # U = 4 of 9 in 3 vs 3 is the middle of the distribution: p = 1
    assert mann_whitney([1.0, 4.0, 6.0], [2.0, 3.0, 7.0]) == pytest.approx(_exact_mw_p([1, 4, 6], [2, 3, 7]))
    for x, y in [([3.1, 4.7, 1.2, 5.5], [6.3, 2.8, 7.9, 8.4, 9.0]),
                 ([10.2, 11.5, 9.8, 12.7, 10.9, 11.1], [12.0, 13.4, 11.9, 12.2, 14.1])]:  # fmt: skip
        assert mann_whitney(x, y) == pytest.approx(_exact_mw_p(x, y)), (x, y)
    # by hand for the first pair: U = 3 (each of 3.1, 4.7, 5.5 beats 2.8); U <= 3 in 1 + 1 + 2 + 3 = 7 of the
    # C(9,4) = 126 splits (partitions of 0..3 into at most 4 parts of at most 5): p = 2 * 7/126
    assert mann_whitney([3.1, 4.7, 1.2, 5.5], [6.3, 2.8, 7.9, 8.4, 9.0]) == pytest.approx((3.0, 2 * 7 / 126))


def test_min_attainable_p():
    assert min_attainable_p(3, 3) == pytest.approx(0.1)
    assert min_attainable_p(5, 5) == pytest.approx(2 / 252)


def test_holm_known_answer():
    # Holm (1979) step-down: sorted p 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1, made monotone
    p = [0.01, 0.04, 0.03, 0.005]
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # the textbook example (e.g. Wikipedia's "Holm-Bonferroni method"): only H1 is rejected at 0.05
    p2 = [0.01, 0.04, 0.03]
    adj = holm(p2)
    assert adj == pytest.approx([0.03, 0.06, 0.06])
    assert [a < 0.05 for a in adj] == [True, False, False]
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert math.isnan(holm([float("nan"), 0.01])[0]) and holm([float("nan"), 0.01])[1] == pytest.approx(0.01)


def test_holm_agrees_with_statsmodels():
    mt = pytest.importorskip("statsmodels.stats.multitest", reason="statsmodels not installed")
    rng = np.random.default_rng(3)
    p = rng.uniform(0, 0.1, 12)
    assert holm(p) == pytest.approx(mt.multipletests(p, method="holm")[1].tolist())


def test_cliffs_delta_is_rank_biserial():
    rng = np.random.default_rng(7)
    x, y = rng.normal(0, 1, 15), rng.normal(0.5, 1, 11)
    u = sst.mannwhitneyu(x, y).statistic
    assert cliffs_delta(x, y) == pytest.approx(2 * u / (15 * 11) - 1)
    assert cliffs_delta([3, 4], [1, 2]) == 1.0 and cliffs_delta([1, 2], [3, 4]) == -1.0


def test_describe():
    d = describe([1, 2, 3, 4, 100])
    assert (d.n, d.median, d.mean, d.min, d.max) == (5, 3.0, 22.0, 1.0, 100.0)
    assert d.sd == pytest.approx(np.std([1, 2, 3, 4, 100], ddof=1))
    assert d.cv == pytest.approx(d.sd / 22.0)
    assert d.pct[25] == 2.0 and d.pct[75] == 4.0
    assert d.ci_lo <= d.median <= d.ci_hi
    one = describe([7.0])
    assert (one.ci_lo, one.ci_hi, one.sd) == (7.0, 7.0, 0.0)


# 12 draws of a lognormal(0, 1) (numpy default_rng(0), rounded): skewed, so BCa and the plain percentile
# interval differ by about a tenth of the width at the upper end
SKEWED = [1.134, 0.876, 1.897, 1.111, 0.585, 1.436, 3.684, 2.578, 0.495, 0.282, 0.536, 1.042]


def test_describe_mean_ci_matches_scipy_bca():
    """The 95% CI of the mean is what adaptive repetitions stop on (runner: half-width <= target_ci_pct of the
    mean): it must be the BCa bootstrap CI of the mean, checked against scipy's own implementation run with
    many more resamples (Monte Carlo error of ours, 4000 resamples: about 1% of the width here)."""
    d = describe(SKEWED)
    assert d.mean == pytest.approx(sum(SKEWED) / 12)
    ref = sst.bootstrap((np.array(SKEWED),), np.mean, method="BCa", n_resamples=50_000, random_state=1)
    lo, hi = ref.confidence_interval
    width = hi - lo
    assert d.mean_ci_lo == pytest.approx(lo, abs=0.04 * width)
    assert d.mean_ci_hi == pytest.approx(hi, abs=0.04 * width)
    ref_med = sst.bootstrap((np.array(SKEWED),), np.median, method="BCa", n_resamples=50_000, random_state=1)
    assert (d.ci_lo, d.ci_hi) == pytest.approx(tuple(ref_med.confidence_interval), abs=0.04 * width)
    # a 90% interval is visibly narrower: the level is honoured
    d90 = describe(SKEWED, level=0.90)
    assert d90.mean_ci_hi - d90.mean_ci_lo < 0.9 * (d.mean_ci_hi - d.mean_ci_lo)
    # reproducible from the seed (the same report every time), and the seed is really what drives the draws
    assert (d.mean_ci_lo, d.mean_ci_hi) == bootstrap_ci(SKEWED, np.mean)
    other = describe(SKEWED, seed=7)
    assert (other.mean_ci_lo, other.mean_ci_hi) != (d.mean_ci_lo, d.mean_ci_hi)
    assert other.mean_ci_hi == pytest.approx(hi, abs=0.04 * width)


@pytest.mark.parametrize("dist", ["normal", "exponential"])
def test_bootstrap_ci_covers_the_true_mean_at_about_the_nominal_rate(dist):
    rng = np.random.default_rng(12345)
    trials, n, hits = 200, 30, 0
    for i in range(trials):
        x = rng.normal(10.0, 2.0, n) if dist == "normal" else rng.exponential(2.0, n)
        true = 10.0 if dist == "normal" else 2.0
        lo, hi = bootstrap_ci(x, np.mean, n_resamples=2000, seed=i)
        hits += lo <= true <= hi
    coverage = hits / trials
    assert 0.88 <= coverage <= 0.99, coverage


def test_bootstrap_ci_can_fail_when_wrong():
    # the CI of the mean of one population does not cover a clearly different value
    x = np.random.default_rng(1).normal(10, 1, 40)
    lo, hi = bootstrap_ci(x, np.mean)
    assert not lo <= 11 <= hi and lo <= 10 <= hi


def test_ratio_ci():
    rng = np.random.default_rng(5)
    a, b = rng.normal(80, 2, 20), rng.normal(100, 2, 20)
    r, lo, hi = ratio_ci(a, b)
    assert lo < 0.8 < hi and hi < 0.85 and r == pytest.approx(np.median(a) / np.median(b))
    assert all(math.isnan(v) for v in ratio_ci([1, 2], [0, 0]))


def _synthetic(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "a": rng.normal(100, 2, n),
        "b": rng.normal(100.5, 2, n),
        "c": rng.normal(80, 2, n),
        "d": rng.normal(60, 2, n),
    }


def test_tiers_separate_only_significant_differences():
    g = _synthetic(20)
    t = tiers(g, "higher")
    assert t.order[:2] in (["a", "b"], ["b", "a"]) and t.order[2:] == ["c", "d"]
    assert t.groups() in ([["a", "b"], ["c"], ["d"]], [["b", "a"], ["c"], ["d"]])
    sig = {frozenset((p.a, p.b)) for p in t.pairs if p.significant}
    for x in g:
        for y in g:
            if t.tier[x] != t.tier[y]:
                assert frozenset((x, y)) in sig  # different tiers => significant pair
    # lower is better: the same cuts, reversed
    low = tiers(g, "lower")
    assert (
        low.order[0] == "d"
        and low.tier["d"] == 1
        and low.tier["c"] == 2
        and low.tier["a"] == low.tier["b"] == 3
    )


def test_tiers_with_too_few_repetitions_are_one_tier():
    t = tiers(_synthetic(3), "higher")
    assert set(t.tier.values()) == {1}  # 3 vs 3: min p = 0.1 > 0.05, nothing separates
    assert tiers(_synthetic(20), "none").tier == dict.fromkeys("abcd", 1)


def test_pairwise_holm_family():
    g = _synthetic(10)
    pairs = pairwise(g)
    assert len(pairs) == 6
    ps = [p.p for p in pairs]
    assert [p.p_holm for p in pairs] == pytest.approx(holm(ps))
    ab = next(p for p in pairs if {p.a, p.b} == {"a", "b"})
    assert not ab.significant and ab.rel_median_diff == pytest.approx(
        (np.median(g[ab.a]) - np.median(g[ab.b])) / np.median(g[ab.b])
    )
