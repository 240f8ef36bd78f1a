"""Multi-host traffic (Nebula's benchmark blog): one host transmits to N others at once (`tx`), N hosts transmit to one
(`rx`, iperf3 -R from the one host as the seed ran it), or both at once (`bidir`). TCP with the MSS
clamped to 1200 by default (`iperf3 -M 1200`, as Nebula's benchmark blog), one iperf3 server per peer on its own port.

Per-stream goodput carries the peer's host name; the aggregates are the sums of the streams. Per-host
daemon CPU and memory come from the runner's Monitor, which samples every host's VPN daemons."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome, Series
from tunnelbench.instruments.common import Iperf3Run, start_iperf3
from tunnelbench.lab.host import Host
from tunnelbench.workloads.base import TOOL_START_S, CaseContext, Params, Workload, WorkloadError

TX_PORT, RX_PORT = 5301, 5501


class MultihostParams(Params):
    mode: Literal["tx", "rx", "bidir"] = Field("tx", description="tx = one to N, rx = N to one, bidir = both")
    peers: int | None = Field(None, ge=1, le=64, description="peers to use (default: every other host)")
    duration_s: float = Field(10.0, gt=0, le=3600, description="measured seconds")
    omit_s: float = Field(1.0, ge=0, le=60, description="warm-up seconds excluded (iperf3 -O)")
    mss: int | None = Field(
        1200, ge=0, le=9000, description="iperf3 -M (Nebula's benchmark blog: 1200); 0 = no clamp"
    )


def jain(values: list[float]) -> float | None:
    if not values or sum(values) == 0:
        return None
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


class Multihost(Workload):
    name = "multihost"
    summary = "one host to N peers, N peers to one, or both at once (iperf3 -M 1200, Nebula's benchmark blog)"
    tools = ("iperf3", "ss")
    headline = ("aggregate_goodput_mbps", "stream_fairness")
    Params = MultihostParams
    params: MultihostParams
    metrics = (
        MetricSpec("aggregate_goodput_mbps", "Mbit/s", "higher", "sum of every stream's receiver goodput"),
        MetricSpec("tx_aggregate_goodput_mbps", "Mbit/s", "higher", "sum of streams from the one host"),
        MetricSpec("rx_aggregate_goodput_mbps", "Mbit/s", "higher", "sum of streams into the one host"),
        MetricSpec("tx_goodput_mbps", "Mbit/s", "higher", "one stream from the one host (host = the peer)"),
        MetricSpec("rx_goodput_mbps", "Mbit/s", "higher", "one stream into the one host (host = the peer)"),
        MetricSpec("min_stream_goodput_mbps", "Mbit/s", "higher", "slowest stream"),
        MetricSpec(
            "stream_fairness", "ratio", "higher", "Jain's fairness index over the streams (1 = equal)"
        ),
        MetricSpec("retransmits", "count", "lower", "TCP retransmits summed over the streams"),
        MetricSpec("streams", "count", "none", "concurrent streams"),
    )

    def label(self) -> str:
        p = self.params
        return f"multihost-{p.mode}" + (f"-n{p.peers}" if p.peers else "")

    def expected_seconds(self) -> float:
        return self.params.duration_s + self.params.omit_s + 3

    def typical_seconds(self, cases: int = 1) -> float:
        return self.params.duration_s + self.params.omit_s + TOOL_START_S  # every iperf3 at once

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        one = ctx.client
        peers = [h for h in ctx.mesh.hosts if h is not one][: p.peers or None]
        if not peers:
            raise WorkloadError("multihost needs at least two hosts")
        mss = (p.mss if p.mss is not None else ctx.options.get("mss")) or None
        directions = ["tx", "rx"] if p.mode == "bidir" else [p.mode]
        runs: list[tuple[str, Host, Iperf3Run]] = []
        try:
            for d in directions:
                for k, peer in enumerate(peers):
                    port = (TX_PORT if d == "tx" else RX_PORT) + k
                    args = ["-R"] if d == "rx" else []
                    runs.append(
                        (
                            d,
                            peer,
                            start_iperf3(
                                ctx,
                                one,
                                peer,
                                ctx.mesh.tunnel_ip(peer),
                                port,
                                args,
                                p.duration_s,
                                f"{d}-{peer.name}",
                                p.omit_s,
                                mss,
                            ),
                        )
                    )
            results = []
            for d, peer, r in runs:
                results.append((d, peer, r.wait(timeout=ctx.remaining())))
        finally:
            for _, _, r in runs:
                r.stop()
        out = Outcome(measure_s=p.duration_s)
        sums = {"tx": 0.0, "rx": 0.0}
        streams: list[float] = []
        retr = 0
        for d, peer, data in results:
            end = data["end"]
            mbps = end["sum_received"]["bits_per_second"] / 1e6
            streams.append(mbps)
            sums[d] += mbps
            retr += end["sum_sent"].get("retransmits") or 0
            out.add(f"{d}_goodput_mbps", mbps, peer.name)
            pts = [
                (float(iv["sum"]["end"]), iv["sum"]["bits_per_second"] / 1e6)
                for iv in data.get("intervals", [])
                if not iv["sum"].get("omitted")
            ]
            out.series.append(Series(f"{d}_goodput_mbps", "Mbit/s", pts, peer.name))
        for d in directions:
            out.add(f"{d}_aggregate_goodput_mbps", sums[d])
        out.add("aggregate_goodput_mbps", sum(streams))
        out.add("min_stream_goodput_mbps", min(streams))
        out.add("stream_fairness", jain(streams))
        out.add("retransmits", retr)
        out.add("streams", len(streams))
        return out
