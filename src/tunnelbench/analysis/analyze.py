"""From the store to claims: samples grouped per (VPN, profile, workload label, metric), their statistics,
ratios to the `internal` baseline, significance tiers across VPNs, parallel scaling and CPU efficiency.

Several runs can be analysed together (e.g. two releases of one VPN): each (run, VPN) becomes a *variant*
named after the VPN, or "VPN version" / "VPN @run" when the same VPN appears in more than one run."""

from __future__ import annotations

import functools
import json
import math
import tomllib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tunnelbench.analysis.blocked import Test, blocked, unpaired
from tunnelbench.analysis.emulator import EmulatorFacts, emulator_facts
from tunnelbench.analysis.legacy import Specs, legacy_capabilities, legacy_specs
from tunnelbench.analysis.records import Records
from tunnelbench.analysis.stats import (
    Better,
    Describe,
    Pair,
    Tiering,
    describe,
    min_attainable_p,
    ratio_ci,
    tiers,
)
from tunnelbench.analysis.verdict import CaseFacts, Verdict, is_ceiling_metric, judge, min_kept
from tunnelbench.case_metrics import DAEMON_METRICS
from tunnelbench.core.metrics import MetricSpec
from tunnelbench.store import CaseRow, Store

BASELINE = "internal"
# ratios to the baseline are shown where they read as "x times slower/faster", not for near-zero rates
RATIO_UNITS = ("Mbit/s", "ms", "s")
# differences to another reading (latency under load minus idle) are already relative: no ratio of them
NO_RATIO_PREFIXES = ("added_",)


def is_baseline(variant: str) -> bool:
    """The no-VPN baselines (internal, and internal@mtuNNNN at another underlay MTU): rows to read the VPNs
    against, never contenders in a ranking."""
    return variant.split(" ")[0].split("@")[0] == BASELINE


def has_ratio(metric: str, unit: str) -> bool:
    """Whether "x times the baseline" reads sensibly for this metric."""
    return unit in RATIO_UNITS and not metric.startswith(NO_RATIO_PREFIXES)


FAILED = ("failed", "interrupted", "error")
# DAEMON_METRICS (from case_metrics.py): what the monitor adds to every case per host; analysed separately as CPU
# and memory. Efficiency divides a case's goodput (one stream pair, or multihost's sum over every stream) by
# the daemon CPU of the client and server (goodput_mbps) or of every host (aggregate_goodput_mbps).
EFFICIENCY_GOODPUT = ("goodput_mbps", "aggregate_goodput_mbps")


def metric_spec(workload: str, metric: str, run: RunData | None = None) -> tuple[Better, str]:
    """(better, description) of a metric of a workload: as `run` defined it (`RunData.spec`; today's
    definitions without a run); ("none", "") when undeclared."""
    m = run.spec(workload, metric) if run is not None else _lookup(legacy_specs(), workload, metric)
    return (m.better, m.description) if m is not None else ("none", "")


def _lookup(specs: Specs, workload: str, metric: str) -> MetricSpec | None:
    """A workload's metric in a table of specs, else the runner's own of that name (workload "")."""
    found = specs.get((workload, metric)) or specs.get(("", metric))
    return found[0] if found is not None else None


