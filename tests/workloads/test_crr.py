"""Connection rate (issue 19, workload `crr`): the agent on loopback, its counts checked against the server's
own count and against a hand-written peer; then the workload through the internal path and wireguard-go."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import through_a_tunnel_long

from tunnelbench.catalog import WORKLOADS
from tunnelbench.instruments import crr_agent
from tunnelbench.workloads.base import CaseContext
from tunnelbench.workloads.crr import Crr, CrrParams

AGENT = [sys.executable, crr_agent.__file__]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The agent's server on loopback; stop() returns its own counts."""

    def __init__(self, req: int = 1, resp: int = 1):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [*AGENT, "server", "127.0.0.1", str(self.port), str(req), str(resp)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=10)
        assert self.proc.returncode == 0
        return json.loads(out.strip().splitlines()[-1])["server"]


def client(port: int, mode: str, conc: int, dur: float, req: int = 1, resp: int = 1, timeout: float = 5.0):
    t0 = time.monotonic()
    r = subprocess.run(
        [
            *AGENT,
            "client",
            "127.0.0.1",
            str(port),
            mode,
            str(conc),
            f"{dur:g}",
            str(req),
            str(resp),
            f"{timeout:g}",
        ],
        capture_output=True,
        text=True,
        timeout=dur + timeout + 30,
    )
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), wall


def check_client(c: dict, dur: float, wall: float, conc: int) -> None:
    """The client's own numbers agree with each other and with the clock outside it."""
    assert c["transactions"] == sum(c["per_second"])
    assert c["tps"] == pytest.approx(c["transactions"] / c["elapsed_s"])
    assert dur <= c["elapsed_s"] < wall  # ran the duration (plus the drain), inside the process's lifetime
    assert c["transactions"] / wall < c["tps"]
    lat = c["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"]
    # Little's law, the latencies against the rate: with every worker always busy, mean time = conc / tps
    assert c["latency_mean_ms"] == pytest.approx(1000 * conc / c["tps"], rel=0.2)


@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
def test_crr_counts_match_the_servers_own_count():
    conc, dur = 4, 1.5
    srv = Server(req=32, resp=100)
    try:
        c, wall = client(srv.port, "crr", conc, dur, 32, 100)
    finally:
        s = srv.stop()
    assert c["errors"] == 0, c["error_kinds"]
    assert c["transactions"] > 200
    check_client(c, dur, wall, conc)
    # every completed transaction is a connection the server accepted, answered once and saw closed by the
    # client; in-flight ones at the end are drained, so the counts agree (+ concurrency at most)
    assert c["transactions"] <= s["accepted"] <= c["transactions"] + conc
    assert s["answered"] == s["accepted"] == s["closed"]
    assert s["errors"] == 0 and s["partial_requests"] == 0 and s["open_at_stop"] == 0
    assert c["connects"] == c["transactions"]


@pytest.mark.slow  # 3-4 s: out of the fast lane
def test_rr_one_connection_per_worker_and_faster_than_crr():
    conc, dur = 2, 1.0
    srv = Server()
    try:
        rr, wall = client(srv.port, "rr", conc, dur)
        s_rr = srv.stop()
        srv = Server()
        crr, _ = client(srv.port, "crr", conc, dur)
    finally:
        srv.stop()
    assert rr["errors"] == 0
    check_client(rr, dur, wall, conc)
    assert rr["connects"] == conc and s_rr["accepted"] == conc == s_rr["closed"]
    assert rr["transactions"] <= s_rr["answered"] <= rr["transactions"] + conc
    assert rr["tps"] > crr["tps"]  # no handshake per transaction
    assert rr["latency_ms"]["p50"] < crr["latency_ms"]["p50"]


