"""QUIC (the ten-VPN thesis's qperf: connection set-up time and time to first byte, with retries) plus a bulk
download for goodput, with quicperf: a small Rust program on quinn (native/quicperf, every crate pinned by its
Cargo.lock; scripts/build-quicperf.sh builds it into the install cache and links /usr/local/bin/quicperf).

quinn, because the tool must not be the bottleneck: on this 2-core lab's internal path (no VPN), in runs
interleaved on one lab, a quinn bulk download carried 2.9 Gbit/s where quic-go (Go, one P) carried 1.4; with
quicperf's 8 MiB socket buffers quinn carries 3.0-3.5 Gbit/s there, against 1.3 Gbit/s of iperf3 TCP through
wireguard-go, the fastest VPN of the default set. aioquic (pure Python) carried 75 Mbit/s on loopback. quinn
receives with UDP GRO and sends with GSO, one thread per side. (GitHub's quic-go/perf, a ready perf tool, is
not served by the Go module proxy.)

The protocol is the QUIC perf protocol (ALPN "perf"): a stream carrying the requested response size, answered
with that many bytes. The case:
  - `handshakes` probes, each a new connection from a new UDP socket without session resumption (a full
    1-RTT handshake, TLS 1.3, ECDSA P-256 certificate): the handshake time is from connect until the
    client's handshake is complete (>= 1 RTT); the time to first byte from connect until the first byte of
    a `ttfb_bytes` response on the connection's first stream (>= handshake + 1 RTT), as qperf's. A probe
    whose handshake or request fails (no answer within `timeout_s`, an error) is retried up to `retries`
    times; every failed attempt is counted, and a probe failing all of its attempts is given up.
  - a bulk download of `bulk_mb` MB (10^6 bytes) on one more connection: goodput = payload bits / the time
    from the request until the last byte arrived (the handshake is not in it).
The server reports its own counts when stopped (connections, payload bytes sent, CLOCK_MONOTONIC stamps of
its largest response, its CPU over it): `quic_server_sent_mb` is its count, independent of the client's, and
both tools' CPU (% of one core, over the bulk download) says when the tool, not the path, was the limit."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome, Series
from tunnelbench.instruments.common import add_percentiles, tool_on
from tunnelbench.lab.host import Host, Process
from tunnelbench.workloads.base import CaseContext, Params, Workload, WorkloadError

QUIC_PORT = 8444  # UDP
# what native/quicperf is at (its TOOL_VERSION and the quinn in its Cargo.lock; tests/workloads/test_quic.py keeps them equal)
QUICPERF_VERSION = "1"
QUINN_VERSION = "0.11.12"
BUILD_HINT = "run scripts/build-quicperf.sh (scripts/setup.sh does)"


class QuicParams(Params):
    handshakes: int = Field(
        50, ge=1, le=100_000, description="probes: a new connection (full handshake) and a small request each"
    )
    retries: int = Field(
        2, ge=0, le=100, description="retries of a failed probe (each failed attempt is counted)"
    )
    timeout_s: float = Field(
        2.0, gt=0, le=60, description="a handshake, or then its response, slower than this fails"
    )
    ttfb_bytes: int = Field(
        1, ge=1, le=1 << 30, description="response size of a probe (its first byte is the TTFB)"
    )
    bulk_mb: float = Field(
        100.0, ge=0, le=100_000, description="bulk download for goodput, MB (10^6 bytes); 0: none"
    )
    interval_s: float = Field(0.0, ge=0, le=10, description="pause between probes")


class Quic(Workload):
    name = "quic"
    summary = "QUIC handshake time, time to first byte (with retries) and bulk goodput (quicperf on quinn)"
    tools = ("quicperf",)
    headline = ("quic_handshake_p50_ms", "quic_ttfb_p50_ms", "quic_goodput_mbps")
    Params = QuicParams
    params: QuicParams
    metrics = (
        MetricSpec(
            "quic_handshake_p50_ms",
            "ms",
            "lower",
            "median handshake time (new connection, full 1-RTT handshake)",
        ),
        MetricSpec("quic_handshake_p90_ms", "ms", "lower", "90th percentile handshake time"),
        MetricSpec("quic_handshake_p99_ms", "ms", "lower", "99th percentile handshake time"),
        MetricSpec("quic_ttfb_p50_ms", "ms", "lower", "median time from dial to the first response byte"),
        MetricSpec("quic_ttfb_p90_ms", "ms", "lower", "90th percentile time to first byte"),
        MetricSpec("quic_ttfb_p99_ms", "ms", "lower", "99th percentile time to first byte"),
        MetricSpec(
            "quic_goodput_mbps", "Mbit/s", "higher", "bulk download: payload bits / request-to-last-byte time"
        ),
        MetricSpec("quic_bulk_s", "s", "none", "bulk download time, request to last byte"),
        MetricSpec(
            "quic_bulk_mb", "MB", "none", "payload bytes the client received in the bulk download (10^6)"
        ),
        MetricSpec("quic_handshakes", "count", "none", "probes completed (handshake and response)"),
        MetricSpec(
            "quic_handshake_failures", "count", "lower", "attempts whose handshake failed (timeout, refused)"
        ),
        MetricSpec("quic_request_failures", "count", "lower", "attempts that failed after the handshake"),
        MetricSpec("quic_handshake_retries", "count", "lower", "attempts made again after a failure"),
        MetricSpec("quic_probes_given_up", "count", "lower", "probes that failed all of their attempts"),
        MetricSpec("quic_min_rtt_ms", "ms", "none", "the QUIC stack's minimum RTT on the bulk connection"),
        MetricSpec(
            "quic_server_sent_mb", "MB", "none", "payload bytes the server sent, its own count (10^6)"
        ),
        MetricSpec(
            "quic_client_cpu_pct", "%", "none", "client tool CPU over the bulk download, % of one core"
        ),
        MetricSpec(
            "quic_server_cpu_pct", "%", "none", "server tool CPU over its bulk response, % of one core"
        ),
    )

    def label(self) -> str:
        p = self.params
        return f"quic-h{p.handshakes}-{p.bulk_mb:g}MB"

    def expected_seconds(self) -> float:
        p = self.params
        # probes at 20 ms each on a slow path, the download at 50 Mbit/s worst case
        return 5 + p.handshakes * (0.02 + p.interval_s) + p.bulk_mb * 8 / 50

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        d = ctx.artifact_dir
        exe = quicperf(ctx.client)
        srv = ctx.server.spawn(
            [quicperf(ctx.server), "server", "-listen", hostport(ctx.server_ip, QUIC_PORT)],
            label="quicperf-server",
            log_path=d / "quicperf-server.log",
        )
        try:
            wait_ready(srv, 10)
            bulk_timeout = max(5.0, ctx.remaining() - 5)
            argv = [exe, "client", "-server", hostport(ctx.server_ip, QUIC_PORT), "-handshakes", str(p.handshakes),
                    "-retries", str(p.retries), "-timeout", f"{p.timeout_s:.6f}s", "-ttfb-bytes", str(p.ttfb_bytes),
                    "-bulk-bytes", str(round(p.bulk_mb * 1e6)), "-bulk-timeout", f"{bulk_timeout:.0f}s",
                    "-interval", f"{p.interval_s:.6f}s"]  # fmt: skip
            res = ctx.client.run(argv, timeout=ctx.remaining(), check=False)
        finally:
            srv.stop(grace=3)
        (d / "quicperf-client.json").write_text(res.stdout)
        try:
            cli = parse_client(res.stdout)
        except WorkloadError:
            raise WorkloadError(
                f"quicperf client failed (exit {res.returncode}): {(res.stderr or res.stdout)[-400:]}"
            ) from None
        return outcome(cli, server_counts(srv, d))


def hostport(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def quicperf(host: Host) -> str:
    """quicperf's path on the host, checked once per host to be the version this tunnelbench expects."""
    exe = tool_on(host, "quicperf")
    if host.__dict__.get("_tb_quicperf") == exe:
        return exe
    r = host.run([exe, "version"], check=False, timeout=10)
    try:
        v = json.loads(r.stdout)
    except json.JSONDecodeError:
        raise WorkloadError(
            f"{exe} does not run (exit {r.returncode}: {r.stderr[-200:]}); {BUILD_HINT}"
        ) from None
    if (v.get("quicperf"), v.get("quinn")) != (QUICPERF_VERSION, QUINN_VERSION):
        raise WorkloadError(
            f"{exe} is quicperf {v.get('quicperf')} on quinn {v.get('quinn')}, expected "
            f"{QUICPERF_VERSION} on quinn {QUINN_VERSION}: {BUILD_HINT}"
        )
    host.__dict__["_tb_quicperf"] = exe
    return exe


