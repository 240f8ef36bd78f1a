"""The full report of one or more runs: a self-contained HTML page (styles and SVG plots inline, no
scripts, no external requests) and a Markdown summary for pasting into issues and papers."""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from tunnelbench.analysis.analyze import Analysis, Derived, Family, RunData, is_baseline
from tunnelbench.analysis.emulator import facts_lines
from tunnelbench.analysis.records import Records
from tunnelbench.analysis.stats import ALPHA, cliffs_magnitude
from tunnelbench.analysis.verdict import SHORT
from tunnelbench.core.files import write_atomic
from tunnelbench.report import plots
from tunnelbench.report.flamegraphs import render_all as render_flamegraphs
from tunnelbench.report.fmt import code, md, num
from tunnelbench.report.headline import CAPTION, Headline
from tunnelbench.report.reading import Reading
from tunnelbench.report.security import COLUMNS as SECURITY_COLUMNS
from tunnelbench.store import CaseRow

LOG_TAIL_LINES = 25
MAX_LOG_FILES = 6


def _ts(t: float | None) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if t else "–"


def ci(lo: float, hi: float, unit: str = "") -> str:
    if math.isnan(lo) or math.isnan(hi):
        return "–"
    return f"[{num(lo, unit)}, {num(hi, unit)}]"


def ratio_txt(r: tuple[float, float, float] | None) -> str:
    if not r or math.isnan(r[0]):
        return ""
    return f"{r[0]:.3g} [{r[1]:.3g}, {r[2]:.3g}]"


def pct(v: float) -> str:
    return "–" if math.isnan(v) else f"{100 * v:+.1f}%"


def pval(p: float) -> str:
    if math.isnan(p):
        return "–"
    return f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"(unreadable: {e})"
    return "\n".join(text.splitlines()[-lines:])


# -- context ---------------------------------------------------------------------------------------------
def _family_ctx(f: Family) -> dict[str, Any]:
    t = f.tiering
    rows = []
    for rank, v in enumerate(f.order(), 1):
        g = f.groups[v]
        d = g.desc
        assert d is not None
        tier = f.tier_of(v)
        rows.append(
            {
                "rank": rank,
                "variant": v,
                # no tier: the baseline (the reference), a limited cell (its verdict), one not compared
                "tier": tier
                if tier is not None
                else ("ref" if is_baseline(v) else SHORT.get(g.verdict.kind, "–")),
                "n": d.n,
                "median": num(d.median, f.unit),
                "ci": ci(d.ci_lo, d.ci_hi, f.unit),
                "mean": num(d.mean, f.unit),
                "cv": "–" if math.isnan(d.cv) else f"{100 * d.cv:.1f}%",
                "ratio": ratio_txt(g.ratio),
            }
        )
    pairs = [
        {
            "a": p.a,
            "b": p.b,
            "rel": pct(p.rel_median_diff),
            "delta": f"{p.cliffs_delta:+.2f}",
            "mag": cliffs_magnitude(p.cliffs_delta),
            "p": pval(p.p),
            "p_holm": pval(p.p_holm),
            "sig": p.significant,
        }
        for p in f.pairs
    ]
    return {
        "profile": f.profile,
        "label": f.label,
        "metric": f.metric,
        "unit": f.unit,
        "better": f.better,
        "rows": rows,
        "pairs": pairs,
        "underpowered": f.underpowered,
        "method": f.test.text if f.test else "",
        "method_why": f.test.why if f.test else "",
        "mde": f.test.mde_text(f.unit) if f.test else "",
        "tiers": " > ".join("{" + ", ".join(gr) + "}" for gr in t.groups()) if t else "",
        "plot": plots.ranking(f),
    }


