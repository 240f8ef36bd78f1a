"""compare_runs (analysis/compare.py) on two hand-made runs whose changes are known, every field of every
change against a reference it did not compute: medians and the relative change by numpy, the change's
interval by scipy's percentile bootstrap drawn as compare draws (its seed and resample count), p by scipy's
Mann-Whitney U, Holm per metric by statsmodels, Cliff's delta (B vs A) from scipy's U; the verdict by the
rules of the module's docstring, one hand-made group per verdict; and the JSON `compare --json` writes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sst
from stat_refs import ratio_ref
from statsmodels.stats.multitest import multipletests
from synthetic_runs import hand_store

from tunnelbench.analysis.analyze import load_run
from tunnelbench.analysis.compare import compare_runs
from tunnelbench.core.results import Outcome, Sample

A_VALUES = [100.0, 101.0, 102.0, 103.0, 104.0, 105.0]
RTT_A = [1.00, 1.01, 1.02, 1.03, 1.04, 1.05]
# (vpn, workload, metric, unit) -> (A, B, the verdict the rules give at a 10% threshold)
GROUPS = {
    ("v1", "tcp", "goodput_mbps", "Mbit/s"): (A_VALUES, [x * 0.7 for x in A_VALUES], "REGRESSION"),
    ("v2", "tcp", "goodput_mbps", "Mbit/s"): (
        A_VALUES,
        [x * 0.95 for x in A_VALUES],
        "worse (within threshold)",
    ),
    ("v3", "tcp", "goodput_mbps", "Mbit/s"): (A_VALUES, [x * 1.3 for x in A_VALUES], "improvement"),
    ("v1", "ping", "rtt_p50_ms", "ms"): (RTT_A, [x * 0.96 for x in RTT_A], "better (within threshold)"),
    ("v2", "ping", "rtt_p50_ms", "ms"): (
        RTT_A,
        [1.005, 1.035, 1.015, 1.045, 1.025, 1.055],
        "no significant change",
    ),
    # not gated (a ratio: near-zero rates are reported, not gated by default), lower is better
    ("v1", "tcp", "retransmit_rate", "ratio"): (
        [0.010, 0.011, 0.012, 0.013, 0.014, 0.015],
        [0.020, 0.021, 0.022, 0.023, 0.024, 0.025],
        "worse (beyond threshold, not gated)",
    ),
    ("v2", "tcp", "retransmit_rate", "ratio"): ([0.0] * 6, [0.01] * 6, "n/a"),  # A's median 0: no ratio
    ("v1", "udp", "goodput_sender_mbps", "Mbit/s"): (
        A_VALUES,
        [x * 2 for x in A_VALUES],
        "changed",
    ),  # no direction
}
GATED = {"goodput_mbps", "rtt_p50_ms"}  # headline metrics with a direction, in Mbit/s, ms or s


def run_of(root: Path, run_id: str, side: int, extra: dict | None = None) -> Path:
    with hand_store(root, ("v1", "v2", "v3"), run_id=run_id) as (st, run_dir):
        for (vpn, wl, metric, unit), values in {
            **{k: v[side] for k, v in GROUPS.items()},
            **(extra or {}),
        }.items():
            for rep, x in enumerate(values, 1):
                adir = run_dir / "cases" / vpn / wl / metric / f"r{rep}"
                adir.mkdir(parents=True)
                cid = st.start_case(run_id, vpn, "baseline", wl, wl, {}, rep, 0, "h1", "h2", adir)
                st.finish_case(cid, "ok", Outcome(samples=[Sample(metric, x, unit)]))
    return run_dir


def change_ci(a: list[float], b: list[float]) -> tuple[float, float]:
    """compare's change CI, in %: scipy's interval of median(b) / median(a)."""
    _, lo, hi = ratio_ref(b, a)
    return 100 * (lo - 1), 100 * (hi - 1)


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    a = load_run(run_of(root, "20260101-000000-tbcmpa", 0))
    b = load_run(run_of(root, "20260101-000001-tbcmpb", 1))
    return compare_runs(a, b, threshold_pct=10.0)


def test_every_change_against_its_reference(comparison):
    got = {(c.vpn, c.metric): c for c in comparison.changes}
    assert set(got) == {(k[0], k[2]) for k in GROUPS}
    holm = {}
    for metric in {k[2] for k in GROUPS}:
        keys = [k for k in GROUPS if k[2] == metric]
        ps = [sst.mannwhitneyu(GROUPS[k][0], GROUPS[k][1]).pvalue for k in keys]
        holm.update(dict(zip(keys, multipletests(ps, method="holm")[1], strict=True)))
    for k, (xa, xb, verdict) in GROUPS.items():
        vpn, wl, metric, unit = k
        c = got[(vpn, metric)]
        assert (c.profile, c.label, c.unit, c.n_a, c.n_b) == ("baseline", wl, unit, 6, 6)
        assert c.gated is (metric in GATED), (k, c.gated)
        assert (c.median_a, c.median_b) == (np.median(xa), np.median(xb))
        assert c.verdict == verdict, (k, c)
        assert c.p == pytest.approx(sst.mannwhitneyu(xa, xb).pvalue, rel=1e-12)
        assert c.p_holm == pytest.approx(holm[k], rel=1e-12)
        u = sst.mannwhitneyu(xb, xa).statistic
        assert c.cliffs_delta == pytest.approx(2 * u / 36 - 1)
        if verdict == "n/a":
            assert math.isnan(c.change_pct) and c.to_json()["change_pct"] is None
            continue
        assert c.change_pct == pytest.approx(100 * (np.median(xb) / np.median(xa) - 1), rel=1e-12)
        assert (c.ci_lo_pct, c.ci_hi_pct) == pytest.approx(change_ci(xa, xb), rel=1e-9)
    # gated first, regressions first among them, then by VPN, profile, label, metric
    order = [(c.gated, c.verdict == "REGRESSION", c.vpn, c.label, c.metric) for c in comparison.changes]
    assert order == sorted(order, key=lambda o: (not o[0], not o[1], *o[2:]))
    assert [c.vpn for c in comparison.regressions] == ["v1"] and comparison.gate_failed


def test_the_json_compare_writes(comparison):
    doc = comparison.to_json()
    assert (doc["run_a"], doc["run_b"], doc["threshold_pct"], doc["alpha"]) == (
        "20260101-000000-tbcmpa",
        "20260101-000001-tbcmpb",
        10.0,
        0.05,
    )
    assert doc["regressions"] == 1 and doc["underpowered"] == []
    assert doc["only_a"] == doc["only_b"] == doc["failed_b"] == doc["security_b"] == []
    assert [(c["vpn"], c["metric"], c["verdict"]) for c in doc["changes"]] == [
        (c.vpn, c.metric, c.verdict) for c in comparison.changes
    ]
    first = doc["changes"][0]
    assert first == {
        "vpn": "v1",
        "profile": "baseline",
        "label": "tcp",
        "metric": "goodput_mbps",
        "unit": "Mbit/s",
        "better": "higher",
        "gated": True,
        "n_a": 6,
        "n_b": 6,
        "median_a": 102.5,
        "median_b": pytest.approx(71.75),
        "change_pct": pytest.approx(-30.0),
        "ci_lo_pct": pytest.approx(change_ci(A_VALUES, [x * 0.7 for x in A_VALUES])[0], rel=1e-9),
        "ci_hi_pct": pytest.approx(change_ci(A_VALUES, [x * 0.7 for x in A_VALUES])[1], rel=1e-9),
        "p": pytest.approx(sst.mannwhitneyu(A_VALUES, [x * 0.7 for x in A_VALUES]).pvalue),
        "p_holm": pytest.approx(comparison.changes[0].p_holm),
        "cliffs_delta": -1.0,
        "verdict": "REGRESSION",
        "limited": "",  # neither group disturbed nor off-path: gated
    }


def test_a_renamed_vpn_a_group_only_one_side_has_and_a_small_family(tmp_path):
    """vpn_map renames A's VPNs before matching; groups measured on one side only are listed; a metric whose
    family cannot reach significance (2 vs 2 repetitions: best exact p 1/3) is named underpowered."""
    extra_a = {("v3", "connect", "connect_s", "s"): [0.1, 0.2]}
    extra_b = {
        ("v3", "connect", "connect_s", "s"): [0.3, 0.4],
        ("v2", "connect", "connect_s", "s"): [0.5, 0.6],
    }
    a = load_run(run_of(tmp_path, "20260101-000000-tbcmpa", 0, extra_a))
    b = load_run(run_of(tmp_path, "20260101-000001-tbcmpb", 1, extra_b))
    cmp = compare_runs(a, b, threshold_pct=10.0, metrics=["goodput_mbps", "connect_s"])
    assert {(c.vpn, c.metric) for c in cmp.changes} == {
        ("v1", "goodput_mbps"),
        ("v2", "goodput_mbps"),
        ("v3", "goodput_mbps"),
        ("v3", "connect_s"),
    }
    assert all(c.gated for c in cmp.changes) and cmp.underpowered == ["connect_s"]
    assert cmp.only_b == [("v2", "baseline", "connect")] and cmp.only_a == []
    # A's v3 renamed to v2: its connect times now stand against B's v2, and B's v3 has no A to match
    renamed = compare_runs(a, b, threshold_pct=10.0, metrics=["connect_s"], vpn_map={"v3": "v2"})
    (c,) = renamed.changes
    assert (c.vpn, c.median_a, c.median_b) == ("v2", pytest.approx(0.15), pytest.approx(0.55))
    assert renamed.only_b == [("v3", "baseline", "connect"), ("v3", "baseline", "tcp")]
