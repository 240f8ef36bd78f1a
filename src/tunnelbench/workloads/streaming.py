"""Streaming (the ten-VPN thesis's RIST video test): a constant-bitrate media-like UDP stream (default 25 Mbit/s in
1316-byte datagrams, 7 MPEG-TS packets each) from the client to the server, carried by real RIST (librist
0.2.7's `ristsender`/`ristreceiver` from Debian's rist-tools, main profile, ARQ retransmissions) over
the tunnel, or as plain UDP (`transport = "udp"`). ffmpeg's RIST support is not used: Debian's ffmpeg
would add an encoder whose warm-up the ten-VPN thesis saw as dropped frames; the source here is a paced Python
sender whose datagrams carry a sequence number and a send timestamp.

The receiver applies a playout buffer: a datagram is on time if it arrives within `playout_ms` of the
stream's base delay (the smallest one-way delay seen, so RIST's own buffering is not counted against
it), late if after, lost if never. Jitter is RFC 3550's interarrival jitter. The quality score is an
E-model-style MOS (ITU-T G.107's packet-loss impairment, Bpl = 10, applied to lost + late datagrams):
a proxy for how the stream would play, not a video-quality model."""

from __future__ import annotations

import json
import shutil
import time
from typing import Literal

from pydantic import Field

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome
from tunnelbench.instruments import stream_agent
from tunnelbench.instruments.common import script_argv
from tunnelbench.lab.host import Host
from tunnelbench.workloads.base import TOOL_START_S, CaseContext, Params, Workload, WorkloadError

RIST_PORT = 8200  # even: RIST uses the port and the next one
SRC_PORT, SINK_PORT = 8300, 8310


def mos(effective_loss_pct: float, bpl: float = 10.0) -> float:
    """E-model: R = 93.2 - Ie_eff with Ie = 0, Ie_eff = 95 Ppl / (Ppl + Bpl); MOS from R (G.107 Annex B)."""
    ppl = max(0.0, effective_loss_pct)
    r = 93.2 - 95.0 * ppl / (ppl + bpl)
    if r <= 0:
        return 1.0
    if r >= 100:
        return 4.5
    return 1 + 0.035 * r + 7e-6 * r * (r - 60) * (100 - r)


class StreamingParams(Params):
    bitrate_mbps: float = Field(25.0, gt=0, le=2000, description="stream bit rate (payload)")
    packet_bytes: int = Field(1316, ge=64, le=1472, description="datagram payload (7 x 188-byte TS packets)")
    duration_s: float = Field(10.0, gt=0, le=3600, description="seconds of streaming")
    playout_ms: float = Field(400.0, ge=0, le=10_000, description="playout buffer")
    transport: Literal["rist", "udp"] = Field("rist", description="rist = librist main profile; udp = plain")
    rist_buffer_ms: int = Field(
        400, ge=20, le=30_000, description="RIST recovery buffer (ristsender/-receiver -b)"
    )


