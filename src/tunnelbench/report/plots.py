"""The report's plots: matplotlib figures rendered to inline SVG (no files, no network, no JavaScript).

Every plot labels its axes with units and has a legend when it shows more than one thing."""

from __future__ import annotations

import io
import itertools
import math
import re
from collections import defaultdict
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LinearSegmentedColormap  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from tunnelbench.analysis.analyze import Analysis, Family  # noqa: E402

plt.rcParams.update(
    {
        "svg.fonttype": "none",  # text stays text: crisp, searchable, small
        "svg.hashsalt": "tunnelbench",  # deterministic ids
        "font.family": "sans-serif",
        "font.sans-serif": ["DejaVu Sans", "Liberation Sans", "Arial"],
        "font.size": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "figure.dpi": 96,
    }
)

TIER_COLORS = ["#1b7837", "#5aae61", "#a6dba0", "#c2a5cf", "#9970ab", "#762a83"]
PALETTE = list(plt.get_cmap("tab10").colors)  # type: ignore[attr-defined]  # tab10 is a ListedColormap
_counter = itertools.count()


def variant_colors(variants: list[str]) -> dict[str, tuple[float, float, float]]:
    return {v: PALETTE[i % len(PALETTE)] for i, v in enumerate(variants)}


def to_svg(fig: Figure) -> str:
    """The figure as an inline <svg> element, its ids prefixed so several figures can share one page."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    pre = f"f{next(_counter)}-"
    svg = re.sub(r'id="([^"]+)"', lambda m: f'id="{pre}{m.group(1)}"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{pre}{m.group(1)})", svg)
    svg = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{pre}{m.group(1)}"', svg)
    return svg.replace("<svg ", '<svg role="img" class="plot" ', 1)


def axis_label(metric: str, unit: str) -> str:
    return f"{metric} [{unit}]" if unit else metric


def ranking(f: Family) -> str:
    """Median with its bootstrap 95% CI per variant, best first; colour = significance tier."""
    order = f.order()
    n = len(order)
    fig, ax = plt.subplots(figsize=(4.8, 0.42 * n + 1.0))
    allv = []
    for i, v in enumerate(order):
        g = f.groups[v]
        d = g.desc
        assert d is not None
        tier = f.tier_of(v)
        c = TIER_COLORS[(tier - 1) % len(TIER_COLORS)] if tier is not None else "#4477aa"
        y = n - 1 - i
        ax.plot(g.values, [y] * len(g.values), "|", color="#888", ms=10, zorder=1)
        ax.errorbar(
            [d.median],
            [y],
            xerr=[[max(0.0, d.median - d.ci_lo)], [max(0.0, d.ci_hi - d.median)]],
            fmt="o",
            color=c,
            ecolor="#333",
            capsize=3,
            ms=7,
            mec="#222",
            zorder=2,
        )
        allv += list(g.values) + [d.ci_lo, d.ci_hi]
    finite = [x for x in allv if np.isfinite(x)]
    if finite and min(finite) > 0 and max(finite) / min(finite) > 30:
        ax.set_xscale("log")
    else:
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _tick(x, ax.get_xlim())))
    ax.set_yticks(range(n), list(reversed(order)))
    arrow = {"higher": "  (higher is better →)", "lower": "  (← lower is better)"}.get(f.better, "")
    log = " (log scale)" if ax.get_xscale() == "log" else ""
    ax.set_xlabel(axis_label(f.metric, f.unit) + log + arrow)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_title(
        "● median, bar = 95% CI, | = each repetition" + (", colour = tier" if f.better != "none" else ""),
        fontsize=7,
        loc="left",
        color="#555",
    )
    return to_svg(fig)


def heatmap(a: Analysis, label: str, metric: str) -> str | None:
    """Variants x profiles: cell text = median, colour = median relative to the best variant in the profile."""
    found = [a.family(p, label, metric) for p in a.profiles]
    fams = [f for f in found if f is not None]
    if not fams:
        return None
    better = fams[0].better
    unit = fams[0].unit
    profiles = [f.profile for f in fams]
    variants = [v for v in a.variants if any(v in f.groups for f in fams)]
    med = np.full((len(variants), len(profiles)), np.nan)
    rel = np.full_like(med, np.nan)
    for j, f in enumerate(fams):
        vals = {v: g.desc.median for v, g in f.groups.items() if g.desc}
        best = (max if better == "higher" else min)(vals.values()) if vals else float("nan")
        for i, v in enumerate(variants):
            if v in vals:
                med[i, j] = vals[v]
                if better == "higher":
                    rel[i, j] = vals[v] / best if best else np.nan
                elif better == "lower":
                    rel[i, j] = best / vals[v] if vals[v] else (1.0 if best == 0 else np.nan)
    cmap = LinearSegmentedColormap.from_list("tb", ["#d73027", "#fee08b", "#1a9850"])
    fig, ax = plt.subplots(figsize=(1.3 * len(profiles) + 2.6, 0.42 * len(variants) + 1.3))
    im = ax.imshow(
        np.nan_to_num(rel, nan=0.0) if better != "none" else np.zeros_like(med),
        cmap=cmap,
        vmin=0,
        vmax=1,
        aspect="auto",
    )
    ax.grid(False)
    for i, j in itertools.product(range(len(variants)), range(len(profiles))):
        txt = "–" if math.isnan(med[i, j]) else _short(med[i, j])
        ax.text(j, i, txt, ha="center", va="center", fontsize=8, color="#111")
    ax.set_xticks(range(len(profiles)), profiles)
    ax.set_yticks(range(len(variants)), variants)
    ax.set_xlabel("impairment profile")
    ax.set_title(f"{label} · {axis_label(metric, unit)} (median)", fontsize=9, loc="left")
    if better != "none":
        cb = fig.colorbar(im, ax=ax, fraction=0.08, pad=0.03)
        cb.set_label("relative to the best in the profile (1 = best)", fontsize=7)
    return to_svg(fig)


def _tick(v: float, lim: tuple[float, float]) -> str:
    """An axis tick: as short as _short, but with enough decimals that ticks of a narrow axis (every VPN
    at 100.0 Mbit/s ± 0.01) stay distinct."""
    span = abs(lim[1] - lim[0])
    if 0 < span < 0.05 * max(abs(lim[0]), abs(lim[1])):
        return f"{v:.{max(1, math.ceil(-math.log10(span / 5)))}f}"
    return _short(v)


def _short(v: float) -> str:
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 0.01 or v == 0:
        return f"{v:.2f}"
    return f"{v:.1e}"


def latency_vs_throughput(
    a: Analysis, tput_label: str = "tcp", lat_label: str = "ping", lat_metric: str = "rtt_p50_ms"
) -> str | None:
    """One point per variant and profile: goodput median (x) vs RTT median (y), both with 95% CIs."""
    colors = variant_colors(a.variants)
    markers = dict(zip(a.profiles, "osD^v<>ph*", strict=False))
    fig, ax = plt.subplots(figsize=(6.2, 4.2))
    drawn = 0
    for v in a.variants:
        for p in a.profiles:
            gx = a.groups.get((v, p, tput_label, "goodput_mbps"))
            gy = a.groups.get((v, p, lat_label, lat_metric))
            if not (gx and gy and gx.desc and gy.desc):
                continue
            dx, dy = gx.desc, gy.desc
            ax.errorbar(
                [dx.median],
                [dy.median],
                xerr=[[max(0, dx.median - dx.ci_lo)], [max(0, dx.ci_hi - dx.median)]],
                yerr=[[max(0, dy.median - dy.ci_lo)], [max(0, dy.ci_hi - dy.median)]],
                fmt=markers.get(p, "o"),
                color=colors[v],
                ms=8,
                capsize=3,
                mec="#333",
                label=f"{v}" + (f" @ {p}" if len(a.profiles) > 1 else ""),
            )
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"{tput_label} goodput_mbps [Mbit/s]  (→ better)")
    ax.set_ylabel(f"{lat_label} {lat_metric} [ms]  (↓ better)")
    ax.set_title("latency vs throughput (median, 95% CI); best is bottom right", fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="best")
    return to_svg(fig)


def cdf(
    a: Analysis, profile: str, series: dict[str, list[float]], metric: str, unit: str, title: str
) -> str | None:
    """Empirical CDF of pooled per-packet samples (e.g. every echo RTT of every repetition) per variant."""
    colors = variant_colors(a.variants)
    fig, ax = plt.subplots(figsize=(6.2, 3.6))
    drawn = 0
    for v in a.variants:
        x = np.sort(np.asarray(series.get(v, []), float))
        if x.size == 0:
            continue
        y = np.arange(1, x.size + 1) / x.size
        ax.step(x, y, where="post", color=colors[v], label=f"{v} (n={x.size})", lw=1.5)
        drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xscale("log")
    ax.set_xlabel(axis_label(metric, unit) + " (log scale)")
    ax.set_ylabel("fraction of samples ≤ x")
    ax.set_ylim(0, 1.02)
    ax.set_title(title, fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="lower right")
    return to_svg(fig)


def histogram_shares(
    series: dict[str, list[float]], bins: int = 40
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Shared log-spaced bin edges over every variant's positive samples, and each variant's share of its own
    samples per bin (each sums to 1)."""
    pos = {v: np.asarray([x for x in xs if x > 0], float) for v, xs in series.items()}
    pos = {v: x for v, x in pos.items() if x.size}
    if not pos:
        return np.array([]), {}
    lo, hi = min(x.min() for x in pos.values()), max(x.max() for x in pos.values())
    edges = np.geomspace(lo, hi * 1.0001, bins + 1) if hi > lo else np.array([lo * 0.9, hi * 1.1])
    return edges, {v: np.histogram(x, bins=edges)[0] / x.size for v, x in pos.items()}