@dataclass
class RunData:
    """Everything stored about one run, read once."""

    run_dir: Path
    run_id: str
    run: dict[str, Any]
    env: dict[str, str]
    vpns: list[dict[str, Any]]
    cases: list[CaseRow]
    metrics: list[dict[str, Any]]
    phases: dict[str, float]
    store: Store
    # (workload, metric) -> (spec, place among the headline metrics, 0 = not one) as the run stored them
    # ("" = the runner's own); {} for a run from before they were stored
    specs: dict[tuple[str, str], tuple[MetricSpec, int]] = field(default_factory=dict)
    # metric -> (sum, count) over every case that stored it, a disturbed one too (`metrics` holds the ok ones)
    totals: dict[str, tuple[float, int]] = field(default_factory=dict)

    @functools.cached_property
    def definitions(self) -> Specs:
        """The metric definitions to read this run by: the ones it stored, or (a run from before they were
        stored) today's, through the one legacy adaptor (analysis/legacy.py)."""
        return self.specs or legacy_specs()

    def spec(self, workload: str, metric: str) -> MetricSpec | None:
        """A workload's metric as this run defined it (unit, direction, description); None when undeclared."""
        return _lookup(self.definitions, workload, metric)

    def is_headline(self, workload: str, metric: str) -> bool:
        return metric in self.headline(workload)

    def settings(self, vpn: str) -> dict[str, Any]:
        """The VPN's record as the run stored it (`vpn` table: what ran, the capabilities, the feature record);
        {} when there is none or it is not JSON."""
        for v in self.vpns:
            if v["name"] == vpn:
                try:
                    got = json.loads(v.get("settings") or "{}")
                except json.JSONDecodeError:
                    return {}
                return got if isinstance(got, dict) else {}
        return {}

    def capabilities(self, vpn: str) -> dict[str, Any] | None:
        """The VPN's driver capabilities (ACLs, revocation) as the run recorded them; for a run from before
        they were recorded, today's driver of that name (analysis/legacy.py); None when neither says."""
        caps = self.settings(vpn).get("capabilities")
        return caps if isinstance(caps, dict) else legacy_capabilities(vpn)

    @functools.cached_property
    def alone(self) -> Analysis:
        """This run analysed on its own, once (compare and history read its groups)."""
        return analyze([self])

    @functools.cached_property
    def emulator(self) -> EmulatorFacts:
        """What the emulator cost and how the machine drifted (analysis/emulator.py), read once."""
        return emulator_facts(self.env, self.metrics)

    @functools.cached_property
    def records(self) -> Records:
        """The run's recorded facts (calibration, engine tax, key hygiene, drift), read once."""
        return Records.of(self.env)

    @property
    def short(self) -> str:
        return self.run_id.rsplit("-", 1)[-1]

    @property
    def interleaved(self) -> bool:
        """Rounds are blocks: repetition r of every VPN ran before r+1 of any (the run's recorded order)."""
        order = self.env.get("run.order")
        if order is None:
            try:
                order = str(
                    tomllib.loads(self.run["scenario"] or "").get("run", {}).get("order", "interleaved")
                )
            except tomllib.TOMLDecodeError:
                return False
        return order.strip('"') == "interleaved"

    @property
    def scenario_name(self) -> str:
        try:
            return str(tomllib.loads(self.run["scenario"] or "").get("name", ""))
        except tomllib.TOMLDecodeError:
            return ""

    def version(self, vpn: str) -> str | None:
        for v in self.vpns:
            if v["name"] == vpn:
                version: str | None = v["version"]
                return version
        return None

    def series(self, case_ids: list[int], name: str) -> list[dict[str, Any]]:
        return [dict(r) for r in self.store.series(case_ids) if r["name"] == name]

    def headline(self, workload: str) -> tuple[str, ...]:
        """The workload's headline metrics in order, as this run defined them (`definitions`)."""
        ranked = sorted((h, m) for (w, m), (_, h) in self.definitions.items() if w == workload and h > 0)
        return tuple(m for _, m in ranked)

    def failures(self) -> dict[tuple[str, str, str], int]:
        """(vpn, profile, label) -> cases that failed, were interrupted or errored (retries counted)."""
        out: dict[tuple[str, str, str], int] = defaultdict(int)
        for c in self.cases:
            if c.status in FAILED:
                out[(c.vpn, c.profile, c.label)] += 1
        return dict(out)


def load_run(run_dir: Path, run_id: str | None = None) -> RunData:
    """The run (the newest in its store, or `run_id`) read through the store's read-only opener: a store
    it cannot read raises StoreError (store.py); damaged values are left out, named in `store.skipped`."""
    store = Store.open_run_dir(run_dir)
    try:
        run = dict(store.run_row(run_id))
        rid = run["id"]
        env, vpns, cases = store.env(rid), [dict(v) for v in store.vpns(rid)], list(store.cases(rid))
        metrics: list[dict[str, Any]] = []
        totals: dict[str, tuple[float, int]] = {}
        for row in store.metrics(rid, every_status=True):  # the metric table, read once
            m = dict(row)
            s, n = totals.get(m["name"], (0.0, 0))
            totals[m["name"]] = (s + m["value"], n + 1)
            if m.pop("status") == "ok":
                metrics.append(m)
        return RunData(
            run_dir=run_dir,
            run_id=rid,
            run=run,
            env=env,
            vpns=vpns,
            cases=cases,
            metrics=metrics,
            phases=store.phases(rid),
            store=store,
            specs=store.metric_specs(rid),
            totals=totals,
        )
    except BaseException:
        store.close()
        raise


