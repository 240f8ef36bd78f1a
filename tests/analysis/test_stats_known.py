"""The statistical building blocks against answers from outside the product (issue 18): hand counts,
textbook values, scipy and statsmodels computed independently here, and edge cases."""

from __future__ import annotations

import math
import warnings
from itertools import combinations

import numpy as np
import pytest
from scipy import stats as sst

from tunnelbench.analysis.stats import (
    ALPHA,
    N_RESAMPLES,
    PERCENTILES,
    SEED,
    Describe,
    Pair,
    Tiering,
    bootstrap_ci,
    cliffs_delta,
    cliffs_magnitude,
    describe,
    holm,
    mann_whitney,
    min_attainable_p,
    pairwise,
    ratio_ci,
    rel_diff,
    tiers,
)

SKEWED = [3.1, 4.7, 2.2, 8.9, 5.5, 6.0, 4.1, 7.3, 19.5, 4.4, 5.1]


def scipy_ci(values, stat, method="BCa", level=0.95, n=N_RESAMPLES, seed=SEED) -> tuple[float, float]:
    """scipy.stats.bootstrap on the same random stream (its resampling draws the same indices)."""
    r = sst.bootstrap(
        (np.asarray(values, float),),
        stat,
        n_resamples=n,
        rng=np.random.default_rng(seed),
        method=method,
        confidence_level=level,
        vectorized=True,
    )
    return float(r.confidence_interval.low), float(r.confidence_interval.high)


# -- bootstrap_ci ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("stat", [np.mean, np.median])
@pytest.mark.parametrize(
    "values",
    [SKEWED, [10.0, 11.5, 9.8, 10.2, 30.0], [1.0, 2.0, 4.0], [0.5, 0.6, 0.55, 0.9, 0.52, 0.58, 0.61, 0.57]],
)
def test_bootstrap_bca_equals_scipy(values, stat):
    assert bootstrap_ci(values, stat) == pytest.approx(scipy_ci(values, stat), rel=1e-12)


def test_bootstrap_bca_other_level_resamples_and_seed_equal_scipy():
    got = bootstrap_ci(SKEWED, np.mean, level=0.8, n_resamples=999, seed=7)
    assert got == pytest.approx(scipy_ci(SKEWED, np.mean, level=0.8, n=999, seed=7), rel=1e-12)
    got = bootstrap_ci(SKEWED, np.median, level=0.99, n_resamples=1500, seed=11)
    assert got == pytest.approx(scipy_ci(SKEWED, np.median, level=0.99, n=1500, seed=11), rel=1e-12)
    # the default statistic is the mean
    assert bootstrap_ci(SKEWED) == pytest.approx(scipy_ci(SKEWED, np.mean), rel=1e-12)


def test_bootstrap_percentile_equals_scipy():
    for stat in (np.mean, np.median):
        got = bootstrap_ci(SKEWED, stat, method="percentile")
        assert got == pytest.approx(scipy_ci(SKEWED, stat, method="percentile"), rel=1e-12)
    got = bootstrap_ci(SKEWED, np.mean, level=0.9, n_resamples=500, seed=3, method="percentile")
    assert got == pytest.approx(scipy_ci(SKEWED, np.mean, "percentile", 0.9, 500, 3), rel=1e-12)
    # two samples: BCa is undefined (jackknife of one value), the percentile interval is used
    assert bootstrap_ci([4.0, 9.0], np.mean) == pytest.approx(scipy_ci([4.0, 9.0], np.mean, "percentile"))
    assert bootstrap_ci([4.0, 9.0], np.mean, level=0.5) == pytest.approx(
        scipy_ci([4.0, 9.0], np.mean, "percentile", level=0.5)
    )


def test_bootstrap_bca_differs_from_percentile_on_skewed_data():
    bca = bootstrap_ci(SKEWED, np.mean)
    pct = bootstrap_ci(SKEWED, np.mean, method="percentile")
    assert bca[1] > pct[1] + 0.1  # the right-skewed sample's BCa interval reaches further up


def distinct(x, axis=-1):
    """Number of distinct values: every resample has at most as many as the sample (BCa undefined)."""
    s = np.sort(x, axis=axis)
    return (np.diff(s, axis=axis) != 0).sum(axis=axis) + 1.0