def histogram(
    a: Analysis, series: dict[str, list[float]], metric: str, unit: str, title: str, bins: int = 40
) -> str | None:
    """The same pooled samples as cdf(), as a histogram (a second mode, e.g. a VPN's periodic stall, shows
    as its own hump where a CDF only bends)."""
    edges, shares = histogram_shares(series, bins)
    if not shares:
        return None
    colors = variant_colors(a.variants)
    fig, ax = plt.subplots(figsize=(6.2, 3.6))
    for v in a.variants:
        if v in shares:
            n = len([x for x in series[v] if x > 0])
            ax.stairs(shares[v], edges, lw=1.5, color=colors[v], label=f"{v} (n={n})")
    ax.set_xscale("log")
    ax.set_xlabel(axis_label(metric, unit) + " (log scale)")
    ax.set_ylabel("share of samples")
    ax.set_title(title, fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="upper right")
    return to_svg(fig)


def timeseries(
    a: Analysis, series: dict[str, list[list[tuple[float, float]]]], metric: str, unit: str, title: str
) -> str | None:
    """One thin line per repetition, one colour per variant."""
    colors = variant_colors(a.variants)
    fig, ax = plt.subplots(figsize=(6.2, 3.4))
    drawn = 0
    for v in a.variants:
        for k, pts in enumerate(series.get(v, [])):
            if not pts:
                continue
            t, y = zip(*pts, strict=True)
            ax.plot(
                t,
                y,
                color=colors[v],
                lw=1.2,
                alpha=0.8,
                marker=".",
                ms=3,
                label=f"{v} ({len(series[v])} runs)" if k == 0 else None,
            )
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_yscale("log")
    ax.set_xlim(left=0)
    ax.set_xlabel("time since the start of the transfer [s]")
    ax.set_ylabel(axis_label(metric, unit) + " (log scale)")
    ax.set_title(title, fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="best")
    return to_svg(fig)


