"""TCP bulk transfer, client -> server over the tunnel: one stream, or N parallel streams (-P).

Two engines measure it under the same metric names, so one tool can be checked against the other:
  iperf3 (default): a timed transfer with an omit_s warm-up (-O); every metric below.
  iperf2 (`engine = "iperf2"`, Debian's `iperf` 2.1, Gentile et al.'s tool): a timed transfer, or with
      `bytes = "100M"` a byte-count transfer (iperf -n; K/M/G are powers of 1024, k/m/g of 1000). iperf2
      has no -O: the warm-up runs omit_s longer and only the one-second reports after it count; a
      byte-count transfer counts from its first byte, so omit_s is not allowed with bytes. Its enhanced
      reports (-e) give retransmits (Rtry), the congestion window and the sRTT per second; it does not
      measure CPU, so iperf_cpu_client_pct and iperf_cpu_server_pct are absent. tcp_rtt_mean_ms is the
      mean of the sender's per-second sRTT samples, max_cwnd_kbytes the largest of them.
`reverse` (server sends) is -R on both engines."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome
from tunnelbench.instruments import iperf2
from tunnelbench.instruments.iperf3 import parse_tcp, run_client
from tunnelbench.workloads.base import TOOL_START_S, CaseContext, Params, Workload

TCP_METRICS = (
    MetricSpec("goodput_mbps", "Mbit/s", "higher", "application goodput at the receiver"),
    MetricSpec("goodput_sender_mbps", "Mbit/s", "higher", "goodput as the sender counted it"),
    MetricSpec("retransmits", "count", "lower", "TCP retransmitted segments (TCP_INFO)"),
    MetricSpec("retransmit_rate", "ratio", "lower", "retransmits / segments sent (bytes sent / MSS)"),
    MetricSpec("max_cwnd_kbytes", "KiB", "none", "largest sender congestion window seen"),
    MetricSpec("tcp_rtt_mean_ms", "ms", "lower", "mean smoothed RTT of the TCP connection(s)"),
    MetricSpec("tcp_mss_bytes", "B", "none", "maximum segment size the connection used (iperf3's tcp_mss)"),
    MetricSpec("iperf_cpu_client_pct", "%", "none", "iperf3 client CPU (saturation check; iperf3 only)"),
    MetricSpec("iperf_cpu_server_pct", "%", "none", "iperf3 server CPU (saturation check; iperf3 only)"),
)
BYTES = re.compile(r"[0-9]+[kmgKMG]?")  # ASCII digits (`\d` takes any script's)
MAX_BYTES = 1 << 40  # 1 TiB
BYTES_FLOOR_MBPS = 20  # a byte-count case's expected time assumes at least this rate


def byte_count(v: str) -> int:
    """iperf2's reading of -n: K/M/G are powers of 1024, k/m/g of 1000."""
    mult = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "K": 1024, "M": 1024**2, "G": 1024**3}
    return int(v.rstrip("kmgKMG")) * mult[v.lstrip("0123456789")]


class EngineParams(Params):
    """The engine choice tcp and udp share: iperf3 (timed), or iperf2 with an optional byte count."""

    engine: Literal["iperf3", "iperf2"] = Field("iperf3", description="the tool: iperf3, or iperf2 (iperf)")
    bytes: str | None = Field(
        None, description="iperf2 only: transfer this much instead of duration_s (-n 100M)"
    )

    @field_validator("bytes")
    @classmethod
    def _bytes(cls, v: str | None) -> str | None:
        if v is not None and (not BYTES.fullmatch(v) or not 0 < byte_count(v) <= MAX_BYTES):
            raise ValueError("bytes must look like 100M (MiB), 500K, 1G or 100m (10^6 bytes), at most 1024G")
        return v

    @model_validator(mode="after")
    def _byte_count_engine(self) -> EngineParams:
        if self.bytes and self.engine != "iperf2":
            raise ValueError(
                'bytes: a byte-count transfer needs engine = "iperf2" (the iperf3 engine is timed)'
            )
        return self


class TcpParams(EngineParams):
    duration_s: int = Field(10, ge=1, le=3600, description="measured seconds (iperf3 -t takes whole seconds)")
    omit_s: int = Field(1, ge=0, le=60, description="warm-up seconds excluded (iperf3 -O)")
    streams: int = Field(1, ge=1, le=128, description="parallel streams (iperf3 -P)")
    reverse: bool = Field(False, description="server sends to client (iperf3 -R)")

    @model_validator(mode="after")
    def _omit(self) -> TcpParams:
        if self.bytes and self.omit_s and "omit_s" in self.model_fields_set:
            raise ValueError(
                "omit_s: a byte-count transfer (bytes) is measured from its first byte; drop omit_s"
            )
        return self


class Tcp(Workload):
    name = "tcp"
    summary = "TCP bulk transfer, iperf3 or iperf2 (single stream by default; streams = N for -P N)"
    tools = ("iperf3", "iperf", "ss")
    headline = ("goodput_mbps", "retransmit_rate")
    Params = TcpParams
    params: TcpParams
    metrics = TCP_METRICS

    def label(self) -> str:
        p = self.params
        label = f"tcp-p{p.streams}" if p.streams > 1 else "tcp"
        if p.engine == "iperf2":
            label += "-iperf2" + (f"-{p.bytes}" if p.bytes else "")
        return label

    def omit(self) -> int:
        return 0 if self.params.bytes else self.params.omit_s

    def expected_seconds(self) -> float:
        p = self.params
        if p.bytes:
            return byte_count(p.bytes) * 8 / (BYTES_FLOOR_MBPS * 1e6) + 2
        return p.duration_s + p.omit_s + 1

    def typical_seconds(self, cases: int = 1) -> float | None:
        p = self.params
        return None if p.bytes else p.omit_s + p.duration_s + TOOL_START_S

    def run(self, ctx: CaseContext) -> Outcome:
        if self.params.engine == "iperf2":
            return self.run_iperf2(ctx)
        p = self.params
        args = ["-P", str(p.streams)] + (["-R"] if p.reverse else [])
        data, ran = run_client(ctx, args, p.duration_s, p.omit_s, self.label())
        # measuring = the kept intervals; the -O warm-up and tool start-up are case overhead
        out = Outcome(measure_s=min(ran, p.duration_s))
        parse_tcp(data, out)
        return out

    def run_iperf2(self, ctx: CaseContext) -> Outcome:
        p, omit = self.params, self.omit()
        args = ["-P", str(p.streams)] + (["-R"] if p.reverse else [])
        r = iperf2.run(
            ctx,
            args,
            udp=False,
            streams=p.streams,
            seconds=p.duration_s + omit,
            nbytes=p.bytes,
            omit_s=omit,
            tag=self.label(),
            expected_s=self.expected_seconds(),
        )
        sender, receiver = (r.server, r.client.local) if p.reverse else (r.client.local, r.server)
        # measuring = the kept intervals (a byte-count transfer: all of it); tool start-up is case overhead
        out = Outcome(measure_s=r.seconds if p.bytes else min(max(0.0, r.seconds - omit), p.duration_s))
        iperf2.add_tcp(out, sender, receiver, omit)
        series = iperf2.interval_series(r.client.local, omit)
        if series.points:  # a byte-count transfer shorter than a second has no interval
            out.series.append(series)
        return out
