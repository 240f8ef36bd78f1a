"""Comparisons that use the run's design: every round holds each VPN once, so a round is a block, and a
slowdown that hits a round (the machine got busy, the CPU clocked down) hits every VPN in it and cancels
when VPNs are compared within rounds. Unpaired tests (Mann-Whitney U) put that round-to-round drift into
the noise and separate nothing on a machine that drifts.

The method, chosen by a simulation with known effects under injected drift (scripts/stat-sim, its table in
docs/results.md): a two-way additive model of the values (log values when all are positive: a drift that
scales every VPN alike is additive there) with the VPN and the round as factors, each pair of VPNs compared
by a t-test of its contrast with the model's pooled residual variance, Holm-corrected over the pairs. The
model assumes roughly normal residuals; the run checks that (Shapiro-Wilk on the residuals) and, when it
fails (heavy tails: connect times, an outlier round), uses ranks within rounds instead (Friedman's design
with Conover's pairwise test, on the rounds every compared VPN has), which outliers cannot sway. Variants
that share no rounds (two runs, or a block-order run) are compared unpaired (Mann-Whitney U), and say so.

Also here: the smallest difference the run could have detected (80% power, the first step of Holm), from
the model's residual spread: what "not separable" means in this run."""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from tunnelbench.analysis.stats import ALPHA, Pair, cliffs_delta, holm, mann_whitney, rel_diff

Block = Hashable
TWO_WAY, RANKS, UNPAIRED = "two-way", "ranks", "unpaired"
METHOD_TEXT = {
    TWO_WAY: "two-way model (round as block), pairwise t-tests, Holm",
    RANKS: "ranks within rounds (Friedman, Conover's pairwise test), Holm",
    UNPAIRED: "Mann-Whitney U (unpaired), Holm",
}
NORMALITY_ALPHA = 0.05  # residuals that fail Shapiro-Wilk at this level take the rank method
MIN_RANK_BLOCKS = 3  # fewer complete rounds than this: the ranks cannot say anything; the model stays
POWER = 0.8  # of the smallest detectable difference


@dataclass
class Test:
    """Every pair of one family (one metric under one condition), compared by one method."""

    method: str  # TWO_WAY | RANKS | UNPAIRED
    why: str  # why this method (normality, shared rounds)
    pairs: list[Pair]
    log: bool  # the model ran on log values (ratios) or on the values (differences)
    mde: float | None = None  # smallest detectable difference: % (log) or in the metric's unit
    df: int | None = None  # the model's residual degrees of freedom
    normality_p: float | None = None  # Shapiro-Wilk on the model's residuals
    excluded: dict[str, str] = field(default_factory=dict)  # variant -> why it was not compared

    @property
    def text(self) -> str:
        return METHOD_TEXT[self.method]

    def mde_text(self, unit: str = "") -> str:
        if self.mde is None or math.isnan(self.mde):
            return ""
        return f"±{self.mde:.0f}%" if self.log else f"±{self.mde:.3g} {unit}".rstrip()


def _pair(a: str, b: str, x: Sequence[float], y: Sequence[float], p: float) -> Pair:
    mx, my = float(np.median(x)), float(np.median(y))
    return Pair(
        a,
        b,
        len(x),
        len(y),
        mx,
        my,
        float("nan"),
        p,
        cliffs_delta=cliffs_delta(x, y),
        rel_median_diff=rel_diff(mx, my),
    )


def _holm(pairs: list[Pair]) -> list[Pair]:
    for pr, ph in zip(pairs, holm([pr.p for pr in pairs]), strict=True):
        pr.p_holm = ph
    return pairs


def unpaired(groups: Mapping[str, Sequence[float]], why: str) -> Test:
    """Mann-Whitney U between every pair (Holm); the detectable difference from the pooled spread."""
    pairs = []
    for a, b in combinations(groups, 2):
        x, y = np.asarray(groups[a], float), np.asarray(groups[b], float)
        u, p = mann_whitney(x, y)
        pr = _pair(a, b, x.tolist(), y.tolist(), p)
        pr.u = u
        pairs.append(pr)
    values = [np.asarray(v, float) for v in groups.values()]
    log = all(v.size and np.all(v > 0) for v in values)
    t = [np.log(v) if log else v for v in values]
    n = sum(v.size for v in t)
    df = n - len(t)
    mde = None
    if df > 0 and len(t) > 1:
        sd = math.sqrt(sum(float(((v - v.mean()) ** 2).sum()) for v in t) / df)
        n_bar = n / len(t)
        mde = _mde(sd * math.sqrt(2 / n_bar), df, len(pairs), log)
    return Test(UNPAIRED, why, _holm(pairs), log, mde, df if df > 0 else None)


def _mde(se: float, df: int, m: int, log: bool) -> float:
    from scipy import stats as sst

    crit = float(sst.t.ppf(1 - ALPHA / (2 * max(m, 1)), df) + sst.t.ppf(POWER, df))
    d = crit * se
    return 100 * (math.exp(d) - 1) if log else d


@dataclass
class _Fit:
    beta: np.ndarray
    cov: np.ndarray  # (X'X)^+ scaled by the residual variance
    resid: np.ndarray
    df: int
    mse: float