def clients_curve(curves: dict[str, dict[int, dict[str, list[float]]]], title: str) -> str | None:
    """Seed 001's figure: response time (median line, p25-p75 band) and failure rate against N, log x; one
    colour per variant; medians over repetitions; an N with a failed case marked x on the failure panel."""
    colors = variant_colors(list(curves))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    drawn = 0
    for v, per_n in curves.items():
        ns = sorted(per_n)
        resp = [n for n in ns if per_n[n].get("p50")]
        if resp:
            med = {
                q: [float(np.median(per_n[n][q])) for n in resp]
                for q in ("p25", "p50", "p75")
                if all(per_n[n].get(q) for n in resp)
            }
            a1.plot(resp, med["p50"], color=colors[v], marker="o", ms=3, label=v)
            if "p25" in med and "p75" in med:
                a1.fill_between(resp, med["p25"], med["p75"], color=colors[v], alpha=0.2, lw=0)
            drawn += 1
        fail = [float(np.median(per_n[n]["fail"])) for n in ns]
        a2.plot(ns, fail, color=colors[v], marker="o", ms=3, label=v)
        bad = [n for n in ns if per_n[n].get("failed_cases")]
        a2.plot(bad, [float(np.median(per_n[n]["fail"])) for n in bad], "x", color=colors[v], ms=8)
        drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    for ax in (a1, a2):
        ax.set_xscale("log")
        ax.set_xlabel("clients N (log scale)")
        ax.grid(True, alpha=0.3)
    a1.set_ylabel("response time of successful calls [ms]")
    a2.set_ylabel("failed calls [%]")
    a2.set_ylim(-2, 102)
    a2.legend(fontsize=7, loc="best")  # every variant has a failure line, not always a response one
    fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    return to_svg(fig)