def test_bootstrap_bca_falls_back_when_every_resample_is_on_one_side():
    v = np.arange(1.0, 13.0)  # 12 distinct values: a resample repeating none has probability 12!/12^12
    got = bootstrap_ci(v, distinct)
    assert got == pytest.approx(scipy_ci(v, distinct, method="percentile"))
    assert got[1] < 12  # every resample has fewer distinct values than the sample


def test_bootstrap_bias_corrected_without_acceleration_when_the_jackknife_is_flat():
    # the median of [1, 2, 5, 5, 5, 5, 5, 9] leaving out any one value is 5: no acceleration (a = 0), bias
    # correction only (Efron's BC: quantiles Phi(2 z0 + z_alpha))
    v = np.array([1.0, 2.0, 5.0, 5.0, 5.0, 5.0, 5.0, 9.0])
    rng = np.random.default_rng(SEED)
    boot = np.median(v[rng.integers(0, v.size, (N_RESAMPLES, v.size))], axis=-1)
    z0 = sst.norm.ppf((np.sum(boot < 5) + 0.5 * np.sum(boot == 5)) / N_RESAMPLES)
    q = sst.norm.cdf(2 * z0 + sst.norm.ppf([0.025, 0.975]))
    got = bootstrap_ci(v, np.median)
    assert got == pytest.approx(tuple(np.quantile(boot, q)))
    assert got != bootstrap_ci(v, np.median, method="percentile")  # the correction matters here


def test_bootstrap_edge_cases():
    lo, hi = bootstrap_ci([])
    assert math.isnan(lo) and math.isnan(hi)
    assert bootstrap_ci([7.5]) == (7.5, 7.5)
    assert bootstrap_ci([3.0, 3.0, 3.0, 3.0], np.median) == (3.0, 3.0)  # all ties: no spread
    assert bootstrap_ci([-2.0, -2.0]) == (-2.0, -2.0)
    r = bootstrap_ci([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], np.mean)
    assert all(type(v) is float for v in r) and 3 < r[0] < 5.5 < r[1] < 8


def test_bootstrap_reproducible_and_seed_dependent():
    assert bootstrap_ci(SKEWED) == bootstrap_ci(SKEWED)
    assert bootstrap_ci(SKEWED, seed=1) != bootstrap_ci(SKEWED, seed=2)
    assert bootstrap_ci(SKEWED, np.mean, level=0.5)[1] < bootstrap_ci(SKEWED, np.mean, level=0.95)[1]


