"""Run-to-run regression checks: match the cases of run A and run B by (VPN, profile, workload label,
metric) and say, per metric, how B changed relative to A, with a CI and a significance test.

A change is a *regression* (and makes `tunnelbench compare` exit 1) when all of these hold:
  - the metric is gated: by default a headline metric with a direction whose unit is Mbit/s, ms or s
    (goodput, RTT percentiles, jitter, connect times); `--metric` picks others. Near-zero rates such as
    loss % or retransmit ratio are reported but not gated by default: their relative change is not stable;
  - the Mann-Whitney U test of A vs B is significant at alpha = 0.05 after Holm correction over all
    compared groups of the same metric;
  - the whole bootstrap 95% CI of the relative change of the median lies beyond the threshold in the
    metric's bad direction (below -threshold for "higher is better", above +threshold for "lower").
So a flag means "we are confident B is worse than A by more than the threshold", not "B's median is lower".

Two runs share no rounds, so A and B are compared unpaired (within a run, VPNs are compared within rounds:
analysis/blocked.py). The samples are the analysis' own (analysis/analyze.py): a repetition something outside
the lab disturbed, or whose traffic took another path, is left out as the run's report leaves it out, and a
group whose cell is disturbed or off-path in either run is shown but never gated (its numbers say what the
machine or the path did, not the release)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tunnelbench.analysis.analyze import RATIO_UNITS, RunData, metric_spec
from tunnelbench.analysis.stats import ALPHA, cliffs_delta, holm, mann_whitney, min_attainable_p, ratio_ci
from tunnelbench.analysis.verdict import DISTURBED, OFF_PATH

DEFAULT_THRESHOLD_PCT = 10.0
# pass/fail security checks (metric -> its passing value): no distribution to test, a pass in A that fails in B
# is a regression whatever the sample sizes
# (revocation is not here: a "still reachable" case fails, and a group that fails in B gates as failed_b)
SECURITY_CHECKS = {"leak_pass": 1.0, "acl_enforced": 1.0}


@dataclass
class Change:
    vpn: str
    profile: str
    label: str
    metric: str
    unit: str
    better: str
    gated: bool
    n_a: int
    n_b: int
    median_a: float
    median_b: float
    change_pct: float  # (median B / median A - 1) * 100
    ci_lo_pct: float
    ci_hi_pct: float
    p: float
    p_holm: float = float("nan")
    cliffs_delta: float = float("nan")  # B vs A
    verdict: str = ""
    limited: str = ""  # "A disturbed", "B off-path", ...: the group is shown, not gated

    @property
    def significant(self) -> bool:
        return not math.isnan(self.p_holm) and self.p_holm < ALPHA

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


@dataclass
class Comparison:
    run_a: str
    run_b: str
    threshold_pct: float
    changes: list[Change]
    only_a: list[tuple[str, str, str]]  # (vpn, profile, label) measured only in A
    only_b: list[tuple[str, str, str]]
    underpowered: list[str]  # metrics whose family cannot reach significance with these sample sizes
    # groups measured in A that B ran but never completed (every attempt failed): the release broke them
    failed_b: list[tuple[str, str, str]] = field(default_factory=list)
    # security checks that passed in A and fail in B: (vpn, profile, label, check); key hygiene is per VPN
    security_b: list[tuple[str, str, str, str]] = field(default_factory=list)

    @property
    def gate_failed(self) -> bool:
        return bool(self.regressions or self.failed_b or self.security_b)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.verdict == "REGRESSION"]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_a": self.run_a,
            "run_b": self.run_b,
            "threshold_pct": self.threshold_pct,
            "alpha": ALPHA,
            "regressions": len(self.regressions),
            "changes": [c.to_json() for c in self.changes],
            "only_a": [list(k) for k in self.only_a],
            "only_b": [list(k) for k in self.only_b],
            "underpowered": self.underpowered,
            "failed_b": [list(k) for k in self.failed_b],
            "security_b": [list(k) for k in self.security_b],
        }


Key = tuple[str, str, str, str]  # (vpn, profile, label, metric)
UNGATED_KINDS = (DISTURBED, OFF_PATH)


def _samples(run: RunData) -> tuple[dict[Key, list[float]], dict[Key, tuple[str, str]], dict[Key, str]]:
    """The run's samples per group as its analysis has them, each group's (unit, workload) (one metric name
    can be two metrics: goodput_sender_mbps of tcp and of udp), and the groups whose cell is disturbed or
    off-path (their verdict kind)."""
    out: dict[Key, list[float]] = {}
    info: dict[Key, tuple[str, str]] = {}
    limited: dict[Key, str] = {}
    for g in run.alone.groups.values():
        k = (g.vpn, g.profile, g.label, g.metric)
        out[k] = list(g.values)
        info[k] = (g.unit, g.workload)
        if g.verdict.kind in UNGATED_KINDS:
            limited[k] = g.verdict.kind
    return out, info, limited


def default_gated(workload: str, metric: str, unit: str, run: RunData) -> bool:
    better, _ = metric_spec(workload, metric, run)
    return better != "none" and run.is_headline(workload, metric) and unit in RATIO_UNITS


def compare_runs(
    a: RunData,
    b: RunData,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    metrics: list[str] | None = None,
    vpn_map: dict[str, str] | None = None,
) -> Comparison:
    """Compare run B against run A. `metrics` restricts the comparison (and the gate) to these metrics;
    `vpn_map` renames A's VPNs to B's (e.g. to compare two drivers) before matching."""
    sa, info_a, lim_a = _samples(a)
    sb, info_b, lim_b = _samples(b)
    if vpn_map:
        sa = {(vpn_map.get(k[0], k[0]), *k[1:]): v for k, v in sa.items()}
        info_a = {(vpn_map.get(k[0], k[0]), *k[1:]): v for k, v in info_a.items()}
        lim_a = {(vpn_map.get(k[0], k[0]), *k[1:]): v for k, v in lim_a.items()}
    info = {**info_a, **info_b}
    keys = [k for k in sa if k in sb and (not metrics or k[3] in metrics)]
    changes: list[Change] = []
    thr = threshold_pct / 100
    for k in keys:
        vpn, profile, label, metric = k
        unit, workload = info[k]
        better, _ = metric_spec(workload, metric, b)  # the newer run's definitions
        gated = (
            (metric in metrics and better != "none") if metrics else default_gated(workload, metric, unit, b)
        )
        xa, xb = np.asarray(sa[k], float), np.asarray(sb[k], float)
        _, p = mann_whitney(xa, xb)
        r, lo, hi = ratio_ci(xb, xa)
        changes.append(
            Change(
                vpn,
                profile,
                label,
                metric,
                unit,
                better,
                gated,
                xa.size,
                xb.size,
                float(np.median(xa)),
                float(np.median(xb)),
                (r - 1) * 100,
                (lo - 1) * 100,
                (hi - 1) * 100,
                p,
                cliffs_delta=cliffs_delta(xb, xa),
                limited=", ".join(
                    f"{side} {kind}" for side, lim in (("A", lim_a), ("B", lim_b)) if (kind := lim.get(k))
                ),
            )
        )
    # Holm within each metric: the family of all matched groups of that metric
    by_metric: dict[str, list[Change]] = defaultdict(list)
    for c in changes:
        by_metric[c.metric].append(c)
    underpowered = []
    for metric, cs in by_metric.items():
        for c, ph in zip(cs, holm([c.p for c in cs]), strict=True):
            c.p_holm = ph
        best = min(min_attainable_p(c.n_a, c.n_b) for c in cs)
        if best * len(cs) >= ALPHA and any(c.gated for c in cs):
            underpowered.append(metric)
    for c in changes:
        c.verdict = _verdict(c, thr)
    changes.sort(key=lambda c: (not c.gated, c.verdict != "REGRESSION", c.vpn, c.profile, c.label, c.metric))
    ga = {k[:3] for k in sa}
    gb = {k[:3] for k in sb}
    ran_b = {(c.vpn, c.profile, c.label) for c in b.cases if c.status in ("ok", "failed")}
    failed_b = sorted(k for k in ga - gb if k in ran_b)
    return Comparison(
        a.run_id,
        b.run_id,
        threshold_pct,
        changes,
        sorted(ga - gb - set(failed_b)),
        sorted(gb - ga),
        underpowered,
        failed_b,
        _security_b(a, b, sa, sb, vpn_map),
    )


def _security_b(
    a: RunData,
    b: RunData,
    sa: dict[tuple[str, str, str, str], list[float]],
    sb: dict[tuple[str, str, str, str], list[float]],
    vpn_map: dict[str, str] | None,
) -> list[tuple[str, str, str, str]]:
    """Pass/fail checks that passed in A (every repetition) and fail in B (any repetition): the leak check per
    group, and key hygiene per VPN (no violation in A, some in B)."""
    out = []
    for k, xb in sb.items():
        good = SECURITY_CHECKS.get(k[3])
        xa = sa.get(k)
        if good is not None and xa and all(x == good for x in xa) and any(x != good for x in xb):
            out.append(k)
    rename = vpn_map or {}
    hyg_a = {rename.get(v, v): n for v, n in a.records.key_violations().items()}
    for vpn, n in b.records.key_violations().items():
        if n and hyg_a.get(vpn) == 0:
            out.append((vpn, "", "", "key_hygiene"))
    return sorted(out)


def _verdict(c: Change, thr: float) -> str:
    if any(math.isnan(x) for x in (c.change_pct, c.ci_lo_pct, c.ci_hi_pct)):
        return "n/a"
    if c.limited:
        return f"not judged ({c.limited})"
    if not c.significant:
        return "no significant change"
    lo, hi = c.ci_lo_pct / 100, c.ci_hi_pct / 100
    if c.better == "none":
        return "changed"
    worse = c.change_pct < 0 if c.better == "higher" else c.change_pct > 0
    if worse:
        beyond = (hi < -thr) if c.better == "higher" else (lo > thr)
        if beyond and c.gated:
            return "REGRESSION"
        return "worse (beyond threshold, not gated)" if beyond else "worse (within threshold)"
    beyond = (lo > thr) if c.better == "higher" else (hi < -thr)
    return "improvement" if beyond else "better (within threshold)"
