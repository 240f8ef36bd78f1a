"""QUIC (issue 15, workload `quic`): quicperf's recorded output turned into metrics (known answers worked out by
hand from tests/data/quic/, recorded on the namespace lab's internal path), the tool's own counts of failures
and retries on loopback, and the workload end to end on the internal path, its goodput checked against the
server's own byte count and clock, the interface's byte counter and the test's clock, and its handshake
against ping's RTT on the same path."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import tomllib

import pytest
from tree import DATA as TEST_DATA
from tree import ROOT

from tunnelbench.catalog import DRIVERS, WORKLOADS
from tunnelbench.impair.backend import make_backend
from tunnelbench.impair.profiles import Profile
from tunnelbench.instruments.common import interface_of, link_counters
from tunnelbench.instruments.ping import parse_ping
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.mesh import Mesh
from tunnelbench.workloads.base import CaseContext, WorkloadError
from tunnelbench.workloads.quic import (
    QUICPERF_VERSION,
    QUINN_VERSION,
    Quic,
    QuicParams,
    outcome,
    parse_client,
    quicperf,
)

REPO = ROOT
DATA = TEST_DATA / "quic"


def recorded(name: str) -> dict:
    return parse_client((DATA / name).read_text())


def recorded_server(name: str) -> dict:
    line = (DATA / name).read_text().splitlines()[-1]
    return json.loads(line)["server"]


def samples(out) -> dict[str, float]:
    return {s.name: s.value for s in out.samples}


# -- recorded output, known answers -------------------------------------------------------------------------
def test_a_clean_run_known_answers():
    """client-ok.json: 5 probes (1000-byte responses) and a 20 MB download on the internal path. Percentiles
    by linear interpolation between closest ranks, worked out by hand from the 5 sorted values."""
    out = outcome(recorded("client-ok.json"), recorded_server("server-ok.log"))
    m = samples(out)
    # handshake_ms sorted: 0.671143 0.671384 0.730191 0.73617 1.279234 -> p50 = the 3rd; p90 at rank 3.6,
    # p99 at rank 3.96 between 0.73617 and 1.279234 (gap 0.543064)
    assert m["quic_handshake_p50_ms"] == pytest.approx(0.730191)
    assert m["quic_handshake_p90_ms"] == pytest.approx(0.73617 + 0.6 * 0.543064)
    assert m["quic_handshake_p99_ms"] == pytest.approx(0.73617 + 0.96 * 0.543064)
    # ttfb_ms sorted: 0.887674 0.912811 0.913001 0.972349 1.657994 (gap at the top 0.685645)
    assert m["quic_ttfb_p50_ms"] == pytest.approx(0.913001)
    assert m["quic_ttfb_p90_ms"] == pytest.approx(0.972349 + 0.6 * 0.685645)
    assert m["quic_ttfb_p99_ms"] == pytest.approx(0.972349 + 0.96 * 0.685645)
    # 20,000,000 bytes in 0.046854487 s: 160 Mbit / 0.046854487 s
    assert m["quic_goodput_mbps"] == pytest.approx(3414.8277, rel=1e-6)
    assert m["quic_bulk_s"] == pytest.approx(0.046854487)
    assert m["quic_bulk_mb"] == 20.0
    # the server's own count: the download plus 5 x 1000 bytes of probe responses
    assert m["quic_server_sent_mb"] == pytest.approx(20.005)
    assert m["quic_min_rtt_ms"] == pytest.approx(0.037395)
    # CPU over the download: client 0.021465 s of 0.046854487 s; server 0.023494 s from its first write until
    # the client had acknowledged everything (acked_mono - start_mono = 0.047022276 s)
    assert m["quic_client_cpu_pct"] == pytest.approx(45.8120, abs=1e-4)
    assert m["quic_server_cpu_pct"] == pytest.approx(49.9636, abs=1e-4)
    assert m["quic_handshakes"] == 5
    assert m["quic_handshake_failures"] == m["quic_request_failures"] == m["quic_handshake_retries"] == 0
    assert m["quic_probes_given_up"] == 0
    assert out.measure_s == pytest.approx(0.053568615)
    series = {s.name: s for s in out.series}
    assert series["quic_handshake_ms"].points[1] == (0.002097124, 0.73617)
    assert series["quic_ttfb_ms"].points[0] == (0.000387203, 1.657994)
    assert {s.unit for s in out.samples if s.name.endswith("_ms")} == {"ms"}


def test_retried_probes_are_counted():
    """client-late.json: the server started 0.5 s after the client (200 ms timeout, 3 retries): the first
    probe failed 3 times and succeeded at its 4th attempt; the other two at once."""
    cli = recorded("client-late.json")
    assert [p["attempt"] for p in cli["probes"]] == [3, 0, 0]
    m = samples(outcome(cli, recorded_server("server-late.log")))
    assert m["quic_handshakes"] == 3
    assert m["quic_handshake_failures"] == 3 and m["quic_handshake_retries"] == 3
    assert m["quic_probes_given_up"] == 0 and m["quic_request_failures"] == 0
    assert m["quic_handshake_p50_ms"] == pytest.approx(0.937658)
    assert m["quic_server_sent_mb"] == pytest.approx(3e-6)
    assert "quic_goodput_mbps" not in m  # no bulk download asked for


def test_a_probe_given_up_is_counted_apart_from_its_retries():
    """client-gave-up.json: the server started 0.5 s after the client (200 ms timeout, 1 retry): the
    first probe failed both attempts (given up), the second failed once and succeeded on its retry, the
    third went through; then a 1 MB download."""
    cli = recorded("client-gave-up.json")
    assert [p["attempt"] for p in cli["probes"]] == [1, 0]
    m = samples(outcome(cli, recorded_server("server-gave-up.log")))
    assert m["quic_handshakes"] == 2 and m["quic_probes_given_up"] == 1
    assert m["quic_handshake_failures"] == 3 and m["quic_handshake_retries"] == 2
    assert m["quic_handshake_p50_ms"] == pytest.approx((0.846542 + 0.714397) / 2)
    assert m["quic_goodput_mbps"] == pytest.approx(8 / 0.004511107)
    assert m["quic_server_sent_mb"] == pytest.approx(1.000002)


def test_nothing_answering_is_an_error_with_the_failures():
    """client-none.json: no server; 2 probes x (1 + 1 retry) and the bulk connection's 2 attempts all timed out."""
    cli = recorded("client-none.json")
    assert (cli["handshake_failures"], cli["retries"], cli["gave_up"]) == (6, 3, 2)
    with pytest.raises(WorkloadError, match=r"no QUIC handshake probe succeeded.*handshake:timeout"):
        outcome(cli, None)