def test_large_responses_are_sent_whole_and_exactly():
    """A response larger than a socket buffer (the server's partial-send path): a hand-written peer reads
    exactly response_bytes per request, nothing more, then EOF after its own close."""
    req, resp = 1000, 8_000_000  # over the largest send buffer (tcp_wmem max 4 MiB) + the peer's 64 KiB
    srv = Server(req, resp)
    try:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # fixed before connect: no autotuning
            s.settimeout(10)
            s.connect(("127.0.0.1", srv.port))
            for _ in range(2):
                s.sendall(b"x" * (req - 1))
                time.sleep(0.05)
                s.setblocking(False)
                with pytest.raises(BlockingIOError):  # no answer to a partial request
                    s.recv(1)
                s.settimeout(10)  # (setblocking(True) would drop the timeout)
                s.sendall(b"x")
                time.sleep(0.2)  # let the server's send() fill the buffers: it must come back for the rest
                got = 0
                while got < resp:
                    chunk = s.recv(1 << 20)
                    assert chunk
                    got += len(chunk)
                assert got == resp
            s.shutdown(socket.SHUT_WR)
            assert s.recv(1) == b""  # nothing beyond the two responses, and the server closed after us
        c, wall = client(srv.port, "crr", 2, 0.5, req, resp)
    finally:
        st = srv.stop()
    assert c["errors"] == 0 and c["transactions"] > 0
    assert st["answered"] == c["transactions"] + 2 and st["accepted"] == c["transactions"] + 1


def test_refused_and_timed_out_transactions_are_errors_not_transactions():
    port = free_port()  # nothing listens
    c, _ = client(port, "crr", 2, 0.3)
    assert c["transactions"] == 0 and c["tps"] == 0
    assert c["errors"] > 0 and set(c["error_kinds"]) == {"ECONNREFUSED"}
    # a listener that never accepts or answers: every transaction times out
    with socket.create_server(("127.0.0.1", 0), backlog=64) as ls:
        c, _ = client(ls.getsockname()[1], "crr", 3, 0.3, timeout=0.2)
    assert c["transactions"] == 0
    assert c["error_kinds"].get("timeout", 0) >= 3


def test_a_server_that_closes_early_is_a_short_response():
    ls = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def half_answer():
        ls.settimeout(0.1)
        while not stop.is_set():
            try:
                c, _ = ls.accept()
            except TimeoutError:
                continue
            c.recv(10)
            c.sendall(b"ab")  # 2 of the 10 bytes the client waits for, then close
            c.close()

    t = threading.Thread(target=half_answer, daemon=True)
    t.start()
    try:
        c, _ = client(ls.getsockname()[1], "crr", 1, 0.3, 1, 10)
    finally:
        stop.set()
        t.join()
        ls.close()
    assert c["transactions"] == 0 and c["error_kinds"].get("short_response", 0) > 0


def test_percentile_matches_numpy():
    rng = np.random.default_rng(7)
    for n in (1, 2, 5, 101, 1000):
        v = sorted(rng.exponential(3.0, n).tolist())
        for q in (0, 50, 90, 99, 100):
            assert crr_agent.percentile(v, q) == pytest.approx(float(np.percentile(v, q)))


def test_params_label_and_metrics():
    assert Crr(CrrParams()).label() == "crr-c8"
    assert Crr(CrrParams(mode="rr", concurrency=1)).label() == "rr-c1"
    assert Crr(CrrParams(request_bytes=64, response_bytes=1024)).label() == "crr-c8-64x1024"
    names = {m.name for m in Crr.metrics}
    assert {"crr_tps", "crr_latency_p50_ms", "crr_latency_p99_ms", "crr_errors", "rr_tps"} <= names
    assert set(Crr.headline) <= names and {m.name: m for m in Crr.metrics}["crr_tps"].better == "higher"
    assert WORKLOADS["crr"] is Crr
    with pytest.raises(ValueError):
        CrrParams(mode="udp_rr")


# -- through a tunnel ------------------------------------------------------------------------------------
@pytest.fixture(params=["internal", "wireguard-go"])
def mesh(request, mesh_factory):
    return mesh_factory(request.param)


def run(mesh, timeout: float = 90, **params) -> tuple[dict, object]:
    wl = Crr(CrrParams(**params))
    adir = mesh.run_dir / "cases" / f"{wl.label()}-{time.monotonic_ns()}"
    adir.mkdir(parents=True, exist_ok=True)
    ctx = CaseContext(mesh, mesh.hosts[0], mesh.hosts[1], adir, time.monotonic() + timeout, {"mss": None})
    out = wl.run(ctx)
    return {s.name: s.value for s in out.samples}, out