def degradation(axes: dict[str, dict[str, dict[float, dict[str, list[float]]]]]) -> str | None:
    """Seed 001's degradation figure: failed calls and median response time against loss (%) and one-way
    delay (ms), one column per axis, medians over repetitions, one colour per variant."""
    if not axes:
        return None
    names = {"loss_pct": "packet loss [%]", "delay_ms": "one-way delay [ms]"}
    variants = sorted({v for vs in axes.values() for v in vs})
    colors = variant_colors(variants)
    fig, grid = plt.subplots(2, len(axes), figsize=(5 * len(axes), 6), squeeze=False)
    for col, (axis, vs) in enumerate(axes.items()):
        for v, pts in vs.items():
            xs = sorted(pts)
            grid[0][col].plot(
                xs,
                [float(np.median(pts[x]["fail"])) if pts[x]["fail"] else np.nan for x in xs],
                color=colors[v],
                marker="o",
                ms=3,
                label=v,
            )
            ok = [x for x in xs if pts[x]["p50"]]
            grid[1][col].plot(
                ok, [float(np.median(pts[x]["p50"])) for x in ok], color=colors[v], marker="o", ms=3
            )
        grid[0][col].set_ylim(-2, 102)
        grid[0][col].set_ylabel("failed calls [%]")
        grid[1][col].set_ylabel("median response of successful calls [ms]")
        grid[1][col].set_xlabel(names.get(axis, axis))
        for r in (0, 1):
            grid[r][col].grid(True, alpha=0.3)
    grid[0][0].legend(fontsize=7, loc="best")
    fig.suptitle("many clients under degradation (Goethals et al.)", fontsize=9, x=0.01, ha="left")
    return to_svg(fig)


def per_peer(streams: dict[str, dict[str, list[tuple[float, float]]]], title: str) -> str | None:
    """Multi-host per-peer goodput over time (Nebula's benchmark blog): one panel per direction (tx = from the one host,
    rx = into it), one line per peer; equal lines = a fair share."""
    dirs = [d for d in ("tx", "rx") if streams.get(d)]
    if not dirs:
        return None
    fig, axes = plt.subplots(1, len(dirs), figsize=(6.2 * len(dirs) / 1.4, 3.4), squeeze=False, sharey=True)
    for ax, d in zip(axes[0], dirs, strict=True):
        for peer, pts in sorted(
            streams[d].items(), key=lambda kv: int(kv[0][1:]) if kv[0][1:].isdigit() else 0
        ):
            if pts:
                t, y = zip(*sorted(pts), strict=True)
                ax.plot(t, y, lw=1.2, marker=".", ms=3, label=peer)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("time since the start of the transfer [s]")
        ax.set_title(
            {"tx": "from the one host to each peer", "rx": "from each peer into the one host"}[d],
            fontsize=8,
            loc="left",
        )
        ax.legend(fontsize=6, loc="best", ncol=2)
    axes[0][0].set_ylabel(axis_label("goodput_mbps", "Mbit/s"))
    fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    return to_svg(fig)