def _series_by_variant(
    a: Analysis, profile: str, label: str, name: str
) -> dict[str, list[list[tuple[float, float]]]]:
    """variant -> list (per repetition) of [(t, value)] of a stored series."""
    out: dict[str, list[list[tuple[float, float]]]] = defaultdict(list)
    for v in a.variants:
        run = a.run_of(v)
        ids = [
            c.id
            for c in run.cases
            if c.status == "ok"
            and c.profile == profile
            and c.label == label
            and a.variant_of[(run.run_id, c.vpn)] == v
        ]
        if not ids:
            continue
        rows = [r for r in run.series(ids, name) if r["host"] is None or name == "rtt_ms"]
        for _, pts in sorted(plots.pooled(rows).items()):
            out[v].append(sorted(pts))
    return out


def _clients_curve(a: Analysis, profile: str) -> str | None:
    curves = clients_points(a, profile)
    return plots.clients_curve(curves, f"many clients · {profile}") if curves else None


def _profile_defs(a: Analysis) -> dict[str, Any]:
    """Profile name -> its definition (the run's own [impair.profiles] over the built-in ones)."""
    import tomllib

    from tunnelbench.impair.profiles import PROFILES, Profile

    defs: dict[str, Any] = dict(PROFILES)
    for r in a.runs:
        try:
            own = tomllib.loads(r.run["scenario"] or "").get("impair", {}).get("profiles", {})
        except tomllib.TOMLDecodeError:
            continue
        for name, d in own.items():
            try:
                defs[name] = Profile(**d)
            except ValueError:
                continue
    return defs


def degradation_points(a: Analysis) -> dict[str, dict[str, dict[float, dict[str, list[float]]]]]:
    """Seed 001's degradation sweeps: per axis ("loss_pct" over profiles that only lose packets, "delay_ms"
    over profiles that only delay them; baseline is 0 on both), variant -> x -> the many-clients repetitions'
    failure rates and response p50s at the largest N. Empty unless some axis has at least two points."""
    defs = _profile_defs(a)
    out: dict[str, dict[str, dict[float, dict[str, list[float]]]]] = {"loss_pct": {}, "delay_ms": {}}
    for profile in a.profiles:
        d = defs.get(profile)
        if d is None:
            continue
        if d.is_baseline:
            axes = [("loss_pct", 0.0), ("delay_ms", 0.0)]
        elif d.loss_pct > 0 and d.delay_ms == 0 and d.jitter_ms == 0 and d.rate_mbit is None:
            axes = [("loss_pct", d.loss_pct)]
        elif d.delay_ms > 0 and d.loss_pct == 0 and d.rate_mbit is None:
            axes = [("delay_ms", d.delay_ms)]
        else:
            continue
        for v, per_n in clients_points(a, profile).items():
            n = max(per_n)
            for axis, x in axes:
                out[axis].setdefault(v, {})[x] = {
                    "fail": per_n[n].get("fail", []),
                    "p50": per_n[n].get("p50", []),
                }
    return {ax: vs for ax, vs in out.items() if any(len(xs) > 1 for xs in vs.values())}


def clients_points(a: Analysis, profile: str) -> dict[str, dict[int, dict[str, list[float]]]]:
    """The many-clients curve of a profile: variant -> N -> the repetitions' response p25/p50/p75 and failure
    rates ("fail"); a repetition whose case failed (the mesh did not come up, no call made) is 100% failed and
    also listed in "failed_cases"."""
    curves: dict[str, dict[int, dict[str, list[float]]]] = {}
    for v in a.variants:
        run = a.run_of(v)
        last: dict[tuple[str, int], CaseRow] = {}  # the final attempt of each (label, repetition)
        for c in sorted(run.cases, key=lambda c: c.attempt):
            if (c.workload == "many_clients" and c.profile == profile and c.status in ("ok", "failed")
                    and a.variant_of[(run.run_id, c.vpn)] == v):  # fmt: skip
                last[(c.label, c.repetition)] = c
        if not last:
            continue
        vals: dict[int, dict[str, float]] = defaultdict(dict)
        for m in run.metrics:
            if m["host"] is None:
                vals[m["case_id"]][m["name"]] = m["value"]
        per_n: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for c in last.values():
            n = int(c.params.get("clients", 5))
            got = vals.get(c.id, {})
            if c.status == "ok" and "failure_rate_pct" in got:
                per_n[n]["fail"].append(got["failure_rate_pct"])
                for q in ("p25", "p50", "p75"):
                    if f"response_{q}_ms" in got:
                        per_n[n][q].append(got[f"response_{q}_ms"])
            else:
                per_n[n]["fail"].append(100.0)
                per_n[n]["failed_cases"].append(1)
        curves[v] = {n: dict(d) for n, d in per_n.items()}
    return curves


