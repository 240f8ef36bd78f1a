"""Shared iperf3 plumbing: a one-off server on the server host, the client on the client host, JSON parsing."""

from __future__ import annotations

import json
import time
from typing import Any

from tunnelbench.lab.host import CommandError, Host
from tunnelbench.workloads.base import CaseContext, Outcome, Series, WorkloadError

PORT = 5201


def wait_listening(host: Host, port: int, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if host.run(["ss", "-Hltn", f"sport = :{port}"], check=False).stdout.strip():
            return
        time.sleep(0.01)
    raise WorkloadError(f"iperf3 server on {host.name} not listening on :{port} after {timeout:.0f} s")


def run_client(
    ctx: CaseContext, args: list[str], duration_s: float, omit_s: float, tag: str
) -> tuple[dict, float]:
    """Run one iperf3 test (server one-off) and return (parsed JSON, seconds the client ran)."""
    srv_log = ctx.artifact_dir / f"{tag}-server.log"
    server = ctx.server.spawn(
        ["iperf3", "-s", "-1", "-p", str(PORT), "-B", ctx.server_ip], label="iperf3-server", log_path=srv_log
    )
    try:
        wait_listening(ctx.server, PORT)
        argv = ["iperf3", "-c", ctx.server_ip, "-p", str(PORT), "-J", "-t", f"{duration_s:g}"]
        if omit_s:
            argv += ["-O", f"{omit_s:g}"]
        if ctx.options.get("mss"):
            argv += ["-M", str(ctx.options["mss"])]
        argv += ["--connect-timeout", "5000", *args]
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


def interval_series(data: dict, name: str = "goodput_mbps") -> Series:
    pts = [
        (float(iv["sum"]["end"]), float(iv["sum"]["bits_per_second"]) / 1e6)
        for iv in data.get("intervals", [])
        if not iv["sum"].get("omitted")
    ]
    return Series(name, "Mbit/s", pts)


def parse_tcp(data: dict[str, Any], out: Outcome) -> None:
    end = data["end"]
    sent, recv = end["sum_sent"], end["sum_received"]
    out.add("goodput_mbps", recv["bits_per_second"] / 1e6, "Mbit/s")
    out.add("goodput_sender_mbps", sent["bits_per_second"] / 1e6, "Mbit/s")
    retr = sent.get("retransmits")
    out.add("retransmits", retr, "count")
    mss = data["start"].get("tcp_mss") or data["start"].get("tcp_mss_default")
    out.add("tcp_mss_bytes", mss or None, "B")  # the MSS the connection used: the tunnel's MTU shows here
    if retr is not None and mss and sent["bytes"]:
        # segments sent estimated from bytes and MSS: VPN-agnostic (an outer TCP would pollute kernel counters)
        out.add("retransmit_rate", retr / (sent["bytes"] / mss), "ratio")
    senders = [s["sender"] for s in end.get("streams", []) if "sender" in s]
    cwnds = [s["max_snd_cwnd"] for s in senders if "max_snd_cwnd" in s]
    if cwnds:
        out.add("max_cwnd_kbytes", max(cwnds) / 1024, "KiB")
    rtts = [s["mean_rtt"] for s in senders if "mean_rtt" in s]
    if rtts:
        out.add("tcp_rtt_mean_ms", sum(rtts) / len(rtts) / 1000, "ms")
    cpu = end.get("cpu_utilization_percent", {})
    out.add("iperf_cpu_client_pct", cpu.get("host_total"), "%")
    out.add("iperf_cpu_server_pct", cpu.get("remote_total"), "%")
    out.series.append(interval_series(data))


def parse_udp(data: dict[str, Any], out: Outcome) -> None:
    end = data["end"]
    s = end["sum"]
    sent = end.get("sum_sent", s)
    recv = end.get("sum_received", s)
    out.add("goodput_mbps", recv["bits_per_second"] / 1e6, "Mbit/s")
    out.add("goodput_sender_mbps", sent["bits_per_second"] / 1e6, "Mbit/s")
    out.add("udp_loss_pct", recv.get("lost_percent", s.get("lost_percent")), "%")
    out.add("udp_jitter_ms", recv.get("jitter_ms", s.get("jitter_ms")), "ms")
    out.add("udp_packets", recv.get("packets", s.get("packets")), "count")
    out.add("udp_lost_packets", recv.get("lost_packets", s.get("lost_packets")), "count")
    # the datagram payload iperf3 sent (-l, or its default: the path MTU's worth)
    out.add("udp_payload_bytes", data.get("start", {}).get("test_start", {}).get("blksize"), "B")
    cpu = end.get("cpu_utilization_percent", {})
    out.add("iperf_cpu_client_pct", cpu.get("host_total"), "%")
    out.add("iperf_cpu_server_pct", cpu.get("remote_total"), "%")
    out.series.append(interval_series(data))