def rounds(a: Analysis, per_round: dict[str, dict[int, float]], drift: list[float], title: str) -> str | None:
    """Each variant's value per round relative to its own median (1 = its median), with the drift reference
    (raw underlay TCP at every round boundary, relative to its median) as a dashed black line: a VPN line
    that follows the reference moved with the machine, not on its own."""
    colors = variant_colors(a.variants)
    fig, ax = plt.subplots(figsize=(6.2, 3.2))
    drawn = 0
    for v in a.variants:
        pts = sorted(per_round.get(v, {}).items())
        if len(pts) < 2:
            continue
        med = float(np.median([y for _, y in pts]))
        if med == 0:
            continue
        ax.plot(
            [r for r, _ in pts], [y / med for _, y in pts], color=colors[v], lw=1.3, marker="o", ms=3, label=v
        )
        drawn += 1
    if len(drift) >= 2:
        med = float(np.median(drift))
        ax.plot(
            range(1, len(drift) + 1),
            [d / med for d in drift],
            color="black",
            ls="--",
            lw=1.2,
            label="drift reference (raw TCP)",
        )
    if not drawn:
        plt.close(fig)
        return None
    ax.axhline(1.0, color="#999", lw=0.6)
    ax.set_xlabel("round (repetition)")
    ax.set_ylabel("value / its median")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title, fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="best")
    return to_svg(fig)


def cpu_memory(a: Analysis, profile: str) -> str | None:
    """Daemon CPU (% of one core, median with CI) on client and server, and peak RSS, per workload label."""
    us = [u for u in a.usage if u.profile == profile]
    if not us:
        return None
    labels = [lb for lb in a.labels if any(u.label == lb for u in us)]
    variants = [v for v in a.variants if any(u.variant == v for u in us)]
    by = {(u.variant, u.label): u for u in us}
    colors = variant_colors(a.variants)
    fig, (ax1, ax2) = plt.subplots(
        1,
        2,
        figsize=(9.6, 0.5 * len(labels) * max(1, len(variants)) / 2 + 2.2),
        gridspec_kw={"width_ratios": [2, 1]},
    )
    h = 0.8 / max(1, len(variants))
    for i, v in enumerate(variants):
        ys, cpu, err_lo, err_hi, rss = [], [], [], [], []
        for j, lb in enumerate(labels):
            u = by.get((v, lb))
            if not u:
                continue
            tot = [d for d in (u.cpu_client, u.cpu_server) if d is not None]
            m = sum(d.median for d in tot)
            lo = sum(d.ci_lo for d in tot)
            hi = sum(d.ci_hi for d in tot)
            ys.append(j + i * h)
            cpu.append(m)
            err_lo.append(max(0, m - lo))
            err_hi.append(max(0, hi - m))
            rss.append(max(x for x in (u.rss_client_mb, u.rss_server_mb, 0.0) if x is not None))
        if not ys:
            continue
        ax1.barh(ys, cpu, height=h, xerr=[err_lo, err_hi], color=colors[v], label=v, capsize=2)
        ax2.barh(ys, rss, height=h, color=colors[v])
    ticks = [j + h * (len(variants) - 1) / 2 for j in range(len(labels))]
    ax1.set_yticks(ticks, labels)
    ax2.set_yticks(ticks, labels)
    ax1.invert_yaxis()
    ax2.invert_yaxis()
    ax1.set_xlabel("daemon CPU, client + server [% of one core] (median, 95% CI)")
    ax2.set_xlabel("daemon peak RSS, larger host [MiB]")
    ax1.legend(fontsize=7, loc="best")
    ax1.set_title(f"CPU and memory of the VPN daemons · {profile}", fontsize=9, loc="left")
    fig.tight_layout()
    return to_svg(fig)


