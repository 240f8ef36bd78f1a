"""Encapsulation overhead: underlay bytes and packets per tunnel payload byte during an iperf3 TCP bulk
transfer (the client's eth0 transmit counters against the bytes iperf3 moved), and packets per second at
a fixed small datagram size (iperf3 UDP -l 64, unlimited sender) with its own bytes-per-payload ratio.

Counters are read in the client's namespace from sysfs. A GSO/TSO super-packet (up to 64 KB) passes a
veth whole and counts once, headers included once: the no-VPN baseline's ratios (about 1.001 bytes per
payload byte) are therefore a lower bound of what a real NIC would put on the wire, while a userspace
VPN's encrypted datagrams are counted one by one. Compare VPNs with each other; the baseline shows the
floor. Keepalives, control traffic and TCP retransmissions during the transfer count as overhead in the
per-payload ratios; `underlay_bytes_per_tunnel_byte` (eth0 bytes / tunnel-interface bytes, VPNs only) is the
encapsulation alone."""

from __future__ import annotations

import time

from pydantic import Field, field_validator

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome
from tunnelbench.instruments.common import interface_of, link_counters
from tunnelbench.instruments.iperf3 import run_client
from tunnelbench.workloads.base import TOOL_START_S, CaseContext, Params, Workload, WorkloadError
from tunnelbench.workloads.udp import checked_bitrate


class OverheadParams(Params):
    duration_s: float = Field(5.0, gt=0, le=600, description="seconds of the TCP bulk transfer")
    small_duration_s: float = Field(
        3.0, ge=0, le=600, description="seconds of the small-packet test (0 = skip)"
    )
    small_size: int = Field(64, ge=16, le=1400, description="UDP payload bytes of the small-packet test")
    small_bitrate: str = Field(
        "0", description="iperf3 -b of the small-packet test (0 = as fast as possible)"
    )

    @field_validator("small_bitrate")
    @classmethod
    def _rate(cls, v: str) -> str:
        return checked_bitrate(v)


class Overhead(Workload):
    name = "overhead"
    summary = "underlay bytes/packets per payload byte (TCP bulk) and small-packet rate (UDP -l 64)"
    tools = ("iperf3", "ss")
    headline = ("underlay_bytes_per_payload_byte", "small_packet_pps")
    Params = OverheadParams
    params: OverheadParams
    metrics = (
        MetricSpec(
            "underlay_bytes_per_payload_byte", "ratio", "lower", "client eth0 tx bytes / payload bytes"
        ),
        MetricSpec(
            "underlay_packets_per_payload_kb",
            "1/KB",
            "lower",
            "client eth0 tx packets per 1000 payload bytes",
        ),
        MetricSpec(
            "underlay_packets_per_tunnel_packet", "ratio", "lower", "eth0 tx packets / tunnel tx packets"
        ),
        MetricSpec(
            "underlay_bytes_per_tunnel_byte", "ratio", "lower", "eth0 tx bytes / tunnel interface tx bytes"
        ),
        MetricSpec(
            "reverse_bytes_per_payload_byte", "ratio", "lower", "server eth0 tx bytes (ACKs) / payload"
        ),
        MetricSpec("bulk_goodput_mbps", "Mbit/s", "higher", "goodput of the bulk transfer"),
        MetricSpec("small_packet_pps", "1/s", "higher", "small datagrams delivered per second"),
        MetricSpec("small_packet_sent_pps", "1/s", "none", "small datagrams offered per second"),
        MetricSpec("small_packet_loss_pct", "%", "lower", "small datagrams lost"),
        MetricSpec(
            "small_underlay_bytes_per_payload_byte", "ratio", "lower", "the same / the datagram payload size"
        ),
        MetricSpec(
            "small_underlay_bytes_per_packet", "B", "lower", "eth0 bytes per small datagram on the wire"
        ),
    )

    def label(self) -> str:
        return "overhead"

    def expected_seconds(self) -> float:
        return self.params.duration_s + self.params.small_duration_s + 4

    def typical_seconds(self, cases: int = 1) -> float:
        p = self.params  # the bulk transfer, then the small-packet one
        return p.duration_s + TOOL_START_S + (p.small_duration_s + TOOL_START_S if p.small_duration_s else 0)

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        uif = getattr(ctx.client, "underlay_if", "eth0")
        tif = interface_of(ctx.client, ctx.client_ip)
        t0 = time.monotonic()
        out = Outcome()
        c0, s0 = link_counters(ctx.client, uif), link_counters(ctx.server, uif)
        k0 = link_counters(ctx.client, tif) if tif and tif != uif else None
        data, _ = run_client(ctx, [], p.duration_s, 0, "overhead-tcp")
        c1, s1 = link_counters(ctx.client, uif), link_counters(ctx.server, uif)
        k1 = link_counters(ctx.client, tif) if k0 and tif else None
        payload = data["end"]["sum_sent"]["bytes"]
        if not payload:
            raise WorkloadError("the bulk transfer moved no bytes")
        out.add("underlay_bytes_per_payload_byte", (c1["tx_bytes"] - c0["tx_bytes"]) / payload)
        out.add(
            "underlay_packets_per_payload_kb",
            (c1["tx_packets"] - c0["tx_packets"]) / (payload / 1000),
        )
        out.add("reverse_bytes_per_payload_byte", (s1["tx_bytes"] - s0["tx_bytes"]) / payload)
        if k0 and k1 and k1["tx_bytes"] > k0["tx_bytes"]:  # pure encapsulation: retransmissions cancel out
            out.add(
                "underlay_bytes_per_tunnel_byte",
                (c1["tx_bytes"] - c0["tx_bytes"]) / (k1["tx_bytes"] - k0["tx_bytes"]),
            )
        if k0 and k1 and k1["tx_packets"] > k0["tx_packets"]:
            out.add(
                "underlay_packets_per_tunnel_packet",
                (c1["tx_packets"] - c0["tx_packets"]) / (k1["tx_packets"] - k0["tx_packets"]),
            )
        out.add("bulk_goodput_mbps", data["end"]["sum_received"]["bits_per_second"] / 1e6)
        if p.small_duration_s > 0:
            c0 = link_counters(ctx.client, uif)
            args = ["-u", "-b", p.small_bitrate, "-l", str(p.small_size)]
            udp, _ = run_client(ctx, args, p.small_duration_s, 0, "overhead-udp-small")
            c1 = link_counters(ctx.client, uif)
            s = udp["end"]["sum"]
            recv = udp["end"].get("sum_received", s)
            sent = udp["end"].get("sum_sent", s)
            secs = float(recv.get("seconds") or p.small_duration_s)
            n_sent = int(sent.get("packets") or s.get("packets") or 0)
            lost = int(recv.get("lost_packets", s.get("lost_packets", 0)) or 0)
            n_recv = int(recv.get("packets", n_sent)) - lost
            out.add("small_packet_pps", n_recv / secs)
            out.add("small_packet_sent_pps", n_sent / secs)
            out.add("small_packet_loss_pct", 100.0 * lost / n_sent if n_sent else None)
            pkts = c1["tx_packets"] - c0["tx_packets"]
            if pkts:  # per packet that reached the underlay: robust to datagrams the VPN dropped before it
                per_pkt = (c1["tx_bytes"] - c0["tx_bytes"]) / pkts
                out.add("small_underlay_bytes_per_packet", per_pkt)
                out.add("small_underlay_bytes_per_payload_byte", per_pkt / p.small_size)
        out.measure_s = time.monotonic() - t0
        return out
