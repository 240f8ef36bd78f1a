"""Tidy exports of a run: one row per measured value with its full case key (CSV or JSON).

Columns: run_id, vpn, vpn_version, profile, workload, label, repetition, attempt, host, metric, value, unit,
better. `host` is empty for the case's own metrics and names the host for per-host metrics (daemon CPU and
memory of the client or server host). Only successful cases are exported; failed cases are in the report
and in the SQLite store. With series=True, time series (rtt_ms per echo, goodput_mbps per iperf3 interval,
daemon CPU) follow as rows with a `t` column (seconds since the case started)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from tunnelbench.analysis.analyze import RunData, metric_spec

COLUMNS = (
    "run_id",
    "vpn",
    "vpn_version",
    "profile",
    "workload",
    "label",
    "repetition",
    "attempt",
    "host",
    "metric",
    "value",
    "unit",
    "better",
)
SERIES_COLUMNS = (*COLUMNS[:10], "t", "value", "unit")


def metric_rows(run: RunData) -> list[dict[str, Any]]:
    cases = {c.id: c for c in run.cases}
    out = []
    for m in run.metrics:
        c = cases[m["case_id"]]
        out.append(
            {
                "run_id": run.run_id,
                "vpn": c.vpn,
                "vpn_version": run.version(c.vpn),
                "profile": c.profile,
                "workload": c.workload,
                "label": c.label,
                "repetition": c.repetition,
                "attempt": c.attempt,
                "host": m["host"],
                "metric": m["name"],
                "value": m["value"],
                "unit": m["unit"],
                "better": metric_spec(c.workload, m["name"], run)[0],
            }
        )
    return out


def series_rows(run: RunData) -> list[dict[str, Any]]:
    ok = {c.id: c for c in run.cases if c.status == "ok"}
    out = []
    for r in run.store.series(list(ok)):
        c = ok[r["case_id"]]
        out.append(
            {
                "run_id": run.run_id,
                "vpn": c.vpn,
                "vpn_version": run.version(c.vpn),
                "profile": c.profile,
                "workload": c.workload,
                "label": c.label,
                "repetition": c.repetition,
                "attempt": c.attempt,
                "host": r["host"],
                "metric": r["name"],
                "t": r["t"],
                "value": r["value"],
                "unit": r["unit"],
            }
        )
    return out


def to_csv(rows: list[dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if r.get(k) is None else r.get(k) for k in columns})
    return buf.getvalue()


def to_json(run: RunData, series: bool = False) -> str:
    doc = {
        "run": {k: run.run[k] for k in ("id", "tag", "started", "ended", "status", "tunnelbench_version")},
        "environment": run.env,
        "vpns": [{k: v[k] for k in ("name", "version", "status", "reason")} for v in run.vpns],
        "cases": [
            {
                "id": c.id,
                "vpn": c.vpn,
                "profile": c.profile,
                "workload": c.workload,
                "label": c.label,
                "params": c.params,
                "repetition": c.repetition,
                "attempt": c.attempt,
                "status": c.status,
                "error": c.error,
                "client": c.client,
                "server": c.server,
            }
            for c in run.cases
        ],  # fmt: skip
        "metrics": metric_rows(run),
    }
    if series:
        doc["series"] = series_rows(run)
    return json.dumps(doc, indent=1)
