"""Statistical building blocks: descriptive statistics, bootstrap confidence intervals, Mann-Whitney U with
Holm correction, effect sizes and significance tiers.

Everything here is a pure function of arrays of samples (one sample per repetition) so it can be tested
against known answers. Random resampling uses a fixed seed: the same data always yields the same report."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

Samples = Sequence[float] | np.ndarray  # a list of values, or an array of them

SEED = 20240601  # fixed: bootstrap CIs are reproducible run to run
N_RESAMPLES = 4000
ALPHA = 0.05
PERCENTILES = (5, 25, 75, 95, 99)

Better = Literal["higher", "lower", "none"]
_NORM = NormalDist()  # the standard normal of BCa's bias and acceleration terms (scipy.stats.norm's values)


# -- descriptive statistics ----------------------------------------------------------------------------
@dataclass
class Describe:
    n: int
    mean: float
    median: float
    sd: float
    cv: float  # sd / mean (nan when the mean is 0)
    min: float
    max: float
    pct: dict[int, float]  # percentile -> value (linear interpolation)
    ci_lo: float  # bootstrap 95% CI of the median
    ci_hi: float
    mean_ci_lo: float  # bootstrap 95% CI of the mean
    mean_ci_hi: float

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("n", "mean", "median", "sd", "cv", "min", "max")}
        d.update({f"p{k}": v for k, v in self.pct.items()})
        d.update(ci_lo=self.ci_lo, ci_hi=self.ci_hi, mean_ci_lo=self.mean_ci_lo, mean_ci_hi=self.mean_ci_hi)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def describe(values: Samples, level: float = 0.95, seed: int = SEED) -> Describe:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        raise ValueError("describe() of no samples")
    sd = float(a.std(ddof=1)) if a.size > 1 else 0.0
    mean = float(a.mean())
    lo, hi = bootstrap_ci(a, np.median, level=level, seed=seed)
    mlo, mhi = bootstrap_ci(a, np.mean, level=level, seed=seed)
    return Describe(
        n=int(a.size),
        mean=mean,
        median=float(np.median(a)),
        sd=sd,
        cv=sd / abs(mean) if mean else float("nan"),
        min=float(a.min()),
        max=float(a.max()),
        pct={p: float(np.percentile(a, p)) for p in PERCENTILES},
        ci_lo=lo,
        ci_hi=hi,
        mean_ci_lo=mlo,
        mean_ci_hi=mhi,
    )


# -- bootstrap ---------------------------------------------------------------------------------------
Stat = Callable[..., np.ndarray]


def _resample(a: np.ndarray, rng: np.random.Generator, n_resamples: int) -> np.ndarray:
    return a[rng.integers(0, a.size, size=(n_resamples, a.size))]


def bootstrap_ci(
    values: Samples,
    statistic: Stat = np.mean,
    level: float = 0.95,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
    method: Literal["bca", "percentile"] = "bca",
) -> tuple[float, float]:
    """Two-sided bootstrap CI of statistic(values). `statistic` must accept axis=-1 (np.mean, np.median).

    BCa (bias-corrected and accelerated, Efron 1987) by default; it falls back to the percentile method
    when BCa is undefined (fewer than 3 samples, or every resample on one side of the estimate).
    One sample gives (x, x): no spread is known, and the report says n=1."""
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return (float("nan"), float("nan"))
    if a.size == 1 or np.all(a == a[0]):
        return (float(a[0]), float(a[0]))
    rng = np.random.default_rng(seed)
    boot = statistic(_resample(a, rng, n_resamples), axis=-1)
    alpha = (1 - level) / 2
    q = np.array([alpha, 1 - alpha])
    if method == "bca" and a.size >= 3:
        theta = float(statistic(a, axis=-1))
        prop = (np.sum(boot < theta) + 0.5 * np.sum(boot == theta)) / boot.size
        if 0 < prop < 1:
            z0 = _NORM.inv_cdf(float(prop))
            jack = np.array([statistic(np.delete(a, i), axis=-1) for i in range(a.size)])
            d = jack.mean() - jack
            den = 6.0 * np.sum(d**2) ** 1.5
            acc = float(np.sum(d**3) / den) if den > 0 else 0.0
            z = np.array([_NORM.inv_cdf(float(x)) for x in q])
            adj = np.array([_NORM.cdf(float(x)) for x in z0 + (z0 + z) / (1 - acc * (z0 + z))])
            if np.all(np.isfinite(adj)):
                q = adj
    lo, hi = np.quantile(boot, q)
    return float(lo), float(hi)


def ratio_ci(
    values: Samples,
    base: Samples,
    statistic: Stat = np.median,
    level: float = 0.95,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float, float]:
    """statistic(values) / statistic(base) with a percentile bootstrap CI (both samples resampled
    independently). Returns (ratio, lo, hi); nan when the baseline statistic is 0."""
    a, b = np.asarray(values, dtype=float), np.asarray(base, dtype=float)
    sb = float(statistic(b, axis=-1))
    if a.size == 0 or b.size == 0 or sb == 0:
        return (float("nan"),) * 3
    point = float(statistic(a, axis=-1)) / sb
    rng = np.random.default_rng(seed)
    ba = statistic(_resample(a, rng, n_resamples), axis=-1)
    bb = statistic(_resample(b, rng, n_resamples), axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = ba / bb
    r = r[np.isfinite(r)]
    if r.size == 0:
        return (point, float("nan"), float("nan"))
    alpha = (1 - level) / 2
    lo, hi = np.quantile(r, [alpha, 1 - alpha])
    return point, float(lo), float(hi)


# -- hypothesis tests ----------------------------------------------------------------------------------
def mann_whitney(x: Samples, y: Samples) -> tuple[float, float]:
    """Two-sided Mann-Whitney U test: (U of x, p). Exact p for small samples without ties (scipy's 'auto')."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size == 0 or y.size == 0:
        return float("nan"), float("nan")
    if np.all(x == x[0]) and np.all(y == y[0]) and x[0] == y[0]:
        return x.size * y.size / 2, 1.0  # identical constants: no evidence of a difference
    # imported here, not at the top: importing scipy.stats costs every CLI command ~1.7 s
    from scipy import stats as sst

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        r = sst.mannwhitneyu(x, y, alternative="two-sided", method="auto")
    return float(r.statistic), float(r.pvalue)


def min_attainable_p(nx: int, ny: int) -> float:
    """The smallest two-sided p the exact Mann-Whitney test can give for these sample sizes
    (complete separation): 2 / C(nx+ny, nx). With 3 vs 3 repetitions it is 0.1: nothing can be significant."""
    if nx == 0 or ny == 0:
        return 1.0
    return min(1.0, 2.0 / math.comb(nx + ny, nx))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values (same order as given; nan stays nan and is not counted)."""
    p = np.asarray(pvalues, dtype=float)
    ok = ~np.isnan(p)
    idx = np.flatnonzero(ok)
    m = idx.size
    out = np.full(p.shape, np.nan)
    if m == 0:
        empty: list[float] = out.tolist()
        return empty
    order = idx[np.argsort(p[idx], kind="stable")]
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    adjusted: list[float] = out.tolist()
    return adjusted


def cliffs_delta(x: Samples, y: Samples) -> float:
    """Cliff's delta = P(X > Y) - P(X < Y), in [-1, 1]; equals the rank-biserial correlation 2U/(nx ny) - 1."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size == 0 or y.size == 0:
        return float("nan")
    diff = x[:, None] - y[None, :]
    return float((int(np.sum(diff > 0)) - int(np.sum(diff < 0))) / diff.size)


def cliffs_magnitude(d: float) -> str:
    """Romano et al. (2006) thresholds."""
    if math.isnan(d):
        return ""
    a = abs(d)
    return "negligible" if a < 0.147 else "small" if a < 0.33 else "medium" if a < 0.474 else "large"


def rel_diff(a: float, b: float) -> float:
    """(a - b) / |b|: the relative difference of a to b (nan when b is 0)."""
    return (a - b) / abs(b) if b else float("nan")


# -- pairwise comparisons and tiers --------------------------------------------------------------------
@dataclass
class Pair:
    a: str
    b: str
    n_a: int
    n_b: int
    median_a: float
    median_b: float
    u: float
    p: float
    p_holm: float = float("nan")
    cliffs_delta: float = float("nan")  # of a vs b
    rel_median_diff: float = float("nan")  # (median a - median b) / |median b|

    @property
    def significant(self) -> bool:
        return not math.isnan(self.p_holm) and self.p_holm < ALPHA


def pairwise(groups: Mapping[str, Samples]) -> list[Pair]:
    """Mann-Whitney U between every pair of groups, Holm-corrected within this family (one metric)."""
    pairs = []
    for a, b in combinations(groups, 2):
        x, y = np.asarray(groups[a], float), np.asarray(groups[b], float)
        u, p = mann_whitney(x, y)
        mx, my = float(np.median(x)), float(np.median(y))
        pairs.append(
            Pair(
                a,
                b,
                x.size,
                y.size,
                mx,
                my,
                u,
                p,
                cliffs_delta=cliffs_delta(x, y),
                rel_median_diff=rel_diff(mx, my),
            )
        )
    for pr, ph in zip(pairs, holm([pr.p for pr in pairs]), strict=True):
        pr.p_holm = ph
    return pairs


@dataclass
class Tiering:
    order: list[str]  # best first (by median, in the metric's better direction)
    tier: dict[str, int]  # name -> 1-based tier
    pairs: list[Pair] = field(default_factory=list)

    def groups(self) -> list[list[str]]:
        out: list[list[str]] = []
        for name in self.order:
            t = self.tier[name]
            while len(out) < t:
                out.append([])
            out[t - 1].append(name)
        return out


def tiers(groups: Mapping[str, Samples], better: Better, pairs: list[Pair] | None = None) -> Tiering:
    """Rank groups by median (best first) and cut the ranking only where every group above the cut differs
    significantly (Mann-Whitney, Holm-corrected over all pairs) from every group below it.

    So any two groups in different tiers are significantly different; groups without evidence of a
    difference share a tier. For better == "none" everything is one tier, ordered by median."""
    pairs = pairs if pairs is not None else pairwise(groups)
    sig = {frozenset((p.a, p.b)) for p in pairs if p.significant}
    med = {k: float(np.median(np.asarray(v, float))) for k, v in groups.items()}
    order = sorted(groups, key=lambda k: -med[k] if better == "higher" else med[k])
    tier, t = {}, 1
    for k, name in enumerate(order):
        if k > 0 and better != "none":
            above, below = order[:k], order[k:]
            if all(frozenset((i, j)) in sig for i in above for j in below):
                t += 1
        tier[name] = t
    return Tiering(order, tier, pairs)