class Streaming(Workload):
    name = "streaming"
    summary = "constant-bitrate 25 Mbit/s stream (RIST or UDP) with a 400 ms playout buffer: loss, late, MOS"
    tools = ("ristsender", "ristreceiver")
    headline = ("quality_mos", "lost_pct", "late_pct")
    Params = StreamingParams
    params: StreamingParams
    metrics = (
        MetricSpec("lost_pct", "%", "lower", "datagrams that never arrived"),
        MetricSpec("late_pct", "%", "lower", "datagrams that arrived after their playout deadline"),
        MetricSpec("on_time_pct", "%", "higher", "datagrams played out"),
        MetricSpec("jitter_ms", "ms", "lower", "RFC 3550 interarrival jitter"),
        MetricSpec("delay_p50_ms", "ms", "lower", "median one-way delay source -> sink"),
        MetricSpec("delay_p99_ms", "ms", "lower", "99th percentile one-way delay"),
        MetricSpec("quality_mos", "MOS", "higher", "E-model-style score from lost + late (1..4.5)"),
        MetricSpec("received_mbps", "Mbit/s", "higher", "payload rate that arrived"),
        MetricSpec("duplicates", "count", "none", "datagrams received more than once"),
    )

    def label(self) -> str:
        p = self.params
        return f"streaming-{p.transport}-{p.bitrate_mbps:g}M"

    def expected_seconds(self) -> float:
        return self.params.duration_s + self.params.playout_ms / 1000 + 5

    def typical_seconds(self, cases: int = 1) -> float:
        return self.params.duration_s + self.params.playout_ms / 1000 + TOOL_START_S

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        d = ctx.artifact_dir
        rist = p.transport == "rist"
        if rist:
            _need_rist(ctx.client, "ristsender")
            _need_rist(ctx.server, "ristreceiver")
        sink_bind = ("127.0.0.1", SINK_PORT) if rist else (ctx.server_ip, SINK_PORT)
        # written where the sink runs: the artifact folder here, the host's work folder over SSH
        stats_path = (
            ctx.folder_on(ctx.server, "stream") / "sink.json" if ctx.server.remote else d / "sink.json"
        )
        ctx.server.mkdir(stats_path.parent)
        ctx.server.remove(stats_path)
        procs = []
        try:
            sink = ctx.server.spawn(
                [
                    *script_argv(ctx.server, stream_agent.__file__, "tbstreamagent.py"),
                    "sink",
                    sink_bind[0],
                    str(sink_bind[1]),
                    str(p.duration_s + 3 + p.playout_ms / 1000),
                    str(stats_path),
                ],
                label="stream-sink",
                log_path=d / "sink.log",
            )
            procs.append(sink)
            if rist:
                b = str(p.rist_buffer_ms)
                procs.append(ctx.server.spawn(["ristreceiver", "-p", "1", "-b", b, "-S", "0", "-v", "4",
                                               "-i", f"rist://@{ctx.server_ip}:{RIST_PORT}",
                                               "-o", f"udp://127.0.0.1:{SINK_PORT}"],
                                              label="ristreceiver", log_path=d / "ristreceiver.log"))  # fmt: skip
                procs.append(ctx.client.spawn(["ristsender", "-p", "1", "-b", b, "-S", "0", "-v", "4",
                                               "-i", f"udp://@127.0.0.1:{SRC_PORT}",
                                               "-o", f"rist://{ctx.server_ip}:{RIST_PORT}"],
                                              label="ristsender", log_path=d / "ristsender.log"))  # fmt: skip
                time.sleep(1.0)  # RIST handshake before the stream starts
                dest = ("127.0.0.1", SRC_PORT)
            else:
                time.sleep(0.3)
                dest = (ctx.server_ip, SINK_PORT)
            t0 = time.monotonic()
            res = ctx.client.run(
                [
                    *script_argv(ctx.client, stream_agent.__file__, "tbstreamagent.py"),
                    "source",
                    dest[0],
                    str(dest[1]),
                    str(p.bitrate_mbps),
                    str(p.packet_bytes),
                    str(p.duration_s),
                ],
                timeout=p.duration_s + 30,
            )
            sent = json.loads(res.stdout)
            if sink.wait(p.playout_ms / 1000 + 10) is None and sink.alive():
                raise WorkloadError("stream sink did not finish")
            ran = time.monotonic() - t0
        finally:
            for pr in reversed(procs):
                pr.stop(grace=2)
        if not ctx.server.exists(stats_path):
            log = d / "sink.log"  # the sink's output, copied here when it stopped
            said = log.read_text(errors="replace")[-300:] if log.exists() else "no sink log"
            raise WorkloadError(f"stream sink wrote no result: {said}")
        raw = ctx.server.read_file(stats_path)
        if stats_path != d / "sink.json":
            (d / "sink.json").write_bytes(raw)
        arrivals = json.loads(raw)["arrivals"]  # [seq, send time, arrival time]
        return analyse(arrivals, sent["sent"], p, ran)


def analyse(arrivals: list[list[float]], n_sent: int, p: StreamingParams, ran: float) -> Outcome:
    import numpy as np

    out = Outcome(measure_s=ran)
    first: dict[int, tuple[float, float]] = {}
    dup = 0
    for seq, ts, ta in arrivals:
        if seq in first:
            dup += 1
        else:
            first[int(seq)] = (ts, ta)
    if not first:
        raise WorkloadError("no datagram of the stream arrived")
    delays = np.array([(ta - ts) * 1000 for ts, ta in first.values()])
    base = float(delays.min())
    late = int((delays > base + p.playout_ms).sum())
    lost = n_sent - len(first)
    # RFC 3550 jitter in arrival order
    order = sorted(first.values(), key=lambda x: x[1])
    j = 0.0
    for (s0, a0), (s1, a1) in zip(order, order[1:], strict=False):
        dd = abs((a1 - a0) - (s1 - s0)) * 1000
        j += (dd - j) / 16
    out.add("lost_pct", 100.0 * max(0, lost) / n_sent)
    out.add("late_pct", 100.0 * late / n_sent)
    out.add("on_time_pct", 100.0 * (len(first) - late) / n_sent)
    out.add("jitter_ms", j)
    out.add("delay_p50_ms", float(np.percentile(delays, 50)))
    out.add("delay_p99_ms", float(np.percentile(delays, 99)))
    out.add("quality_mos", mos(100.0 * (max(0, lost) + late) / n_sent))
    out.add("received_mbps", len(first) * p.packet_bytes * 8 / p.duration_s / 1e6)
    out.add("duplicates", dup)
    return out


def _need_rist(host: Host, binary: str) -> None:
    """librist's tool on the host that runs it: this machine's PATH, or the SSH host's own."""
    found = host.which([binary])[binary] if host.remote else shutil.which(binary)
    if not found:
        where = f" on {host.name}" if host.remote else ""
        raise WorkloadError(
            f"{binary} missing{where} (Debian rist-tools; scripts/setup.sh or install --inventory)"
        )
