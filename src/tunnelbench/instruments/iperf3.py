"""Shared iperf3 plumbing: a one-off server on the server host, the client on the client host, JSON parsing.

The one way to launch iperf3 (`start_server`, `client_argv`, `wait_listening`): `run_client` here (a client
run to completion) and `common.start_iperf3` (a client in the background) are both built from it."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tunnelbench.core.results import Outcome, Series, WorkloadError
from tunnelbench.instruments.base import CaseEnds
from tunnelbench.lab.host import CommandError, Host, Process

PORT = 5201
# iperf3's UDP sockets (-w: SO_SNDBUF on the sender, SO_RCVBUF on the receiver). At the kernel's default
# (net.core.rmem_default, 208 KiB) the receiving iperf3 socket overflows whenever the scheduler keeps iperf3
# off the CPU for a few ms at a few hundred Mbit/s: the UDP ceiling then measured iperf3's buffer, not a
# tunnel (kern_udp_tool_drops counts what it still drops). 4 MiB holds ~20 ms at 1.6 Gbit/s; capped at
# net.core.rmem_max / wmem_max (iperf3 fails when it cannot set the size it was given).
UDP_SOCKET_BUFFER = 4 * 2**20


def udp_window(client: Host, server: Host) -> list[str]:
    """iperf3's `-w BYTES` for a UDP test between these hosts: UDP_SOCKET_BUFFER within both kernels' caps."""
    caps = [UDP_SOCKET_BUFFER]
    for host, key in ((server, "rmem_max"), (client, "wmem_max")):
        got = host.run(["cat", f"/proc/sys/net/core/{key}"], check=False).stdout.strip()
        if got.isdigit():
            caps.append(int(got))
    return ["-w", str(min(caps))]


def sized(args: Sequence[str], client: Host, server: Host) -> list[str]:
    """The client's arguments with the socket buffer sized for a UDP test (-u without a -w of its own)."""
    return [*args, *udp_window(client, server)] if "-u" in args and "-w" not in args else list(args)


def wait_listening(host: Host, port: int, timeout: float = 5.0, what: str = "iperf3 server") -> None:
    """Wait until a TCP socket listens on `port` on the host (any server: iperf3, nginx, sockperf, ...)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if host.run(["ss", "-Hltn", f"sport = :{port}"], check=False).stdout.strip():
            return
        time.sleep(0.01)
    raise WorkloadError(f"{what} on {host.name} not listening on :{port} after {timeout:.0f} s")


def start_server(host: Host, bind_ip: str, port: int, label: str, log_path: Path | None) -> Process:
    """A one-off iperf3 server (one test, then it exits) bound to bind_ip:port, listening when this returns
    (stopped again if it never listens)."""
    srv = host.spawn(["iperf3", "-s", "-1", "-p", str(port), "-B", bind_ip], label=label, log_path=log_path)
    try:
        wait_listening(host, port)
    except WorkloadError:
        srv.stop(grace=1)
        raise
    return srv


def client_argv(
    server_ip: str,
    port: int,
    duration_s: float,
    omit_s: float = 0.0,
    mss: int | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The iperf3 client's command line (JSON output, a 5 s connect timeout, `extra` last)."""
    argv = ["iperf3", "-c", server_ip, "-p", str(port), "-J", "-t", f"{duration_s:g}"]
    if omit_s:
        argv += ["-O", f"{omit_s:g}"]
    if mss:
        argv += ["-M", str(mss)]
    return [*argv, "--connect-timeout", "5000", *extra]


