"""Metric parsing from real tool output captured on this kind of machine (tests/data)."""

from __future__ import annotations

import json

import pytest
from tree import DATA

from tunnelbench.core.results import Outcome
from tunnelbench.instruments.iperf3 import parse_tcp, parse_udp
from tunnelbench.instruments.ping import parse_ping
from tunnelbench.workloads.ping import rtt_samples


def metrics(out: Outcome) -> dict[str, float]:
    return {s.name: s.value for s in out.samples}


def test_iperf3_tcp_single_stream():
    data = json.loads((DATA / "iperf_tcp.json").read_text())
    out = Outcome()
    parse_tcp(data, out)
    m = metrics(out)
    end = data["end"]
    assert m["goodput_mbps"] == pytest.approx(end["sum_received"]["bits_per_second"] / 1e6)
    assert m["goodput_sender_mbps"] == pytest.approx(end["sum_sent"]["bits_per_second"] / 1e6)
    assert m["retransmits"] == end["sum_sent"]["retransmits"] == 181
    segs = end["sum_sent"]["bytes"] / data["start"]["tcp_mss_default"]
    assert m["retransmit_rate"] == pytest.approx(181 / segs)
    assert m["max_cwnd_kbytes"] == pytest.approx(631328 / 1024)
    assert m["tcp_rtt_mean_ms"] == pytest.approx(0.034)
    assert 0 < m["iperf_cpu_client_pct"] <= 100
    (series,) = out.series
    assert series.name == "goodput_mbps" and len(series.points) == len(data["intervals"])


def test_iperf3_tcp_parallel_takes_sum_and_worst_streams():
    data = json.loads((DATA / "iperf_tcp_p2.json").read_text())
    out = Outcome()
    parse_tcp(data, out)
    m = metrics(out)
    streams = [s["sender"] for s in data["end"]["streams"]]
    assert len(streams) == 2
    assert m["retransmits"] == sum(s["retransmits"] for s in streams)
    assert m["max_cwnd_kbytes"] == pytest.approx(max(s["max_snd_cwnd"] for s in streams) / 1024)
    per_stream = sum(s["bits_per_second"] for s in streams) / 1e6
    assert m["goodput_sender_mbps"] == pytest.approx(per_stream, rel=1e-3)


def test_iperf3_udp():
    data = json.loads((DATA / "iperf_udp.json").read_text())
    out = Outcome()
    parse_udp(data, out)
    m = metrics(out)
    recv = data["end"]["sum_received"]
    assert m["goodput_mbps"] == pytest.approx(recv["bits_per_second"] / 1e6)
    assert m["udp_loss_pct"] == recv["lost_percent"]
    assert m["udp_jitter_ms"] == pytest.approx(recv["jitter_ms"])
    assert m["udp_packets"] == recv["packets"] == 17259
    assert m["udp_payload_bytes"] == 1448  # the recording's blksize: iperf3's default on a 1500-byte path


def test_ping_percentiles_and_loss():
    text = (DATA / "ping.txt").read_text()
    parsed = parse_ping(text)
    assert parsed["transmitted"] == 20 and parsed["received"] == 20
    out = Outcome()
    rtt_samples(parsed, out)
    m = metrics(out)
    # ping's own summary line says min/avg/max/mdev = 0.050/0.075/0.127/0.014
    assert m["rtt_min_ms"] == pytest.approx(0.050)
    assert m["rtt_max_ms"] == pytest.approx(0.127)
    assert m["rtt_avg_ms"] == pytest.approx(0.075, abs=0.0006)
    assert m["rtt_mdev_ms"] == pytest.approx(0.014, abs=0.001)  # ping rounds each RTT to 3 decimals
    assert m["rtt_min_ms"] <= m["rtt_p50_ms"] <= m["rtt_p95_ms"] <= m["rtt_p99_ms"] <= m["rtt_max_ms"]
    assert m["ping_loss_pct"] == 0


def test_ping_loss_and_duplicates():
    text = (
        "PING 10.0.0.2 (10.0.0.2) 56(84) bytes of data.\n"
        "[1.000000] 64 bytes from 10.0.0.2: icmp_seq=1 ttl=63 time=1.00 ms\n"
        "[1.100000] 64 bytes from 10.0.0.2: icmp_seq=1 ttl=63 time=9.00 ms (DUP!)\n"
        "[1.200000] 64 bytes from 10.0.0.2: icmp_seq=3 ttl=63 time=3.00 ms\n"
        "\n--- 10.0.0.2 ping statistics ---\n"
        "4 packets transmitted, 2 received, +1 duplicates, 50% packet loss, time 300ms\n"
        "rtt min/avg/max/mdev = 1.000/4.333/9.000/3.399 ms\n"
    )
    out = Outcome()
    rtt_samples(parse_ping(text), out)
    m = metrics(out)
    assert m["ping_loss_pct"] == 50.0
    assert m["rtt_max_ms"] == 3.0  # the duplicate is not a second sample
    assert m["rtt_p50_ms"] == 2.0


def test_ping_without_summary_is_an_error():
    from tunnelbench.workloads.base import WorkloadError

    with pytest.raises(WorkloadError):
        parse_ping("ping: connect: Network is unreachable\n")