# -- ratio_ci ------------------------------------------------------------------------------------------
def ref_ratio(a, b, stat=np.median, level=0.95, n=N_RESAMPLES, seed=SEED):
    """Percentile bootstrap of stat(a)/stat(b), a then b resampled from one stream (the documented design)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    rng = np.random.default_rng(seed)
    ra = stat(a[rng.integers(0, a.size, (n, a.size))], axis=-1)
    rb = stat(b[rng.integers(0, b.size, (n, b.size))], axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = ra / rb
    r = r[np.isfinite(r)]
    lo, hi = np.quantile(r, [(1 - level) / 2, (1 + level) / 2])
    return float(stat(a, axis=-1) / stat(b, axis=-1)), float(lo), float(hi)


A = [81.0, 79.5, 83.2, 78.8, 80.1, 82.4, 77.9]
B = [100.2, 98.7, 101.5, 99.9, 103.0, 97.6]


def test_ratio_ci_known_answer():
    r, lo, hi = ratio_ci(A, B)
    assert r == pytest.approx(80.1 / 100.05, rel=1e-12)  # medians by hand
    assert (r, lo, hi) == pytest.approx(ref_ratio(A, B), rel=1e-12)
    assert 0.76 < lo < r < hi < 0.84
    got = ratio_ci(A, B, np.mean, level=0.5, n_resamples=700, seed=9)
    assert got == pytest.approx(ref_ratio(A, B, np.mean, 0.5, 700, 9), rel=1e-12)
    assert got[0] == pytest.approx(np.mean(A) / np.mean(B), rel=1e-12)
    assert all(type(v) is float for v in got)


def nan3(t) -> bool:
    return len(t) == 3 and all(math.isnan(v) for v in t)


@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value encountered")
def test_ratio_ci_zero_baselines_and_empty():
    assert nan3(ratio_ci([1, 2], [0, 0]))
    assert nan3(ratio_ci([1, 2], [0, 0, 5]))  # median of the baseline is 0
    assert nan3(ratio_ci([], [1, 2]))
    assert nan3(ratio_ci([1, 2], []))
    # baseline median 1 but some resamples have median 0: those ratios are dropped, not inf
    a, b = [2.0, 2.2, 1.8, 2.1, 1.9], [0.0, 0.0, 1.0, 1.0, 1.0]
    r, lo, hi = ratio_ci(a, b)
    assert (r, lo, hi) == pytest.approx(ref_ratio(a, b), rel=1e-12) and math.isfinite(hi)
    # no finite resampled ratio at all: the point estimate without an interval
    r, lo, hi = ratio_ci([math.inf], [1.0, 2.0])
    assert r == math.inf and math.isnan(lo) and math.isnan(hi)


def test_ratio_ci_resamples_both_samples():
    # a constant numerator: the spread comes from the baseline alone, so it is not zero
    r, lo, hi = ratio_ci([5.0] * 6, B)
    assert lo < r < hi
    r, lo, hi = ratio_ci(A, [100.0] * 6)
    assert lo < r < hi
    # a single baseline value is a valid baseline
    r, lo, hi = ratio_ci(A, [100.0])
    assert (r, lo, hi) == pytest.approx(ref_ratio(A, [100.0]), rel=1e-12) and lo < r < hi


def test_ratio_ci_is_quiet_when_resampled_baselines_are_zero():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r, lo, hi = ratio_ci([2.0, 2.2, 1.8, 2.1, 1.9], [0.0, 0.0, 1.0, 1.0, 1.0])  # x/0 resamples
        assert math.isfinite(hi)
        r, lo, hi = ratio_ci([0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 1.0, 1.0])  # 0/0 resamples
        assert r == 0.0 and math.isfinite(hi)
        assert nan3(ratio_ci([], [1.0, 2.0]))  # no values: answered without touching them


# -- Mann-Whitney U ----------------------------------------------------------------------------------
def test_mann_whitney_exact_hand_counts():
    # complete separation, 2 vs 3: U = 0; exact two-sided p = 2 / C(5, 2) = 0.2
    assert mann_whitney([1, 2], [3, 4, 5]) == pytest.approx((0.0, 0.2))
    assert mann_whitney([3, 4, 5], [1, 2]) == pytest.approx((6.0, 0.2))  # U of x = nx*ny
    # 3 vs 3, x ranks {1, 2, 4}: U = 1; P(U <= 1) = 2/20, two-sided 0.2
    assert mann_whitney([1.0, 2.0, 4.0], [3.0, 5.0, 6.0]) == pytest.approx((1.0, 0.2))
    u, p = mann_whitney([1.0, 3.0, 5.0], [2.0, 4.0, 6.0])  # U = 3 of 9: P(U <= 3) = 7/20, two-sided 0.7
    assert (u, p) == pytest.approx((3.0, 0.7))


@pytest.mark.parametrize(
    ("x", "y"),
    [
        ([1.2, 3.4, 2.2, 5.1, 0.7], [4.4, 6.1, 5.5, 7.0, 3.9, 8.2]),
        ([1, 2, 2, 3, 3, 3], [2, 3, 4, 4, 5]),  # ties: asymptotic with tie correction
        ([5, 5, 5], [5, 6, 7]),  # one constant sample
        ([5, 5, 5], [6, 6]),  # two different constants
        (list(range(30)), [v + 12.5 for v in range(25)]),  # large: asymptotic
    ],
)
def test_mann_whitney_equals_scipy(x, y):
    ref = sst.mannwhitneyu(x, y, alternative="two-sided", method="auto")
    u, p = mann_whitney(x, y)
    assert (u, p) == pytest.approx((ref.statistic, ref.pvalue), rel=1e-12)
    assert type(u) is float and type(p) is float


def test_mann_whitney_constants_and_empty():
    assert mann_whitney([5, 5, 5], [5, 5]) == (3.0, 1.0)  # identical constants: U = nx ny / 2, p = 1
    assert mann_whitney([2.0], [2.0]) == (0.5, 1.0)
    u, p = mann_whitney([1, 1], [2, 2])  # different constants: complete separation (ties: asymptotic p)
    ref = sst.mannwhitneyu([1, 1], [2, 2], alternative="two-sided")
    assert (u, p) == pytest.approx((0.0, ref.pvalue)) and p < 0.2
    for x, y in (([], [1, 2]), ([1, 2], []), ([], [])):
        u, p = mann_whitney(x, y)
        assert math.isnan(u) and math.isnan(p)


def test_mann_whitney_quiet_on_degenerate_input(recwarn):
    mann_whitney([1.0, 1.0, 1.0], [1.0, 1.0, 2.0])
    mann_whitney([np.nan, 1.0], [2.0, 3.0])
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize(
    ("nx", "ny"),
    [(1, 1), (1, 2), (2, 1), (1, 4), (4, 1), (2, 2), (2, 3), (3, 3), (3, 4), (4, 5), (5, 5), (6, 4)],
)
def test_min_attainable_p_is_the_exact_p_of_complete_separation(nx, ny):
    n_orders = sum(1 for _ in combinations(range(nx + ny), nx))  # equally likely rank sets under H0
    assert min_attainable_p(nx, ny) == pytest.approx(min(1.0, 2 / n_orders))
    p = sst.mannwhitneyu(range(nx), range(nx, nx + ny), method="exact").pvalue
    assert min_attainable_p(nx, ny) == pytest.approx(p)


def test_min_attainable_p_edges():
    assert min_attainable_p(0, 5) == 1.0 and min_attainable_p(4, 0) == 1.0 and min_attainable_p(0, 0) == 1.0
    assert min_attainable_p(1, 1) == 1.0
    assert min_attainable_p(3, 3) == pytest.approx(0.1) and min_attainable_p(4, 4) == pytest.approx(1 / 35)
    assert min_attainable_p(4, 4) < ALPHA < min_attainable_p(3, 3)


# -- Holm ----------------------------------------------------------------------------------------------
def test_holm_equals_statsmodels():
    mt = pytest.importorskip("statsmodels.stats.multitest", reason="statsmodels not installed")
    for p in ([0.01, 0.04, 0.03, 0.005], [0.2, 0.01, 0.012, 0.5, 0.011, 0.04], [0.04, 0.04, 0.01], [0.3],
              [0.6, 0.7, 0.01]):  # fmt: skip
        assert holm(p) == pytest.approx(mt.multipletests(p, method="holm")[1].tolist(), rel=1e-12)


def test_holm_nan_is_not_counted_and_edges():
    # family of 2 (the nan is ignored): 0.01 * 2 = 0.02, max(0.02, 0.03 * 1) = 0.03
    out = holm([0.03, float("nan"), 0.01])
    assert out[0] == pytest.approx(0.03) and math.isnan(out[1]) and out[2] == pytest.approx(0.02)
    assert all(math.isnan(v) for v in holm([float("nan"), float("nan")]))
    assert holm([]) == []
    assert holm([0.02]) == pytest.approx([0.02])
    assert holm([0.4, 0.45]) == pytest.approx([0.8, 0.8])  # 0.4*2, then max(0.8, 0.45): monotone
    assert holm([0.9, 0.6]) == [1.0, 1.0]  # capped
    assert holm([0.0, 0.0]) == [0.0, 0.0]
    assert isinstance(holm([0.1]), list)


# -- Cliff's delta and magnitude -----------------------------------------------------------------------
def test_cliffs_delta_by_hand():
    # x = 1, 2, 3 vs y = 2, 2, 4: greater pairs (3>2, 3>2) = 2, smaller (1<2, 1<2, 1<4, 2<4, 3<4) = 5, ties 2
    assert cliffs_delta([1, 2, 3], [2, 2, 4]) == pytest.approx(-3 / 9)
    assert cliffs_delta([2, 2, 4], [1, 2, 3]) == pytest.approx(3 / 9)
    assert cliffs_delta([5, 5], [5, 5, 5]) == 0.0  # all ties
    assert cliffs_delta([10], [1, 2, 3, 20]) == pytest.approx((3 - 1) / 4)
    assert cliffs_delta([1, 2, 3], [1.5]) == pytest.approx((2 - 1) / 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 0/0 along the way
        assert math.isnan(cliffs_delta([], [1.0])) and math.isnan(cliffs_delta([1.0], []))
    # equals the rank-biserial correlation from scipy's U, with ties
    x, y = [1, 2, 2, 3, 3, 3, 7], [2, 3, 4, 4, 5]
    u = sst.mannwhitneyu(x, y).statistic
    assert cliffs_delta(x, y) == pytest.approx(2 * u / (len(x) * len(y)) - 1)


@pytest.mark.parametrize(
    ("d", "label"),
    [
        (0.0, "negligible"),
        (0.1469, "negligible"),
        (-0.1469, "negligible"),
        (0.147, "small"),
        (-0.147, "small"),
        (0.2, "small"),
        (0.3299, "small"),
        (0.33, "medium"),
        (-0.33, "medium"),
        (0.4739, "medium"),
        (0.474, "large"),
        (-0.474, "large"),
        (1.0, "large"),
        (-1.0, "large"),
        (float("nan"), ""),
    ],
)
def test_cliffs_magnitude_thresholds(d, label):
    assert cliffs_magnitude(d) == label


def test_rel_diff():
    assert rel_diff(110.0, 100.0) == pytest.approx(0.1)
    assert rel_diff(90.0, 100.0) == pytest.approx(-0.1)
    assert rel_diff(-1.0, -2.0) == pytest.approx(0.5)  # relative to |b|
    assert rel_diff(-3.0, -2.0) == pytest.approx(-0.5)
    assert math.isnan(rel_diff(1.0, 0.0)) and math.isnan(rel_diff(0.0, 0.0))


# -- describe and its JSON -----------------------------------------------------------------------------
def test_describe_hand_computed():
    v = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]  # the textbook sample: mean 5, population sd 2
    d = describe(v)
    assert (d.n, d.mean, d.median, d.min, d.max) == (8, 5.0, 4.5, 2.0, 9.0)
    assert d.sd == pytest.approx(math.sqrt(32 / 7))  # sample sd (ddof 1): sum of squares 32
    assert d.cv == pytest.approx(math.sqrt(32 / 7) / 5)
    # linear interpolation at (n - 1) p: p5 at 0.35, p25 at 1.75, p75 at 5.25, p95 at 6.65, p99 at 6.93
    assert d.pct == pytest.approx({5: 2.7, 25: 4.0, 75: 5.5, 95: 8.3, 99: 8.86})
    assert list(d.pct) == list(PERCENTILES)
    assert (d.ci_lo, d.ci_hi) == pytest.approx(scipy_ci(v, np.median), rel=1e-12)
    assert (d.mean_ci_lo, d.mean_ci_hi) == pytest.approx(scipy_ci(v, np.mean), rel=1e-12)
    assert all(type(getattr(d, k)) is float for k in ("mean", "median", "sd", "cv", "min", "max", "ci_lo"))
    assert type(d.n) is int


def test_describe_passes_level_and_seed():
    v = np.random.default_rng(4).normal(10, 2, 30)
    d = describe(v, level=0.8, seed=1)
    assert (d.ci_lo, d.ci_hi) == pytest.approx(scipy_ci(v, np.median, level=0.8, seed=1), rel=1e-12)
    assert (d.mean_ci_lo, d.mean_ci_hi) == pytest.approx(scipy_ci(v, np.mean, level=0.8, seed=1), rel=1e-12)
    d0 = describe(v, level=0.8)
    assert (d.ci_lo, d.ci_hi) != (d0.ci_lo, d0.ci_hi)  # the seed matters for this sample


def test_describe_edges():
    with pytest.raises(ValueError, match=r"^describe\(\) of no samples$"):
        describe([])
    one = describe([3.5])
    assert (one.n, one.mean, one.median, one.sd, one.cv, one.min, one.max) == (
        1,
        3.5,
        3.5,
        0.0,
        0.0,
        3.5,
        3.5,
    )
    assert one.pct == dict.fromkeys(PERCENTILES, 3.5)
    assert (one.ci_lo, one.ci_hi, one.mean_ci_lo, one.mean_ci_hi) == (3.5, 3.5, 3.5, 3.5)
    zero = describe([-1.0, 1.0])
    assert math.isnan(zero.cv) and zero.sd == pytest.approx(math.sqrt(2))
    neg = describe([-2.0, -4.0, -6.0])
    assert neg.cv == pytest.approx(2.0 / 4.0)  # sd / |mean|: positive
    assert describe([0.0, 0.0]).sd == 0.0 and math.isnan(describe([0.0, 0.0]).cv)


def test_describe_to_json_exact_fields():
    d = Describe(
        n=3,
        mean=2.0,
        median=2.5,
        sd=0.5,
        cv=float("nan"),
        min=1.0,
        max=3.0,
        pct={5: 1.1, 25: 1.5, 75: 2.75, 95: 2.95, 99: 2.99},
        ci_lo=1.25,
        ci_hi=float("nan"),
        mean_ci_lo=1.5,
        mean_ci_hi=2.5,
    )
    j = d.to_json()
    assert j == {
        "n": 3,
        "mean": 2.0,
        "median": 2.5,
        "sd": 0.5,
        "cv": None,
        "min": 1.0,
        "max": 3.0,
        "p5": 1.1,
        "p25": 1.5,
        "p75": 2.75,
        "p95": 2.95,
        "p99": 2.99,
        "ci_lo": 1.25,
        "ci_hi": None,
        "mean_ci_lo": 1.5,
        "mean_ci_hi": 2.5,
    }
    assert list(j) == [
        "n",
        "mean",
        "median",
        "sd",
        "cv",
        "min",
        "max",
        "p5",
        "p25",
        "p75",
        "p95",
        "p99",
        "ci_lo",
        "ci_hi",
        "mean_ci_lo",
        "mean_ci_hi",
    ]
    assert type(j["n"]) is int


def test_describe_to_json_round_trip():
    import json

    d = describe([1.0, 2.0, 3.0, 4.0, 10.0])
    j = json.loads(json.dumps(d.to_json(), allow_nan=False))  # strict JSON: no NaN tokens
    back = Describe(
        **{
            k: j[k]
            for k in (
                "n",
                "mean",
                "median",
                "sd",
                "cv",
                "min",
                "max",
                "ci_lo",
                "ci_hi",
                "mean_ci_lo",
                "mean_ci_hi",
            )
        },
        pct={p: j[f"p{p}"] for p in PERCENTILES},
    )
    assert back == d
    z = describe([-1.0, 1.0]).to_json()
    assert z["cv"] is None and json.dumps(z, allow_nan=False)


# -- pairwise, Pair, tiers -------------------------------------------------------------------------------
G = {
    "a": [10.0, 11.0, 12.0, 13.0, 14.0],
    "b": [1.0, 2.0, 3.0, 4.0, 5.0],
    "c": [2.5, 3.5, 4.5, 5.5, 6.5, 7.5],
}


def test_pairwise_fields_against_scipy_and_statsmodels():
    mt = pytest.importorskip("statsmodels.stats.multitest", reason="statsmodels not installed")
    pairs = pairwise(G)
    assert [(p.a, p.b) for p in pairs] == [("a", "b"), ("a", "c"), ("b", "c")]
    raw = [
        sst.mannwhitneyu(G[x], G[y], alternative="two-sided").pvalue
        for x, y in (("a", "b"), ("a", "c"), ("b", "c"))
    ]
    adj = mt.multipletests(raw, method="holm")[1]
    ab, ac, bc = pairs
    assert (ab.n_a, ab.n_b, ab.median_a, ab.median_b, ab.u) == (5, 5, 12.0, 3.0, 25.0)
    assert (ac.n_a, ac.n_b, ac.median_b) == (5, 6, 5.0)
    assert (bc.u, bc.cliffs_delta) == pytest.approx((6.0, 2 * 6 / 30 - 1))  # b > c in 6 of 30 pairs
    assert [p.p for p in pairs] == pytest.approx(raw, rel=1e-12)
    assert [p.p_holm for p in pairs] == pytest.approx(adj.tolist(), rel=1e-12)
    assert ab.cliffs_delta == 1.0 and ab.rel_median_diff == pytest.approx((12 - 3) / 3)
    assert bc.rel_median_diff == pytest.approx((3 - 5) / 5)
    # separated: a-c 5 vs 6 p = 2/462 (rank 1: times 3), a-b 5 vs 5 p = 2/252 (rank 2: times 2)
    assert ac.p == pytest.approx(2 / 462) and ac.p_holm == pytest.approx(3 * 2 / 462)
    assert ab.p == pytest.approx(2 / 252) and ab.p_holm == pytest.approx(2 * 2 / 252)
    assert ab.significant and ac.significant and not bc.significant
    assert pairwise({"only": [1.0, 2.0]}) == []


def test_pair_significance_boundaries():
    p = Pair("a", "b", 3, 3, 1.0, 2.0, 0.0, 0.01)
    assert math.isnan(p.p_holm) and math.isnan(p.cliffs_delta) and math.isnan(p.rel_median_diff)
    assert not p.significant  # not corrected yet
    p.p_holm = ALPHA
    assert not p.significant  # strictly below alpha
    p.p_holm = 0.0499
    assert p.significant
    assert ALPHA == 0.05


def pair(a: str, b: str, p_holm: float) -> Pair:
    return Pair(a, b, 5, 5, 0.0, 0.0, 0.0, p_holm, p_holm=p_holm)


def test_tiers_cut_only_where_everything_above_differs_from_everything_below():
    g = {"x": [3.0], "y": [2.0], "z": [1.0]}  # medians 3 > 2 > 1
    t = tiers(g, "higher", [pair("x", "y", 0.01), pair("x", "z", 0.01), pair("y", "z", 0.5)])
    assert t.order == ["x", "y", "z"] and t.tier == {"x": 1, "y": 2, "z": 2}
    assert t.groups() == [["x"], ["y", "z"]]
    t = tiers(g, "higher", [pair("x", "y", 0.5), pair("x", "z", 0.01), pair("y", "z", 0.01)])
    assert t.tier == {"x": 1, "y": 1, "z": 2}
    # x-z differs but x-y and y-z do not: no cut is clean, one tier
    t = tiers(g, "higher", [pair("x", "y", 0.5), pair("x", "z", 0.01), pair("y", "z", 0.5)])
    assert t.tier == {"x": 1, "y": 1, "z": 1}
    # everything differs: three tiers; lower is better reverses the order
    allsig = [pair("x", "y", 0.01), pair("x", "z", 0.01), pair("y", "z", 0.01)]
    t = tiers(g, "higher", allsig)
    assert t.tier == {"x": 1, "y": 2, "z": 3} and t.pairs == allsig
    t = tiers(g, "lower", allsig)
    assert t.order == ["z", "y", "x"] and t.tier == {"z": 1, "y": 2, "x": 3}
    assert t.groups() == [["z"], ["y"], ["x"]]
    # no direction: ordered by median (ascending), one tier
    t = tiers(g, "none", allsig)
    assert t.order == ["z", "y", "x"] and t.tier == dict.fromkeys("xyz", 1)
    # an empty pair list means no evidence (not "compute the pairs")
    assert tiers(g, "higher", []).tier == dict.fromkeys("xyz", 1)


def test_tiers_computes_pairs_when_not_given():
    t = tiers(G, "higher")
    assert t.order == ["a", "c", "b"]
    assert t.tier == {"a": 1, "c": 2, "b": 2}  # a differs from both; c vs b does not (5 vs 6, overlapping)
    assert [(p.a, p.b) for p in t.pairs] == [("a", "b"), ("a", "c"), ("b", "c")]
    assert tiers(G, "lower").order == ["b", "c", "a"]


def test_tiering_groups_with_an_empty_tier():
    t = Tiering(order=["p", "q", "r"], tier={"p": 1, "q": 3, "r": 3})
    assert t.groups() == [["p"], [], ["q", "r"]]
    assert Tiering(["s"], {"s": 1}).groups() == [["s"]] and Tiering(["s"], {"s": 1}).pairs == []