def _two_way(cells: list[tuple[int, int, float]], k: int, b: int) -> _Fit | None:
    """Least squares of value ~ variant + block (missing cells allowed); None without residual df."""
    n = len(cells)
    x = np.zeros((n, k + b - 1))
    y = np.empty(n)
    for row, (i, j, v) in enumerate(cells):
        x[row, i] = 1.0  # one column per variant (no intercept)
        if j > 0:
            x[row, k + j - 1] = 1.0  # block effects against the first block
        y[row] = v
    rank = int(np.linalg.matrix_rank(x))
    df = n - rank
    if df < 1:
        return None
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    mse = float(resid @ resid) / df
    return _Fit(beta, np.linalg.pinv(x.T @ x) * mse, resid, df, mse)


def _shapiro(resid: np.ndarray, scale: float) -> float | None:
    """Shapiro-Wilk's p of the residuals; None when there are too few or no spread beyond rounding."""
    if resid.size < 3 or float(np.ptp(resid)) <= 1e-9 * max(scale, 1e-300):
        return None
    from scipy import stats as sst

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(sst.shapiro(resid).pvalue)


def _t_p(est: float, se: float, df: int, scale: float = 1.0) -> float:
    """Two-sided p of a contrast; no residual spread (equal to rounding, relative to the values' `scale`):
    a contrast is then a certain difference or none."""
    tiny = 1e-9 * max(scale, 1e-300)
    if se <= tiny or not math.isfinite(se):
        return 0.0 if abs(est) > tiny else 1.0
    from scipy import stats as sst

    return float(2 * sst.t.sf(abs(est) / se, df))


def conover(table: np.ndarray) -> tuple[np.ndarray, int]:
    """Conover's pairwise test after Friedman's ranking (Conover 1999, 5.8): `table` is blocks x variants;
    returns the matrix of two-sided p-values (unadjusted) and the degrees of freedom."""
    from scipy import stats as sst

    nb, k = table.shape
    ranks = np.apply_along_axis(sst.rankdata, 1, table)
    r = ranks.sum(axis=0)
    a1 = float((ranks**2).sum())
    df = (nb - 1) * (k - 1)
    spread = 2 * (nb * a1 - float((r**2).sum())) / df
    p = np.ones((k, k))
    for i, j in combinations(range(k), 2):
        d = abs(float(r[i] - r[j]))
        if spread <= 1e-12:
            p[i, j] = p[j, i] = 0.0 if d > 0 else 1.0
        else:
            p[i, j] = p[j, i] = float(2 * sst.t.sf(d / math.sqrt(spread), df))
    return p, df


def blocked(values: Mapping[str, Mapping[Block, float]]) -> Test:
    """Compare every pair of variants within blocks (rounds); see the module's docstring. Variants with
    fewer than 2 values are left out (too few to compare), named in `excluded`."""
    excluded = {v: f"{len(b)} value" + ("s" if len(b) != 1 else "") for v, b in values.items() if len(b) < 2}
    vs = [v for v in values if v not in excluded]
    plain = {v: list(values[v].values()) for v in vs}
    if len(vs) < 2:
        t = unpaired(plain, "fewer than two variants to compare")
        t.excluded = excluded
        return t
    blocks = list(dict.fromkeys(bk for v in vs for bk in values[v]))
    log = all(x > 0 for v in vs for x in values[v].values())
    cells = [
        (i, blocks.index(bk), math.log(x) if log else x)
        for i, v in enumerate(vs)
        for bk, x in values[v].items()
    ]
    fit = _two_way(cells, len(vs), len(blocks))
    if fit is None:
        t = unpaired(plain, "too few values for a model with rounds as blocks")
        t.excluded = excluded
        return t
    normal_p = _shapiro(fit.resid, float(np.abs(np.asarray([c[2] for c in cells])).max()))
    m = len(vs) * (len(vs) - 1) // 2
    se = [
        math.sqrt(max(float(fit.cov[i, i] + fit.cov[j, j] - 2 * fit.cov[i, j]), 0.0))
        for i, j in combinations(range(len(vs)), 2)
    ]
    scale = max(abs(c[2]) for c in cells)
    exact = math.sqrt(fit.mse) <= 1e-9 * max(scale, 1e-300)  # no residual spread beyond rounding
    mde = _mde(float(np.median(se)), fit.df, m, log) if not exact else None
    complete = [bk for bk in blocks if all(bk in values[v] for v in vs)]
    use_ranks = normal_p is not None and normal_p < NORMALITY_ALPHA and len(complete) >= MIN_RANK_BLOCKS
    pairs = []
    if use_ranks:
        p, _df = conover(np.array([[values[v][bk] for v in vs] for bk in complete]))
        for i, j in combinations(range(len(vs)), 2):
            pairs.append(_pair(vs[i], vs[j], plain[vs[i]], plain[vs[j]], float(p[i, j])))
        why = (
            f"the two-way model's residuals are not normal (Shapiro-Wilk p = {normal_p:.2g}): ranks within "
            f"the {len(complete)} rounds every VPN has"
        )
        method = RANKS
    else:
        for (i, j), s in zip(combinations(range(len(vs)), 2), se, strict=True):
            est = float(fit.beta[i] - fit.beta[j])
            pairs.append(_pair(vs[i], vs[j], plain[vs[i]], plain[vs[j]], _t_p(est, s, fit.df, scale)))
        method = TWO_WAY
        why = "residuals consistent with normal" + (
            f" (Shapiro-Wilk p = {normal_p:.2g})" if normal_p is not None else ""
        )
        if normal_p is not None and normal_p < NORMALITY_ALPHA:
            why = f"residuals not normal (Shapiro-Wilk p = {normal_p:.2g}) but fewer than {MIN_RANK_BLOCKS} rounds every VPN has: the model stays"
    t = Test(method, why, _holm(pairs), log, mde, fit.df, normal_p, excluded)
    return t
