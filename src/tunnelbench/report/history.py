"""The history of every stored run: per VPN (and version), each headline metric over time with its CI, the
changes `tunnelbench compare` flags between consecutive runs of a VPN, an offline HTML page (styles and SVG
inline, no scripts, no external requests) and a terminal table of the latest vs the previous run per VPN.

Consecutive runs are compared exactly as `tunnelbench compare PREVIOUS LATEST` would (analysis/compare.py):
for each (VPN, profile, workload label), its previous run is the latest earlier run where that group has a
successful case."""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import re
import tomllib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import escape
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from tunnelbench.analysis.analyze import BASELINE, RunData, load_run, metric_spec
from tunnelbench.analysis.compare import DEFAULT_THRESHOLD_PCT, Change, Comparison, _samples, compare_runs
from tunnelbench.analysis.stats import describe
from tunnelbench.core.files import FileRefused, check_private_folder
from tunnelbench.report.fmt import num
from tunnelbench.store import DB_NAME, Store

FLAG_VERDICTS = ("REGRESSION", "improvement")
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf"]  # fmt: skip  # matplotlib tab10, as in the run report
SHAPES = ("circle", "square", "diamond", "triangle", "triangle-down")


@dataclass
class Point:
    """One run's median of one (VPN, profile, label, metric), with its bootstrap 95% CI."""

    run_id: str
    started: float
    version: str | None
    n: int
    median: float
    ci_lo: float
    ci_hi: float
    values: list[float]
    prev_run: str | None = None  # the run compared against (previous run of this VPN/profile/label)
    change_pct: float | None = None  # vs prev_run, as compare computes it
    verdict: str = ""  # compare's verdict vs prev_run ("" for the first point)

    @property
    def flag(self) -> str:
        return {"REGRESSION": "regression", "improvement": "improvement"}.get(self.verdict, "")


@dataclass
class Trend:
    """One metric under one profile and workload label: one series of points (in run order) per VPN."""

    profile: str
    label: str
    workload: str
    metric: str
    unit: str
    better: str
    series: dict[str, list[Point]] = field(default_factory=dict)
    headline: tuple[str, ...] = ()  # the workload's headline metrics in order (their order on the page)


@dataclass
class Flag:
    """A change `compare` flags between a VPN's previous and next run (or a group that stopped succeeding)."""

    vpn: str
    profile: str
    label: str
    metric: str
    unit: str
    run_a: str
    run_b: str
    version_a: str | None
    version_b: str | None
    verdict: str
    change: Change | None = None


@dataclass
class RunInfo:
    run_id: str
    run_dir: Path
    started: float
    status: str
    scenario: str
    versions: dict[str, str | None]
    ok_cases: int
    cases: int


@dataclass
class History:
    runs: list[RunInfo]
    skipped: list[tuple[Path, str]]
    trends: list[Trend]
    flags: list[Flag]
    vpns: list[str]
    threshold_pct: float
    vpn_filter: list[str] | None = None
    metric_filter: list[str] | None = None
    comparisons: dict[tuple[str, str], Comparison] = field(default_factory=dict)

    def trend(self, profile: str, label: str, metric: str) -> Trend | None:
        return next(
            (t for t in self.trends if (t.profile, t.label, t.metric) == (profile, label, metric)), None
        )


# -- collecting ------------------------------------------------------------------------------------------
def collect_runs(results: Path) -> tuple[list[RunData], list[tuple[Path, str]]]:
    """Every run stored under `results` (each folder with a results.sqlite), oldest first, and the folders
    skipped with the reason. Never raises for a broken, partial or old store, or a run folder another user
    can write: each store is opened read-only (store.py), so a broken file stays as it is."""
    runs: list[RunData] = []
    skipped: list[tuple[Path, str]] = []
    if not results.is_dir():
        return runs, skipped
    seen: dict[str, Path] = {}
    for d in sorted(p for p in results.iterdir() if p.is_dir()):
        if not (d / DB_NAME).exists():
            continue
        try:
            check_private_folder(d)
            st = Store.open_run_dir(d)
            try:
                ids = [r["id"] for r in st.runs()]
            finally:
                st.close()
            for rid in ids:
                if rid in seen:
                    skipped.append((d, f"run {rid} is also stored in {seen[rid]}"))
                    continue
                runs.append(load_run(d, rid))
                seen[rid] = d
        except FileRefused as e:  # one line naming the file or folder and what is wrong (StoreError too)
            skipped.append((d, str(e)))
        except Exception as e:  # noqa: BLE001 - a store we cannot read must not stop the others
            skipped.append((d, f"{type(e).__name__}: {e}"))
    runs.sort(key=lambda r: (r.run["started"] or 0.0, r.run_id))
    return runs, skipped