def pooled(rows: list[dict[str, Any]]) -> dict[int, list[tuple[float, float]]]:
    out: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        out[r["case_id"]].append((r["t"], r["value"]))
    return out


ROLE_STYLE = {"client": "-", "server": "--", "peer": ":"}
# label -> variant -> [(host role, [(t, RSS MiB)])]
RssLines = dict[str, dict[str, list[tuple[str, list[tuple[float, float]]]]]]


def rss_lines(rows: list[dict[str, Any]], cases: dict[Any, tuple[str, str, str, str]]) -> RssLines:
    """Stored `daemon_rss_mb` series rows ({case_id, host, t, value}) pooled for memory_over_time():
    label -> variant -> [(role, points sorted by time)], one entry per (case, host), in case then role order.
    `cases` maps a row's case_id to (variant, label, client host, server host); rows of other cases are left
    out. Role: "client", "server", or "peer" for any other host (multihost's further peers)."""
    per: dict[tuple[Any, str], list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r["case_id"] in cases and r["host"] is not None:
            per[(r["case_id"], r["host"])].append((float(r["t"]), float(r["value"])))
    rank = {"client": 0, "server": 1, "peer": 2}
    case_rank = {cid: i for i, cid in enumerate(cases)}
    keyed = []
    for (cid, host), pts in per.items():
        variant, label, client, server = cases[cid]
        role = "client" if host == client else "server" if host == server else "peer"
        keyed.append(((case_rank[cid], rank[role], host), variant, label, role, sorted(pts)))
    out: RssLines = {}
    for _, variant, label, role, pts in sorted(keyed, key=lambda k: k[0]):
        out.setdefault(label, {}).setdefault(variant, []).append((role, pts))
    return out


def memory_over_time(a: Analysis, profile: str, lines: RssLines) -> str | None:
    """Daemon RSS over each case (from rss_lines()): one panel per workload label, one line per repetition and
    host, colour = VPN, line style = client / server / other peer. A climbing line: a daemon that grows."""
    labels = [lb for lb in a.labels if any(pts for reps in lines.get(lb, {}).values() for _, pts in reps)]
    if not labels:
        return None
    colors = variant_colors(a.variants)
    ncol = min(3, len(labels))
    nrow = math.ceil(len(labels) / ncol)
    fig, axes = plt.subplots(
        nrow, ncol, figsize=(3.3 * ncol + 0.4, 2.5 * nrow + 0.9), squeeze=False, sharey=True
    )
    roles, variants = set(), []
    for ax, lb in zip(axes.flat, labels, strict=False):
        for v in a.variants:
            for role, pts in lines[lb].get(v, []):
                if not pts:
                    continue
                t, y = zip(*pts, strict=True)
                ax.plot(t, y, color=colors[v], ls=ROLE_STYLE[role], lw=1.0, alpha=0.75)
                roles.add(role)
                if v not in variants:
                    variants.append(v)
        ax.set_title(lb, fontsize=8, loc="left")
        ax.set_xlim(left=0)
        ax.set_xlabel("time since the case started [s]")
    for ax in axes.flat[len(labels) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("daemon RSS [MiB]")
    handles = [Line2D([], [], color=colors[v], lw=2, label=v) for v in variants]
    handles += [Line2D([], [], color="#444", ls=ROLE_STYLE[r], label=r) for r in ROLE_STYLE if r in roles]
    fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=min(6, len(handles)), frameon=False)
    fig.suptitle(
        f"memory over time of the VPN daemons · {profile} (one line per repetition and host)",
        fontsize=9,
        x=0.01,
        ha="left",
    )
    fig.tight_layout(rect=(0, 0.08 if nrow == 1 else 0.05, 1, 1))
    return to_svg(fig)
