"""iperf3 TCP bulk transfer, client -> server over the tunnel: one stream, or N parallel streams (-P)."""

from __future__ import annotations

from pydantic import Field

from tunnelbench.workloads.base import CaseContext, MetricSpec, Outcome, Params, Workload
from tunnelbench.workloads.iperf3 import parse_tcp, run_client

TCP_METRICS = (
    MetricSpec("goodput_mbps", "Mbit/s", "higher", "application goodput at the receiver"),
    MetricSpec("goodput_sender_mbps", "Mbit/s", "higher", "goodput as the sender counted it"),
    MetricSpec("retransmits", "count", "lower", "TCP retransmitted segments (TCP_INFO)"),
    MetricSpec("retransmit_rate", "ratio", "lower", "retransmits / segments sent (bytes sent / MSS)"),
    MetricSpec("max_cwnd_kbytes", "KiB", "none", "largest sender congestion window seen"),
    MetricSpec("tcp_rtt_mean_ms", "ms", "lower", "mean smoothed RTT of the TCP connection(s)"),
    MetricSpec("iperf_cpu_client_pct", "%", "none", "iperf3 client CPU (saturation check)"),
    MetricSpec("iperf_cpu_server_pct", "%", "none", "iperf3 server CPU (saturation check)"),
)


class TcpParams(Params):
    duration_s: int = Field(10, ge=1, le=3600, description="measured seconds (iperf3 -t takes whole seconds)")
    omit_s: int = Field(1, ge=0, le=60, description="warm-up seconds excluded (iperf3 -O)")
    streams: int = Field(1, ge=1, le=128, description="parallel streams (iperf3 -P)")
    reverse: bool = Field(False, description="server sends to client (iperf3 -R)")


class Tcp(Workload):
    name = "tcp"
    summary = "iperf3 TCP bulk transfer (single stream by default; streams = N for -P N)"
    tools = ("iperf3", "ss")
    headline = ("goodput_mbps", "retransmit_rate")
    Params = TcpParams
    metrics = TCP_METRICS

    def label(self) -> str:
        p = self.params
        return f"tcp-p{p.streams}" if p.streams > 1 else "tcp"

    def expected_seconds(self) -> float:
        return self.params.duration_s + self.params.omit_s + 1

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        args = ["-P", str(p.streams)] + (["-R"] if p.reverse else [])
        data, ran = run_client(ctx, args, p.duration_s, p.omit_s, self.label())
        # measuring = the kept intervals; the -O warm-up and tool start-up are case overhead
        out = Outcome(measure_s=min(ran, p.duration_s))
        parse_tcp(data, out)
        return out