def close_runs(runs: list[RunData]) -> None:
    for r in runs:
        with contextlib.suppress(Exception):
            r.store.close()


def _wanted(metric: str, workload: str, metrics: list[str] | None, run: RunData) -> bool:
    return metric in metrics if metrics else run.is_headline(workload, metric)


def build_history(
    runs: list[RunData],
    vpns: list[str] | None = None,
    metrics: list[str] | None = None,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    skipped: list[tuple[Path, str]] | None = None,
) -> History:
    """Trends of the headline metrics (or `metrics`) of every VPN (or `vpns`) over `runs` (oldest first), and
    the changes compare flags between each group's consecutive runs (with `metrics` as compare --metric)."""
    runs = sorted(runs, key=lambda r: (r.run["started"] or 0.0, r.run_id))
    by_id = {r.run_id: r for r in runs}
    samples = {r.run_id: _samples(r) for r in runs}
    trends: dict[tuple[str, str, str], Trend] = {}
    vpn_seen: list[str] = []
    for r in runs:
        s, info, _limited = samples[r.run_id]
        for (vpn, profile, label, metric), vals in s.items():
            unit, workload = info[(vpn, profile, label, metric)]
            if (vpns and vpn not in vpns) or not _wanted(metric, workload, metrics, r) or not vals:
                continue
            t = trends.get((profile, label, metric))
            if t is None:
                better, _ = metric_spec(workload, metric, r)
                t = trends[(profile, label, metric)] = Trend(profile, label, workload, metric, unit, better)
            t.headline = r.headline(workload)  # as the newest run with it defined them
            d = describe(vals)
            t.series.setdefault(vpn, []).append(
                Point(
                    r.run_id,
                    r.run["started"] or 0.0,
                    r.version(vpn),
                    d.n,
                    d.median,
                    d.ci_lo,
                    d.ci_hi,
                    list(vals),
                )
            )
            if vpn not in vpn_seen:
                vpn_seen.append(vpn)
    # consecutive runs of each (VPN, profile, label): compare PREVIOUS RUN as compare does
    attempted: dict[tuple[str, str, str], list[str]] = defaultdict(list)  # group -> runs that ran it
    succeeded: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for r in runs:
        for c in r.cases:
            if vpns and c.vpn not in vpns:
                continue
            k = (c.vpn, c.profile, c.label)
            if c.status in ("ok", "failed") and r.run_id not in attempted[k]:
                attempted[k].append(r.run_id)
        for vpn, profile, label, _ in samples[r.run_id][0]:
            succeeded[(vpn, profile, label)].add(r.run_id)
    cmp_cache: dict[tuple[str, str], Comparison] = {}
    flags: list[Flag] = []
    for k, rids in attempted.items():
        prev = None
        for rid in rids:
            if prev is not None:
                key = (prev, rid)
                if key not in cmp_cache:
                    cmp_cache[key] = compare_runs(by_id[prev], by_id[rid], threshold_pct, metrics)
                _apply(cmp_cache[key], k, trends, flags, by_id, metrics)
            if rid in succeeded[k]:
                prev = rid
    flags.sort(key=lambda f: (by_id[f.run_b].run["started"] or 0.0, f.vpn, f.profile, f.label, f.metric))
    tlist = sorted(trends.values(), key=_trend_order(list(trends), metrics))
    vpn_seen = _vpn_order(runs, vpn_seen)
    rank = {v: i for i, v in enumerate(vpn_seen)}
    for t in tlist:
        t.series = dict(sorted(t.series.items(), key=lambda kv: rank[kv[0]]))
    return History(
        runs=[_run_info(r) for r in runs],
        skipped=list(skipped or []),
        trends=tlist,
        flags=flags,
        vpns=vpn_seen,
        threshold_pct=threshold_pct,
        vpn_filter=vpns,
        metric_filter=metrics,
        comparisons=cmp_cache,
    )