def _per_peer_plots(a: Analysis, profile: str, label: str) -> list[str]:
    """Per variant: the first successful repetition's per-peer goodput series (multihost stores one per peer
    and direction, host = the peer), titled with that case's Jain fairness index."""
    out = []
    for v in a.variants:
        run = a.run_of(v)
        case = next(
            (
                c
                for c in sorted(run.cases, key=lambda c: (c.repetition, c.id))
                if c.status == "ok"
                and c.profile == profile
                and c.label == label
                and a.variant_of[(run.run_id, c.vpn)] == v
            ),
            None,
        )
        if case is None:
            continue
        streams: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
        for d in ("tx", "rx"):
            for r in run.series([case.id], f"{d}_goodput_mbps"):
                if r["host"] is not None:
                    streams[d][r["host"]].append((r["t"], r["value"]))
        jain = [m["value"] for m in run.metrics if m["case_id"] == case.id and m["name"] == "stream_fairness"]
        fair = f"Jain fairness {jain[0]:.3f}" if jain else "fairness not stored"
        svg = plots.per_peer(
            streams, f"{v} · {label} · {profile} · repetition {case.repetition}: per-peer goodput ({fair})"
        )
        if svg:
            out.append(svg)
    return out


def _rss_lines(a: Analysis, profile: str) -> plots.RssLines:
    """The stored daemon RSS series (per host) of every successful case of a profile, pooled."""
    rows, cases = [], {}
    for r in a.runs:
        ok = {c.id: c for c in r.cases if c.status == "ok" and c.profile == profile}
        for c in ok.values():
            cases[(r.run_id, c.id)] = (a.variant_of[(r.run_id, c.vpn)], c.label, c.client, c.server)
        rows += [{**x, "case_id": (r.run_id, x["case_id"])} for x in r.series(list(ok), "daemon_rss_mb")]
    return plots.rss_lines(rows, cases)


def _features(a: Analysis) -> list[dict[str, Any]]:
    """Each VPN's feature record as its run stored it (vpn settings "features", written by the runner from
    the driver's record and the lab's probes at the time): a run from before a record changed keeps its
    own, and a run that stored none shows none."""
    return [
        {
            "variant": f["variant"],
            "features": {k: _jsonish(x) for k, x in sorted(f["raw"].items())},
            "settings": f["settings"],
        }
        for f in _feature_records(a)
    ]


def _nat_matrix(a: Analysis) -> dict[str, Any] | None:
    """The NAT-traversal matrix (`tunnelbench nat-matrix`): the `nat_matrix` probed fact of each VPN's feature
    record, {"NAT type x NAT type": "direct (97% direct)" | "relayed (0% direct)" | "failed" | ...}, as a table:
    one row per VPN, one column per NAT pair. None when no VPN of the report has one."""
    rows, pairs = [], []
    for f in _feature_records(a):
        fact = f["raw"].get("nat_matrix")
        value = fact.get("value") if isinstance(fact, dict) else None
        if not isinstance(value, dict):
            continue
        pairs += [p for p in value if p not in pairs]
        rows.append({"variant": f["variant"], "cells": value, "source": str(fact.get("source", ""))})
    if not rows:
        return None
    for r in rows:
        r["cells"] = [(r["cells"].get(p, "-"), str(r["cells"].get(p, "-")).split(" ")[0]) for p in pairs]
    return {"pairs": pairs, "rows": rows}