def test_a_cut_download_is_an_error():
    """client-bulk-timeout.json: 2 GB asked for with a 200 ms limit; the probes went through."""
    with pytest.raises(
        WorkloadError, match=r"bulk download failed after 80322081 of 2000000000 bytes: download: timeout"
    ):
        outcome(recorded("client-bulk-timeout.json"), None)


def test_parse_client_takes_the_result_line():
    text = (DATA / "client-ok.json").read_text()
    assert parse_client("a warning\n" + text)["handshakes_requested"] == 5
    with pytest.raises(WorkloadError, match="printed no result"):
        parse_client('quicperf: listen: address in use\n{"not": "a result"}\n')


def test_params_label_metrics_and_seeds_scenario():
    assert Quic(QuicParams()).label() == "quic-h50-100MB"
    assert Quic(QuicParams(handshakes=10, bulk_mb=0.5)).label() == "quic-h10-0.5MB"
    names = {m.name for m in Quic.metrics}
    assert {
        "quic_handshake_p50_ms",
        "quic_handshake_p99_ms",
        "quic_ttfb_p50_ms",
        "quic_goodput_mbps",
        "quic_handshake_failures",
        "quic_handshake_retries",
    } <= names
    assert set(Quic.headline) <= names
    assert {m.name: m for m in Quic.metrics}["quic_goodput_mbps"].better == "higher" and {
        m.name: m for m in Quic.metrics
    }["quic_ttfb_p50_ms"].unit == "ms"
    assert all(m.unit == "ms" for m in Quic.metrics if m.name.endswith("_ms"))
    assert WORKLOADS["quic"] is Quic and Quic.tools == ("quicperf",)
    with pytest.raises(ValueError):
        QuicParams(handshakes=0)
    seeds = tomllib.loads((REPO / "src/tunnelbench/scenarios/seeds.toml").read_text())
    (block,) = [w for w in seeds["workloads"] if w["name"] == "quic"]
    QuicParams(**{k: v for k, v in block.items() if k != "name"})