def wait_ready(proc: Process, timeout: float) -> None:
    """The server prints `ready` once its UDP socket is bound."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if "ready" in proc.log_tail(200):
            return
        if not proc.alive():
            break
        time.sleep(0.02)
    raise WorkloadError(f"quicperf server not ready: {proc.log_tail(400)}")


def parse_client(text: str) -> dict[str, Any]:
    """The client's one JSON line (its last line on stdout)."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                data: dict[str, Any] = json.loads(line)
                if "probes" in data:
                    return data
    raise WorkloadError(f"quicperf client printed no result: {text[-300:]}")


def server_counts(proc: Process, artifact_dir: Path) -> dict[str, Any] | None:
    """The server's own counts, the JSON line it prints when stopped."""
    log = artifact_dir / "quicperf-server.log"
    text = log.read_text(errors="replace") if log.exists() else proc.log_tail(4000)
    for line in reversed(text.splitlines()):
        if line.startswith('{"server"'):
            counts: dict[str, Any] = json.loads(line)["server"]
            return counts
    return None


def outcome(cli: dict[str, Any], server: dict[str, Any] | None) -> Outcome:
    """Samples and series from the client's result and the server's own counts."""
    probes = cli["probes"]
    out = Outcome(measure_s=cli["elapsed_s"])
    out.add("quic_handshakes", len(probes))
    out.add("quic_handshake_failures", cli["handshake_failures"])
    out.add("quic_request_failures", cli["request_failures"])
    out.add("quic_handshake_retries", cli["retries"])
    out.add("quic_probes_given_up", cli["gave_up"])
    if not probes:
        raise WorkloadError(f"no QUIC handshake probe succeeded: {cli['error_kinds']}")
    add_percentiles(out, "quic_handshake", [x["handshake_ms"] for x in probes], "ms", (50, 90, 99))
    add_percentiles(out, "quic_ttfb", [x["ttfb_ms"] for x in probes], "ms", (50, 90, 99))
    out.series.append(Series("quic_handshake_ms", "ms", [(x["start_s"], x["handshake_ms"]) for x in probes]))
    out.series.append(Series("quic_ttfb_ms", "ms", [(x["start_s"], x["ttfb_ms"]) for x in probes]))
    bulk = cli.get("bulk")
    if bulk is not None:
        if bulk.get("error"):
            raise WorkloadError(
                f"QUIC bulk download failed after {bulk['bytes']} of {bulk['requested_bytes']} "
                f"bytes: {bulk['error']}"
            )
        secs = bulk["seconds"]
        out.add("quic_bulk_s", secs)
        out.add("quic_bulk_mb", bulk["bytes"] / 1e6)
        out.add("quic_goodput_mbps", bulk["bytes"] * 8 / secs / 1e6 if secs > 0 else None)
        out.add("quic_min_rtt_ms", bulk["min_rtt_ms"] or None)
        out.add("quic_client_cpu_pct", 100 * bulk["cpu_s"] / secs if secs > 0 else None)
    if server is not None:
        out.add("quic_server_sent_mb", server["bytes_sent"] / 1e6)
        big = server.get("largest")
        if bulk is not None and big and big["bytes"] == bulk["bytes"]:
            wall = big["acked_mono"] - big["start_mono"]
            out.add("quic_server_cpu_pct", 100 * big["cpu_s"] / wall if wall > 0 else None)
    return out