def _feature_records(a: Analysis) -> list[dict[str, Any]]:
    out = []
    for r in a.runs:
        for v in r.vpns:
            settings = r.settings(v["name"])
            feats = settings.get("features")
            out.append(
                {
                    "variant": a.variant_of.get((r.run_id, v["name"]), v["name"]),
                    "raw": feats if isinstance(feats, dict) else {},
                    # what ran; the feature record and the capabilities have their own sections
                    "settings": {
                        k: _jsonish(x) for k, x in settings.items() if k not in ("features", "capabilities")
                    },
                }
            )
    return out


def _jsonish(v: object) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _calibration(r: RunData) -> dict[str, Any]:
    profiles = []
    for name, d in r.records.calibrations.items():
        if isinstance(d, dict) and isinstance(d.get("checks"), list):
            profiles.append(
                {
                    "name": name,
                    "summary": d.get("summary", ""),
                    "backend": d.get("backend", ""),
                    "ok": d.get("ok"),
                    "checks": [
                        {**c, "configured": num(c.get("configured")), "measured": num(c.get("measured"))}
                        for c in d["checks"]
                    ],
                }
            )
        else:
            profiles.append({"name": name, "summary": d, "backend": "", "ok": None, "checks": []})
    return {"base": r.records.calibration_base, "profiles": profiles}


def _failures(r: RunData, a: Analysis) -> list[dict[str, Any]]:
    out = []
    for c in r.cases:
        if c.status in ("ok", "running"):
            continue
        d = Path(c.artifact_dir) if c.artifact_dir else None
        logs = []
        error_txt = ""
        if d and str(d) not in ("", ".") and d.is_dir():
            if (d / "error.txt").exists():
                error_txt = tail(d / "error.txt")
            ld = d / "daemon-logs"
            if ld.is_dir():
                for p in sorted(ld.iterdir())[:MAX_LOG_FILES]:
                    logs.append({"name": p.name, "text": tail(p)})
            for name in ("diagnostics.txt", "dmesg.txt"):  # the case's pcap and kernel log (diagnostics/)
                if (d / name).is_file() and (d / name).stat().st_size:
                    logs.append({"name": name, "text": tail(d / name)})
        out.append(
            {
                "variant": a.variant_of.get((r.run_id, c.vpn), c.vpn),
                "profile": c.profile,
                "label": c.label,
                "rep": c.repetition,
                "attempt": c.attempt + 1,
                "status": c.status,
                "error": c.error or "",
                "error_txt": error_txt,
                "logs": logs,
                "dir": str(d) if d and str(d) not in ("", ".") else "",
            }
        )
    return out


def _emulator(r: RunData) -> dict[str, Any]:
    f = r.emulator
    taxes = []
    for vpn, t in f.taxes.items():
        for mode, c in t.items():
            if isinstance(c, dict):
                taxes.append(
                    {
                        "vpn": vpn,
                        "mode": mode,
                        "off": num(statistics.median(c["off_mbps"])),
                        "on": num(statistics.median(c["on_mbps"])),
                        "tax": f"{c['tax_pct']:+.1f}%"
                        + (
                            f" [{c['tax_lo']:+.1f}, {c['tax_hi']:+.1f}]"
                            if isinstance(c.get("tax_lo"), int | float)
                            and isinstance(c.get("tax_hi"), int | float)
                            else ""
                        ),
                        # clearly above the line (its interval's low end; a run from before: the point)
                        "flagged": float(
                            c["tax_lo"] if isinstance(c.get("tax_lo"), int | float) else c["tax_pct"]
                        )
                        > 10,
                        "n": len(c["off_mbps"]),
                        "cpu": num(statistics.median(c["engine_cpu_pct"]))
                        if c.get("engine_cpu_pct")
                        else "–",
                    }
                )
    return {"lines": facts_lines(f), "taxes": taxes, "any": bool(f.placement or f.profiles or f.drift.points)}