def test_versions_match_the_native_source():
    """The version the workload insists on is the one native/quicperf builds (tool version and quinn pin)."""
    main = (REPO / "native/quicperf/src/main.rs").read_text()
    assert re.search(r'^const TOOL_VERSION: &str = "(.*)";$', main, re.M)[1] == QUICPERF_VERSION
    assert re.search(r'^const QUINN_VERSION: &str = "(.*)";', main, re.M)[1] == QUINN_VERSION
    cargo = tomllib.loads((REPO / "native/quicperf/Cargo.toml").read_text())
    assert cargo["dependencies"]["quinn"]["version"] == f"={QUINN_VERSION}"
    lock = tomllib.loads((REPO / "native/quicperf/Cargo.lock").read_text())
    assert [p["version"] for p in lock["package"] if p["name"] == "quinn"] == [QUINN_VERSION]


class FakeHost:
    """Just enough of a Host for quicperf(): run() on this machine."""

    name = "fake"
    remote = False

    def run(self, argv, check=True, timeout=None):
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def test_a_wrong_or_missing_quicperf_is_reported(monkeypatch, tmp_path):
    fake = tmp_path / "quicperf"
    fake.write_text('#!/bin/sh\necho \'{"quicperf": "0", "quinn": "0.10.0"}\'\n')
    fake.chmod(0o755)
    monkeypatch.setattr("tunnelbench.workloads.quic.tool_on", lambda host, name: str(fake))
    with pytest.raises(
        WorkloadError, match=r"is quicperf 0 on quinn 0\.10\.0, expected 1 on quinn .*build-quicperf\.sh"
    ):
        quicperf(FakeHost())
    fake.write_text("#!/bin/sh\nexit 3\n")
    with pytest.raises(WorkloadError, match=r"does not run \(exit 3.*build-quicperf\.sh"):
        quicperf(FakeHost())
    # not installed at all: common.tool's message, which `tunnelbench doctor` mirrors through Quic.tools
    monkeypatch.undo()
    monkeypatch.setattr("tunnelbench.instruments.common.shutil.which", lambda name: None)
    monkeypatch.setattr("tunnelbench.instruments.common.Path.exists", lambda self: False)
    with pytest.raises(WorkloadError, match="quicperf not found; run scripts/setup.sh"):
        quicperf(FakeHost())


