"""Request/response latency (Gentile et al.'s netperf TCP_RR / UDP_RR): sockperf ping-pong through the
tunnel, TCP or UDP, on an idle tunnel or under a concurrent iperf3 TCP bulk stream (`load = "tcp"`).

netperf is not in Debian; sockperf (3.7) is. Its ping-pong client sends one `msg_size` message, waits for
the server's echo, sends the next: one request in flight, so transactions per second and the mean
round trip are two views of one number (Little's law: tps = 1 / mean RTT, up to the client's own time
between a reply and the next request). With --full-rtt sockperf reports the round trip (without it, half of
it; the parser reads both). Its -t run starts with 0.4 s of warm-up and ends with 0.05 s of cool-down, both
left out of the statistics, so `duration_s` = 1 measures ~0.55 s; before -t starts it sends a few warm-up
messages and pauses 2 s (here: while the load ramps up). Percentiles are sockperf's own (nearest rank).

- rr_tps: echoes received in the measured window over its length ([Valid Duration]).
- rr_server_messages: the server's own count of the messages it answered over the whole run, warm-up
  included (it prints it when interrupted), independent of the client's.
- rr_stalled_s: sockperf has no retransmission timer: in UDP a lost request or echo stalls the client until
  -t ends (netperf's UDP_RR behaves alike). Its window then ends at the loss, the statistics cover only
  the time before it (measure_s), and sockperf counts no drop; this metric is the part of the run lost,
  -t minus warm-up, cool-down and the window. Without a loss that difference is slack of up to about one
  round trip (the window ends at the last echo before the cool-down), so under STALL_FLOOR_S or twice the
  slowest round trip it counts as 0.
- load_goodput_mbps: the bulk stream's goodput (load = "tcp"), iperf3 client -> server."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome
from tunnelbench.instruments.common import start_iperf3
from tunnelbench.instruments.iperf2 import wait_udp_bound
from tunnelbench.instruments.iperf3 import wait_listening
from tunnelbench.lab.host import CommandError, Host, Process
from tunnelbench.workloads.base import TOOL_START_S, CaseContext, Params, Workload, WorkloadError

RR_PORT = 11111  # sockperf's default
LOAD_PORT = 5213
SOCKPERF_PAUSE_S = 2.0  # sockperf sleeps this long between its warm-up messages and the timed run
COOLDOWN_S = 0.05  # sockperf's TEST_END_COOLDOWN_MSEC: the end of the run left out of the window
STALL_FLOOR_S = 0.05  # s; see rr_stalled_s
QUANTILES = {"50": 50.0, "90": 90.0, "99": 99.0, "99_9": 99.9}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NUM = r"(\d+(?:\.\d+)?)"


class RrParams(Params):
    protocol: Literal["tcp", "udp"] = Field("tcp", description="TCP (sockperf --tcp, Nagle off) or UDP")
    msg_size: int = Field(
        64, ge=14, le=65507, description="request = response bytes (sockperf -m; >= its 14-byte header)"
    )
    duration_s: int = Field(
        5, ge=1, le=3600, description="sockperf -t seconds (whole); 0.45 s of it are warm-up/cool-down"
    )
    load: Literal["none", "tcp"] = Field(
        "none", description="none: idle tunnel; tcp: an iperf3 TCP stream client -> server throughout"
    )


@dataclass
class SockperfResult:
    """sockperf ping-pong's summary, latencies as round trips in microseconds."""

    total_s: float  # [Total Run]: the whole -t run, warm-up included
    warmup_s: float
    total_sent: int
    total_received: int
    valid_s: float  # [Valid Duration]: the measured window
    valid_sent: int
    transactions: int  # echoes received in the window (= observations)
    mean_us: float
    max_us: float
    min_us: float
    percentiles_us: dict[float, float] = field(default_factory=dict)  # {50.0: ..., 99.9: ...}

    @property
    def tps(self) -> float:
        return self.transactions / self.valid_s

    @property
    def stalled_s(self) -> float:
        """The run's time outside warm-up, cool-down and the measured window: a stall on a lost message,
        once it is longer than the window's own slack (about one round trip)."""
        lost = self.total_s - self.warmup_s - COOLDOWN_S - self.valid_s
        return lost if lost >= max(STALL_FLOOR_S, 2 * self.max_us / 1e6) else 0.0