TUNNEL_LONG = through_a_tunnel_long("mesh")  # through wireguard-go: 5-7 s more each


@pytest.mark.lab
@TUNNEL_LONG
def test_crr_and_rr_through_the_tunnel(mesh):
    client = mesh.hosts[0]
    tw_before = client.run(["sysctl", "-n", "net.ipv4.tcp_tw_reuse"]).stdout.strip()
    conc = 4
    m, out = run(mesh, mode="crr", concurrency=conc, duration_s=3)
    names = {s.name for s in Crr.metrics}
    assert set(m) <= names
    assert m["crr_tps"] > 0 and m["crr_errors"] == 0
    n = m["crr_transactions"]
    assert n == pytest.approx(m["crr_tps"] * out.measure_s)
    # the server's own count of accepted connections (independent of the client's)
    assert abs(m["crr_server_accepted"] - n) <= 0.01 * n + conc
    assert m["crr_server_answered"] == m["crr_server_accepted"]
    assert 0 < m["crr_latency_p50_ms"] <= m["crr_latency_p90_ms"] <= m["crr_latency_p99_ms"] < 5000
    assert {s.name for s in out.series} == {"crr_tps"} and len(out.series[0].points) == 3
    assert 0 < sum(v for _, v in out.series[0].points) <= n
    # the connections went through the tunnel: the server saw the client's tunnel address as the peer
    # (the client's TIME_WAIT sockets, left for 60 s, name both tunnel addresses)
    tw = client.run(
        ["ss", "-Htn", "state", "time-wait", "dst", f"{mesh.tunnel_ip(mesh.hosts[1])}:8400"]
    ).stdout
    assert len(tw.splitlines()) >= min(n, 100)
    assert all(line.split()[-2].startswith(mesh.tunnel_ip(client) + ":") for line in tw.splitlines()[:100])
    # the case's sysctl is put back
    assert client.run(["sysctl", "-n", "net.ipv4.tcp_tw_reuse"]).stdout.strip() == tw_before
    # a persistent connection beats a connection per request
    r, _ = run(mesh, mode="rr", concurrency=conc, duration_s=3)
    assert r["rr_errors"] == 0 and r["rr_server_accepted"] == conc
    assert abs(r["rr_server_answered"] - r["rr_transactions"]) <= 0.01 * r["rr_transactions"] + conc
    assert r["rr_tps"] > m["crr_tps"], (r["rr_tps"], m["crr_tps"])
    assert r["rr_latency_p50_ms"] < m["crr_latency_p50_ms"]
    print(
        f"\n{mesh.driver.name}: crr {m['crr_tps']:.0f}/s p50 {m['crr_latency_p50_ms']:.2f} ms p99 "
        f"{m['crr_latency_p99_ms']:.2f} ms (client cpu {m['crr_client_cpu_pct']:.0f}%, server cpu "
        f"{m.get('crr_server_cpu_pct', float('nan')):.0f}%); rr {r['rr_tps']:.0f}/s p50 {r['rr_latency_p50_ms']:.2f} ms"
    )


@pytest.mark.lab
@TUNNEL_LONG
def test_time_wait_does_not_starve_the_client_of_ports(mesh):
    """With the client's ephemeral range cut to 1024 ports, connections closed by the client (TIME_WAIT for
    60 s) would end the test after 1024 transactions; tcp_tw_reuse (set for the case) lets a port whose
    TIME_WAIT is over 1 s old be used again, so 4 s give well over 2 x 1024. The ports that run out are
    errors, never transactions."""
    client = mesh.hosts[0]
    key = "net.ipv4.ip_local_port_range"
    old = client.run(["sysctl", "-n", key]).stdout.split()
    client.run(["sysctl", "-qw", f"{key}=50000 51023"])
    try:
        m, _ = run(mesh, mode="crr", concurrency=4, duration_s=4)
    finally:
        client.run(["sysctl", "-qw", f"{key}={old[0]} {old[1]}"])
    assert m["crr_transactions"] > 2 * 1024, m
    assert abs(m["crr_server_accepted"] - m["crr_transactions"]) <= 4
