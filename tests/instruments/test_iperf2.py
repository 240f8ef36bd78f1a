"""iperf2 as the second engine of the tcp and udp workloads (issue 15): its enhanced reports parsed from real
recordings (tests/data/iperf2_*, iperf -e -f b between two lab namespaces) against numbers worked out by
hand, the iperf3 engine's metric names, the params' checks; then both engines end to end on the internal
path against the kernel's byte and packet counters and against each other."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pydantic import ValidationError
from test_parsers_known import FakeClock
from tree import DATA

from tunnelbench.catalog import WORKLOADS
from tunnelbench.core.results import Outcome
from tunnelbench.instruments import iperf2
from tunnelbench.instruments.common import interface_of, link_counters
from tunnelbench.instruments.iperf3 import parse_tcp, parse_udp
from tunnelbench.workloads.base import CaseContext, WorkloadError
from tunnelbench.workloads.tcp import Tcp, TcpParams, byte_count
from tunnelbench.workloads.udp import Udp, UdpParams, iperf2_rate

CPU = {"iperf_cpu_client_pct", "iperf_cpu_server_pct"}


def pair(name: str) -> tuple[iperf2.Output, iperf2.Output]:
    return (
        iperf2.parse((DATA / f"{name}_client.txt").read_text()),
        iperf2.parse((DATA / f"{name}_server.txt").read_text()),
    )


def flat(points: list[tuple[float, float]]) -> list[float]:
    return [v for p in points for v in p]


def metrics(out: Outcome) -> dict[str, float]:
    return {s.name: s.value for s in out.samples}


def tcp_metrics(name: str, omit_s: float = 0.0, reverse: bool = False) -> tuple[dict[str, float], Outcome]:
    client, server = pair(name)
    sender, receiver = (server.local, client.local) if reverse else (client.local, server.local)
    out = Outcome()
    iperf2.add_tcp(out, sender, receiver, omit_s)
    out.series.append(iperf2.interval_series(client.local, omit_s))
    return metrics(out), out


# -- TCP ---------------------------------------------------------------------------------------------------
def test_tcp_whole_test_known_numbers():
    """iperf -c -t 3 -i 1 (server -i 1): sender = client's final line, receiver = server's."""
    m, out = tcp_metrics("iperf2_tcp")
    assert m["goodput_mbps"] == pytest.approx(2512781372 * 8 / 3.0288 / 1e6)  # 6637.0, the server's line
    assert m["goodput_sender_mbps"] == pytest.approx(2512781372 * 8 / 3.0295 / 1e6)  # 6635.5
    assert m["goodput_mbps"] == pytest.approx(6637021644 / 1e6, rel=1e-4)  # iperf2's own bits/sec
    assert m["retransmits"] == 655  # the final line's Rtry (= 0 + 609 + 46 of the intervals)
    assert m["retransmit_rate"] == pytest.approx(655 / (2512781372 / 1448))  # MSS from "icwnd/mss/irtt"
    assert m["max_cwnd_kbytes"] == 3198  # KiB, the largest per-second sample
    assert m["tcp_rtt_mean_ms"] == pytest.approx((82 + 1195 + 1412) / 3 / 1000)  # per-second sRTT, us -> ms
    assert set(m) == {s.name for s in Tcp.metrics} - CPU  # iperf2 measures no CPU
    (series,) = out.series
    assert series.name == "goodput_mbps" and series.unit == "Mbit/s"
    assert flat(series.points) == pytest.approx(
        flat([(1.0, 6806.307296), (2.0, 7341.080576), (3.0, 5953.814528)])
    )


def test_tcp_warm_up_left_out_from_the_intervals():
    """omit_s = 1 (iperf2 has no -O): only the intervals from 1 s count, at both ends."""
    m, out = tcp_metrics("iperf2_tcp", omit_s=1)
    assert m["goodput_sender_mbps"] == pytest.approx((917635072 + 744226816) * 8 / 2.0 / 1e6)
    assert m["goodput_mbps"] == pytest.approx((906207744 + 722755072) * 8 / 2.0 / 1e6)
    assert m["retransmits"] == 609 + 46
    assert m["tcp_rtt_mean_ms"] == pytest.approx((1195 + 1412) / 2 / 1000)
    assert [t for t, _ in out.series[0].points] == [2.0, 3.0]
    # an output without the intervals cannot leave the warm-up out
    client, server = pair("iperf2_tcp_p2")
    with pytest.raises(WorkloadError, match="warm-up"):
        iperf2.add_tcp(Outcome(), client.local, server.local, 1)


def test_parallel_streams_add_up_without_the_sum_lines():
    """-P 2: the streams' final lines add up to iperf2's own [SUM] counts, which are not counted again."""
    m, out = tcp_metrics("iperf2_tcp_p2")
    assert m["goodput_mbps"] == pytest.approx((1025245244 + 1041498172) * 8 / 2.0189 / 1e6)  # longest stream
    assert m["goodput_sender_mbps"] == pytest.approx(2066743416 * 8 / 2.0385 / 1e6)
    assert m["retransmits"] == 343 + 252 == 595  # iperf2's [SUM] line says 595 too
    assert m["max_cwnd_kbytes"] == 1815
    assert m["tcp_rtt_mean_ms"] == pytest.approx((300 + 472 + 147 + 2005) / 4 / 1000)
    # the series adds the streams of each second
    expect = [(1.0, (4666163680 + 4363125216) / 1e6), (2.0, (3664773120 + 3837788160) / 1e6)]
    assert flat(out.series[0].points) == pytest.approx(flat(expect))


def test_reverse_the_server_is_the_sender():
    """-R: the client receives ("[ *1]" lines), the server's output has Rtry and the sender's MSS."""
    m, _ = tcp_metrics("iperf2_tcp_rev", reverse=True)
    assert m["goodput_mbps"] == pytest.approx(1577713664 * 8 / 2.0022 / 1e6)
    assert m["goodput_sender_mbps"] == pytest.approx(1577713664 * 8 / 2.0401 / 1e6)
    assert m["retransmits"] == 270 and m["max_cwnd_kbytes"] == 2180
    assert m["tcp_rtt_mean_ms"] == pytest.approx(0.314)  # no intervals on the server: the final snapshot


def test_byte_count_transfer():
    """iperf -n 100M: 100 MiB (iperf2's uppercase suffixes are powers of 1024) at both ends."""
    client, server = pair("iperf2_tcp_n100M")
    assert byte_count("100M") == 100 * 2**20 == 104857600
    assert [r.bytes for r in client.local.finals()] == [byte_count("100M")]
    assert [r.bytes for r in server.local.finals()] == [byte_count("100M")]
    m, _ = tcp_metrics("iperf2_tcp_n100M")
    assert m["goodput_mbps"] == pytest.approx(104857600 * 8 / 0.1078 / 1e6)
    assert client.local.intervals() == []  # shorter than the 1 s interval


# -- UDP ---------------------------------------------------------------------------------------------------
def test_udp_from_the_server_report():
    """iperf -u -b 100m -t 2: the receiver's numbers from the client's copy of the server report; -b 100m (the
    powers-of-1000 spelling the engine passes) sends 100.0 Mbit/s, iperf3's -b 100M."""
    client, server = pair("iperf2_udp_100m")
    out = Outcome()
    iperf2.add_udp(out, client, server.local)
    m = metrics(out)
    assert m["goodput_mbps"] == pytest.approx(25006170 * 8 / 2.0004 / 1e6)
    assert m["goodput_sender_mbps"] == pytest.approx(25006170 * 8 / 2.0002 / 1e6)
    assert m["goodput_sender_mbps"] == pytest.approx(100, rel=0.001)
    assert (m["udp_packets"], m["udp_lost_packets"], m["udp_loss_pct"]) == (17011, 0, 0)
    assert m["udp_jitter_ms"] == 0.001  # the report's, not the server's own line (0.002)
    assert m["udp_payload_bytes"] == 1470  # "Sending 1470 byte datagrams"
    assert set(m) == {s.name for s in Udp.metrics} - CPU
    assert iperf2_rate("100M") == "100m" and iperf2_rate("1.5G") == "1.5g"


def test_udp_flood_and_the_servers_own_output():
    """-b 100g (the engine's unlimited): 52043 of 95302 datagrams lost. Without the client's server report
    (its last datagram unacknowledged) the server's own line gives the same counts."""
    client, server = pair("iperf2_udp_flood")
    out = Outcome()
    iperf2.add_udp(out, client, server.local)
    m = metrics(out)
    assert m["udp_loss_pct"] == pytest.approx(100 * 52043 / 95302)  # 54.6 (iperf2 prints a rounded 55%)
    assert m["goodput_mbps"] == pytest.approx(63590730 * 8 / 0.996 / 1e6)
    text = (DATA / "iperf2_udp_flood_client.txt").read_text()
    cut = iperf2.parse(text[: text.index("Server Report:")])
    assert cut.server_report is None
    out2 = Outcome()
    iperf2.add_udp(out2, cut, server.local)
    m2 = metrics(out2)
    assert (m2["udp_lost_packets"], m2["udp_packets"]) == (52043, 95302)
    assert m2["udp_jitter_ms"] == 0.002
    with pytest.raises(WorkloadError, match="no server report"):
        iperf2.add_udp(Outcome(), cut, None)
    assert iperf2_rate("0") == "100g"


def test_same_metric_names_as_the_iperf3_engine():
    out3 = Outcome()
    parse_tcp(json.loads((DATA / "iperf_tcp.json").read_text()), out3)
    m2, _ = tcp_metrics("iperf2_tcp")
    assert set(m2) == set(metrics(out3)) - CPU
    u3 = Outcome()
    parse_udp(json.loads((DATA / "iperf_udp.json").read_text()), u3)
    client, server = pair("iperf2_udp_100m")
    u2 = Outcome()
    iperf2.add_udp(u2, client, server.local)
    assert set(metrics(u2)) == set(metrics(u3)) - CPU
    assert {s.unit for s in u2.samples} <= {s.unit for s in u3.samples}


# -- waiting for the server ------------------------------------------------------------------------------------
class GrowingLog:
    """A server process whose output grows by one recorded line per look, as a slow server prints it."""

    def __init__(self, text: str, ready_lines: int):
        self.lines, self.shown, self.looks = text.splitlines(keepends=True), ready_lines, 0

    def log_tail(self, chars: int = 2000) -> str:
        self.looks += 1
        self.shown += 1
        return "".join(self.lines[: self.shown])[-chars:]


def test_wait_finals_waits_for_every_streams_whole_test_line(monkeypatch):
    """The server prints its final lines after the client has gone: wait_finals returns only once each
    stream has one, and with intervals (omit_s = 1) the first 0-1 s interval does not pass for a final."""
    text = (DATA / "iperf2_tcp_server.txt").read_text()
    start = next(i for i, line in enumerate(text.splitlines()) if "0.0000-1.0000 sec" in line)
    proc = GrowingLog(text, start + 1)  # the 0-1 s interval is there, the rest comes later
    side = iperf2.wait_finals(proc, streams=1, min_end=1 + 0.5, timeout=5)
    assert [(r.start, r.end) for r in side.finals()] == [(0.0, 3.0288)] and proc.looks == 3
    p2 = (DATA / "iperf2_tcp_p2_server.txt").read_text()
    start = next(i for i, line in enumerate(p2.splitlines()) if line.startswith("[  1] 0.0000"))
    proc = GrowingLog(p2, start)  # no final yet; the second stream's comes a line after the first's
    side = iperf2.wait_finals(proc, streams=2, min_end=0.0, timeout=5)
    assert len(side.finals()) == 2 and proc.looks == 2
    # a server that never prints a final: the wait ends at its timeout with what there is, on a fake clock:
    # looks at 0, 0.05, ..., 0.35 s (8), the last one past the 0.3-s timeout
    clock = FakeClock(start=0.0)
    monkeypatch.setattr(iperf2, "time", clock)
    never = GrowingLog("nothing\n", 1)
    side = iperf2.wait_finals(never, streams=1, min_end=0.0, timeout=0.3)
    assert side.reports == [] and never.looks == 8 and clock.monotonic() == pytest.approx(0.35)


# -- params ------------------------------------------------------------------------------------------------
def test_params_engines_and_labels():
    assert TcpParams().engine == "iperf3" and Tcp(TcpParams()).label() == "tcp"  # unchanged defaults
    assert Tcp(TcpParams(engine="iperf2")).label() == "tcp-iperf2"
    assert Tcp(TcpParams(engine="iperf2", streams=4)).label() == "tcp-p4-iperf2"
    w = Tcp(TcpParams(engine="iperf2", bytes="100M"))
    assert w.label() == "tcp-iperf2-100M" and w.omit() == 0  # the default omit_s does not apply
    assert w.expected_seconds() == pytest.approx(104857600 * 8 / 20e6 + 2)
    with pytest.raises(ValidationError, match="bytes"):
        TcpParams(bytes="100M")  # iperf3's launcher is timed
    with pytest.raises(ValidationError, match="omit_s"):
        TcpParams(engine="iperf2", bytes="100M", omit_s=2)
    TcpParams(engine="iperf2", bytes="100M", omit_s=0)
    for bad in ("100X", "M", "0", "1.5M"):
        with pytest.raises(ValidationError, match="bytes"):
            TcpParams(engine="iperf2", bytes=bad)
    with pytest.raises(ValidationError, match="engine"):
        TcpParams(engine="netperf")
    assert Udp(UdpParams(engine="iperf2", bitrate="100M")).label() == "udp-100M-iperf2"
    assert Udp(UdpParams(engine="iperf2")).label() == "udp-unlimited-iperf2"
    assert Udp(UdpParams(engine="iperf2", bitrate="100M", bytes="50M")).expected_seconds() == pytest.approx(
        50 * 2**20 * 8 / 100e6 + 2
    )
    with pytest.raises(ValidationError, match="bytes"):
        UdpParams(engine="iperf2", bytes="50M")  # an unlimited flood is timed
    with pytest.raises(ValidationError, match="bytes"):
        UdpParams(bitrate="10M", bytes="50M")
    assert byte_count("100m") == 10**8 and byte_count("500K") == 512000 and byte_count("7") == 7
    assert "iperf" in Tcp.tools and "iperf" in Udp.tools
    assert WORKLOADS["tcp"] is Tcp and WORKLOADS["udp"] is Udp


# -- end to end, through the internal path -----------------------------------------------------------------
@pytest.fixture
def mesh(mesh_factory):
    return mesh_factory("internal")


def counters(mesh) -> dict[str, dict[str, int]]:
    """Both hosts' counters on the interface that holds their tunnel address (the kernel's count)."""
    return {h.name: link_counters(h, interface_of(h, mesh.tunnel_ip(h))) for h in mesh.hosts[:2]}


def run(
    mesh, name: str, mss: int | None = None, **params
) -> tuple[dict, Outcome, dict[str, dict[str, int]], Path]:
    wl = WORKLOADS[name](WORKLOADS[name].Params(**params))
    adir = mesh.run_dir / "cases" / f"{wl.label()}-{time.monotonic_ns()}"
    adir.mkdir(parents=True)
    ctx = CaseContext(mesh, mesh.hosts[0], mesh.hosts[1], adir, time.monotonic() + 60, {"mss": mss})
    before = counters(mesh)
    out = wl.run(ctx)
    after = counters(mesh)
    delta = {h: {k: after[h][k] - before[h][k] for k in after[h]} for h in after}
    return metrics(out), out, delta, adir / wl.label()


def check_wire(payload: float, wire: int) -> None:
    """Payload bytes against the kernel's count on the receiving device: at least the payload, at most the
    Ethernet + IP + TCP headers (66 B per segment of <= 1448 B, 4.6%) and 64 KiB of control traffic more."""
    assert payload <= wire <= payload * 1.06 + 65536, (wire, payload, wire / payload)


@pytest.mark.lab
def test_iperf2_tcp_against_the_kernel_and_iperf3(mesh):
    cli, srv = (h.name for h in mesh.hosts[:2])
    m2, out, d, base = run(mesh, "tcp", engine="iperf2", duration_s=2, omit_s=0)
    # the receiver's (server's) final line: goodput x its seconds = the payload the kernel carried
    (final,) = iperf2.parse(Path(f"{base}-server.txt").read_text()).local.finals()
    assert m2["goodput_mbps"] * 1e6 / 8 * final.end == pytest.approx(final.bytes)
    check_wire(final.bytes, d[srv]["rx_bytes"])
    assert m2["retransmits"] >= 0 and 0 <= m2["retransmit_rate"] < 1
    assert m2["goodput_mbps"] <= m2["goodput_sender_mbps"] * 1.05 and 1 <= out.measure_s <= 2
    # the same test with iperf3 on the same path: the two tools agree within what a shared machine allows
    m3, _, _, _ = run(mesh, "tcp", duration_s=2, omit_s=0)
    assert 0.25 < m2["goodput_mbps"] / m3["goodput_mbps"] < 4, (m2, m3)
    # a reverse, two-stream test: the client received what the server's lines say it sent
    mr, _, dr, base = run(mesh, "tcp", engine="iperf2", duration_s=1, omit_s=0, streams=2, reverse=True)
    sent = sum(r.bytes for r in iperf2.parse(Path(f"{base}-server.txt").read_text()).local.finals())
    check_wire(sent, dr[cli]["rx_bytes"])
    assert mr["goodput_mbps"] > 10 and mr["retransmits"] >= 0
    print(
        f"\ninternal tcp 2 s: iperf2 {m2['goodput_mbps']:.0f} Mbit/s, iperf3 {m3['goodput_mbps']:.0f} Mbit/s; "
        f"iperf2 -R -P 2 {mr['goodput_mbps']:.0f} Mbit/s"
    )


@pytest.mark.lab
def test_iperf2_byte_count_and_udp_rate(mesh):
    srv = mesh.hosts[1].name
    m, _, d, base = run(mesh, "tcp", engine="iperf2", bytes="20M")
    (final,) = iperf2.parse(Path(f"{base}-server.txt").read_text()).local.finals()
    assert final.bytes == 20 * 2**20  # exactly the byte count asked for
    check_wire(final.bytes, d[srv]["rx_bytes"])
    assert m["goodput_mbps"] > 10
    # the scenario's MSS clamp reaches iperf2 (-M): the client reports the connection's MSS
    _, _, _, base = run(mesh, "tcp", mss=1000, engine="iperf2", bytes="5M")
    assert iperf2.parse(Path(f"{base}-client.txt").read_text()).local.mss <= 1000
    # UDP at 20M: iperf3's meaning (20 x 10^6 bit/s), every datagram counted by the receiving kernel
    u, _, du, _ = run(mesh, "udp", engine="iperf2", bitrate="20M", duration_s=1)
    assert u["goodput_sender_mbps"] == pytest.approx(20, rel=0.03)  # 2^20-based would be 20.97
    assert u["udp_loss_pct"] < 5
    # (at least every datagram that arrived; a few more: the TCP runs' last packets, neighbour traffic)
    received = u["udp_packets"] - u["udp_lost_packets"]
    assert received <= du[srv]["rx_packets"] <= received + 20, (du, u)
    print(f"\ninternal iperf2 -n 20M {m['goodput_mbps']:.0f} Mbit/s; udp 20M: {u['goodput_mbps']:.2f} Mbit/s")