def _vpn_order(runs: list[RunData], names: list[str]) -> list[str]:
    """The baseline first, then the VPNs in the order the scenarios list them (newest run first)."""
    order: list[str] = [BASELINE]
    for r in reversed(runs):
        try:
            listed = tomllib.loads(r.run["scenario"] or "").get("vpns", [])
        except tomllib.TOMLDecodeError:
            listed = []
        order += [v for v in listed if isinstance(v, str)] + [v["name"] for v in r.vpns]
    rank = {v: i for i, v in enumerate(dict.fromkeys(order))}
    return sorted(names, key=lambda v: (rank.get(v, len(rank)), names.index(v)))


def _trend_order(
    keys: list[tuple[str, str, str]], metrics: list[str] | None
) -> Callable[[Trend], tuple[int, int, int, str]]:
    """Profiles and workload labels in order of first appearance, metrics in the workload's headline order
    (or the order of `metrics`)."""
    prank = {p: i for i, p in enumerate(dict.fromkeys(k[0] for k in keys))}
    lrank = {lb: i for i, lb in enumerate(dict.fromkeys(k[1] for k in keys))}

    def key(t: Trend) -> tuple[int, int, int, str]:
        names = list(metrics or t.headline)
        return (
            prank[t.profile],
            lrank[t.label],
            names.index(t.metric) if t.metric in names else 99,
            t.metric,
        )

    return key


def _apply(
    cmp: Comparison,
    group: tuple[str, str, str],
    trends: dict[tuple[str, str, str], Trend],
    flags: list[Flag],
    by_id: dict[str, RunData],
    metrics: list[str] | None,
) -> None:
    """Put compare's verdicts for this group on the later run's points, and its flags in the list."""
    vpn, profile, label = group
    a, b = by_id[cmp.run_a], by_id[cmp.run_b]
    for c in cmp.changes:
        if (c.vpn, c.profile, c.label) != group:
            continue
        t = trends.get((profile, label, c.metric))
        if t is None:
            continue  # not a metric on the page
        for p in t.series.get(vpn, []):
            if p.run_id == cmp.run_b:
                p.prev_run, p.change_pct, p.verdict = cmp.run_a, c.change_pct, c.verdict
        if c.verdict in FLAG_VERDICTS:
            flags.append(
                Flag(
                    vpn,
                    profile,
                    label,
                    c.metric,
                    c.unit,
                    cmp.run_a,
                    cmp.run_b,
                    a.version(vpn),
                    b.version(vpn),
                    c.verdict,
                    c,
                )
            )
    if group in cmp.failed_b:
        flags.append(
            Flag(
                vpn,
                profile,
                label,
                "",
                "",
                cmp.run_a,
                cmp.run_b,
                a.version(vpn),
                b.version(vpn),
                "FAILED: every attempt failed",
            )
        )


def _run_info(r: RunData) -> RunInfo:
    return RunInfo(
        r.run_id,
        r.run_dir,
        r.run["started"] or 0.0,
        r.run["status"] or "",
        r.scenario_name,
        {v["name"]: v["version"] for v in r.vpns},
        sum(c.status == "ok" for c in r.cases),
        len(r.cases),
    )


# -- terminal ----------------------------------------------------------------------------------------------
def latest_vs_previous(h: History, vpn: str) -> list[tuple[Trend, Point, Point | None]]:
    """The VPN's rows of the terminal table: per trend whose last point is the VPN's latest run, that point
    and the one before it (the run compare measured it against)."""
    last = _latest_run(h, vpn)
    out = []
    for t in h.trends:
        pts = t.series.get(vpn, [])
        if pts and pts[-1].run_id == last:
            out.append((t, pts[-1], pts[-2] if len(pts) > 1 else None))
    return out