@dataclass
class Group:
    """The samples of one (variant, profile, label, metric): one value per successful repetition."""

    variant: str
    run_id: str
    vpn: str
    version: str | None
    profile: str
    workload: str
    label: str
    metric: str
    unit: str
    better: Better
    values: list[float] = field(default_factory=list)
    case_ids: list[int] = field(default_factory=list)
    reps: list[int] = field(
        default_factory=list
    )  # each value's repetition (its round, in an interleaved run)
    # repetitions kept out of the ranking (disturbed, off-path): (case id, value, why); the cell is ranked on
    # the others when enough remain (verdict.min_kept), else it shows every value under that verdict
    left_out: list[tuple[int, float, str]] = field(default_factory=list)
    desc: Describe | None = None
    ratio: tuple[float, float, float] | None = None  # (median / baseline median, CI lo, CI hi)
    verdict: Verdict = field(default_factory=Verdict)  # measured, or what limited it (analysis/verdict.py)
    params: dict[str, Any] = field(
        default_factory=dict
    )  # the workload's parameters, as its cases stored them

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.variant, self.profile, self.label, self.metric)


@dataclass
class Family:
    """One metric under one profile and workload label, across variants: pairwise tests and tiers."""

    profile: str
    label: str
    workload: str
    metric: str
    unit: str
    better: Better
    groups: dict[str, Group]  # variant -> group
    tiering: Tiering | None = None  # among the VPNs whose cells are ranked; the baselines are not contenders
    test: Test | None = None  # how the pairs were compared (analysis/blocked.py)

    @property
    def pairs(self) -> list[Pair]:
        return self.tiering.pairs if self.tiering else []

    def order(self) -> list[str]:
        """Every variant for display: the baselines first, then the ranked VPNs best first, then the cells
        that take no tier (limited, or too few values) by median in the metric's direction."""
        ranked = self.tiering.order if self.tiering else []
        rest = [v for v in self.groups if v not in ranked and not is_baseline(v)]

        def med(v: str) -> float:
            d = self.groups[v].desc
            m = d.median if d is not None else math.nan
            return -m if self.better == "higher" else m

        return [v for v in self.groups if is_baseline(v)] + ranked + sorted(rest, key=med)

    def tier_of(self, variant: str) -> int | None:
        """The VPN's significance tier; None for a baseline, a limited cell, or one not compared."""
        if self.tiering is None or self.better == "none":
            return None
        return self.tiering.tier.get(variant)

    @property
    def underpowered(self) -> bool:
        """True when no pair can reach significance after Holm correction, whatever the data (only an
        unpaired exact test has such a floor; the blocked methods say what they could detect instead)."""
        m = len(self.pairs)
        if m == 0 or (self.test is not None and self.test.method != "unpaired"):
            return False
        best = min(min_attainable_p(p.n_a, p.n_b) for p in self.pairs)
        return best * m >= 0.05


@dataclass
class Derived:
    """A derived quantity of a (variant, profile[, label]) with a CI: parallel scaling, CPU efficiency."""

    variant: str
    profile: str
    label: str
    value: float
    lo: float
    hi: float
    n: int
    unit: str
    note: str = ""


@dataclass
class Usage:
    """Daemon CPU (mean over the case, % of one core) and peak RSS on the client and the server host."""

    variant: str
    profile: str
    label: str
    cpu_client: Describe | None
    cpu_server: Describe | None
    rss_client_mb: float | None
    rss_server_mb: float | None


@dataclass
class Analysis:
    runs: list[RunData]
    variants: list[str]  # in run order, then scenario order
    variant_of: dict[tuple[str, str], str]  # (run_id, vpn) -> variant
    groups: dict[tuple[str, str, str, str], Group]
    families: list[Family]
    scaling: list[Derived]
    efficiency: list[Derived]
    usage: list[Usage]
    profiles: list[str]
    labels: list[str]
    # workload -> its headline metrics in order, as the newest run that measured it defined them
    headlines: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def family(self, profile: str, label: str, metric: str) -> Family | None:
        for f in self.families:
            if (f.profile, f.label, f.metric) == (profile, label, metric):
                return f
        return None

    def headline_families(self) -> list[Family]:
        return [f for f in self.families if self.is_headline(f)]

    def headline(self, workload: str) -> tuple[str, ...]:
        """A workload's headline metrics in order, as the newest run that measured it defined them."""
        return self.headlines.get(workload, ())

    def is_headline(self, f: Family) -> bool:
        return f.metric in self.headline(f.workload)

    def run_of(self, variant: str) -> RunData:
        for (rid, _), v in self.variant_of.items():
            if v == variant:
                return next(r for r in self.runs if r.run_id == rid)
        raise KeyError(variant)


