"""Connection rate: TCP connect/request/response/close transactions per second through the tunnel,
netperf's TCP_CRR, and with `mode = "rr"` its persistent-connection TCP_RR for comparison.

netperf is the field's tool for this, but Debian ships it in non-free, which this lab's apt sources do not
carry; the agent (crr_agent.py, stdlib only, one epoll loop per side) does the same thing: a server on the
server's tunnel address answering every `request_bytes` with `response_bytes`, and a client with
`concurrency` workers, each a loop of socket, connect, send the request, read the whole response, close
(crr) or of request/response on one connection per worker (rr), for `duration_s`. Only completed
transactions count; tps is their number over the time from start until the last in-flight one finished.

The client closes first, so TIME_WAIT lands on the client (as in netperf's TCP_CRR). At a few thousand
connections per second a 10 s case would run the client's ephemeral ports (32768-60999) out for the 60 s
of TIME_WAIT; for the case the client host gets `net.ipv4.tcp_tw_reuse = 1` (a namespace's own sysctl;
connect() may take a port whose TIME_WAIT is over 1 s old, using TCP timestamps), restored afterwards. No
SO_LINGER 0: an RST close would change what is measured.

`crr_server_accepted` is the server's own count of accepted connections, reported independently of the
client: it matches `crr_transactions` up to failed transactions. The agents' CPU (`crr_client_cpu_pct`,
`crr_server_cpu_pct`, % of one core) says when the Python agent, not the tunnel, was the limit."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome, Series
from tunnelbench.instruments import crr_agent
from tunnelbench.instruments.common import script_argv
from tunnelbench.lab.host import Host, Process
from tunnelbench.workloads.base import TOOL_START_S, CaseContext, Params, Workload, WorkloadError

CRR_PORT = 8400
TW_REUSE = "net.ipv4.tcp_tw_reuse"


class CrrParams(Params):
    mode: Literal["crr", "rr"] = Field(
        "crr", description="crr: a new TCP connection per transaction (TCP_CRR); rr: one per worker (TCP_RR)"
    )
    duration_s: float = Field(5.0, gt=0, le=600, description="seconds of transactions")
    concurrency: int = Field(8, ge=1, le=1000, description="workers, each with one transaction in flight")
    request_bytes: int = Field(1, ge=1, le=1 << 20, description="request size (netperf's default: 1)")
    response_bytes: int = Field(1, ge=1, le=1 << 20, description="response size (netperf's default: 1)")
    timeout_s: float = Field(5.0, gt=0, le=60, description="a transaction slower than this is an error")


class Crr(Workload):
    name = "crr"
    summary = "TCP connect/request/response/close per second through the tunnel (TCP_CRR; rr mode: TCP_RR)"
    tools = ("python3",)
    headline = ("crr_tps", "crr_latency_p99_ms", "rr_tps", "rr_latency_p99_ms")
    Params = CrrParams
    params: CrrParams
    metrics = tuple(
        spec
        for m, what in (("crr", "connect + request + response + close"), ("rr", "request + response"))
        for spec in (
            MetricSpec(f"{m}_tps", "1/s", "higher", f"completed transactions ({what}) per second"),
            MetricSpec(f"{m}_latency_p50_ms", "ms", "lower", f"median transaction time ({what})"),
            MetricSpec(f"{m}_latency_p90_ms", "ms", "lower", "90th percentile transaction time"),
            MetricSpec(f"{m}_latency_p99_ms", "ms", "lower", "99th percentile transaction time"),
            MetricSpec(
                f"{m}_errors", "count", "lower", "failed transactions (connect error, reset, timeout)"
            ),
            MetricSpec(f"{m}_transactions", "count", "none", "completed transactions (the client's count)"),
            MetricSpec(
                f"{m}_server_accepted", "count", "none", "connections the server accepted (its own count)"
            ),
            MetricSpec(f"{m}_server_answered", "count", "none", "responses the server sent (its own count)"),
            MetricSpec(f"{m}_client_cpu_pct", "%", "none", "client agent CPU, % of one core"),
            MetricSpec(f"{m}_server_cpu_pct", "%", "none", "server agent CPU while busy, % of one core"),
        )
    )

    def label(self) -> str:
        p = self.params
        size = (
            "" if (p.request_bytes, p.response_bytes) == (1, 1) else f"-{p.request_bytes}x{p.response_bytes}"
        )
        return f"{p.mode}-c{p.concurrency}{size}"

    def expected_seconds(self) -> float:
        p = self.params
        return p.duration_s + p.timeout_s + 5 + p.concurrency / 100

    def typical_seconds(self, cases: int = 1) -> float:
        return self.params.duration_s + TOOL_START_S

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        m = p.mode
        d = ctx.artifact_dir
        srv = ctx.server.spawn(
            [
                *agent_argv(ctx.server),
                "server",
                ctx.server_ip,
                str(CRR_PORT),
                str(p.request_bytes),
                str(p.response_bytes),
            ],
            label="crr-server",
            log_path=d / "crr-server.log",
        )
        restore = None
        try:
            wait_ready(srv, 10)
            if m == "crr":
                restore = set_sysctl(ctx.client, TW_REUSE, "1")
            argv = [
                *agent_argv(ctx.client),
                "client",
                ctx.server_ip,
                str(CRR_PORT),
                m,
                str(p.concurrency),
                f"{p.duration_s:g}",
                str(p.request_bytes),
                str(p.response_bytes),
                f"{p.timeout_s:g}",
            ]
            res = ctx.client.run(argv, timeout=ctx.remaining(), check=False)
            (d / "crr-client.json").write_text(res.stdout)
            if res.returncode != 0:
                raise WorkloadError(
                    f"crr client failed (exit {res.returncode}): {(res.stderr or res.stdout)[-400:]}"
                )
        finally:
            srv.stop(grace=3)
            if restore is not None:
                with contextlib.suppress(Exception):
                    set_sysctl(ctx.client, TW_REUSE, restore)
        try:
            cli = json.loads(res.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            raise WorkloadError(
                f"crr client printed no result: {res.stdout[-300:]} {res.stderr[-300:]}"
            ) from None
        server = server_counts(srv, d)
        out = Outcome(measure_s=cli["elapsed_s"])
        out.add(f"{m}_transactions", cli["transactions"])
        out.add(f"{m}_errors", cli["errors"])
        out.add(f"{m}_client_cpu_pct", cli["cpu_pct"])
        if cli["transactions"] == 0:
            raise WorkloadError(f"no transaction completed: errors {cli['error_kinds']}")
        out.add(f"{m}_tps", cli["tps"])
        for q in (50, 90, 99):
            out.add(f"{m}_latency_p{q}_ms", cli["latency_ms"][f"p{q}"])
        if server is not None:
            out.add(f"{m}_server_accepted", server["accepted"])
            out.add(f"{m}_server_answered", server["answered"])
            if server["busy_wall_s"] > 0:
                out.add(f"{m}_server_cpu_pct", 100 * server["busy_cpu_s"] / server["busy_wall_s"])
        # transactions completed in each whole second of the run (the partial last second and the drain left out)
        per_s = cli["per_second"][: int(p.duration_s)]
        out.series.append(Series(f"{m}_tps", "1/s", [(i + 0.5, float(n)) for i, n in enumerate(per_s)]))
        return out


def agent_argv(host: Host) -> list[str]:
    return script_argv(host, crr_agent.__file__, "tbcrragent.py")


def wait_ready(proc: Process, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if "ready" in proc.log_tail(200):
            return
        if not proc.alive():
            break
        time.sleep(0.05)
    raise WorkloadError(f"crr server not ready: {proc.log_tail(400)}")


def set_sysctl(host: Host, key: str, value: str) -> str:
    """Set a sysctl on the host (its namespace's own for net.*); returns the value it had."""
    old = host.run(["sysctl", "-n", key]).stdout.strip()
    if old != value:
        host.run(["sysctl", "-qw", f"{key}={value}"])
    return old


def server_counts(proc: Process, artifact_dir: Path) -> dict[str, Any] | None:
    """The server's own counts, the JSON line it prints when stopped."""
    log = artifact_dir / "crr-server.log"
    text = log.read_text(errors="replace") if log.exists() else proc.log_tail(4000)
    for line in reversed(text.splitlines()):
        if line.startswith('{"server"'):
            counts: dict[str, Any] = json.loads(line)["server"]
            return counts
    return None