def _latest_run(h: History, vpn: str) -> str | None:
    runs = [p.run_id for t in h.trends for p in t.series.get(vpn, [])]
    order = {r.run_id: i for i, r in enumerate(h.runs)}
    return max(runs, key=lambda rid: order.get(rid, -1)) if runs else None


def _short_version(v: str | None) -> str:
    """A version without its parenthesised provenance ("0.0.20250522 (go proxy v0.0.0-...)" -> "0.0.20250522")."""
    return re.sub(r"\s*\(.*\)\s*$", "", v or "")[:24]


def history_tables(h: History) -> list[Table]:
    multi_profile = len({t.profile for t in h.trends}) > 1
    tables = []
    for vpn in h.vpns:
        rows = latest_vs_previous(h, vpn)
        if not rows:
            continue
        latest = rows[0][1]
        prevs = [p for _, _, p in rows if p is not None]
        prev = prevs[0] if prevs else None
        title = Text(f"{vpn}: ", style="bold")
        if prev is not None:
            title.append(f"{prev.run_id} ({_short_version(prev.version) or '?'}) → ")
        title.append(f"{latest.run_id} ({_short_version(latest.version) or '?'})")
        if prev is None:
            title.append("  (first run: nothing to compare)", style="dim")
        t = Table(title=title, title_justify="left")
        cols: list[tuple[str, JustifyMethod]] = [
            ("workload", "left"),
            ("metric", "left"),
            ("previous", "right"),
            ("latest", "right"),
            ("change", "right"),
            ("compare says", "left"),
        ]
        for col, just in cols:
            t.add_column(col, justify=just)
        for tr, p, q in rows:
            wl = f"{tr.label} @ {tr.profile}" if multi_profile else tr.label
            prev_txt = "–" if q is None else num(q.median, tr.unit)
            if q is not None and prev is not None and q.run_id != prev.run_id:
                prev_txt += f" (run {q.run_id.rsplit('-', 1)[-1]})"
            change = "–" if p.change_pct is None or math.isnan(p.change_pct) else f"{p.change_pct:+.1f}%"
            style = {"REGRESSION": "bold red", "improvement": "green"}.get(p.verdict, "dim")
            t.add_row(
                Text(wl),
                Text(f"{tr.metric} [{tr.unit}]"),
                Text(prev_txt),
                Text(num(p.median, tr.unit)),
                Text(change),
                Text(p.verdict or "–", style=style),
            )
        tables.append(t)
    return tables


def print_history(h: History, console: Console) -> None:
    tables = history_tables(h)
    if not tables:
        console.print(Text("no headline metric of any selected VPN in the stored runs"))
    for t in tables:
        console.print(t)
    n = sum(f.verdict == "REGRESSION" for f in h.flags)
    console.print(
        Text(
            f"{len(h.runs)} runs: {n} regression(s), {sum(f.verdict == 'improvement' for f in h.flags)} "
            f"improvement(s), {sum(f.verdict.startswith('FAILED') for f in h.flags)} workload(s) that "
            f"stopped succeeding\n(each run of a VPN vs its previous run, as compare does; threshold "
            f"{h.threshold_pct:g}%)"
        )
    )


# -- HTML --------------------------------------------------------------------------------------------------
def _ts(t: float | None, fmt: str = "%Y-%m-%d %H:%M:%S UTC") -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime(fmt) if t else "–"


def _pct(v: float | None) -> str:
    return "" if v is None else "–" if math.isnan(v) else f"{v:+.1f}%"


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    out = []
    v = start
    while v <= hi + step * 1e-9:
        out.append(round(v, 12))
        v += step
    return out


def _tick_txt(v: float, step: float) -> str:
    if step >= 1 or v == 0:
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}"
    return f"{v:.{max(0, -math.floor(math.log10(step)))}f}"