def _find(pattern: str, text: str, what: str) -> re.Match[str]:
    m = re.search(pattern, text)
    if m is None:
        raise WorkloadError(f"sockperf printed no {what}: {text[-400:]}")
    return m


def parse_sockperf(text: str) -> SockperfResult:
    """The client's summary lines (colour codes stripped). Without --full-rtt sockperf prints half round
    trips ("avg-latency", "Latency is"): doubled here, so every latency is a round trip."""
    t = ANSI.sub("", text)
    if "No messages were received" in t or "No valid observations" in t:
        raise WorkloadError(f"sockperf: no echo from the server: {t[-300:]}")
    total = _find(
        rf"\[Total Run\] RunTime={NUM} sec; Warm up time=(\d+) msec; SentMessages=(\d+); "
        r"ReceivedMessages=(\d+)",
        t,
        "[Total Run]",
    )
    valid = _find(
        rf"\[Valid Duration\] RunTime={NUM} sec; SentMessages=(\d+); ReceivedMessages=(\d+)",
        t,
        "[Valid Duration]",
    )
    avg = _find(rf"avg-(rtt|latency)={NUM}", t, "average")
    scale = 1.0 if avg[1] == "rtt" else 2.0
    pct = {float(q): float(v) * scale for q, v in re.findall(rf"---> percentile\s+{NUM}\s*=\s*{NUM}", t)}
    mx = _find(rf"---> <MAX> observation\s*=\s*{NUM}", t, "maximum")
    mn = _find(rf"---> <MIN> observation\s*=\s*{NUM}", t, "minimum")
    if float(valid[1]) <= 0 or int(valid[3]) == 0:
        raise WorkloadError(f"sockperf measured nothing: {valid[0]}")
    return SockperfResult(
        total_s=float(total[1]),
        warmup_s=int(total[2]) / 1000,
        total_sent=int(total[3]),
        total_received=int(total[4]),
        valid_s=float(valid[1]),
        valid_sent=int(valid[2]),
        transactions=int(valid[3]),
        mean_us=float(avg[2]) * scale,
        max_us=float(mx[1]) * scale,
        min_us=float(mn[1]) * scale,
        percentiles_us=pct,
    )


def parse_server_count(text: str) -> int | None:
    """The server's own count, printed when it is interrupted: "Total 13660 messages received and handled"."""
    m = re.search(r"Total (\d+) messages received and handled", ANSI.sub("", text))
    return int(m[1]) if m else None


def add_metrics(out: Outcome, r: SockperfResult) -> None:
    out.add("rr_tps", r.tps)
    for name, q in QUANTILES.items():
        out.add(f"rr_latency_p{name}_ms", None if q not in r.percentiles_us else r.percentiles_us[q] / 1000)
    out.add("rr_latency_mean_ms", r.mean_us / 1000)
    out.add("rr_latency_max_ms", r.max_us / 1000)
    out.add("rr_transactions", r.transactions)
    out.add("rr_stalled_s", r.stalled_s)


def interrupt(host: Host, proc: Process, timeout: float = 3.0) -> None:
    """SIGINT (sockperf's server prints its count then), once more if it did not end, then the usual stop."""
    for _ in range(2):
        if not proc.alive():
            break
        host.signal(proc.pid, signal.SIGINT)
        proc.wait(timeout / 2)
    proc.stop(grace=1)


