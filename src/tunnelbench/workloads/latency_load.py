"""Latency under load (the ten-VPN thesis's buffer bloat): ICMP echo at a fine interval on the idle tunnel first,
then again while an iperf3 TCP bulk transfer saturates the same path; the added latency is the loaded
percentile minus the idle one, measured in the same case."""

from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np
from pydantic import Field

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome, Series
from tunnelbench.instruments.common import start_iperf3
from tunnelbench.instruments.ping import parse_ping
from tunnelbench.workloads.base import TOOL_START_S, CaseContext, Params, Workload, WorkloadError

LOAD_PORT = 5211


class LatencyLoadParams(Params):
    idle_s: float = Field(3.0, gt=0, le=600, description="seconds of pinging on the idle tunnel")
    load_s: float = Field(8.0, gt=0, le=3600, description="seconds of pinging under load")
    warmup_s: float = Field(1.0, ge=0, le=60, description="load runs this long before pinging starts")
    interval_s: float = Field(0.01, ge=0.002, le=1, description="seconds between echo requests")
    streams: int = Field(1, ge=1, le=64, description="parallel TCP streams of the load (iperf3 -P)")
    direction: Literal["up", "down"] = Field("up", description="up = client sends the load, down = server")
    timeout_s: float = Field(5.0, gt=0, le=60, description="a reply later than this counts as lost")


def real_spacing(parsed: dict[str, Any]) -> float | None:
    """Seconds between echo requests as ping kept them (from the -D reply timestamps), None when unknown."""
    ts = sorted(t for t, _ in parsed["replies"].values())
    return (ts[-1] - ts[0]) / (len(ts) - 1) if len(ts) > 1 else None


class LatencyLoad(Workload):
    name = "latency_load"
    summary = "ping at a fine interval, idle and then under a TCP bulk transfer (buffer bloat)"
    tools = ("ping", "iperf3", "ss")
    headline = ("added_latency_p50_ms", "added_latency_p99_ms", "load_goodput_mbps")
    Params = LatencyLoadParams
    params: LatencyLoadParams
    metrics = (
        MetricSpec("idle_rtt_p50_ms", "ms", "lower", "median RTT on the idle tunnel"),
        MetricSpec("idle_rtt_p99_ms", "ms", "lower", "99th percentile RTT on the idle tunnel"),
        MetricSpec("loaded_rtt_p50_ms", "ms", "lower", "median RTT during the bulk transfer"),
        MetricSpec("loaded_rtt_p99_ms", "ms", "lower", "99th percentile RTT during the bulk transfer"),
        MetricSpec("added_latency_p50_ms", "ms", "lower", "loaded minus idle median RTT (buffer bloat)"),
        MetricSpec("added_latency_p99_ms", "ms", "lower", "loaded minus idle 99th percentile RTT"),
        MetricSpec("idle_ping_loss_pct", "%", "lower", "echo requests lost on the idle tunnel"),
        MetricSpec("loaded_ping_loss_pct", "%", "lower", "echo requests lost under load"),
        MetricSpec("load_goodput_mbps", "Mbit/s", "higher", "goodput of the bulk transfer"),
    )

    def label(self) -> str:
        p = self.params
        return f"latency-load-{p.direction}" + (f"-p{p.streams}" if p.streams > 1 else "")

    def expected_seconds(self) -> float:
        p = self.params
        return p.idle_s + p.warmup_s + 1.25 * p.load_s + 1 + 2 * p.timeout_s

    def typical_seconds(self, cases: int = 1) -> float:
        """Idle pings, then the load's fixed length (it outlasts the loaded pings): see run()."""
        p = self.params
        return p.idle_s + p.warmup_s + 1.25 * p.load_s + 1 + 2 * TOOL_START_S

    def _ping(
        self, ctx: CaseContext, seconds: float, name: str, spacing_s: float | None = None
    ) -> dict[str, Any]:
        """`seconds` of echo requests: their count from the spacing ping really keeps (`spacing_s`, measured
        in the idle phase), not the one asked for: `ping -i 0.01` sends every 17-18 ms on some machines, and a
        count from the asked interval ran the "loaded" phase on past the load, onto an idle path."""
        p = self.params
        count = max(1, int(seconds / max(p.interval_s, spacing_s or 0.0)))
        argv = ["ping", "-D", "-n", "-c", str(count), "-i", f"{p.interval_s:g}", "-W", f"{p.timeout_s:g}",
                ctx.server_ip]  # fmt: skip
        res = ctx.client.run(argv, timeout=seconds * 3 + p.timeout_s + 10, check=False)
        (ctx.artifact_dir / f"{name}.txt").write_text(res.stdout + res.stderr)
        parsed = parse_ping(res.stdout)
        if not parsed["replies"]:
            raise WorkloadError(f"no echo reply during the {name} phase")
        return parsed

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        t0 = time.monotonic()
        idle = self._ping(ctx, p.idle_s, "ping-idle")
        spacing = real_spacing(idle)
        # the load outlasts the loaded pings: a quarter more than asked, for spacing that grows under load
        load_s = p.warmup_s + 1.25 * p.load_s + 1
        args = ["-P", str(p.streams)] + (["-R"] if p.direction == "down" else [])
        run = start_iperf3(
            ctx,
            ctx.client,
            ctx.server,
            ctx.server_ip,
            LOAD_PORT,
            args,
            load_s,
            "load",
            mss=ctx.options.get("mss"),
        )
        try:
            time.sleep(p.warmup_s)
            loaded = self._ping(ctx, p.load_s, "ping-loaded", spacing)
            data = run.wait(timeout=ctx.remaining())
        finally:
            run.stop()
        out = Outcome(measure_s=time.monotonic() - t0)
        stats = {}
        for phase, parsed in (("idle", idle), ("loaded", loaded)):
            tx = parsed["transmitted"]
            out.add(f"{phase}_ping_loss_pct", 100.0 * (tx - parsed["received"]) / tx if tx else None)
            replies = sorted(parsed["replies"].values())
            vals = np.array([r for _, r in replies])
            stats[phase] = {q: float(np.percentile(vals, q)) for q in (50, 99)}
            for q in (50, 99):
                out.add(f"{phase}_rtt_p{q}_ms", stats[phase][q])
            out.series.append(Series(f"{phase}_rtt_ms", "ms", [(ts - replies[0][0], r) for ts, r in replies]))
        for q in (50, 99):
            out.add(f"added_latency_p{q}_ms", stats["loaded"][q] - stats["idle"][q])
        out.add("load_goodput_mbps", data["end"]["sum_received"]["bits_per_second"] / 1e6)
        return out