def _rounds(a: Analysis) -> list[str]:
    """Per-round plots (value per repetition / its median, with the drift reference) per headline metric."""
    out = []
    for r in a.runs:
        drift = [p["goodput_mbps"] for p in r.emulator.drift.points if "goodput_mbps" in p]
        rep_of = {c.id: c.repetition for c in r.cases}
        for f in a.headline_families():
            per_round: dict[str, dict[int, float]] = {}
            for v, g in f.groups.items():
                if g.run_id != r.run_id:
                    continue
                for cid, val in zip(g.case_ids, g.values, strict=False):
                    per_round.setdefault(v, {})[rep_of.get(cid, 0)] = val
            if max((len(x) for x in per_round.values()), default=0) < 2:
                continue
            svg = plots.rounds(a, per_round, drift, f"per round · {f.label} · {f.metric} · {f.profile}")
            if svg:
                out.append(svg)
    return out


def build_context(rd: Reading) -> dict[str, Any]:
    a = rd.analysis
    runs = []
    for r in a.runs:
        runs.append(
            {
                "id": r.run_id,
                "scenario": r.scenario_name,
                "status": r.run["status"],
                "started": _ts(r.run["started"]),
                "wall": r.phases.get("wall", 0.0),
                "measure": r.phases.get("measure", 0.0),
                "version": r.run["tunnelbench_version"],
                "vpns": [
                    {**v, "variant": a.variant_of.get((r.run_id, v["name"]), v["name"])} for v in r.vpns
                ],
                "env": sorted((k, v) for k, v in r.env.items() if not Records.is_record(k)),
                "calibration": _calibration(r),
                "failures": _failures(r, a),
                "phases": sorted((k, v) for k, v in r.phases.items() if k != "wall"),
                "scenario_text": r.run["scenario"],
                "emulator": _emulator(r),
                "order": r.env.get("run.order", "block"),
                "seed": r.env.get("run.seed"),
            }
        )
    headline = a.headline_families()
    overview = [_family_ctx(f) for f in headline if f.better != "none" or len(f.groups) > 1]
    by_profile: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for fam in overview:
        by_profile[fam["profile"]].append(fam)
    # heatmaps: one per headline (label, metric)
    seen = []
    heatmaps = []
    for f in headline:
        if (f.label, f.metric) in seen:
            continue
        seen.append((f.label, f.metric))
        svg = plots.heatmap(a, f.label, f.metric)
        if svg:
            heatmaps.append(svg)
    # distributions and time series
    labels_of = defaultdict(set)
    for g in a.groups.values():
        labels_of[g.workload].add(g.label)
    cdfs, tseries, cpu = [], [], []
    for p in a.profiles:
        for lb in sorted(labels_of.get("ping", ())):
            s = _series_by_variant(a, p, lb, "rtt_ms")
            pooled = {v: [x for rep in reps for _, x in rep] for v, reps in s.items()}
            svg = plots.cdf(a, p, pooled, "rtt_ms", "ms", f"RTT distribution · {lb} · {p} (every echo reply)")
            if svg:
                cdfs.append(svg)
            svg = plots.histogram(a, pooled, "rtt_ms", "ms", f"RTT histogram · {lb} · {p} (every echo reply)")
            if svg:
                cdfs.append(svg)
        for wl in ("tcp", "udp"):
            for lb in sorted(labels_of.get(wl, ())):
                s = _series_by_variant(a, p, lb, "goodput_mbps")
                svg = plots.timeseries(
                    a, s, "goodput_mbps", "Mbit/s", f"throughput over time · {lb} · {p} (iperf3 intervals)"
                )
                if svg:
                    tseries.append(svg)
        for lb in sorted(labels_of.get("multihost", ())):
            tseries += _per_peer_plots(a, p, lb)
        svg = plots.cpu_memory(a, p)
        if svg:
            cpu.append(svg)
        svg = plots.memory_over_time(a, p, _rss_lines(a, p))
        if svg:
            cpu.append(svg)
    scatter = plots.latency_vs_throughput(a)
    stats_rows = []
    for f in a.families:
        for v, g in f.groups.items():
            d = g.desc
            assert d is not None
            stats_rows.append(
                {
                    "variant": v,
                    "profile": f.profile,
                    "label": f.label,
                    "metric": f.metric,
                    "unit": f.unit,
                    "better": f.better,
                    "n": d.n,
                    "mean": num(d.mean, f.unit),
                    "median": num(d.median, f.unit),
                    "sd": num(d.sd, f.unit),
                    "cv": "–" if math.isnan(d.cv) else f"{100 * d.cv:.1f}%",
                    "p5": num(d.pct[5], f.unit),
                    "p25": num(d.pct[25], f.unit),
                    "p75": num(d.pct[75], f.unit),
                    "p95": num(d.pct[95], f.unit),
                    "ci": ci(d.ci_lo, d.ci_hi, f.unit),
                    "mean_ci": ci(d.mean_ci_lo, d.mean_ci_hi, f.unit),
                    "ratio": ratio_txt(g.ratio),
                    "headline": a.is_headline(f),
                }
            )
    usage = [
        {
            "variant": u.variant,
            "profile": u.profile,
            "label": u.label,
            "cpu_client": f"{num(u.cpu_client.median)} {ci(u.cpu_client.ci_lo, u.cpu_client.ci_hi)}"
            if u.cpu_client
            else "–",
            "cpu_server": f"{num(u.cpu_server.median)} {ci(u.cpu_server.ci_lo, u.cpu_server.ci_hi)}"
            if u.cpu_server
            else "–",
            "rss_client": num(u.rss_client_mb),
            "rss_server": num(u.rss_server_mb),
        }
        for u in a.usage
    ]

    def derived(ds: list[Derived]) -> list[dict[str, Any]]:
        return [
            {
                "variant": d.variant,
                "profile": d.profile,
                "label": d.label,
                "value": num(d.value),
                "ci": ci(d.lo, d.hi),
                "n": d.n,
                "note": d.note,
            }
            for d in ds
        ]

    n_min = min((g.desc.n for g in a.groups.values() if g.desc), default=0)
    return {
        "headline": headline_ctx(rd.headline),
        "title": "tunnelbench " + (a.runs[0].run_id if len(a.runs) == 1 else f"{len(a.runs)} runs combined"),
        "security": _security(rd),
        "security_columns": SECURITY_COLUMNS,
        "runs": runs,
        "variants": a.variants,
        "profiles": a.profiles,
        "by_profile": dict(by_profile),
        "any_underpowered": any(f["underpowered"] for f in overview),
        "alpha": ALPHA,
        "n_min": n_min,
        "heatmaps": heatmaps,
        "scatter": scatter,
        "cdfs": cdfs,
        "tseries": tseries,
        "cpu": cpu,
        "clients": [svg for p in a.profiles for svg in [_clients_curve(a, p)] if svg]
        + [svg for svg in [plots.degradation(degradation_points(a))] if svg],
        "usage": usage,
        "scaling": derived(a.scaling),
        "efficiency": derived(a.efficiency),
        "stats_rows": stats_rows,
        "features": _features(a),
        "flamegraphs": _flamegraphs(a),
        "nat_matrix": _nat_matrix(a),
        "rounds": _rounds(a),
        "generated": _ts(dt.datetime.now(dt.UTC).timestamp()),
    }