def run_client(
    ctx: CaseEnds, args: list[str], duration_s: float, omit_s: float, tag: str
) -> tuple[dict[str, Any], float]:
    """Run one iperf3 test (server one-off) and return (parsed JSON, seconds the client ran)."""
    srv_log = ctx.artifact_dir / f"{tag}-server.log"
    server = start_server(ctx.server, ctx.server_ip, PORT, "iperf3-server", srv_log)
    try:
        argv = client_argv(
            ctx.server_ip,
            PORT,
            duration_s,
            omit_s,
            ctx.options.get("mss"),
            sized(args, ctx.client, ctx.server),
        )
        t0 = time.monotonic()
        try:
            res = ctx.client.run(argv, timeout=min(ctx.remaining(), duration_s + omit_s + 30), check=False)
        except CommandError as e:
            raise WorkloadError(f"iperf3 client timed out: {e}") from None
        ran = time.monotonic() - t0
        (ctx.artifact_dir / f"{tag}-client.json").write_text(res.stdout)
        try:
            data = json.loads(res.stdout)
        except json.JSONDecodeError:
            raise WorkloadError(
                f"iperf3 printed no JSON (exit {res.returncode}): {res.stderr[-400:]}"
            ) from None
        if "error" in data:
            raise WorkloadError(f"iperf3: {data['error']}")
        return data, ran
    finally:
        server.stop(grace=2)


def interval_series(data: dict[str, Any], name: str = "goodput_mbps") -> Series:
    pts = [
        (float(iv["sum"]["end"]), float(iv["sum"]["bits_per_second"]) / 1e6)
        for iv in data.get("intervals", [])
        if not iv["sum"].get("omitted")
    ]
    return Series(name, "Mbit/s", pts)


def parse_tcp(data: dict[str, Any], out: Outcome) -> None:
    end = data["end"]
    sent, recv = end["sum_sent"], end["sum_received"]
    out.add("goodput_mbps", recv["bits_per_second"] / 1e6)
    out.add("goodput_sender_mbps", sent["bits_per_second"] / 1e6)
    retr = sent.get("retransmits")
    out.add("retransmits", retr)
    mss = data["start"].get("tcp_mss") or data["start"].get("tcp_mss_default")
    out.add("tcp_mss_bytes", mss or None)  # the MSS the connection used: the tunnel's MTU shows here
    if retr is not None and mss and sent["bytes"]:
        # segments sent estimated from bytes and MSS: VPN-agnostic (an outer TCP would pollute kernel counters)
        out.add("retransmit_rate", retr / (sent["bytes"] / mss))
    senders = [s["sender"] for s in end.get("streams", []) if "sender" in s]
    cwnds = [s["max_snd_cwnd"] for s in senders if "max_snd_cwnd" in s]
    if cwnds:
        out.add("max_cwnd_kbytes", max(cwnds) / 1024)
    rtts = [s["mean_rtt"] for s in senders if "mean_rtt" in s]
    if rtts:
        out.add("tcp_rtt_mean_ms", sum(rtts) / len(rtts) / 1000)
    cpu = end.get("cpu_utilization_percent", {})
    out.add("iperf_cpu_client_pct", cpu.get("host_total"))
    out.add("iperf_cpu_server_pct", cpu.get("remote_total"))
    out.series.append(interval_series(data))


def parse_udp(data: dict[str, Any], out: Outcome) -> None:
    end = data["end"]
    s = end["sum"]
    sent = end.get("sum_sent", s)
    recv = end.get("sum_received", s)
    out.add("goodput_mbps", recv["bits_per_second"] / 1e6)
    out.add("goodput_sender_mbps", sent["bits_per_second"] / 1e6)
    out.add("udp_loss_pct", recv.get("lost_percent", s.get("lost_percent")))
    out.add("udp_jitter_ms", recv.get("jitter_ms", s.get("jitter_ms")))
    out.add("udp_packets", recv.get("packets", s.get("packets")))
    out.add("udp_lost_packets", recv.get("lost_packets", s.get("lost_packets")))
    # the datagram payload iperf3 sent (-l, or its default: the path MTU's worth)
    out.add("udp_payload_bytes", data.get("start", {}).get("test_start", {}).get("blksize"))
    cpu = end.get("cpu_utilization_percent", {})
    out.add("iperf_cpu_client_pct", cpu.get("host_total"))
    out.add("iperf_cpu_server_pct", cpu.get("remote_total"))
    out.series.append(interval_series(data))
