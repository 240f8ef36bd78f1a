"""Per (VPN, profile, workload label, metric): n, median, spread, ratio to the `internal` baseline, and the
daemons' CPU and memory during those cases."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from tunnelbench.analysis.analyze import has_ratio
from tunnelbench.catalog import WORKLOADS
from tunnelbench.store import Store

BASELINE = "internal"


@dataclass
class Stat:
    n: int
    median: float
    mean: float
    sd: float
    lo: float  # min over repetitions
    hi: float  # max over repetitions

    @classmethod
    def of(cls, values: list[float]) -> Stat:
        a = np.asarray(values, dtype=float)
        return cls(
            int(a.size),
            float(np.median(a)),
            float(a.mean()),
            float(a.std(ddof=1)) if a.size > 1 else 0.0,
            float(a.min()),
            float(a.max()),
        )

    @property
    def cv(self) -> float:
        return self.sd / self.mean if self.mean else float("nan")


@dataclass
class Row:
    vpn: str
    profile: str
    label: str
    workload: str
    metric: str
    unit: str
    stat: Stat
    ratio: float | None = None  # median / baseline median
    cpu_client: Stat | None = None
    cpu_server: Stat | None = None
    rss_max_mb: float | None = None


@dataclass
class Summary:
    run_id: str
    rows: list[Row] = field(default_factory=list)
    failures: dict[tuple[str, str, str], int] = field(
        default_factory=dict
    )  # (vpn, profile, label) -> failed cases
    skipped: dict[str, str] = field(default_factory=dict)  # vpn -> reason


def summarize(store: Store, run_id: str) -> Summary:
    rows = store.metrics(run_id)
    values: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    units: dict[str, str] = {}
    workload_of: dict[str, str] = {}
    cpu: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    rss: dict[tuple[str, str, str], float] = {}
    clients: dict[int, tuple[str, str]] = {}
    for c in store.cases(run_id):
        clients[c.id] = (c.client, c.server)
    for r in rows:
        key = (r["vpn"], r["profile"], r["label"])
        workload_of[r["label"]] = r["workload"]
        if r["name"] == "daemon_cpu_pct":
            cli, srv = clients.get(r["case_id"], ("", ""))
            role = "client" if r["host"] == cli else "server" if r["host"] == srv else None
            if role:
                cpu[key][role].append(r["value"])
        elif r["name"] == "daemon_rss_mb":
            rss[key] = max(rss.get(key, 0.0), r["value"])
        elif r["host"] is None:
            values[(*key, r["name"])].append(r["value"])
            units[r["name"]] = r["unit"]
    out = Summary(run_id)
    for (vpn, profile, label, metric), vals in sorted(values.items()):
        key = (vpn, profile, label)
        st = Stat.of(vals)
        row = Row(vpn, profile, label, workload_of[label], metric, units[metric], st)
        base = values.get((BASELINE, profile, label, metric))
        if base and vpn != BASELINE and has_ratio(metric, units[metric]):
            bm = float(np.median(base))
            row.ratio = st.median / bm if bm else None
        if cpu[key]["client"]:
            row.cpu_client = Stat.of(cpu[key]["client"])
        if cpu[key]["server"]:
            row.cpu_server = Stat.of(cpu[key]["server"])
        row.rss_max_mb = rss.get(key)
        out.rows.append(row)
    for c in store.cases(run_id):
        if c.status in ("failed", "interrupted", "error"):
            k = (c.vpn, c.profile, c.label)
            out.failures[k] = out.failures.get(k, 0) + 1
    for v in store.vpns(run_id):
        if v["status"] != "ok":
            out.skipped[v["name"]] = f"{v['status']}: {v['reason']}"
    return out


def headline_rows(summary: Summary) -> list[Row]:
    """The rows the terminal shows: each workload's headline metrics, in scenario order of VPNs."""
    keep = []
    for r in summary.rows:
        wl = WORKLOADS.get(r.workload)
        if wl and r.metric in wl.headline:
            keep.append(r)
    return keep
