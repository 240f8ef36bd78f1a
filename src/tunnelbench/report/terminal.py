"""The terminal summary printed at the end of `run` and by `report`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from tunnelbench.analysis.analyze import Analysis, RunData
from tunnelbench.analysis.emulator import facts_lines
from tunnelbench.catalog import DRIVERS
from tunnelbench.report.fmt import num, spread
from tunnelbench.report.headline import CAPTION, Headline
from tunnelbench.vpns.impossible import IMPOSSIBLE

if TYPE_CHECKING:
    from tunnelbench.analysis.compare import Comparison
    from tunnelbench.report.reading import Reading


def summary_table(a: Analysis, run: RunData) -> Table:
    """Every headline metric of one run per VPN and workload: median, min-max, n, the ratio to the baseline and
    the daemons' CPU and memory, from the run's one analysis (the headline's own)."""
    t = Table(
        title=f"tunnelbench run {run.run_id}: median over repetitions",
        title_justify="left",
        caption="× internal: median / median of the no-VPN baseline (throughput, latency, time metrics)",
        caption_justify="left",
    )
    cols: list[tuple[str, JustifyMethod]] = [
        ("VPN", "left"),
        ("workload", "left"),
        ("metric", "left"),
        ("median", "right"),
        ("min–max", "right"),
        ("n", "right"),
        ("× internal", "right"),
        ("CPU% cli/srv", "right"),
        ("RSS MiB", "right"),
    ]
    for col, just in cols:
        t.add_column(col, justify=just)
    rank = {v["name"]: i for i, v in enumerate(run.vpns)}
    usage = {(u.variant, u.profile, u.label): u for u in a.usage}
    failures = run.failures()
    groups = sorted(
        (g for g in a.groups.values() if g.run_id == run.run_id and run.is_headline(g.workload, g.metric)),
        key=lambda g: (g.profile, rank.get(g.vpn, 99), g.label, g.metric),
    )
    multi_profile = len({g.profile for g in groups}) > 1
    last_vpn = None
    for g in groups:
        u = usage.get((g.variant, g.profile, g.label))
        cpu = "–"
        if u and (u.cpu_client or u.cpu_server):
            cpu = f"{num(u.cpu_client.median if u.cpu_client else None)}/{num(u.cpu_server.median if u.cpu_server else None)}"
        rss = [x for x in (u.rss_client_mb, u.rss_server_mb) if x is not None] if u else []
        vpn_cell = ""
        if (g.vpn, g.profile) != last_vpn:
            vpn_cell = f"{g.vpn} {g.version or ''}".strip()
            if multi_profile:
                vpn_cell += f" @ {g.profile}"
            if last_vpn is not None:
                t.add_section()
        last_vpn = (g.vpn, g.profile)
        fails = failures.get((g.vpn, g.profile, g.label))
        label = Text(g.label).append(f" ({fails} failed)" if fails else "", "red")
        t.add_row(
            vpn_cell,
            label,
            g.metric,
            num(float(np.median(g.values)), g.unit),
            spread(min(g.values), max(g.values), g.unit),
            str(len(g.values)),
            num(g.ratio[0]) if g.ratio is not None else "",
            cpu,
            num(max(rss)) if rss else num(None),
        )
    return t


def headline_tables(h: Headline) -> list[Table]:
    """The headline as rich tables: a row per VPN (version dimmed below), a column per headline metric."""
    out = []
    multi = len({t.profile for t in h.tables}) > 1
    for t in h.tables:
        title = "headline" + (f" · profile {t.profile}" if multi or t.profile != "baseline" else "")
        tab = Table(title=title, title_justify="left", caption=CAPTION, caption_justify="left")
        tab.add_column("VPN", overflow="fold")
        for c in t.columns:
            tab.add_column(c.title, justify="right")
        for r in t.rows:
            name = Text(
                r.variant + (" (no VPN)" if r.baseline else ""), style="dim" if r.baseline else "bold"
            )
            if r.version:
                name.append(f"\n{r.version}", style="dim")
            cells = []
            for c in t.columns:
                cell = r.cells.get(c.label)
                style = "green" if cell is not None and cell.tier == 1 and not r.baseline else ""
                cells.append(Text(cell.text if cell else "–", style=style))
            tab.add_row(name, *cells)
        out.append(tab)
    return out


def print_headline(h: Headline, console: Console) -> None:
    for t in headline_tables(h):
        console.print(t)
    for text, tone in h.findings:
        console.print(Text(text, style={"ok": "green", "warn": "yellow", "bad": "bold red"}.get(tone, "")))


def print_summary(rd: Reading, console: Console, full: bool = False) -> None:
    """The headline and findings of the reading, then each run's own facts (phases, calibration, the
    emulator, security, the router's drops); with `full`, every headline metric per VPN and workload as well.
    Everything from the one reading (report/reading.py): nothing is read or computed again here."""
    print_headline(rd.headline, console)
    for run in rd.runs:
        _print_run(rd, run, console, full)


def _print_run(rd: Reading, run: RunData, console: Console, full: bool) -> None:
    if full:
        console.print(summary_table(rd.analysis, run))
    versions = {v["name"]: v["version"] for v in run.vpns}
    if not full:
        console.print(
            Text(f"every headline metric per workload: tunnelbench report --full {run.run_id}", style="dim")
        )
    if set(versions) >= set(DRIVERS):  # a `--vpn all` run: name the VPNs that have no driver here, and why
        for imp in IMPOSSIBLE.values():
            console.print(Text(f"{imp.name}: impossible here: {imp.reason}", style="yellow"))
    ph = run.phases
    wall = ph.get("wall")
    if wall:
        measure = ph.get("measure", 0.0)
        other = ", ".join(
            f"{k} {v:.0f} s"
            for k, v in sorted(ph.items(), key=lambda kv: -kv[1])
            if k not in ("wall", "measure") and v >= 0.5
        )
        console.print(f"wall {wall:.0f} s; measuring {measure:.0f} s ({100 * measure / wall:.0f}%); {other}")
    env = run.env
    good = [c for c in run.records.calibrations.values() if isinstance(c, dict) and c.get("ok")]
    if good:
        console.print(
            Text(
                f"calibration: {', '.join(str(c.get('profile')) for c in good)} within tolerance "
                f"({good[0].get('backend')})",
                style="green",
            )
        )
    tot = run.totals
    queue, kernel = (tot.get(n, (0.0, 0))[0] for n in ("engine_overflow_drops", "engine_kernel_drops"))
    if queue or kernel:
        console.print(
            Text(
                f"the impairment engine dropped packets the profiles did not ask for "
                f"(its queue {queue:.0f}, the kernel's {kernel:.0f}): the emulator was a bottleneck",
                "bold red",
            )
        )
    rt_sum, rt_cases = tot.get("engine_realtime", (0.0, 0))
    if rt_sum < rt_cases:  # engine_realtime is 1 per case that held SCHED_FIFO
        console.print(Text("the impairment engine ran without real-time priority in some cases", "yellow"))
    for line in facts_lines(run.emulator):
        style = "yellow" if ("(>10%)" in line or "emulator-bound" in line or "failed" in line) else ""
        console.print(Text(line, style=style))
    sec = rd.security[run.run_id]
    print_security(sec.rows, sec.scan, console, full)
    drops = env.get("router.offlab_drops")
    if drops not in (None, "0", "-1"):
        per = ", ".join(f"{vpn} {n}" for vpn, n in drop_shares(env, "offlab_drops").items() if n)
        console.print(
            Text(
                f"router dropped {drops} packet(s) addressed outside the lab (VPNs probing the "
                f"internet){'; per VPN: ' + per if per else ''}",
                style="yellow",
            )
        )


def print_security(
    rows: list[dict[str, Any]], scan: tuple[str, bool] | None, console: Console, full: bool = False
) -> None:
    """The Security table (one row per VPN, one column per check) and the key-scan line, when the run has any.
    A run without a leak, ACL or revocation case gets two summary lines instead (the table in --full)."""
    from tunnelbench.report.security import tone

    checked = ("plaintext leak", "relay", "ACL", "revocation")
    ran = any(r["cells"][c][0] not in ("not run", "not supported") for r in rows for c in checked)
    if rows and (ran or full):
        console.print(security_table(rows))
    elif rows:
        for col in ("off-lab drops", "key hygiene"):
            by: dict[str, list[str]] = {}
            for r in rows:
                by.setdefault(r["cells"][col][0], []).append(r["vpn"])
            parts = [f"{verdict} ({', '.join(vpns)})" for verdict, vpns in sorted(by.items())]
            bad = any(tone(v) == "bad" for v in by)
            console.print(Text(f"security · {col}: {'; '.join(parts)}", style="bold red" if bad else ""))
        console.print(
            Text(
                "security · leak, ACL, revocation: not in this scenario (`tunnelbench run security`)",
                style="dim",
            )
        )
    if scan:
        console.print(Text(f"key scan: {scan[0]}", style="green" if scan[1] else "bold red"))


def security_table(rows: list[dict[str, Any]], title: str = "security") -> Table:
    """One row per VPN, one column per check: the verdict coloured by its tone, the evidence below it."""
    from tunnelbench.report.security import COLUMNS

    t = Table(title=title, title_justify="left")
    for col in ("VPN", "version", *COLUMNS):
        t.add_column(col, overflow="fold")
    for r in rows:
        cells = []
        for col, (verdict, evidence) in r["cells"].items():
            style = {"ok": "green", "bad": "red"}.get(r["tones"][col], "dim")
            cells.append(
                Text(verdict, style=style) + (Text(f"\n{evidence}", style="dim") if evidence else "")
            )
        t.add_row(r["vpn"], r["version"], *cells)
    return t


def drop_shares(env: dict[str, str], key: str) -> dict[str, int]:
    """Each VPN's share of a router drop counter (`offlab_drops.<vpn>`: while its mesh was up)."""
    return {k.removeprefix(f"{key}."): int(v) for k, v in sorted(env.items()) if k.startswith(f"{key}.")}


def print_comparison(cmp: Comparison, console: Console, show_all: bool = False) -> None:
    """The table of `tunnelbench compare`: per matched group and metric, B relative to A."""
    import math

    from tunnelbench.analysis.stats import ALPHA

    t = Table(
        title=f"compare {cmp.run_a} (A) -> {cmp.run_b} (B); threshold {cmp.threshold_pct:g}%",
        title_justify="left",
        caption=(
            "change = median B / median A - 1 with bootstrap 95% CI; p = two-sided Mann-Whitney U (unpaired: two "
            f"runs share no rounds), Holm-corrected per metric; REGRESSION = gated, p < {ALPHA} and the whole CI "
            "beyond the threshold; a group disturbed or off-path in either run is not judged"
        ),
        caption_justify="left",
    )
    cols: list[tuple[str, JustifyMethod]] = [
        ("VPN", "left"),
        ("profile", "left"),
        ("workload", "left"),
        ("metric", "left"),
        ("A median", "right"),
        ("B median", "right"),
        ("n A/B", "right"),
        ("change", "right"),
        ("95% CI", "right"),
        ("p (Holm)", "right"),
        ("Cliff's δ", "right"),
        ("verdict", "left"),
    ]
    for col, just in cols:
        t.add_column(col, justify=just)
    shown = [c for c in cmp.changes if c.gated or show_all]
    for c in shown:
        style = {"REGRESSION": "bold red", "improvement": "green"}.get(c.verdict, "")
        verdict = Text(c.verdict, style)
        ci = "–" if math.isnan(c.ci_lo_pct) else f"{c.ci_lo_pct:+.1f}% … {c.ci_hi_pct:+.1f}%"
        p = "–" if math.isnan(c.p_holm) else f"{c.p_holm:.2g}"
        metric = Text(c.metric).append("" if c.gated else " (not gated)", "dim").append(f" [{c.unit}]")
        t.add_row(
            c.vpn,
            c.profile,
            c.label,
            metric,
            num(c.median_a, c.unit),
            num(c.median_b, c.unit),
            f"{c.n_a}/{c.n_b}",
            "–" if math.isnan(c.change_pct) else f"{c.change_pct:+.1f}%",
            ci,
            p,
            "–" if math.isnan(c.cliffs_delta) else f"{c.cliffs_delta:+.2f}",
            verdict,
        )
    console.print(t)
    hidden = len(cmp.changes) - len(shown)
    if hidden:
        console.print(f"{hidden} non-gated metric(s) not shown (--all lists them)")
    for m in cmp.underpowered:
        console.print(
            Text(
                f"{m}: too few repetitions for any significant result after Holm correction; "
                "this comparison cannot detect a regression (use more repetitions)",
                "yellow",
            )
        )
    for k in cmp.only_a:
        console.print(Text(f"only in A: {' · '.join(k)}", "yellow"))
    for k in cmp.only_b:
        console.print(Text(f"only in B: {' · '.join(k)}", "yellow"))
    for k in cmp.failed_b:
        console.print(
            Text(f"FAILED in B: {' · '.join(k)} was measured in A; every attempt in B failed", "bold red")
        )
    for vpn, profile, label, check in cmp.security_b:
        where = " · ".join(x for x in (vpn, profile, label) if x)
        console.print(Text(f"SECURITY REGRESSION: {check} passed in A and fails in B ({where})", "bold red"))
    n = len(cmp.regressions)
    if cmp.failed_b:
        console.print(Text(f"{len(cmp.failed_b)} case group(s) broken in B", "bold red"))
    if n:
        console.print(Text(f"{n} significant regression(s) beyond {cmp.threshold_pct:g}%", "bold red"))
    elif not cmp.failed_b and not cmp.security_b:
        console.print(Text(f"no significant regression beyond {cmp.threshold_pct:g}%", "green"))