def _variants(runs: list[RunData]) -> tuple[list[str], dict[tuple[str, str], str]]:
    seen: list[tuple[str, str, str | None]] = []
    for r in runs:
        names = [v["name"] for v in r.vpns] + [c.vpn for c in r.cases]
        for vpn in dict.fromkeys(names):
            seen.append((r.run_id, vpn, r.version(vpn)))
    by_vpn: dict[str, list[tuple[str, str, str | None]]] = defaultdict(list)
    for t in seen:
        by_vpn[t[1]].append(t)
    out: dict[tuple[str, str], str] = {}
    for vpn, ts in by_vpn.items():
        versions = [t[2] for t in ts]
        for rid, _, ver in ts:
            if len(ts) == 1:
                name = vpn
            elif all(versions) and len(set(versions)) == len(versions):
                name = f"{vpn} {ver}"
            else:
                name = f"{vpn} @{rid.rsplit('-', 1)[-1]}"
            out[(rid, vpn)] = name
    return [out[(rid, vpn)] for rid, vpn, _ in seen], out


def _latest_ok(cases: list[CaseRow]) -> set[int]:
    """The ids of successful cases (a repetition has at most one: retries stop at the first success)."""
    return {c.id for c in cases if c.status == "ok"}


def analyze(runs: list[RunData]) -> Analysis:
    variants, variant_of = _variants(runs)
    groups: dict[tuple[str, str, str, str], Group] = {}
    # per case: the headline goodput and daemon CPU per role, for efficiency
    per_case: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    usage_raw: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    facts: dict[tuple[str, int], CaseFacts] = defaultdict(CaseFacts)  # per case: its instruments, its engine
    profiles: list[str] = []
    labels: list[str] = []
    for r in runs:
        case_by_id = {c.id: c for c in r.cases}
        ok = _latest_ok(r.cases)
        for c in r.cases:
            if c.profile not in profiles and c.status not in ("skipped", "n/a"):
                profiles.append(c.profile)
            if c.label not in labels and c.status not in ("skipped", "n/a"):
                labels.append(c.label)
        for m in r.metrics:
            cid = m["case_id"]
            if cid not in ok:
                continue
            c = case_by_id[cid]
            var = variant_of[(r.run_id, c.vpn)]
            name, host = m["name"], m["host"]
            facts[(r.run_id, cid)].add(name, m["value"])
            if name in DAEMON_METRICS:
                if name == "daemon_cpu_pct" and host is not None:  # every host's daemons, for multihost
                    d = per_case[(r.run_id, cid)]
                    d["daemon_cpu_pct:all"] = d.get("daemon_cpu_pct:all", 0.0) + m["value"]
                    d["hosts"] = d.get("hosts", 0) + 1
                role = "client" if host == c.client else "server" if host == c.server else None
                if role:
                    per_case[(r.run_id, cid)][f"{name}:{role}"] = m["value"]
                    usage_raw[(var, c.profile, c.label)][f"{name}:{role}"].append(m["value"])
                continue
            if host is not None:
                continue  # other per-host metrics are not yet analysed
            key = (var, c.profile, c.label, name)
            g = groups.get(key)
            if g is None:
                better, _ = metric_spec(c.workload, name, r)
                g = groups[key] = Group(
                    var,
                    r.run_id,
                    c.vpn,
                    r.version(c.vpn),
                    c.profile,
                    c.workload,
                    c.label,
                    name,
                    m["unit"],
                    better,
                    params=c.params,
                )
            g.values.append(m["value"])
            g.case_ids.append(cid)
            g.reps.append(c.repetition)
            if name in EFFICIENCY_GOODPUT:
                per_case[(r.run_id, cid)][name] = m["value"]
    for g in groups.values():  # repetitions left out of the ranking (disturbed, off-path)
        why = [facts[(g.run_id, cid)].left_out for cid in g.case_ids]
        if any(why) and sum(w is None for w in why) >= min_kept(len(why)):
            g.left_out = [(cid, v, w) for cid, v, w in zip(g.case_ids, g.values, why, strict=True) if w]
            keep = [i for i, w in enumerate(why) if w is None]
            g.values = [g.values[i] for i in keep]
            g.case_ids = [g.case_ids[i] for i in keep]
            g.reps = [g.reps[i] for i in keep]
    # statistics and ratios to the baseline of the same run and profile
    base_variant = {r.run_id: variant_of.get((r.run_id, BASELINE)) for r in runs}
    for g in groups.values():
        g.desc = describe(g.values)
        bv = base_variant.get(g.run_id)
        if bv and bv != g.variant and has_ratio(g.metric, g.unit):
            base = groups.get((bv, g.profile, g.label, g.metric))
            if base and base.values:
                g.ratio = ratio_ci(g.values, base.values)
    _judge(runs, groups, facts, base_variant)
    # families: per (profile, label, metric) across variants
    fam: dict[tuple[str, str, str], dict[str, Group]] = defaultdict(dict)
    for g in groups.values():
        fam[(g.profile, g.label, g.metric)][g.variant] = g
    rank = {v: i for i, v in enumerate(variants)}
    families = []
    for (profile, label, metric), gs in fam.items():
        any_g = next(iter(gs.values()))
        gs = dict(sorted(gs.items(), key=lambda kv: rank.get(kv[0], 99)))
        f = Family(profile, label, any_g.workload, metric, any_g.unit, any_g.better, gs)
        # limited cells and the no-VPN baselines take no tier: the VPNs are ranked among themselves
        ranked = {v: g for v, g in gs.items() if g.verdict.ranked and not is_baseline(v) and g.values}
        if len(ranked) > 1:
            f.test = _test(ranked, runs)
            compared = {v: g.values for v, g in ranked.items() if v not in f.test.excluded}
            if len(compared) > 1:
                f.tiering = tiers(compared, any_g.better, f.test.pairs)
        families.append(f)
    lrank = {lb: i for i, lb in enumerate(labels)}
    prank = {p: i for i, p in enumerate(profiles)}
    families.sort(key=lambda f: (prank.get(f.profile, 99), lrank.get(f.label, 99), f.metric))
    return Analysis(
        runs,
        variants,
        variant_of,
        groups,
        families,
        _scaling(groups, variants),
        _efficiency(runs, variant_of, per_case),
        _usage(usage_raw, variants),
        profiles,
        labels,
        {wl: r.headline(wl) for r in runs for wl in dict.fromkeys(c.workload for c in r.cases)},
    )


