"""ICMP echo RTT over the tunnel on an idle path (iputils ping with timestamps)."""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
from pydantic import Field

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome, Series
from tunnelbench.workloads.base import CaseContext, Params, Workload, WorkloadError

# an echo reply line of `ping -D` ("[ts] 64 bytes from ...: icmp_seq=N ttl=64 time=0.05 ms"), never an ICMP
# error ping prints with a timestamp too ("From 10.77.0.2 icmp_seq=N Destination Host Unreachable", e.g. a TAP
# VPN whose peer stopped answering ARP). The one parser of ping's replies (ping and resilience use it).
REPLY = re.compile(r"^\[(?P<ts>[\d.]+)\] \d+ bytes from .*icmp_seq=(?P<seq>\d+) .*time=(?P<rtt>[\d.]+) ms")
SUMMARY = re.compile(r"(?P<tx>\d+) packets transmitted, (?P<rx>\d+) (packets )?received")
RTT_LINE = re.compile(r"= (?P<min>[\d.]+)/(?P<avg>[\d.]+)/(?P<max>[\d.]+)/(?P<mdev>[\d.]+) ms")


def echo_replies(text: str) -> list[tuple[float, int, float]]:
    """(timestamp, icmp_seq, RTT ms) of every echo reply in `ping -D` output, in output order; lines ping
    marks (DUP!) and ICMP errors skipped. A seq may repeat (unmarked duplicates, or wrapped past 65535)."""
    return [
        (float(m["ts"]), int(m["seq"]), float(m["rtt"]))
        for line in text.splitlines()
        if (m := REPLY.match(line)) and "DUP!" not in line
    ]


def parse_ping(text: str) -> dict[str, Any]:
    """Parse `ping -D` output: per-reply RTTs (first reply per seq; duplicates ignored) and the summary."""
    rtts: dict[int, tuple[float, float]] = {}
    for ts, seq, rtt in echo_replies(text):
        rtts.setdefault(seq, (ts, rtt))
    s = SUMMARY.search(text)
    if not s:
        raise WorkloadError("ping printed no summary line")
    tx, rx = int(s["tx"]), int(s["rx"])
    return {"transmitted": tx, "received": rx, "replies": rtts, "summary": RTT_LINE.search(text)}


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