class Rr(Workload):
    name = "rr"
    summary = "request/response latency and transactions/s, sockperf ping-pong TCP or UDP, idle or under a TCP stream"
    tools = ("sockperf", "iperf3", "ss")
    headline = ("rr_tps", "rr_latency_p50_ms", "rr_latency_p99_ms")
    Params = RrParams
    params: RrParams
    metrics = (
        MetricSpec("rr_tps", "1/s", "higher", "request/response transactions per second, one in flight"),
        MetricSpec("rr_latency_p50_ms", "ms", "lower", "median transaction round trip"),
        MetricSpec("rr_latency_p90_ms", "ms", "lower", "90th percentile round trip"),
        MetricSpec("rr_latency_p99_ms", "ms", "lower", "99th percentile round trip"),
        MetricSpec("rr_latency_p99_9_ms", "ms", "lower", "99.9th percentile round trip"),
        MetricSpec("rr_latency_mean_ms", "ms", "lower", "mean round trip (1 / rr_tps by Little's law)"),
        MetricSpec("rr_latency_max_ms", "ms", "lower", "slowest round trip"),
        MetricSpec(
            "rr_transactions", "count", "none", "transactions in the measured window (the client's count)"
        ),
        MetricSpec("rr_stalled_s", "s", "lower", "run time lost waiting for a lost UDP message (0: none)"),
        MetricSpec(
            "rr_server_messages", "count", "none", "messages the server answered, whole run (its own count)"
        ),
        MetricSpec(
            "load_goodput_mbps", "Mbit/s", "none", "goodput of the concurrent TCP stream (load = tcp)"
        ),
    )

    def label(self) -> str:
        p = self.params
        size = "" if p.msg_size == 64 else f"-{p.msg_size}b"
        return f"rr-{p.protocol}{size}" + ("-loaded" if p.load == "tcp" else "")

    def expected_seconds(self) -> float:
        sockperf = self.params.duration_s + SOCKPERF_PAUSE_S + 2
        return max(sockperf, self.load_seconds() + 1) if self.params.load == "tcp" else sockperf

    def typical_seconds(self, cases: int = 1) -> float:
        sockperf = self.params.duration_s + SOCKPERF_PAUSE_S + TOOL_START_S
        return max(sockperf, self.load_seconds()) if self.params.load == "tcp" else sockperf

    def load_seconds(self) -> int:
        """The bulk stream outlasts sockperf's run (its pause, -t and the client's start-up and exit)."""
        return self.params.duration_s + int(SOCKPERF_PAUSE_S) + 3

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        d = ctx.artifact_dir
        proto = ["--tcp"] if p.protocol == "tcp" else []
        server = ctx.server.spawn(["sockperf", "server", "-i", ctx.server_ip, "-p", str(RR_PORT), *proto],
                                  label="sockperf-server", log_path=d / f"{self.label()}-server.txt")  # fmt: skip
        load, load_data = None, None
        try:
            if p.protocol == "tcp":
                wait_listening(ctx.server, RR_PORT, what="sockperf server")
            else:
                wait_udp_bound(ctx.server, RR_PORT, what="sockperf server")
            if p.load == "tcp":
                load = start_iperf3(
                    ctx,
                    ctx.client,
                    ctx.server,
                    ctx.server_ip,
                    LOAD_PORT,
                    [],
                    self.load_seconds(),
                    f"{self.label()}-load",
                    mss=ctx.options.get("mss"),
                )
            argv = ["sockperf", "ping-pong", "-i", ctx.server_ip, "-p", str(RR_PORT), *proto,
                    "-m", str(p.msg_size), "-t", str(p.duration_s), "--full-rtt"]  # fmt: skip
            try:
                res = ctx.client.run(argv, timeout=ctx.remaining(), check=False)
            except CommandError as e:
                raise WorkloadError(f"sockperf client timed out: {e}") from None
            text = res.stdout + res.stderr
            (d / f"{self.label()}-client.txt").write_text(text)
            if load is not None:
                load_data = load.wait(timeout=ctx.remaining())
        finally:
            if load is not None:
                load.stop()
            interrupt(ctx.server, server)
        result = parse_sockperf(text)
        out = Outcome(measure_s=result.valid_s)
        add_metrics(out, result)
        out.add("rr_server_messages", parse_server_count(server.log_tail(100_000)))
        if load_data is not None:
            out.add("load_goodput_mbps", load_data["end"]["sum_received"]["bits_per_second"] / 1e6)
        return out