def _test(groups: dict[str, Group], runs: list[RunData]) -> Test:
    """Every pair of a family's ranked cells, compared within rounds when they share them (one interleaved
    run), else unpaired, saying why (analysis/blocked.py)."""
    run_ids = {g.run_id for g in groups.values()}
    if len(run_ids) > 1:
        return unpaired(
            {v: g.values for v, g in groups.items()}, "the VPNs come from different runs (no common rounds)"
        )
    run = next(r for r in runs if r.run_id in run_ids)
    if not run.interleaved:
        return unpaired({v: g.values for v, g in groups.items()}, "block order: repetitions are not rounds")
    return blocked({v: dict(zip(g.reps, g.values, strict=True)) for v, g in groups.items()})


def _judge(
    runs: list[RunData],
    groups: dict[tuple[str, str, str, str], Group],
    facts: dict[tuple[str, int], CaseFacts],
    base_variant: dict[str, str | None],
) -> None:
    """Each group's verdict from its cases' facts, its ratio to the baseline and the VPN's engine tax."""
    taxes = {r.run_id: {p.profile: p.tax_ci for p in r.emulator.profiles if p.mode} for r in runs}
    misses = {r.run_id: r.records.calibration_misses() for r in runs}
    for g in groups.values():
        base = groups.get((base_variant.get(g.run_id) or "", g.profile, g.label, g.metric))
        ceiling = g.ratio if is_ceiling_metric(g.unit, g.better) and g.vpn != BASELINE else None
        g.verdict = judge(
            [facts[(g.run_id, cid)] for cid in g.case_ids],
            ceiling=ceiling if ceiling and not any(map(math.isnan, ceiling)) else None,
            baseline_median=base.desc.median if base and base.desc else None,
            tax_pct=taxes.get(g.run_id, {}).get(g.profile, {}).get(g.vpn),
            calibration=misses.get(g.run_id, {}).get(g.profile, ()),
        )


