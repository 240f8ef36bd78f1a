"""A simple self-contained HTML page of one stored run (the full report with plots comes later)."""

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
        rows.append({"vpn": r.vpn, "profile": r.profile, "label": r.label, "metric": r.metric, "unit": r.unit,
                     "median": num(r.stat.median, r.unit), "spread": spread(r.stat.lo, r.stat.hi, r.unit),
                     "n": r.stat.n, "ratio": num(r.ratio) if r.ratio is not None else "", "cpu": cpu,
                     "rss": num(r.rss_max_mb), "sep": last is not None and r.vpn != last})  # fmt: skip
        last = r.vpn
    bad = [c for c in store.cases(run_id) if c.status != "ok"]
    phases = store.phases(run_id)
    try:
        name = tomllib.loads(run["scenario"]).get("name", "")
    except tomllib.TOMLDecodeError:
        name = ""
    return env.get_template("run.html").render(
        run=run, rows=rows, vpns=store.vpns(run_id), bad_cases=bad, phases=phases,
        phase_rows=sorted((k, v) for k, v in phases.items() if k != "wall"),
        env=sorted(store.env(run_id).items()), scenario_name=name,
        started=dt.datetime.fromtimestamp(run["started"], dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )  # fmt: skip


def write_html(store: Store, run_id: str, summary: Summary, path: Path) -> Path:
    path.write_text(render_html(store, run_id, summary))
    return path