def _flamegraphs(a: Analysis) -> list[dict[str, Any]]:
    return [
        {
            "variant": fg.variant,
            "profile": fg.profile,
            "label": fg.label,
            "cases": fg.cases,
            "samples": fg.samples,
            "uri": fg.data_uri(),
            "file": str(fg.svg or fg.folded),
            "why": fg.why,
        }
        for fg in render_flamegraphs(a)
    ]


def headline_ctx(h: Headline) -> dict[str, Any]:
    """The same headline as the terminal's (report/headline.py), as plain values for the template."""
    tables = []
    for t in h.tables:
        tables.append(
            {
                "profile": t.profile,
                "columns": [c.title.split("\n") for c in t.columns],
                "rows": [
                    {
                        "variant": r.variant,
                        "version": r.version,
                        "baseline": r.baseline,
                        "cells": [
                            (r.cells[c.label].text, r.cells[c.label].tier)
                            if c.label in r.cells
                            else ("–", None)
                            for c in t.columns
                        ],
                    }
                    for r in t.rows
                ],
            }
        )
    return {"tables": tables, "findings": h.findings, "caption": CAPTION}


# -- HTML and Markdown -------------------------------------------------------------------------------------
def _security(rd: Reading) -> list[dict[str, Any]]:
    """Each run's Security rows (VPN named as its variant) and output key scan; runs without any check left out."""
    out = []
    a = rd.analysis
    for r in a.runs:
        sec = rd.security[r.run_id]
        rows = [{**row, "variant": a.variant_of.get((r.run_id, row["vpn"]), row["vpn"])} for row in sec.rows]
        scan = sec.scan
        if rows or scan:
            out.append({"run": r.run_id, "rows": rows, "scan": scan})
    return out