def _marker(shape: str, x: float, y: float, color: str, r: float = 4.5) -> str:
    common = f'fill="{color}" stroke="#222" stroke-width="0.8" class="marker"'
    if shape == "square":
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" {common}/>'
    if shape == "diamond":
        r *= 1.25
        return f'<path d="M{x:.1f},{y - r:.1f}L{x + r:.1f},{y:.1f}L{x:.1f},{y + r:.1f}L{x - r:.1f},{y:.1f}Z" {common}/>'
    if shape in ("triangle", "triangle-down"):
        s = 1 if shape == "triangle" else -1
        r *= 1.2
        return (
            f'<path d="M{x:.1f},{y - s * r:.1f}L{x + r:.1f},{y + s * r * 0.8:.1f}L{x - r:.1f},'
            f'{y + s * r * 0.8:.1f}Z" {common}/>'
        )
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" {common}/>'


def trend_svg(
    t: Trend, colors: dict[str, str], run_order: dict[str, int], run_started: dict[str, float]
) -> str:
    """The trend of one metric as an inline SVG: x = the runs (in order, labelled with their start time),
    y = median with its 95% CI as a whisker; one line per VPN, the marker shape changes with the VPN's
    version (labelled where it changes), a red ring marks a regression and a green ring an improvement."""
    w, ml, mr, mb = 620, 70, 14, 78
    legend, lx, row = [], float(ml), 0  # (vpn, x, row): the legend wraps when there are many VPNs
    for vpn in t.series:
        width = 34 + 6.2 * len(vpn)
        if lx + width > w - mr and lx > ml:
            lx, row = float(ml), row + 1
        legend.append((vpn, lx, row))
        lx += width
    mt = 34 + 16 * row
    h = mt + 208 + mb
    pw, ph = w - ml - mr, h - mt - mb
    rids = sorted({p.run_id for pts in t.series.values() for p in pts}, key=lambda r: run_order.get(r, 0))
    xi = {r: i for i, r in enumerate(rids)}
    ys = [
        y for pts in t.series.values() for p in pts for y in (p.median, p.ci_lo, p.ci_hi) if math.isfinite(y)
    ]
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if hi - lo < 1e-12 * max(1.0, abs(hi)):
        pad = abs(hi) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    ticks = _nice_ticks(lo, hi)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else (hi - lo)
    lo, hi = min(lo, ticks[0]) - 0.04 * (hi - lo), max(hi, ticks[-1]) + 0.04 * (hi - lo)
    nser = max(1, len(t.series))

    def X(rid: str, j: int) -> float:
        dodge = (j - (nser - 1) / 2) * min(7.0, pw / max(1, len(rids)) / (nser + 1))
        return ml + (xi[rid] + 0.5) * pw / max(1, len(rids)) + dodge

    def Y(v: float) -> float:
        return mt + ph * (1 - (v - lo) / (hi - lo))

    e = escape
    title = f"{t.label} · {t.metric} [{t.unit}] · {t.profile}"
    o = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" class="plot trend-plot" viewBox="0 0 {w} {h}" '
        f'width="{w}" height="{h}" aria-label="{e(title)}: median per run with 95% CI, one line per VPN">',
        f"<title>{e(title)}</title>",
        f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="#fff" stroke="#d5dae0"/>',
    ]
    for v in ticks:
        y = Y(v)
        o.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e8ec"/>')
        o.append(
            f'<text x="{ml - 6}" y="{y + 3:.1f}" text-anchor="end" font-size="10" fill="#333">'
            f"{_tick_txt(v, step)}</text>"
        )
    every = max(1, math.ceil(len(rids) / 14))
    fmt = "%m-%d %H:%M"
    if len({_ts(run_started.get(r), fmt) for r in rids}) < len(rids):
        fmt = "%m-%d %H:%M:%S"  # runs minutes apart
    for rid in rids[::every]:
        x = ml + (xi[rid] + 0.5) * pw / max(1, len(rids))
        o.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt + ph}" y2="{mt + ph + 4}" stroke="#888"/>')
        o.append(
            f'<text x="{x:.1f}" y="{mt + ph + 14}" font-size="9.5" fill="#333" text-anchor="end" '
            f'transform="rotate(-35 {x:.1f} {mt + ph + 14})">{e(_ts(run_started.get(rid), fmt))}'
            f"<title>{e(rid)}</title></text>"
        )
    arrow = {"higher": " (higher is better ↑)", "lower": " (lower is better ↓)"}.get(t.better, "")
    o.append(
        f'<text x="14" y="{mt + ph / 2:.1f}" font-size="10.5" text-anchor="middle" fill="#222" '
        f'transform="rotate(-90 14 {mt + ph / 2:.1f})">{e(t.metric)} [{e(t.unit)}]{e(arrow)}</text>'
    )
    o.append(
        f'<text x="{ml + pw / 2:.1f}" y="{h - 6}" font-size="10.5" text-anchor="middle" fill="#222">'
        "run start (UTC), oldest left</text>"
    )
    # legend
    for vpn, lx, row in legend:
        ly = 16 + 16 * row
        o.append(
            f'<line x1="{lx:.1f}" x2="{lx + 16:.1f}" y1="{ly}" y2="{ly}" stroke="{colors[vpn]}" '
            f'stroke-width="2.2"/><text x="{lx + 20:.1f}" y="{ly + 4}" font-size="10.5" fill="#222">{e(vpn)}</text>'
        )
    for j, (vpn, pts) in enumerate(t.series.items()):
        c = colors[vpn]
        ok = [p for p in pts if math.isfinite(p.median)]
        o.append(f'<g class="series" data-vpn="{e(vpn)}" data-points="{len(ok)}">')
        if len(ok) > 1:
            d = "".join(
                f"{'M' if i == 0 else 'L'}{X(p.run_id, j):.1f},{Y(p.median):.1f}" for i, p in enumerate(ok)
            )
            o.append(f'<path class="line" d="{d}" fill="none" stroke="{c}" stroke-width="1.8"/>')
        versions: list[str | None] = []
        last_version: object = object()
        for p in ok:
            if p.version not in versions:
                versions.append(p.version)
            shape = SHAPES[versions.index(p.version) % len(SHAPES)]
            x, y = X(p.run_id, j), Y(p.median)
            tip = (
                f"{vpn} {p.version or ''} · run {p.run_id} ({_ts(p.started)})\nmedian {num(p.median, t.unit)} "
                f"{t.unit}, 95% CI [{num(p.ci_lo, t.unit)}, {num(p.ci_hi, t.unit)}], n = {p.n}"
            )
            if p.prev_run:
                tip += f"\nvs run {p.prev_run}: {_pct(p.change_pct)}, {p.verdict}"
            o.append(
                f'<g class="point" data-run="{e(p.run_id)}" data-version="{e(p.version or "")}" '
                f'data-median="{p.median!r}" data-ci-lo="{p.ci_lo!r}" data-ci-hi="{p.ci_hi!r}" data-n="{p.n}" '
                f'data-flag="{p.flag}"><title>{e(tip)}</title>'
            )
            if math.isfinite(p.ci_lo) and math.isfinite(p.ci_hi):
                o.append(
                    f'<path class="ci" d="M{x:.1f},{Y(p.ci_lo):.1f}V{Y(p.ci_hi):.1f}M{x - 3:.1f},{Y(p.ci_lo):.1f}'
                    f'h6M{x - 3:.1f},{Y(p.ci_hi):.1f}h6" stroke="#333" stroke-width="1" fill="none"/>'
                )
            if p.flag:
                ring = "#b3261e" if p.flag == "regression" else "#1b7837"
                o.append(
                    f'<circle class="flag {p.flag}" cx="{x:.1f}" cy="{y:.1f}" r="9" fill="none" '
                    f'stroke="{ring}" stroke-width="2.4"/>'
                )
            o.append(_marker(shape, x, y, c))
            if p.version != last_version and p.version:
                o.append(
                    f'<text class="version" x="{x + 6:.1f}" y="{y - 8:.1f}" font-size="9" fill="{c}">'
                    f"{e(_short_version(p.version))}</text>"
                )
            last_version = p.version
            o.append("</g>")
        o.append("</g>")
    o.append("</svg>")
    return "".join(o)


