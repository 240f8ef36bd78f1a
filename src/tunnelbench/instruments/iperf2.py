"""iperf2 (Debian's `iperf` 2.1) as the second engine of the tcp and udp workloads (Gentile et al.'s tool): a server
on the server host, the client on the client host, both with enhanced reports (-e) in plain bytes and
bits/s (-f b: exact integers, where -y C in 2.1.8 drops the enhanced fields such as retries), parsed into
the iperf3 engine's metric names.

iperf2 has no -O: the warm-up is left out by running omit_s longer with one-second reports (-i 1) and
keeping only the intervals after it. Totals of several streams are the streams' byte sum over the longest
stream's time (iperf2's own [SUM] line uses a time of its own and is missing from the server's output
when it prints intervals)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from tunnelbench.core.results import Outcome, Series, WorkloadError
from tunnelbench.instruments.base import CaseEnds
from tunnelbench.instruments.iperf3 import wait_listening
from tunnelbench.lab.host import CommandError, Host, Process

PORT = 5001
# one report line of one stream: "[  1] 0.0000-1.0000 sec  850788412 Bytes  6806307296 bits/sec  <enhanced>"
# (a reverse test's client marks its streams "[ *1]"; [SUM] lines are left out, see the module doc)
REPORT = re.compile(
    r"^\[\s*\*?(?P<id>\d+)\]\s+(?P<start>\d+(?:\.\d+)?)\s*-\s*(?P<end>\d+(?:\.\d+)?) sec\s+"
    r"(?P<bytes>\d+) Bytes\s+(?P<bps>\d+(?:\.\d+)?) bits/sec(?P<rest>.*)$"
)
# TCP sender (-e): "Write/Err  Rtry  Cwnd/RTT(var)": "6491/0   609   3198K/1195(1482) us"
SENDER = re.compile(r"^\s*\d+/\d+\s+(?P<retry>\d+)\s+(?P<cwnd>\d+)K/(?P<rtt>\d+)\(\d+\) us")
# UDP receiver (-e): "Jitter  Lost/Total": "0.001 ms 0/17011 (0%)"
UDP_RECV = re.compile(r"^\s*(?P<jitter>\d+(?:\.\d+)?) ms\s+(?P<lost>-?\d+)/\s*(?P<total>\d+)\s")
MSS = re.compile(r"\(icwnd/mss/irtt=\d+/(?P<mss>\d+)/\d+\)")
DATAGRAM = re.compile(r"Sending (?P<size>\d+) byte datagrams")


@dataclass
class Report:
    stream: int
    start: float
    end: float
    bytes: int
    bps: float
    retries: int | None = None  # TCP sender: retransmitted segments (TCP_INFO)
    cwnd_kib: int | None = None
    rtt_us: int | None = None
    jitter_ms: float | None = None  # UDP receiver
    lost: int | None = None
    total: int | None = None


@dataclass
class Side:
    """The report lines one process printed about its streams (or, on a UDP client, the server's report)."""

    reports: list[Report] = field(default_factory=list)
    mss: int | None = None
    datagram: int | None = None  # a UDP client's "Sending N byte datagrams"

    def finals(self) -> list[Report]:
        """Each stream's whole-test line: iperf2 prints it last for that stream."""
        last: dict[int, Report] = {}
        for r in self.reports:
            last[r.stream] = r
        return list(last.values())

    def intervals(self) -> list[Report]:
        finals = {id(r) for r in self.finals()}
        return [r for r in self.reports if id(r) not in finals]


@dataclass
class Output:
    local: Side
    server_report: Side | None  # a UDP client's copy of the server's numbers


def parse_line(line: str) -> Report | None:
    m = REPORT.match(line.strip())
    if not m:
        return None
    r = Report(int(m["id"]), float(m["start"]), float(m["end"]), int(m["bytes"]), float(m["bps"]))
    rest = m["rest"]
    if s := SENDER.match(rest):
        r.retries, r.cwnd_kib, r.rtt_us = int(s["retry"]), int(s["cwnd"]), int(s["rtt"])
    elif u := UDP_RECV.match(rest):
        r.jitter_ms, r.lost, r.total = float(u["jitter"]), int(u["lost"]), int(u["total"])
    return r


def parse(text: str) -> Output:
    """Every report line of iperf2 -e -f b output, split at a UDP client's "Server Report:"."""
    local, server = Side(), None
    side = local
    for line in text.splitlines():
        if line.rstrip().endswith("Server Report:"):
            server = side = Side()
            continue
        if (m := MSS.search(line)) and local.mss is None:
            local.mss = int(m["mss"])
        if (m := DATAGRAM.match(line)) and local.datagram is None:
            local.datagram = int(m["size"])
        if (r := parse_line(line)) is not None:
            side.reports.append(r)
    return Output(local, server)


@dataclass
class Totals:
    bytes: int
    seconds: float
    retries: int | None
    max_cwnd_kib: int | None
    rtt_mean_us: float | None

    @property
    def mbps(self) -> float:
        return self.bytes * 8 / self.seconds / 1e6


def totals(side: Side, omit_s: float = 0.0) -> Totals:
    """All streams together: the whole test from the final lines, or with omit_s > 0 the intervals that
    start at or after omit_s (needs -i 1)."""
    if omit_s > 0:
        lines = [r for r in side.intervals() if r.start >= omit_s - 1e-6]
        if not lines:
            raise WorkloadError(f"iperf2 printed no interval after the {omit_s:g} s warm-up")
        seconds = max(r.end for r in lines) - omit_s
        samples = lines
    else:
        lines = side.finals()
        if not lines:
            raise WorkloadError("iperf2 printed no final report")
        seconds = max(r.end - r.start for r in lines)
        samples = side.intervals() or lines  # the RTT's per-second samples; the final line is a snapshot
    if seconds <= 0:
        raise WorkloadError(f"iperf2 reported a test of {seconds:g} s")
    retries = [r.retries for r in lines if r.retries is not None]
    cwnds = [r.cwnd_kib for r in samples + lines if r.cwnd_kib is not None]
    rtts = [r.rtt_us for r in samples if r.rtt_us is not None]
    return Totals(
        bytes=sum(r.bytes for r in lines),
        seconds=seconds,
        retries=sum(retries) if retries else None,
        max_cwnd_kib=max(cwnds) if cwnds else None,
        rtt_mean_us=sum(rtts) / len(rtts) if rtts else None,
    )


def interval_series(side: Side, omit_s: float = 0.0, name: str = "goodput_mbps") -> Series:
    """Mbit/s of every one-second interval after the warm-up, the streams added up."""
    by_start: dict[float, list[Report]] = {}
    for r in side.intervals():
        if r.start >= omit_s - 1e-6 and r.end > r.start:
            by_start.setdefault(r.start, []).append(r)
    pts = [
        (max(r.end for r in rs), sum(r.bytes * 8 / (r.end - r.start) for r in rs) / 1e6)
        for _, rs in sorted(by_start.items())
    ]
    return Series(name, "Mbit/s", pts)


def add_tcp(out: Outcome, sender: Side, receiver: Side, omit_s: float) -> None:
    """The tcp workload's metrics: goodput at both ends, and the sender's retries, cwnd and RTT."""
    snd, rcv = totals(sender, omit_s), totals(receiver, omit_s)
    out.add("goodput_mbps", rcv.mbps)
    out.add("goodput_sender_mbps", snd.mbps)
    out.add("retransmits", snd.retries)
    if snd.retries is not None and sender.mss and snd.bytes:
        out.add("retransmit_rate", snd.retries / (snd.bytes / sender.mss))
    out.add("max_cwnd_kbytes", snd.max_cwnd_kib)
    out.add("tcp_rtt_mean_ms", None if snd.rtt_mean_us is None else snd.rtt_mean_us / 1000)
    out.add("tcp_mss_bytes", sender.mss or receiver.mss)


def add_udp(out: Outcome, client: Output, server: Side | None) -> None:
    """The udp workload's metrics: the receiver's numbers from the server report the client got back, else
    from the server's own output."""
    recv = client.server_report if client.server_report and client.server_report.reports else server
    if recv is None or not recv.finals():
        raise WorkloadError("iperf2 UDP: no server report (the client's last datagram was not acknowledged)")
    rcv, snd = recv.finals(), totals(client.local)
    out.add("goodput_mbps", totals(recv).mbps)
    out.add("goodput_sender_mbps", snd.mbps)
    total = sum(r.total or 0 for r in rcv)
    lost = sum(r.lost or 0 for r in rcv)
    if total:
        out.add("udp_loss_pct", 100.0 * lost / total)
        out.add("udp_packets", total)
        out.add("udp_lost_packets", lost)
    out.add("udp_payload_bytes", client.local.datagram)
    jitters = [r.jitter_ms for r in rcv if r.jitter_ms is not None]
    if jitters:
        out.add("udp_jitter_ms", sum(jitters) / len(jitters))


# -- running it -----------------------------------------------------------------------------------------
def wait_udp_bound(host: Host, port: int, timeout: float = 5.0, what: str = "server") -> None:
    """A UDP server's socket is bound (the UDP counterpart of wait_listening)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if host.run(["ss", "-Hlun", f"sport = :{port}"], check=False).stdout.strip():
            return
        time.sleep(0.02)
    raise WorkloadError(f"{what} on {host.name} not bound to UDP :{port} after {timeout:.0f} s")


def wait_finals(proc: Process, streams: int, min_end: float, timeout: float) -> Side:
    """The server's output once it printed a whole-test line for each stream (a line from 0 ending after
    min_end, which tells it from the first one-second interval when the server prints intervals)."""
    end = time.monotonic() + timeout
    while True:
        side = parse(proc.log_tail(1_000_000)).local
        done = {r.stream for r in side.reports if r.start == 0 and r.end > min_end}
        if len(done) >= streams or time.monotonic() > end:
            return side
        time.sleep(0.05)


@dataclass
class Run:
    client: Output
    client_text: str
    server: Side
    seconds: float  # how long the client ran


def run(
    ctx: CaseEnds,
    args: list[str],
    *,
    udp: bool,
    streams: int,
    seconds: float | None,
    nbytes: str | None,
    omit_s: float,
    tag: str,
    expected_s: float,
) -> Run:
    """One iperf2 test against a server started for it: `seconds` (-t) or `nbytes` (-n) of traffic; with
    omit_s > 0 (the caller added it to `seconds`) the server prints one-second intervals as well."""
    proto = ["-u"] if udp else []
    fmt = ["-e", "-f", "b"]
    srv_argv = ["iperf", "-s", *proto, "-p", str(PORT), "-B", ctx.server_ip, *fmt]
    srv_argv += ["-i", "1"] if omit_s > 0 else []
    server = ctx.server.spawn(
        srv_argv, label="iperf2-server", log_path=ctx.artifact_dir / f"{tag}-server.txt"
    )
    try:
        if udp:
            wait_udp_bound(ctx.server, PORT, what="iperf2 UDP server")
        else:
            wait_listening(ctx.server, PORT, what="iperf2 server")
        argv = ["iperf", "-c", ctx.server_ip, *proto, "-p", str(PORT), *fmt, "-i", "1"]
        argv += ["-n", nbytes] if nbytes else ["-t", f"{seconds:g}"]
        if ctx.options.get("mss") and not udp:
            argv += ["-M", str(ctx.options["mss"])]
        argv += args
        t0 = time.monotonic()
        try:
            res = ctx.client.run(argv, timeout=min(ctx.remaining(), expected_s + 30), check=False)
        except CommandError as e:
            raise WorkloadError(f"iperf2 client timed out: {e}") from None
        ran = time.monotonic() - t0
        text = res.stdout + res.stderr
        (ctx.artifact_dir / f"{tag}-client.txt").write_text(text)
        client = parse(text)
        if res.returncode != 0 or not client.local.finals():
            raise WorkloadError(f"iperf2 client failed (exit {res.returncode}): {text[-400:]}")
        if udp and client.server_report and client.server_report.reports:
            srv = parse(server.log_tail(1_000_000)).local  # the receiver's numbers are in hand already
        else:
            # TCP: the receiver's (or with -R the sender's) numbers are in the server's own output; with
            # intervals, its first one (0-1 s) ends before omit_s + 0.5 and the whole-test line after it
            srv = wait_finals(server, streams, omit_s + 0.5 if omit_s > 0 else 0.0, timeout=5)
        return Run(client, text, srv, ran)
    finally:
        # iperf2's server takes ~1 s to notice a signal; its reports are written (flushed) already
        server.stop(grace=0.2)
