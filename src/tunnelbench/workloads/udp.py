"""UDP, client -> server over the tunnel, unlimited (-b 0, the ten-VPN thesis) or at a fixed rate.

Two engines measure it under the same metric names, so one tool can be checked against the other:
  iperf3 (default): every metric below.
  iperf2 (`engine = "iperf2"`, Debian's `iperf` 2.1, Gentile et al.'s tool): the receiver's numbers come from the
      server report the client gets back (else the server's own output). iperf2 reads rates with K/M/G as
      powers of 1024, so the bitrate is passed in its powers-of-1000 spelling (100M -> 100m), the rate iperf3
      sends; it has no unlimited -b 0, so 0 becomes 100g (send as fast as it can). `bytes = "100M"` sends a
      byte count instead of duration_s (iperf -n; K/M/G powers of 1024). It does not measure CPU:
      iperf_cpu_client_pct and iperf_cpu_server_pct are absent."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome
from tunnelbench.instruments import iperf2
from tunnelbench.instruments.iperf3 import parse_udp, run_client
from tunnelbench.workloads.base import TOOL_START_S, CaseContext, Workload
from tunnelbench.workloads.tcp import EngineParams, byte_count

UNLIMITED_IPERF2 = "100g"  # iperf2 -b 0 is an error; this rate's gap between datagrams is ~0.1 us


class UdpParams(EngineParams):
    duration_s: int = Field(10, ge=1, le=3600, description="measured seconds (iperf3 -t takes whole seconds)")
    bitrate: str = Field("0", description="iperf3 -b: 0 = unlimited, or e.g. 100M, 1G")
    length: int | None = Field(None, ge=16, le=65507, description="datagram payload bytes (iperf3 -l)")

    @field_validator("bitrate")
    @classmethod
    def _rate(cls, v: str) -> str:
        return checked_bitrate(v)

    @model_validator(mode="after")
    def _fixed_rate(self) -> UdpParams:
        if self.bytes and unlimited(self.bitrate):
            raise ValueError(
                "bytes: a byte-count UDP transfer needs a fixed bitrate (unlimited floods are timed)"
            )
        return self


# ASCII digits only (`\d` takes any script's digits, which iperf3 does not read); at most 100 Gbit/s
BITRATE = re.compile(r"[0-9]+(\.[0-9]+)?[KMG]?")
MAX_BITRATE = 100e9


def bits_per_s(bitrate: str) -> float:
    return float(bitrate.rstrip("KMG")) * {"K": 1e3, "M": 1e6, "G": 1e9}.get(bitrate[-1], 1)


def checked_bitrate(v: str) -> str:
    """An iperf3 -b value as the Params take it (a field validator's check: the error names the field)."""
    if not BITRATE.fullmatch(v):
        raise ValueError("must look like 0, 500K, 100M or 1G (ASCII digits)")
    if bits_per_s(v) > MAX_BITRATE:
        raise ValueError("at most 100G (100 Gbit/s)")
    return v


def unlimited(bitrate: str) -> bool:
    return bits_per_s(bitrate) == 0


def iperf2_rate(bitrate: str) -> str:
    """iperf3's -b in iperf2's spelling: the same bits per second (powers of 1000, lowercase suffix)."""
    return UNLIMITED_IPERF2 if unlimited(bitrate) else bitrate.lower()


class Udp(Workload):
    name = "udp"
    summary = "UDP stream, iperf3 or iperf2 (bitrate 0 = unlimited sender, or a fixed rate)"
    tools = ("iperf3", "iperf", "ss")
    headline = ("goodput_mbps", "udp_loss_pct", "udp_jitter_ms")
    Params = UdpParams
    params: UdpParams
    metrics = (
        MetricSpec("goodput_mbps", "Mbit/s", "higher", "received bit rate"),
        MetricSpec("goodput_sender_mbps", "Mbit/s", "none", "offered bit rate"),
        MetricSpec("udp_loss_pct", "%", "lower", "datagrams lost"),
        MetricSpec("udp_jitter_ms", "ms", "lower", "RFC 3550 interarrival jitter"),
        MetricSpec("udp_packets", "count", "none", "datagrams sent"),
        MetricSpec("udp_lost_packets", "count", "lower", "datagrams lost"),
        MetricSpec("udp_payload_bytes", "B", "none", "datagram payload sent (iperf3 -l or its default)"),
        MetricSpec("iperf_cpu_client_pct", "%", "none", "iperf3 client CPU (saturation check; iperf3 only)"),
        MetricSpec("iperf_cpu_server_pct", "%", "none", "iperf3 server CPU (saturation check; iperf3 only)"),
    )

    def label(self) -> str:
        p = self.params
        label = "udp-unlimited" if unlimited(p.bitrate) else f"udp-{p.bitrate}"
        if p.engine == "iperf2":
            label += "-iperf2" + (f"-{p.bytes}" if p.bytes else "")
        return label

    def expected_seconds(self) -> float:
        p = self.params
        if p.bytes:
            return byte_count(p.bytes) * 8 / bits_per_s(p.bitrate) + 2
        return p.duration_s + 1

    def typical_seconds(self, cases: int = 1) -> float | None:
        return None if self.params.bytes else self.params.duration_s + TOOL_START_S

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        if p.engine == "iperf2":
            return self.run_iperf2(ctx)
        args = ["-u", "-b", p.bitrate] + (["-l", str(p.length)] if p.length else [])
        data, ran = run_client(ctx, args, p.duration_s, 0, self.label())
        out = Outcome(measure_s=min(ran, p.duration_s))  # tool start-up is case overhead
        parse_udp(data, out)
        return out

    def run_iperf2(self, ctx: CaseContext) -> Outcome:
        p = self.params
        args = ["-b", iperf2_rate(p.bitrate)] + (["-l", str(p.length)] if p.length else [])
        r = iperf2.run(
            ctx,
            args,
            udp=True,
            streams=1,
            seconds=p.duration_s,
            nbytes=p.bytes,
            omit_s=0,
            tag=self.label(),
            expected_s=self.expected_seconds(),
        )
        out = Outcome(measure_s=r.seconds if p.bytes else min(r.seconds, p.duration_s))
        iperf2.add_udp(out, r.client, r.server)
        series = iperf2.interval_series(r.client.local)
        if series.points:  # a byte-count transfer shorter than a second has no interval
            out.series.append(series)
        return out