def _streams(g: Group) -> int | None:
    """The parallel TCP streams of a tcp group (its stored `streams` parameter); None for another workload."""
    return int(g.params.get("streams", 1)) if g.workload == "tcp" else None


def _scaling(groups: dict[tuple[str, str, str, str], Group], variants: list[str]) -> list[Derived]:
    """Parallel scaling factor: goodput of N tcp streams / goodput of one stream with the same engine and
    transfer (medians, bootstrap CI), the stream count read from the cases' stored parameters."""
    out = []
    for (var, profile, label, metric), g in groups.items():
        n = _streams(g)
        if n is None or n < 2 or metric != "goodput_mbps":
            continue
        same = ("engine", "bytes")
        single = next(
            (
                s
                for s in groups.values()
                if (s.variant, s.profile, s.metric) == (var, profile, metric)
                and _streams(s) == 1
                and all(s.params.get(k) == g.params.get(k) for k in same)
            ),
            None,
        )
        if not single:
            continue
        r, lo, hi = ratio_ci(g.values, single.values)
        out.append(
            Derived(
                var,
                profile,
                label,
                r,
                lo,
                hi,
                min(len(g.values), len(single.values)),
                "×",
                f"{n} streams / 1 stream",
            )
        )
    rank = {v: i for i, v in enumerate(variants)}
    return sorted(out, key=lambda d: (d.profile, rank.get(d.variant, 99), d.label))


def _efficiency(
    runs: list[RunData],
    variant_of: dict[tuple[str, str], str],
    per_case: dict[tuple[str, int], dict[str, float]],
) -> list[Derived]:
    """Goodput per daemon CPU-core: per case goodput / ((client + server daemon CPU %) / 100); for multihost
    (aggregate_goodput_mbps: many peers at once) the sum of every stream over every host's daemon CPU."""
    vals: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    notes: dict[tuple[str, str, str], str] = {}
    for r in runs:
        for c in r.cases:
            d = per_case.get((r.run_id, c.id))
            if not d:
                continue
            if "aggregate_goodput_mbps" in d:
                goodput, cpu = d["aggregate_goodput_mbps"], d.get("daemon_cpu_pct:all")
                note = f"daemon CPU of every host ({int(d.get('hosts', 0))})"
            elif "goodput_mbps" in d:
                goodput, cpu = d["goodput_mbps"], None
                if "daemon_cpu_pct:client" in d or "daemon_cpu_pct:server" in d:
                    cpu = d.get("daemon_cpu_pct:client", 0.0) + d.get("daemon_cpu_pct:server", 0.0)
                note = "client + server daemon CPU"
            else:
                continue
            if cpu is None:
                continue
            key = (variant_of[(r.run_id, c.vpn)], c.profile, c.label)
            if cpu / 100 > 0.005:  # below half a percent of a core the quotient means nothing
                vals[key].append(goodput / (cpu / 100))
                notes.setdefault(key, note)
    out = []
    for key, note in notes.items():
        desc = describe(vals[key])
        out.append(Derived(*key, desc.median, desc.ci_lo, desc.ci_hi, desc.n, "Mbit/s per core", note))
    return out


def _usage(raw: dict[tuple[str, str, str], dict[str, list[float]]], variants: list[str]) -> list[Usage]:
    out = []
    for (var, profile, label), d in raw.items():

        def desc(k: str, d: dict[str, list[float]] = d) -> Describe | None:
            return describe(d[k]) if d.get(k) else None

        out.append(
            Usage(
                var,
                profile,
                label,
                desc("daemon_cpu_pct:client"),
                desc("daemon_cpu_pct:server"),
                max(d["daemon_rss_mb:client"]) if d.get("daemon_rss_mb:client") else None,
                max(d["daemon_rss_mb:server"]) if d.get("daemon_rss_mb:server") else None,
            )
        )
    rank = {v: i for i, v in enumerate(variants)}
    return sorted(out, key=lambda u: (u.profile, rank.get(u.variant, 99), u.label))


def fmt_ci(value: float, lo: float, hi: float, fmt: Callable[[float], str] = lambda v: f"{v:.3g}") -> str:
    if any(math.isnan(x) for x in (value, lo, hi)):
        return fmt(value) if not math.isnan(value) else "–"
    return f"{fmt(value)} [{fmt(lo)}, {fmt(hi)}]"


def all_values(groups: list[Group]) -> np.ndarray:
    return np.concatenate([np.asarray(g.values, float) for g in groups]) if groups else np.array([])
