"""ICMP echo RTT over the tunnel on an idle path (iputils ping with timestamps)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from pydantic import Field

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome, Series
from tunnelbench.instruments.ping import parse_ping
from tunnelbench.workloads.base import PING_LAG_S, TOOL_START_S, CaseContext, Params, Workload


def rtt_samples(parsed: dict[str, Any], out: Outcome) -> None:
    tx = parsed["transmitted"]
    out.add("ping_loss_pct", 100.0 * (tx - parsed["received"]) / tx if tx else None)
    vals = np.array([r for _, r in sorted(parsed["replies"].values())])
    if vals.size == 0:
        return
    out.add("rtt_min_ms", vals.min())
    out.add("rtt_avg_ms", vals.mean())
    out.add("rtt_max_ms", vals.max())
    # mdev as iputils computes it: population standard deviation
    out.add("rtt_mdev_ms", vals.std())
    for q in (50, 95, 99):
        out.add(f"rtt_p{q}_ms", float(np.percentile(vals, q)))
    # The ten-VPN thesis's spike ratio: the worst RTT over the mean (1 = no spike; a stall of a VPN shows as >> 1)
    out.add("rtt_spike_ratio", float(vals.max() / vals.mean()) if vals.mean() > 0 else None)


class PingParams(Params):
    count: int = Field(100, ge=1, le=1_000_000, description="echo requests")
    interval_s: float = Field(0.05, ge=0.002, le=10, description="seconds between requests (ping -i)")
    size: int = Field(56, ge=16, le=65000, description="ICMP payload bytes (ping -s)")
    timeout_s: float = Field(2.0, gt=0, le=60, description="wait for a late reply (ping -W)")


class Ping(Workload):
    name = "ping"
    summary = "ICMP echo RTT on an idle tunnel"
    tools = ("ping",)
    headline = ("rtt_p50_ms", "rtt_p99_ms", "ping_loss_pct")
    Params = PingParams
    params: PingParams
    metrics = (
        MetricSpec("rtt_min_ms", "ms", "lower", "minimum RTT"),
        MetricSpec("rtt_avg_ms", "ms", "lower", "mean RTT"),
        MetricSpec("rtt_max_ms", "ms", "lower", "maximum RTT"),
        MetricSpec("rtt_mdev_ms", "ms", "lower", "RTT standard deviation (ping's mdev)"),
        MetricSpec("rtt_p50_ms", "ms", "lower", "median RTT"),
        MetricSpec("rtt_p95_ms", "ms", "lower", "95th percentile RTT"),
        MetricSpec("rtt_p99_ms", "ms", "lower", "99th percentile RTT"),
        MetricSpec(
            "rtt_spike_ratio", "ratio", "lower", "maximum RTT / mean RTT (the ten-VPN thesis's spike ratio)"
        ),
        MetricSpec("ping_loss_pct", "%", "lower", "echo requests without reply"),
    )

    def label(self) -> str:
        return "ping"

    def expected_seconds(self) -> float:
        return self.params.count * self.params.interval_s + self.params.timeout_s

    def typical_seconds(self, cases: int = 1) -> float:
        return self.params.count * (self.params.interval_s + PING_LAG_S) + TOOL_START_S

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        argv = ["ping", "-D", "-n", "-c", str(p.count), "-i", f"{p.interval_s:g}", "-s", str(p.size),
                "-W", f"{p.timeout_s:g}", ctx.server_ip]  # fmt: skip
        t0 = time.monotonic()
        res = ctx.client.run(argv, timeout=ctx.remaining(), check=False)
        ran = time.monotonic() - t0
        (ctx.artifact_dir / "ping.txt").write_text(res.stdout + res.stderr)
        parsed = parse_ping(res.stdout)
        out = Outcome(measure_s=ran)
        rtt_samples(parsed, out)
        replies = sorted(parsed["replies"].values())
        if replies:
            t_first = replies[0][0]
            out.series.append(Series("rtt_ms", "ms", [(ts - t_first, r) for ts, r in replies]))
        return out
