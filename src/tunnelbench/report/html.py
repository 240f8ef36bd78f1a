"""The HTML page of a stored run. `write_html` writes the full report (report/full.py: statistics, tiers,
plots) and a Markdown summary next to it; `render_html` is the plain tables-only page, kept as a fallback."""

from __future__ import annotations

import datetime as dt
import tomllib
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape

from tunnelbench.analysis.summary import Summary, headline_rows
from tunnelbench.report.fmt import num, spread
from tunnelbench.report.terminal import vpn_order
from tunnelbench.store import Store


def render_html(store: Store, run_id: str, summary: Summary) -> str:
    env = Environment(loader=PackageLoader("tunnelbench", "report/templates"), autoescape=select_autoescape())
    run = store.run_row(run_id)
    order = {v: i for i, v in enumerate(vpn_order(store, run_id))}
    rows, last = [], None
    for r in sorted(
        headline_rows(summary), key=lambda r: (r.profile, order.get(r.vpn, 99), r.label, r.metric)
    ):
        cpu = "–"
        if r.cpu_client or r.cpu_server:
            cpu = f"{num(r.cpu_client.median if r.cpu_client else None)} / {num(r.cpu_server.median if r.cpu_server else None)}"
        rows.append(
            {
                "vpn": r.vpn,
                "profile": r.profile,
                "label": r.label,
                "metric": r.metric,
                "unit": r.unit,
                "median": num(r.stat.median, r.unit),
                "spread": spread(r.stat.lo, r.stat.hi, r.unit),
                "n": r.stat.n,
                "ratio": num(r.ratio) if r.ratio is not None else "",
                "cpu": cpu,
                "rss": num(r.rss_max_mb),
                "sep": last is not None and r.vpn != last,
            }
        )
        last = r.vpn
    bad = [c for c in store.cases(run_id) if c.status != "ok"]
    phases = store.phases(run_id)
    try:
        name = tomllib.loads(run["scenario"]).get("name", "")
    except tomllib.TOMLDecodeError:
        name = ""
    return env.get_template("run.html").render(
        run=run,
        rows=rows,
        vpns=store.vpns(run_id),
        bad_cases=bad,
        phases=phases,
        phase_rows=sorted((k, v) for k, v in phases.items() if k != "wall"),
        env=sorted(store.env(run_id).items()),
        scenario_name=name,
        started=dt.datetime.fromtimestamp(run["started"], dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )


def write_html(store: Store, run_id: str, summary: Summary, path: Path) -> Path:
    """The full report of this run at `path`, and its Markdown summary at the same name with .md."""
    from tunnelbench.analysis.analyze import analyze, load_run
    from tunnelbench.report.full import render_markdown, render_report

    a = analyze([load_run(store.path.parent, run_id)])
    path.write_text(render_report(a))
    path.with_suffix(".md").write_text(render_markdown(a))
    return path
