"""The within-round comparison (analysis/blocked.py) against references it did not compute: statsmodels' OLS
for the two-way model's pairwise contrasts, scikit-posthocs' Conover test after Friedman for the rank method,
statsmodels' Holm; and on hand-made runs with known effects and injected drift (the simulation that chose the
method: scripts/stat-sim.py)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import scikit_posthocs as sp
import statsmodels.formula.api as smf
from scipy import stats as sst
from statsmodels.stats.multitest import multipletests

from tunnelbench.analysis import blocked as B


def _groups(y: np.ndarray, names: list[str]) -> dict[str, dict[int, float]]:
    return {n: {r + 1: float(y[i, r]) for r in range(y.shape[1])} for i, n in enumerate(names)}


def _rng_run(seed: int, mu: list[float], rounds: int = 6, sd: float = 0.1, drift: float = 0.3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = np.asarray(mu)[:, None] * np.exp(rng.normal(0, sd, (len(mu), rounds)))
    return y * np.exp(rng.normal(0, drift, rounds))[None, :]


def test_two_way_contrasts_match_statsmodels_ols():
    names = ["a", "b", "c", "d"]
    y = _rng_run(3, [1.0, 1.1, 1.5, 2.0])
    t = B.blocked(_groups(y, names))
    assert t.method == B.TWO_WAY and t.log
    df = pd.DataFrame(
        [(n, r, math.log(y[i, r])) for i, n in enumerate(names) for r in range(y.shape[1])],
        columns=["v", "r", "y"],
    )
    fit = smf.ols("y ~ C(v) + C(r)", df).fit()
    raw = []
    for a, b in itertools.combinations(names, 2):
        c = np.zeros(len(fit.params))
        for name, sign in ((a, 1), (b, -1)):
            if name != "a":  # treatment coding: a is the reference level
                c[list(fit.params.index).index(f"C(v)[T.{name}]")] += sign
        raw.append(float(fit.t_test(c).pvalue))
    assert [p.p for p in t.pairs] == pytest.approx(raw, rel=1e-6)
    assert [p.p_holm for p in t.pairs] == pytest.approx(list(multipletests(raw, method="holm")[1]), rel=1e-6)
    assert t.df == int(fit.df_resid) == 15
    # residuals as statsmodels has them: the same normality check
    assert t.normality_p == pytest.approx(sst.shapiro(fit.resid).pvalue, rel=1e-6)


def test_missing_cells_match_statsmodels_too():
    """A VPN without one round (a failed or disturbed repetition): the additive model still holds, fitted on
    what is there (unbalanced least squares)."""
    names = ["a", "b", "c"]
    y = _rng_run(5, [1.0, 1.3, 2.0])
    g = _groups(y, names)
    del g["b"][4], g["c"][2]
    t = B.blocked(g)
    rows = [(n, r, math.log(v)) for n in names for r, v in g[n].items()]
    fit = smf.ols("y ~ C(v) + C(r)", pd.DataFrame(rows, columns=["v", "r", "y"])).fit()
    p_ab = float(fit.t_test("C(v)[T.b] = 0").pvalue)
    p_bc = float(fit.t_test("C(v)[T.b] - C(v)[T.c] = 0").pvalue)
    got = {(p.a, p.b): p.p for p in t.pairs}
    assert got[("a", "b")] == pytest.approx(p_ab, rel=1e-6)
    assert got[("b", "c")] == pytest.approx(p_bc, rel=1e-6)
    assert t.df == int(fit.df_resid)


def test_the_rank_method_matches_scikit_posthocs_conover():
    # heavy-tailed values: one wild outlier per VPN in a different round (connect times)
    names = ["a", "b", "c", "d"]
    y = np.array(
        [
            [0.10, 0.11, 0.10, 0.12, 0.95, 0.11],
            [0.20, 0.21, 1.90, 0.22, 0.20, 0.21],
            [0.30, 2.80, 0.31, 0.30, 0.32, 0.31],
            [3.90, 0.40, 0.41, 0.42, 0.40, 0.43],
        ]
    )
    t = B.blocked(_groups(y, names))
    assert t.method == B.RANKS, t.why
    ref = sp.posthoc_conover_friedman(y.T, p_adjust=None)
    raw = [float(ref.iloc[i, j]) for i, j in itertools.combinations(range(4), 2)]
    assert [p.p for p in t.pairs] == pytest.approx(raw, rel=1e-6)
    holm_ref = sp.posthoc_conover_friedman(y.T, p_adjust="holm")
    assert [p.p_holm for p in t.pairs] == pytest.approx(
        [float(holm_ref.iloc[i, j]) for i, j in itertools.combinations(range(4), 2)], rel=1e-6
    )
    assert "not normal" in t.why


def test_a_drift_that_hits_every_vpn_of_a_round_cancels():
    """The issue's run: nebula and wireguard-go fell to a third in rounds 4-6 (a load came). Unpaired tests
    lose the difference in that drift; within rounds it stands."""
    wg = [3820, 3654, 2852, 1721, 1307, 1454]
    neb = [1222, 1258, 1133, 385, 368, 448]
    openvpn = [1180, 1300, 1250, 420, 400, 390]
    tinc = [600, 640, 610, 210, 205, 230]
    g = {
        n: dict(enumerate(v, 1))
        for n, v in zip(["wg", "neb", "ovpn", "tinc"], [wg, neb, openvpn, tinc], strict=True)
    }
    t = B.blocked({k: {r: float(x) for r, x in v.items()} for k, v in g.items()})
    sig = {(p.a, p.b) for p in t.pairs if p.significant}
    assert {("wg", "neb"), ("wg", "ovpn"), ("wg", "tinc"), ("neb", "tinc"), ("ovpn", "tinc")} <= sig, t.pairs
    u = B.unpaired({k: list(v.values()) for k, v in g.items()}, "")
    unpaired_sig = {(p.a, p.b) for p in u.pairs if p.significant}
    assert unpaired_sig < sig and ("neb", "tinc") not in unpaired_sig, unpaired_sig


def test_the_smallest_detectable_difference_follows_the_formula():
    """Balanced 4 x 6: the contrast's standard error is sqrt(2 MSE / 6); 80% power at Holm's first step
    (alpha / 6 pairs): (t(1 - 0.05 / 12, 15) + t(0.8, 15)) x se, as a ratio."""
    y = _rng_run(11, [1.0, 1.2, 1.4, 1.6], drift=0.0)
    t = B.blocked(_groups(y, list("abcd")))
    z = np.log(y)
    res = z - z.mean(1, keepdims=True) - z.mean(0, keepdims=True) + z.mean()
    mse = float((res**2).sum()) / 15
    se = math.sqrt(2 * mse / 6)
    want = 100 * (math.exp((sst.t.ppf(1 - 0.05 / 12, 15) + sst.t.ppf(0.8, 15)) * se) - 1)
    assert t.mde == pytest.approx(want, rel=1e-9)
    assert t.mde_text() == f"±{want:.0f}%"


def test_zeros_use_the_values_not_their_logs_and_too_few_values_are_excluded():
    g = {"a": {1: 0.0, 2: 1.0, 3: 0.0}, "b": {1: 5.0, 2: 6.0, 3: 5.0}, "c": {2: 3.0}}
    t = B.blocked(g)
    assert not t.log and t.excluded == {"c": "1 value"}
    assert [(p.a, p.b) for p in t.pairs] == [("a", "b")]


def test_identical_constants_are_not_separated_and_exact_shifts_are():
    same = B.blocked({"a": {1: 2.0, 2: 2.0, 3: 2.0}, "b": {1: 2.0, 2: 2.0, 3: 2.0}})
    assert all(p.p_holm == 1.0 for p in same.pairs)
    shift = B.blocked(
        {"a": {1: 2.0, 2: 4.0, 3: 3.0}, "b": {1: 3.0, 2: 6.0, 3: 4.5}}
    )  # b = 1.5 a, every round
    assert all(p.p_holm == 0.0 for p in shift.pairs)


@pytest.mark.slow  # ~10 s: 150 simulated runs per condition and method
def test_the_chosen_method_keeps_its_rate_and_beats_unpaired_under_drift():
    """A small run of scripts/stat-sim.py's simulation, with the product's own methods: under the null with a
    round drift the family-wise false-positive rate stays near alpha (150 runs: +-0.035 at 2 SE), and at a
    1.3x effect the within-round method finds more than Mann-Whitney, which the drift blinds."""
    import importlib.util

    from tree import ROOT

    spec = importlib.util.spec_from_file_location("stat_sim", ROOT / "scripts" / "stat-sim.py")
    assert spec and spec.loader
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    fw, _ = sim.count(sim.product, [1.0] * 4, 6, "lognormal", "mult", 150, 7)
    assert fw <= 0.05 + 0.035
    _, power_new = sim.count(sim.product, [1.0, 1.0, 1.0, 1.3], 6, "lognormal", "mult", 150, 7)
    _, power_old = sim.count(sim.today, [1.0, 1.0, 1.0, 1.3], 6, "lognormal", "mult", 150, 7)
    assert power_new > 0.6 and power_old < 0.2, (power_new, power_old)


def test_unpaired_detectable_difference_is_the_pooled_spread_formula():
    """Mann-Whitney (no shared rounds): the smallest detectable difference from the pooled standard deviation
    of the log values (df = N - k), se = sd sqrt(2 / n), 80% power at Holm's first step (alpha / 2m), worked
    out with scipy's t quantiles; U is scipy's."""
    g = {"a": [1.0, 1.2, 0.9, 1.1], "b": [2.0, 2.4, 1.9, 2.2], "c": [1.5, 1.4, 1.7, 1.6]}
    t = B.unpaired(g, "block order")
    z = [np.log(v) for v in g.values()]
    df = 12 - 3
    sd = math.sqrt(sum(float(((v - v.mean()) ** 2).sum()) for v in z) / df)
    crit = sst.t.ppf(1 - 0.05 / (2 * 3), df) + sst.t.ppf(0.8, df)
    want = 100 * (math.exp(crit * sd * math.sqrt(2 / 4)) - 1)
    assert (t.method, t.why, t.log, t.df) == (B.UNPAIRED, "block order", True, df)
    assert t.mde == pytest.approx(want, rel=1e-9) and t.mde_text("ms") == f"±{want:.0f}%"
    for p in t.pairs:
        assert p.u == sst.mannwhitneyu(g[p.a], g[p.b]).statistic
        assert (p.median_a, p.median_b) == (np.median(g[p.a]), np.median(g[p.b]))
    # a zero among the values: differences in the metric's unit, not ratios
    zero = {"a": [0.0, 1.0, 2.0], "b": [3.0, 4.0, 5.0]}
    t = B.unpaired(zero, "")
    sd = math.sqrt((2 + 2) / 4)
    want = (sst.t.ppf(1 - 0.05 / 2, 4) + sst.t.ppf(0.8, 4)) * sd * math.sqrt(2 / 3)
    assert not t.log and t.mde == pytest.approx(want, rel=1e-9) and t.mde_text("ms") == f"±{want:.3g} ms"
    one = B.unpaired({"a": [1.0]}, "")  # nothing to compare, no spread to pool
    assert one.pairs == [] and one.mde is None and one.df is None and one.mde_text() == ""


def test_what_cannot_be_compared_within_rounds_says_why():
    few = B.blocked({"a": {1: 1.0, 2: 1.1, 3: 1.2}, "b": {2: 2.0}, "c": {}})
    assert few.excluded == {"b": "1 value", "c": "0 values"}
    assert (few.method, few.why, few.pairs) == (B.UNPAIRED, "fewer than two variants to compare", [])
    # two VPNs that share no round: no model with rounds as blocks can be fitted
    apart = B.blocked({"a": {1: 1.0, 2: 1.1}, "b": {3: 2.0, 4: 2.2}, "c": {5: 3.0}})
    assert (apart.method, apart.why) == (B.UNPAIRED, "too few values for a model with rounds as blocks")
    assert apart.excluded == {"c": "1 value"} and [(p.a, p.b) for p in apart.pairs] == [("a", "b")]


def test_the_method_line_names_the_normality_check_it_rests_on():
    names = ["a", "b", "c"]
    y = _rng_run(3, [1.0, 1.1, 1.5])
    t = B.blocked(_groups(y, names))
    df = pd.DataFrame(
        [(n, r, math.log(y[i, r])) for i, n in enumerate(names) for r in range(6)], columns=["v", "r", "y"]
    )
    shapiro = sst.shapiro(smf.ols("y ~ C(v) + C(r)", df).fit().resid).pvalue
    assert (
        t.method == B.TWO_WAY
        and t.why == f"residuals consistent with normal (Shapiro-Wilk p = {shapiro:.2g})"
    )
    # heavy tails in a run where only 2 rounds hold every VPN: too few for ranks, the model stays, and says so
    g = _groups(
        np.array([[1.0, 1.1, 1.0, 9.0, 1.05, 1.0], [2.0, 2.1, 2.0, 2.05, 2.0, 30.0], [3.0, 3.1, 0, 0, 0, 0]]),
        names,
    )
    g["c"] = {1: 3.0, 2: 3.1}
    t = B.blocked(g)
    assert t.method == B.TWO_WAY and t.normality_p is not None and t.normality_p < 0.05, t
    assert t.why == (
        f"residuals not normal (Shapiro-Wilk p = {t.normality_p:.2g}) but fewer than 3 rounds every VPN has: "
        "the model stays"
    )
    assert t.normality_p == pytest.approx(
        sst.shapiro(
            smf.ols(
                "y ~ C(v) + C(r)",
                pd.DataFrame(
                    [(v, r, math.log(x)) for v in g for r, x in g[v].items()], columns=["v", "r", "y"]
                ),
            )
            .fit()
            .resid
        ).pvalue,
        rel=1e-6,
    )


def test_conover_without_spread_is_certain():
    """Every round ranks the VPNs alike: no spread left (Conover's denominator 0): distinct rank sums are a
    certain difference (p 0), equal values in every round none (p 1)."""
    table = np.array([[1.0, 2.0, 2.0, 5.0], [3.0, 4.0, 4.0, 9.0], [0.5, 0.7, 0.7, 0.9]])  # rounds x VPNs
    p, df = B.conover(table)
    assert df == (3 - 1) * (4 - 1)
    assert p[1, 2] == p[2, 1] == 1.0 and p[0, 1] == p[0, 3] == p[1, 3] == p[2, 3] == 0.0