def render_report(rd: Reading) -> str:
    env = Environment(loader=PackageLoader("tunnelbench", "report/templates"), autoescape=select_autoescape())
    return env.get_template("report.html").render(**build_context(rd))


def write_report(rd: Reading, out: Path, markdown: Path | None = None) -> None:
    """The report of a reading at `out` (and its Markdown summary), each file written whole (core/files.py)."""
    write_atomic(out, render_report(rd))
    if markdown is not None:
        write_atomic(markdown, render_markdown(rd))


def render_markdown(rd: Reading) -> str:
    a = rd.analysis
    lines = []
    for r in a.runs:
        vers = md(", ".join(f"{v['name']} {v['version'] or ''}".strip() for v in r.vpns))
        lines.append(
            f"**tunnelbench run {code(r.run_id)}** — scenario {code(r.scenario_name)}, status "
            f"{md(r.run['status'])}, {_ts(r.run['started'])}; {vers}; kernel {md(r.env.get('kernel', '?'))}, "
            f"{md(r.env.get('cpu_count', '?'))} CPUs ({md(r.env.get('cpu_model', '?'))})"
        )
    hd = headline_ctx(rd.headline)
    for t in hd["tables"]:
        lines += [
            "",
            f"**Headline** (profile {code(t['profile'])})",
            "",
            "| VPN | " + " | ".join(md(" ".join(c)) for c in t["columns"]) + " |",
            "|---|" + "---:|" * len(t["columns"]),
        ]
        for r in t["rows"]:
            name = (
                r["variant"]
                + (" (no VPN)" if r["baseline"] else "")
                + (f" {r['version']}" if r["version"] else "")
            )
            lines.append(f"| {md(name)} | " + " | ".join(md(text) for text, _ in r["cells"]) + " |")
    if hd["tables"]:
        lines += ["", hd["caption"], ""] + [f"- {md(text)}" for text, _ in hd["findings"]]
    lines.append("")
    lines.append(
        f"Median over repetitions with bootstrap 95% CI; × internal = ratio of medians to the no-VPN "
        f"baseline with CI; tiers (among the VPNs; the baseline is the reference) split only where every "
        f"pair across the cut differs (Holm-corrected, α = {ALPHA}; each metric's method in its row)."
    )
    for p in a.profiles:
        lines += [
            "",
            f"### Profile {code(p)}",
            "",
            "| VPN | workload | metric | median [95% CI] | n | × internal [95% CI] | tier | compared by |",
            "|---|---|---|---:|---:|---:|---:|---|",
        ]
        for f in a.headline_families():
            if f.profile != p:
                continue
            how = f"{f.test.text} {f.test.mde_text(f.unit)}".strip() if f.test else ""
            for v in f.order():
                g = f.groups[v]
                d = g.desc
                assert d is not None
                t = f.tier_of(v)
                tier = (
                    str(t)
                    if t is not None
                    else ("" if f.better == "none" or is_baseline(v) else SHORT.get(g.verdict.kind, "–"))
                )
                lines.append(
                    f"| {md(v)} | {md(f.label)} | {md(f.metric)} [{md(f.unit)}] | {num(d.median, f.unit)} "
                    f"{ci(d.ci_lo, d.ci_hi, f.unit)} | {d.n} | {ratio_txt(g.ratio)} | {tier} | {md(how)} |"
                )
        under = [
            md(f"{f.label}/{f.metric}") for f in a.headline_families() if f.profile == p and f.underpowered
        ]
        if under:
            lines += [
                "",
                f"> Too few repetitions for any significant difference in: {', '.join(under)} "
                "(one tier each; use ≥ 5 repetitions for 2 VPNs, more for more VPNs).",
            ]
    if a.scaling:
        lines += [
            "",
            "Parallel scaling (goodput N streams / 1 stream): "
            + "; ".join(
                f"{md(d.variant)} {md(d.label)} @ {md(d.profile)}: {d.value:.2f} [{d.lo:.2f}, {d.hi:.2f}]"
                for d in a.scaling
            ),
        ]
    if a.efficiency:
        lines += [
            "",
            "CPU efficiency (Mbit/s per daemon CPU-core, client + server; multihost: all hosts): "
            + "; ".join(
                f"{md(d.variant)} {md(d.label)} @ {md(d.profile)}: {num(d.value)} {ci(d.lo, d.hi)}"
                for d in a.efficiency
            ),
        ]
    for r in a.runs:
        facts = facts_lines(r.emulator)
        if facts:
            lines += [
                "",
                f"Order: {md(r.env.get('run.order', 'block'))}"
                + (f" (seed {md(r.env['run.seed'])})" if r.env.get("run.seed") else ""),
            ]
            lines += [f"- {md(x.strip())}" for x in facts]
    for sec in _security(rd):
        lines += [
            "",
            f"### Security (run {code(sec['run'])})",
            "",
            "| VPN | version | " + " | ".join(SECURITY_COLUMNS) + " |",
            "|---|---|" + "---|" * len(SECURITY_COLUMNS),
        ]
        for row in sec["rows"]:
            cells = [md(f"{v} ({e})" if e else v) for v, e in row["cells"].values()]
            lines.append(f"| {md(row['variant'])} | {md(row['version'])} | " + " | ".join(cells) + " |")
        if sec["scan"]:
            lines += ["", f"Key scan: {md(sec['scan'][0])}"]
    for r in a.runs:  # drawn by the HTML report (report/flamegraphs.py), named here
        svgs = sorted((r.run_dir / "flamegraphs").glob("*.svg"))
        if svgs:
            names = ", ".join(code(f"flamegraphs/{p.name}") for p in svgs)
            lines += ["", f"Flame graphs (run {code(r.run_id)}): {names}"]
    fails = [(r, c) for r in a.runs for c in r.cases if c.status not in ("ok", "running")]
    if fails:
        lines += ["", f"{len(fails)} case(s) failed or were skipped:"]
        for r, c in fails[:20]:
            error = (c.error or "").splitlines()[0][:200] if c.error else ""
            lines.append(
                "- "
                + md(
                    f"{a.variant_of.get((r.run_id, c.vpn), c.vpn)} · {c.profile} · {c.label} rep "
                    f"{c.repetition}: {c.status}: {error}"
                )
            )
    return "\n".join(lines) + "\n"