# -- the tool on loopback --------------------------------------------------------------------------------------
@pytest.fixture
def exe() -> str:
    path = shutil.which("quicperf")
    if path is None:
        pytest.skip("quicperf not built: run scripts/build-quicperf.sh (scripts/setup.sh does)")
    return path


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_failed_handshakes_are_retried_and_counted(exe):
    """A UDP socket that takes the datagrams and never answers: every attempt times out; 3 probes with 1 retry
    each make 6 failed attempts and 3 retries, the bulk connection 2 and 1 more."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        sink.bind(("127.0.0.1", 0))
        t0 = time.monotonic()
        r = subprocess.run([exe, "client", "-server", f"127.0.0.1:{sink.getsockname()[1]}", "-handshakes", "3",
                            "-retries", "1", "-timeout", "150ms", "-bulk-bytes", "1000"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
        wall = time.monotonic() - t0
        got = sink.recv(2000)
    assert r.returncode == 1  # nothing measured at all
    c = parse_client(r.stdout)
    assert c["probes"] == [] and c["gave_up"] == 3
    assert c["handshake_failures"] == 8 and c["retries"] == 4 and c["request_failures"] == 0
    assert c["error_kinds"] == {"handshake:timeout": 8}
    assert c["bulk"]["attempts"] == 2 and c["bulk"]["error"] == "handshake: timeout"
    assert 8 * 0.15 <= c["elapsed_s"] < wall  # each attempt waited its timeout
    assert len(got) >= 1200 and got[0] & 0xC0 == 0xC0  # a QUIC long-header Initial, padded to >= 1200 bytes


def test_loopback_counts_agree_with_the_servers(exe):
    port = free_udp_port()
    srv = subprocess.Popen([exe, "server", "-listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "ready"
        r = subprocess.run([exe, "client", "-server", f"127.0.0.1:{port}", "-handshakes", "10", "-ttfb-bytes", "5000",
                            "-bulk-bytes", "30000000"], capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        srv.terminate()
        out, _ = srv.communicate(timeout=10)
    assert r.returncode == 0, r.stderr
    c = parse_client(r.stdout)
    s = json.loads(out.strip().splitlines()[-1])["server"]
    assert len(c["probes"]) == 10 and c["handshake_failures"] == c["request_failures"] == 0
    assert s["connections"] == s["streams"] == s["answered"] == 11 and s["errors"] == 0
    assert s["bytes_sent"] == 30_000_000 + 10 * 5000
    assert s["bytes_received"] == 11 * 8  # one 8-byte request per stream
    b, big = c["bulk"], s["largest"]
    assert b["bytes"] == big["bytes"] == 30_000_000
    # on the one CLOCK_MONOTONIC both share: the server began writing after the request was sent, and began its
    # last write before the last byte arrived
    assert b["start_mono"] <= big["start_mono"] <= big["end_mono"] <= b["end_mono"]
    assert b["seconds"] == pytest.approx(b["end_mono"] - b["start_mono"], abs=2e-4)
    assert b["udp_bytes_received"] > b["bytes"]  # QUIC's framing on top of the payload
    assert b["udp_datagrams_received"] >= b["bytes"] / 1500
    for p in c["probes"]:
        assert 0 < p["handshake_ms"] < p["ttfb_ms"] <= p["total_ms"]


# -- end to end on the internal path ----------------------------------------------------------------------
@pytest.fixture
def mesh(lab_factory, exe):
    cls = DRIVERS["internal"]
    lab = lab_factory(2)
    driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir))
    driver.configure()
    m = Mesh(driver)
    m.start()
    m.wait_ready(60)
    m.run_dir = lab.run_dir
    m.lab = lab
    yield m
    m.stop()
    assert m.leftovers() == []


@pytest.mark.lab
def test_quic_on_the_internal_path(mesh):
    client, server = mesh.hosts[0], mesh.hosts[1]
    sip = mesh.tunnel_ip(server)
    ping = parse_ping(client.run(["ping", "-D", "-n", "-c", "20", "-i", "0.01", sip]).stdout)
    rtt_min = min(r for _, r in ping["replies"].values())
    ifname = interface_of(client, mesh.tunnel_ip(client))
    n, mb, ttfb_bytes = 30, 200.0, 1000
    wl = Quic(QuicParams(handshakes=n, bulk_mb=mb, ttfb_bytes=ttfb_bytes))
    adir = mesh.run_dir / "cases" / wl.label()
    adir.mkdir(parents=True)
    ctx = CaseContext(mesh, client, server, adir, time.monotonic() + 60, {"mss": None})
    rx0 = link_counters(client, ifname)["rx_bytes"]
    t0 = time.monotonic()
    out = wl.run(ctx)
    t1 = time.monotonic()
    rx1 = link_counters(client, ifname)["rx_bytes"]
    m = samples(out)
    assert set(m) <= {s.name for s in Quic.metrics}
    assert m["quic_handshakes"] == n and m["quic_handshake_failures"] == m["quic_handshake_retries"] == 0
    cli = json.loads((adir / "quicperf-client.json").read_text())
    srv = json.loads((adir / "quicperf-server.log").read_text().splitlines()[-1])["server"]
    payload = mb * 1e6

    # goodput x time = bytes, and the bytes are the server's own count of what it sent
    assert m["quic_bulk_mb"] == mb
    assert m["quic_goodput_mbps"] * m["quic_bulk_s"] == pytest.approx(mb * 8, rel=1e-9)
    assert m["quic_server_sent_mb"] * 1e6 == pytest.approx(payload + n * ttfb_bytes, abs=0.5)
    # ... at least that many bytes came in on the client's interface, and not much more (QUIC + UDP/IP headers)
    assert payload <= rx1 - rx0 < 1.15 * payload + 1e6, rx1 - rx0
    # the time, against two other clocks: the server's (it began writing after the request arrived, began its
    # last write before the last byte could arrive, and saw the transfer end when the client had acknowledged
    # every byte) and this test's
    big, b = srv["largest"], cli["bulk"]
    assert big["bytes"] == payload and b["bytes"] == payload
    assert t0 <= b["start_mono"] <= big["start_mono"] <= big["end_mono"] <= b["end_mono"] <= t1
    # the download's own timer and its CLOCK_MONOTONIC stamps agree (the time is request to last byte)
    assert m["quic_bulk_s"] == pytest.approx(b["end_mono"] - b["start_mono"], abs=2e-4)
    assert big["acked_mono"] - big["start_mono"] == pytest.approx(m["quic_bulk_s"], rel=0.1, abs=0.05)
    assert payload * 8 / 1e6 / (t1 - t0) <= m["quic_goodput_mbps"]

    # handshake >= 1 RTT as ping measured it on the same path; the first byte needs one more round trip
    probes = cli["probes"]
    assert min(p["handshake_ms"] for p in probes) >= rtt_min
    assert min(p["ttfb_ms"] - p["handshake_ms"] for p in probes) >= 0.5 * rtt_min
    # the probes ran one after another: each one's whole time fits before the next one's start (the unit
    # of the per-probe times against the tool's own clock of their starts), and all of them in the run
    for a, b in zip(probes, probes[1:], strict=False):
        assert a["start_s"] + a["total_ms"] / 1000 <= b["start_s"]
    assert sum(p["total_ms"] for p in probes) / 1000 < out.measure_s < t1 - t0
    assert 0 < m["quic_handshake_p50_ms"] <= m["quic_handshake_p90_ms"] <= m["quic_handshake_p99_ms"]
    for q in (50, 90, 99):
        assert m[f"quic_handshake_p{q}_ms"] < m[f"quic_ttfb_p{q}_ms"]
    assert m["quic_handshake_p99_ms"] <= max(p["handshake_ms"] for p in probes)
    print(
        f"\ninternal: QUIC goodput {m['quic_goodput_mbps']:.0f} Mbit/s (client cpu {m['quic_client_cpu_pct']:.0f}%, "
        f"server {m.get('quic_server_cpu_pct', float('nan')):.0f}%), handshake p50 {m['quic_handshake_p50_ms']:.2f} ms "
        f"p99 {m['quic_handshake_p99_ms']:.2f} ms, ttfb p50 {m['quic_ttfb_p50_ms']:.2f} ms, ping min {rtt_min:.3f} ms"
    )


def run_case(mesh, **params):
    wl = Quic(QuicParams(**params))
    adir = mesh.run_dir / "cases" / f"{wl.label()}-{time.monotonic_ns()}"
    adir.mkdir(parents=True)
    ctx = CaseContext(mesh, mesh.hosts[0], mesh.hosts[1], adir, time.monotonic() + 60, {"mss": None})
    out = wl.run(ctx)
    return samples(out), json.loads((adir / "quicperf-client.json").read_text())


@pytest.mark.lab
def test_the_handshake_takes_one_round_trip(mesh):
    """With 10 ms added each way on the lab router (netem, or the native engine where the kernel has none),
    a round trip is known: the full handshake takes one (not two: no Retry, no lost flight), the first byte
    one more."""
    lab = mesh.lab
    be = make_backend("auto", lab.router, lab.hosts, lab.run_dir / "impair")
    be.apply(Profile(name="delay-10", delay_ms=10))
    try:
        ping = parse_ping(mesh.hosts[0].run(["ping", "-D", "-n", "-c", "10", "-i", "0.05",
                                             mesh.tunnel_ip(mesh.hosts[1])]).stdout)  # fmt: skip
        m, cli = run_case(mesh, handshakes=10, bulk_mb=5)
    finally:
        be.clear()
    rtt = min(r for _, r in ping["replies"].values())
    assert 19 <= rtt < 30, rtt  # the delay is on
    assert m["quic_handshakes"] == 10 and m["quic_handshake_failures"] == 0
    probes = cli["probes"]
    assert min(p["handshake_ms"] for p in probes) >= rtt
    assert m["quic_handshake_p50_ms"] < 2 * rtt
    assert min(p["ttfb_ms"] - p["handshake_ms"] for p in probes) >= 0.9 * rtt
    assert m["quic_ttfb_p50_ms"] < 3 * rtt
    # quinn's own RTT estimate on the bulk connection agrees with ping's
    assert rtt * 0.9 <= m["quic_min_rtt_ms"] < 2 * rtt
    assert m["quic_goodput_mbps"] * m["quic_bulk_s"] == pytest.approx(5 * 8, rel=1e-9)
    # the download is timed from the request: its first byte came one round trip later, inside the time
    b = cli["bulk"]
    assert m["quic_bulk_s"] == pytest.approx(b["end_mono"] - b["start_mono"], abs=2e-4)
    assert rtt * 0.9 <= b["ttfb_ms"] < m["quic_bulk_s"] * 1000
    print(
        f"\ndelay 10 ms each way: ping min {rtt:.2f} ms, handshake p50 {m['quic_handshake_p50_ms']:.2f} ms, "
        f"ttfb p50 {m['quic_ttfb_p50_ms']:.2f} ms, quinn min RTT {m['quic_min_rtt_ms']:.2f} ms"
    )