def _shared_css(env: Environment) -> str:
    """The run report's stylesheet (report.html's <style>), read from its template so both pages match."""
    try:
        assert env.loader is not None  # the report's environment has its package loader
        src = env.loader.get_source(env, "report.html")[0]
    except Exception:  # noqa: BLE001
        return ""
    m = re.search(r"<style>(.*?)</style>", src, re.S)
    return m.group(1) if m else ""


def build_context(h: History) -> dict[str, Any]:
    colors = {v: PALETTE[i % len(PALETTE)] for i, v in enumerate(h.vpns)}
    run_order = {r.run_id: i for i, r in enumerate(h.runs)}
    started = {r.run_id: r.started for r in h.runs}
    by_profile: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in h.trends:
        rows = []
        for vpn, pts in t.series.items():
            for p in pts:
                rows.append(
                    {
                        "vpn": vpn,
                        "version": p.version or "",
                        "run": p.run_id,
                        "started": _ts(p.started),
                        "median": num(p.median, t.unit),
                        "ci": f"[{num(p.ci_lo, t.unit)}, {num(p.ci_hi, t.unit)}]",
                        "n": p.n,
                        "change": _pct(p.change_pct),
                        "verdict": p.verdict,
                        "flag": p.flag,
                    }
                )
        by_profile[t.profile].append(
            {
                "profile": t.profile,
                "label": t.label,
                "workload": t.workload,
                "metric": t.metric,
                "unit": t.unit,
                "better": t.better,
                "vpns": list(t.series),
                "svg": trend_svg(t, colors, run_order, started),
                "rows": rows,
            }
        )
    flags = []
    for f in h.flags:
        c = f.change
        flags.append(
            {
                "vpn": f.vpn,
                "profile": f.profile,
                "label": f.label,
                "metric": f.metric,
                "unit": f.unit,
                "run_a": f.run_a,
                "run_b": f.run_b,
                "version_a": f.version_a or "",
                "version_b": f.version_b or "",
                "median_a": num(c.median_a, c.unit) if c else "",
                "median_b": num(c.median_b, c.unit) if c else "",
                "change": f"{c.change_pct:+.1f}% [{c.ci_lo_pct:+.1f}, {c.ci_hi_pct:+.1f}]" if c else "",
                "p_holm": f"{c.p_holm:.2g}" if c and math.isfinite(c.p_holm) else "",
                "n": f"{c.n_a} / {c.n_b}" if c else "",
                "verdict": f.verdict,
                "tone": "ok" if f.verdict == "improvement" else "bad",
            }
        )
    runs = [
        {
            "id": r.run_id,
            "started": _ts(r.started),
            "status": r.status,
            "scenario": r.scenario,
            "vpns": [f"{k} {_short_version(v)}".strip() for k, v in r.versions.items()],
            "cases": f"{r.ok_cases} / {r.cases}",
            "dir": str(r.run_dir),
        }
        for r in h.runs
    ]
    first, last = (h.runs[0].started, h.runs[-1].started) if h.runs else (None, None)
    return {
        "title": "tunnelbench history",
        "runs": runs,
        "skipped": [(str(d), why) for d, why in h.skipped],
        "by_profile": dict(by_profile),
        "n_trends": len(h.trends),
        "flags": flags,
        "vpns": h.vpns,
        "first": _ts(first),
        "last": _ts(last),
        "threshold": h.threshold_pct,
        "vpn_filter": h.vpn_filter,
        "metric_filter": h.metric_filter,
        "generated": _ts(dt.datetime.now(dt.UTC).timestamp()),
    }


def render_history(h: History) -> str:
    env = Environment(loader=PackageLoader("tunnelbench", "report/templates"), autoescape=select_autoescape())
    return env.get_template("history.html").render(css=_shared_css(env), **build_context(h))
