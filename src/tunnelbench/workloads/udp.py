"""iperf3 UDP, client -> server over the tunnel, unlimited (-b 0, seed 003) or at a fixed rate."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from tunnelbench.workloads.base import CaseContext, MetricSpec, Outcome, Params, Workload
from tunnelbench.workloads.iperf3 import parse_udp, run_client


class UdpParams(Params):
    duration_s: int = Field(10, ge=1, le=3600, description="measured seconds (iperf3 -t takes whole seconds)")
    bitrate: str = Field("0", description="iperf3 -b: 0 = unlimited, or e.g. 100M, 1G")
    length: int | None = Field(None, ge=16, le=65507, description="datagram payload bytes (iperf3 -l)")

    @field_validator("bitrate")
    @classmethod
    def _rate(cls, v: str) -> str:
        if not re.fullmatch(r"\d+(\.\d+)?[KMG]?", v):
            raise ValueError("bitrate must look like 0, 500K, 100M or 1G")
        return v


class Udp(Workload):
    name = "udp"
    summary = "iperf3 UDP stream (bitrate 0 = unlimited sender, or a fixed rate)"
    tools = ("iperf3", "ss")
    headline = ("goodput_mbps", "udp_loss_pct", "udp_jitter_ms")
    Params = UdpParams
    metrics = (
        MetricSpec("goodput_mbps", "Mbit/s", "higher", "received bit rate"),
        MetricSpec("goodput_sender_mbps", "Mbit/s", "none", "offered bit rate"),
        MetricSpec("udp_loss_pct", "%", "lower", "datagrams lost"),
        MetricSpec("udp_jitter_ms", "ms", "lower", "RFC 3550 interarrival jitter"),
        MetricSpec("udp_packets", "count", "none", "datagrams sent"),
        MetricSpec("udp_lost_packets", "count", "lower", "datagrams lost"),
        MetricSpec("iperf_cpu_client_pct", "%", "none", "iperf3 client CPU (saturation check)"),
        MetricSpec("iperf_cpu_server_pct", "%", "none", "iperf3 server CPU (saturation check)"),
    )

    def label(self) -> str:
        b = self.params.bitrate
        return "udp-unlimited" if float(re.sub(r"[KMG]", "", b)) == 0 else f"udp-{b}"

    def expected_seconds(self) -> float:
        return self.params.duration_s + 1

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        args = ["-u", "-b", p.bitrate] + (["-l", str(p.length)] if p.length else [])
        data, ran = run_client(ctx, args, p.duration_s, 0, self.label())
        out = Outcome(measure_s=min(ran, p.duration_s))  # tool start-up is case overhead
        parse_udp(data, out)
        return out
