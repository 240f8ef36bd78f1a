"""Workload parsers and drivers against known answers (issue 18): hand-written iperf3 JSON, ping output and
stream arrivals whose metrics are worked out by hand, and the run() plumbing of ping, iperf3 and streaming
driven through fake hosts and a fake clock (no lab, no root, no real tools)."""

from __future__ import annotations

import json
import math
import socket as real_socket
import sys
import time as real_time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tunnelbench.core.results import Outcome
from tunnelbench.instruments import iperf3, stream_agent
from tunnelbench.instruments.iperf3 import interval_series, parse_tcp, parse_udp, run_client, wait_listening
from tunnelbench.instruments.ping import parse_ping
from tunnelbench.lab.host import CommandError
from tunnelbench.workloads import ping, streaming
from tunnelbench.workloads.base import CaseContext, WorkloadError
from tunnelbench.workloads.ping import Ping, PingParams, rtt_samples
from tunnelbench.workloads.streaming import Streaming, StreamingParams, analyse, mos


def metrics(out: Outcome) -> dict[str, float]:
    return {s.name: s.value for s in out.samples}


def units(out: Outcome) -> dict[str, str]:
    return {s.name: s.unit for s in out.samples}


# -- fakes: a clock, hosts, processes ------------------------------------------------------------------
class FakeClock:
    """time.monotonic/sleep/time on a virtual clock: sleep() advances it instantly (rounded to the ns, so
    sums of steps land exactly on boundaries), and a loop that never ends fails instead of hanging."""

    def __init__(self, start: float = 100.0, wall: float = 1_700_000_000.0, max_steps: int = 20_000):
        self.t = start
        self.wall0 = wall - start
        self.sleeps: list[float] = []
        self.steps, self.max_steps = 0, max_steps

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return self.wall0 + self.t

    def sleep(self, d: float) -> None:
        d = float(d)
        if d < 0:
            raise ValueError("sleep length must be non-negative")
        self.sleeps.append(d)
        self.advance(d)

    def advance(self, d: float) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise RuntimeError("runaway loop on the fake clock")
        self.t = round(self.t + d, 9)


class FakeProc:
    def __init__(self, host: FakeHost, argv, label, log_path, wait_result=0, alive=False):
        self.host, self.argv, self.label, self.log_path = host, list(argv), label, log_path
        self.wait_result, self.alive_result = wait_result, alive
        self.waits: list[float] = []
        self.stopped: float | None = None

    def wait(self, timeout: float):
        self.waits.append(timeout)
        return self.wait_result

    def alive(self) -> bool:
        return self.alive_result

    def stop(self, grace: float = 5.0) -> None:
        self.stopped = grace
        self.host.stop_order.append(self.label)


class FakeHost:
    """A host of this machine (its files are this machine's) that records commands instead of running them."""

    remote = False

    def __init__(self, name: str, stop_order: list | None = None):
        self.name = name
        self.runs: list[tuple[list[str], dict]] = []
        self.spawned: list[FakeProc] = []
        self.handler = lambda argv, kw: SimpleNamespace(stdout="", stderr="", returncode=0)
        self.stop_order = stop_order if stop_order is not None else []
        self.proc_opts: dict[str, dict] = {}

    def run(self, argv, **kw):
        self.runs.append((list(argv), kw))
        return self.handler(list(argv), kw)

    def spawn(self, argv, label, log_path=None):
        p = FakeProc(self, argv, label, log_path, **self.proc_opts.get(label, {}))
        self.spawned.append(p)
        return p

    def mkdir(self, path: Path, mode: int = 0o755) -> None:
        path.mkdir(parents=True, exist_ok=True)

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def exists(self, path: Path) -> bool:
        return path.exists()

    def read_file(self, path: Path) -> bytes:
        return path.read_bytes()


class FakeMesh:
    def tunnel_ip(self, host: FakeHost) -> str:
        return {"client": "10.9.0.1", "server": "10.9.0.2"}[host.name]


def make_ctx(tmp_path: Path, options: dict | None = None) -> CaseContext:
    order: list[str] = []
    return CaseContext(
        mesh=FakeMesh(),
        client=FakeHost("client", order),
        server=FakeHost("server", order),
        artifact_dir=tmp_path,
        deadline=real_time.monotonic() + 1000,
        options=options or {},
    )  # type: ignore[arg-type]


def result(stdout: str = "", stderr: str = "", rc: int = 0) -> SimpleNamespace:
    return SimpleNamespace(stdout=stdout, stderr=stderr, returncode=rc)


# -- iperf3 JSON -----------------------------------------------------------------------------------------
def tcp_json(**start) -> dict:
    """Two TCP streams, 10 s, 1 omitted interval; sender 1 000 000 000 bytes with MSS 1000 and 50 retransmits."""
    return {
        "start": {"tcp_mss_default": 1448, **start},
        "intervals": [
            {"sum": {"end": 1.0, "bits_per_second": 5e8, "omitted": True}},
            {"sum": {"end": 2.0, "bits_per_second": 8e8, "omitted": False}},
            {"sum": {"end": 3.0, "bits_per_second": 9e8}},
        ],
        "end": {
            "streams": [
                {"sender": {"max_snd_cwnd": 204800, "mean_rtt": 1500, "bits_per_second": 4e8}},
                {"sender": {"max_snd_cwnd": 409600, "mean_rtt": 2500, "bits_per_second": 4e8}},
                {"sender": {"bits_per_second": 1e6}},  # a stream without cwnd/RTT fields (other OS)
                {"receiver": {"max_snd_cwnd": 9_999_999, "mean_rtt": 99_000}},  # not a sender: ignored
            ],
            "sum_sent": {"bytes": 1_000_000_000, "bits_per_second": 8.0e8, "retransmits": 50},
            "sum_received": {"bytes": 990_000_000, "bits_per_second": 7.92e8},
            "cpu_utilization_percent": {"host_total": 12.5, "remote_total": 30.25},
        },
    }


def test_iperf3_tcp_hand_written_two_streams():
    out = Outcome()
    parse_tcp(tcp_json(tcp_mss=1000), out)
    m, u = metrics(out), units(out)
    assert m == pytest.approx(
        {
            "goodput_mbps": 792.0,
            "goodput_sender_mbps": 800.0,
            "retransmits": 50,
            "retransmit_rate": 50 / 1_000_000,  # 1e9 bytes / 1000-byte MSS = 1e6 segments
            "max_cwnd_kbytes": 400.0,  # the larger stream's 409600 bytes
            "tcp_rtt_mean_ms": 2.0,  # mean of 1.5 and 2.5 ms (iperf3 reports microseconds)
            "tcp_mss_bytes": 1000,  # -M's tcp_mss wins over tcp_mss_default 1448
            "iperf_cpu_client_pct": 12.5,
            "iperf_cpu_server_pct": 30.25,
        },
        rel=1e-12,
    )
    assert u == {
        "goodput_mbps": "Mbit/s",
        "goodput_sender_mbps": "Mbit/s",
        "retransmits": "count",
        "retransmit_rate": "ratio",
        "max_cwnd_kbytes": "KiB",
        "tcp_rtt_mean_ms": "ms",
        "tcp_mss_bytes": "B",
        "iperf_cpu_client_pct": "%",
        "iperf_cpu_server_pct": "%",
    }
    (s,) = out.series
    assert (s.name, s.unit, s.points) == ("goodput_mbps", "Mbit/s", [(2.0, 800.0), (3.0, 900.0)])


def test_iperf3_tcp_mss_falls_back_to_the_default():
    out = Outcome()
    parse_tcp(tcp_json(), out)  # no tcp_mss (no -M): tcp_mss_default 1448
    assert metrics(out)["retransmit_rate"] == pytest.approx(50 / (1_000_000_000 / 1448), rel=1e-12)
    out = Outcome()
    parse_tcp(tcp_json(tcp_mss=0), out)  # 0 counts as unset
    assert metrics(out)["retransmit_rate"] == pytest.approx(50 / (1_000_000_000 / 1448), rel=1e-12)


def test_iperf3_tcp_without_retransmits_mss_bytes_streams_or_cpu():
    # no retransmit count (e.g. macOS sender): no retransmit metrics at all
    d = tcp_json(tcp_mss=1000)
    del d["end"]["sum_sent"]["retransmits"]
    out = Outcome()
    parse_tcp(d, out)
    assert "retransmits" not in metrics(out) and "retransmit_rate" not in metrics(out)
    # no MSS known: the count but no rate
    d = tcp_json()
    del d["start"]["tcp_mss_default"]
    out = Outcome()
    parse_tcp(d, out)
    assert metrics(out)["retransmits"] == 50 and "retransmit_rate" not in metrics(out)
    assert "tcp_mss_bytes" not in metrics(out)
    # nothing sent: no rate (no division by zero)
    d = tcp_json(tcp_mss=1000)
    d["end"]["sum_sent"]["bytes"] = 0
    d["end"]["sum_sent"]["retransmits"] = 0
    out = Outcome()
    parse_tcp(d, out)
    assert metrics(out)["retransmits"] == 0 and "retransmit_rate" not in metrics(out)
    # zero retransmits with bytes: a rate of exactly 0
    d = tcp_json(tcp_mss=1000)
    d["end"]["sum_sent"]["retransmits"] = 0
    out = Outcome()
    parse_tcp(d, out)
    assert metrics(out)["retransmit_rate"] == 0.0
    # no streams and no CPU section: only the sums
    d = tcp_json(tcp_mss=1000)
    del d["end"]["streams"], d["end"]["cpu_utilization_percent"], d["intervals"]
    out = Outcome()
    parse_tcp(d, out)
    assert set(metrics(out)) == {
        "goodput_mbps",
        "goodput_sender_mbps",
        "retransmits",
        "retransmit_rate",
        "tcp_mss_bytes",
    }
    assert out.series[0].points == []
    # streams with neither cwnd nor RTT
    d = tcp_json(tcp_mss=1000)
    d["end"]["streams"] = [{"sender": {"bits_per_second": 1.0}}]
    out = Outcome()
    parse_tcp(d, out)
    assert "max_cwnd_kbytes" not in metrics(out) and "tcp_rtt_mean_ms" not in metrics(out)


def test_iperf3_tcp_single_stream_rtt_and_cwnd():
    d = tcp_json(tcp_mss=1000)
    d["end"]["streams"] = [{"sender": {"max_snd_cwnd": 1024, "mean_rtt": 40}}]
    out = Outcome()
    parse_tcp(d, out)
    assert metrics(out)["max_cwnd_kbytes"] == 1.0 and metrics(out)["tcp_rtt_mean_ms"] == pytest.approx(0.04)


def test_interval_series_name_and_omitted():
    data = {
        "intervals": [
            {"sum": {"end": 1.5, "bits_per_second": 1e6, "omitted": True}},
            {"sum": {"end": 2.5, "bits_per_second": 2.5e6}},
        ]
    }
    s = interval_series(data, "rx_mbps")
    assert (s.name, s.unit, s.points) == ("rx_mbps", "Mbit/s", [(2.5, 2.5)])
    assert interval_series({}).points == [] and interval_series({}).name == "goodput_mbps"


def udp_json() -> dict:
    """iperf3 >= 3.7: sum_sent and sum_received; the receiver lost 250 of 10000 datagrams."""
    return {
        "start": {},
        "intervals": [{"sum": {"end": 1.0, "bits_per_second": 9.5e7}}],
        "end": {
            "sum": {
                "bits_per_second": 1.11e8,
                "jitter_ms": 9.9,
                "lost_packets": 9,
                "packets": 99,
                "lost_percent": 9.09,
            },  # fmt: skip
            "sum_sent": {
                "bits_per_second": 1.0e8,
                "jitter_ms": 0,
                "lost_packets": 0,
                "packets": 10000,
                "lost_percent": 0,
            },  # fmt: skip
            "sum_received": {
                "bits_per_second": 9.75e7,
                "jitter_ms": 0.125,
                "lost_packets": 250,
                "packets": 10000,
                "lost_percent": 2.5,
            },  # fmt: skip
            "cpu_utilization_percent": {"host_total": 3.5, "remote_total": 7.25},
        },
    }


def test_iperf3_udp_sent_and_received():
    out = Outcome()
    parse_udp(udp_json(), out)
    assert metrics(out) == pytest.approx(
        {
            "goodput_mbps": 97.5,
            "goodput_sender_mbps": 100.0,
            "udp_loss_pct": 2.5,
            "udp_jitter_ms": 0.125,
            "udp_packets": 10000,
            "udp_lost_packets": 250,
            "iperf_cpu_client_pct": 3.5,
            "iperf_cpu_server_pct": 7.25,
        },
        rel=1e-12,
    )
    assert units(out) == {
        "goodput_mbps": "Mbit/s",
        "goodput_sender_mbps": "Mbit/s",
        "udp_loss_pct": "%",
        "udp_jitter_ms": "ms",
        "udp_packets": "count",
        "udp_lost_packets": "count",
        "iperf_cpu_client_pct": "%",
        "iperf_cpu_server_pct": "%",
    }
    (s,) = out.series
    assert (s.name, s.unit, s.points) == ("goodput_mbps", "Mbit/s", [(1.0, 95.0)])
    assert metrics(out)["goodput_mbps"] == 97.5


def test_iperf3_udp_old_format_only_sum():
    d = udp_json()
    del d["end"]["sum_sent"], d["end"]["sum_received"], d["end"]["cpu_utilization_percent"]
    out = Outcome()
    parse_udp(d, out)
    assert metrics(out) == pytest.approx(
        {
            "goodput_mbps": 111.0,
            "goodput_sender_mbps": 111.0,
            "udp_loss_pct": 9.09,
            "udp_jitter_ms": 9.9,
            "udp_packets": 99,
            "udp_lost_packets": 9,
        },  # fmt: skip
        rel=1e-12,
    )


def test_iperf3_udp_received_without_loss_fields_falls_back_to_sum():
    d = udp_json()
    for k in ("jitter_ms", "lost_packets", "packets", "lost_percent"):
        del d["end"]["sum_received"][k]
    del d["end"]["sum_sent"]
    out = Outcome()
    parse_udp(d, out)
    m = metrics(out)
    assert (m["goodput_mbps"], m["goodput_sender_mbps"]) == pytest.approx((97.5, 111.0))
    assert (m["udp_loss_pct"], m["udp_jitter_ms"], m["udp_packets"], m["udp_lost_packets"]) == pytest.approx(
        (9.09, 9.9, 99, 9)
    )


# -- iperf3 plumbing -----------------------------------------------------------------------------------
def test_wait_listening_polls_ss_until_the_port_listens(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(iperf3, "time", clock)
    host = FakeHost("server")
    answers = iter(["", "  \n", "LISTEN 0 5 10.9.0.2:5201 0.0.0.0:*\n"])
    host.handler = lambda argv, kw: result(next(answers))
    wait_listening(host, 5201)
    assert [r[0] for r in host.runs] == [["ss", "-Hltn", "sport = :5201"]] * 3
    assert all(kw == {"check": False} for _, kw in host.runs)
    assert clock.sleeps == [0.01, 0.01]


def test_wait_listening_times_out(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(iperf3, "time", clock)
    host = FakeHost("srv-a")
    with pytest.raises(WorkloadError, match=r"^iperf3 server on srv-a not listening on :7000 after 2 s$"):
        wait_listening(host, 7000, timeout=1.6)
    assert len(host.runs) == 160 and clock.t == pytest.approx(101.6)
    # the default timeout is 5 s
    clock2 = FakeClock()
    monkeypatch.setattr(iperf3, "time", clock2)
    with pytest.raises(WorkloadError, match="after 5 s"):
        wait_listening(host, 7000)
    assert clock2.t == pytest.approx(105.0)


def iperf_ctx(tmp_path, stdout, options=None, stderr="", rc=0, run_s=12.5, raise_=None, monkeypatch=None):
    clock = FakeClock()
    monkeypatch.setattr(iperf3, "time", clock)
    ctx = make_ctx(tmp_path, options)
    ctx.server.handler = lambda argv, kw: result("LISTEN 0 5 10.9.0.2:5201\n")

    def client_run(argv, kw):
        if raise_:
            raise raise_
        clock.advance(run_s)
        return result(stdout, stderr, rc)

    ctx.client.handler = client_run
    return ctx, clock


def test_run_client_argv_artifacts_and_duration(tmp_path, monkeypatch):
    body = json.dumps({"start": {}, "end": {"x": 1}})
    ctx, _ = iperf_ctx(tmp_path, body, monkeypatch=monkeypatch)
    data, ran = run_client(ctx, ["-P", "4"], 10.0, 0, "tcp")
    assert data == {"start": {}, "end": {"x": 1}} and ran == pytest.approx(12.5)
    (srv,) = ctx.server.spawned
    assert srv.argv == ["iperf3", "-s", "-1", "-p", "5201", "-B", "10.9.0.2"]
    assert srv.label == "iperf3-server" and srv.log_path == tmp_path / "tcp-server.log"
    assert srv.stopped == 2
    ((argv, kw),) = ctx.client.runs
    assert argv == ["iperf3", "-c", "10.9.0.2", "-p", "5201", "-J", "-t", "10", "--connect-timeout", "5000",
                    "-P", "4"]  # fmt: skip
    assert kw["check"] is False and kw["timeout"] == pytest.approx(40.0)
    assert (tmp_path / "tcp-client.json").read_text() == body
    assert ctx.server.runs[0][0] == ["ss", "-Hltn", "sport = :5201"]


def test_run_client_omit_mss_and_timeout_from_the_deadline(tmp_path, monkeypatch):
    ctx, _ = iperf_ctx(tmp_path, "{}", options={"mss": 1200}, monkeypatch=monkeypatch)
    run_client(ctx, [], 2.5, 1.5, "udp")
    ((argv, kw),) = ctx.client.runs
    assert argv == ["iperf3", "-c", "10.9.0.2", "-p", "5201", "-J", "-t", "2.5", "-O", "1.5", "-M", "1200",
                    "--connect-timeout", "5000"]  # fmt: skip
    assert kw["timeout"] == pytest.approx(34.0)
    # the case deadline caps the client's timeout
    ctx, _ = iperf_ctx(tmp_path, "{}", monkeypatch=monkeypatch)
    ctx.deadline = real_time.monotonic() + 20
    run_client(ctx, [], 10, 0, "tcp")
    assert 15 < ctx.client.runs[0][1]["timeout"] <= 20


def test_run_client_errors_stop_the_server(tmp_path, monkeypatch):
    ctx, _ = iperf_ctx(tmp_path, "", stderr="x" * 500 + "unable to connect", rc=1, monkeypatch=monkeypatch)
    with pytest.raises(WorkloadError) as e:
        run_client(ctx, [], 1, 0, "t")
    tail = ("x" * 500 + "unable to connect")[-400:]
    assert str(e.value) == f"iperf3 printed no JSON (exit 1): {tail}"
    assert ctx.server.spawned[0].stopped == 2
    assert (tmp_path / "t-client.json").read_text() == ""

    ctx, _ = iperf_ctx(tmp_path, json.dumps({"error": "the server is busy"}), monkeypatch=monkeypatch)
    with pytest.raises(WorkloadError) as e:
        run_client(ctx, [], 1, 0, "t")
    assert str(e.value) == "iperf3: the server is busy"
    assert ctx.server.spawned[0].stopped == 2

    err = CommandError("client", ["iperf3"], None, "timeout")
    ctx, _ = iperf_ctx(tmp_path, "{}", raise_=err, monkeypatch=monkeypatch)
    with pytest.raises(WorkloadError) as e:
        run_client(ctx, [], 1, 0, "t")
    assert str(e.value) == f"iperf3 client timed out: {err}"
    assert e.value.__cause__ is None and e.value.__suppress_context__
    assert ctx.server.spawned[0].stopped == 2


# -- ping ----------------------------------------------------------------------------------------------
PING_LOSS = """\
PING 10.9.0.2 (10.9.0.2) 56(84) bytes of data.
[1700000000.100000] 64 bytes from 10.9.0.2: icmp_seq=1 ttl=64 time=4.00 ms
[1700000000.200000] 64 bytes from 10.9.0.2: icmp_seq=2 ttl=64 time=2.00 ms
[1700000000.250000] 64 bytes from 10.9.0.2: icmp_seq=2 ttl=64 time=7.00 ms (DUP!)
[1700000000.400000] 64 bytes from 10.9.0.2: icmp_seq=4 ttl=64 time=1.00 ms
[1700000000.500000] 64 bytes from 10.9.0.2: icmp_seq=5 ttl=64 time=3.00 ms
[1700000000.550000] 64 bytes from 10.9.0.2: icmp_seq=5 ttl=64 time=8.00 ms
[1700000000.600000] 64 bytes from 10.9.0.2: icmp_seq=6 ttl=64 time=5 ms

--- 10.9.0.2 ping statistics ---
8 packets transmitted, 5 received, +1 duplicates, 37.5% packet loss, time 700ms
rtt min/avg/max/mdev = 1.000/3.000/5.000/1.414 ms
"""


def test_parse_ping_replies_duplicates_and_summary():
    p = parse_ping(PING_LOSS)
    assert (p["transmitted"], p["received"]) == (8, 5)
    assert p["replies"] == {
        1: (1700000000.1, 4.0),
        2: (1700000000.2, 2.0),  # the DUP! line is ignored
        4: (1700000000.4, 1.0),
        5: (1700000000.5, 3.0),  # the first reply per seq counts
        6: (1700000000.6, 5.0),  # integer RTT (older iputils)
    }
    s = p["summary"]
    assert (s["min"], s["avg"], s["max"], s["mdev"]) == ("1.000", "3.000", "5.000", "1.414")


def test_rtt_samples_hand_computed():
    out = Outcome()
    rtt_samples(parse_ping(PING_LOSS), out)
    m = metrics(out)
    # RTTs 4, 2, 1, 3, 5: min 1, mean 3, max 5, population sd sqrt(2) (ping's mdev), linear percentiles
    assert m == pytest.approx(
        {
            "ping_loss_pct": 37.5,
            "rtt_min_ms": 1.0,
            "rtt_avg_ms": 3.0,
            "rtt_max_ms": 5.0,
            "rtt_mdev_ms": math.sqrt(2),
            "rtt_p50_ms": 3.0,
            "rtt_p95_ms": 4.8,
            "rtt_p99_ms": 4.96,
            "rtt_spike_ratio": 5 / 3,
        },  # fmt: skip
        rel=1e-12,
    )
    assert set(units(out).values()) == {"%", "ms", "ratio"} and units(out)["ping_loss_pct"] == "%"
    assert all(u == "ms" for k, u in units(out).items() if k not in ("ping_loss_pct", "rtt_spike_ratio"))


def test_rtt_samples_no_replies_and_every_declared_name():
    text = (
        "PING 10.9.0.2 (10.9.0.2) 56(84) bytes of data.\n\n--- 10.9.0.2 ping statistics ---\n"
        "5 packets transmitted, 0 received, 100% packet loss, time 4086ms\n"
    )
    p = parse_ping(text)
    assert p["replies"] == {} and p["summary"] is None and (p["transmitted"], p["received"]) == (5, 0)
    out = Outcome()
    rtt_samples(p, out)
    assert metrics(out) == {"ping_loss_pct": 100.0} and units(out) == {"ping_loss_pct": "%"}
    out = Outcome()
    rtt_samples(parse_ping(PING_LOSS), out)
    assert sorted(metrics(out)) == sorted(
        [
            "ping_loss_pct",
            "rtt_min_ms",
            "rtt_avg_ms",
            "rtt_max_ms",
            "rtt_mdev_ms",
            "rtt_p50_ms",
            "rtt_p95_ms",
            "rtt_p99_ms",
            "rtt_spike_ratio",
        ]  # fmt: skip
    )
    # nothing transmitted (ping killed at once): no loss figure
    out = Outcome()
    rtt_samples({"transmitted": 0, "received": 0, "replies": {}}, out)
    assert out.samples == []


def test_parse_ping_busybox_summary_format():
    # busybox: "N packets received" and "round-trip min/avg/max"
    text = (
        "[10.5] 64 bytes from 10.9.0.2: seq=0 ttl=64 time=0.100 ms\n"  # no icmp_seq=: not a -D reply line
        "[11.5] 64 bytes from 10.9.0.2: icmp_seq=7 ttl=64 time=0.250 ms\n"
        "4 packets transmitted, 3 packets received, 25% packet loss\n"
        "round-trip min/avg/max = 0.100/0.200/0.300 ms\n"
    )
    p = parse_ping(text)
    assert (p["transmitted"], p["received"]) == (4, 3) and p["replies"] == {7: (11.5, 0.25)}
    out = Outcome()
    rtt_samples(p, out)
    assert metrics(out)["ping_loss_pct"] == 25.0


def test_parse_ping_without_summary_message():
    with pytest.raises(WorkloadError, match="^ping printed no summary line$"):
        parse_ping("[1.0] 64 bytes from 10.9.0.2: icmp_seq=1 ttl=64 time=1.0 ms\n")


def test_ping_workload_run_label_and_expected_seconds(tmp_path, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(ping, "time", clock)
    ctx = make_ctx(tmp_path)

    def run(argv, kw):
        clock.advance(0.75)
        return result(PING_LOSS, "warning: something\n")

    ctx.client.handler = run
    w = Ping(PingParams(count=8, interval_s=0.1, size=1200, timeout_s=1.5))
    assert w.label() == "ping"
    assert w.expected_seconds() == pytest.approx(8 * 0.1 + 1.5)
    out = w.run(ctx)
    ((argv, kw),) = ctx.client.runs
    assert argv == ["ping", "-D", "-n", "-c", "8", "-i", "0.1", "-s", "1200", "-W", "1.5", "10.9.0.2"]
    assert kw["check"] is False and 990 < kw["timeout"] <= 1000
    assert (tmp_path / "ping.txt").read_text() == PING_LOSS + "warning: something\n"
    assert out.measure_s == pytest.approx(0.75)
    assert metrics(out)["ping_loss_pct"] == 37.5 and metrics(out)["rtt_avg_ms"] == 3.0
    (s,) = out.series
    assert (s.name, s.unit) == ("rtt_ms", "ms")
    assert [t for t, _ in s.points] == pytest.approx([0.0, 0.1, 0.3, 0.4, 0.5], abs=1e-6)
    assert [r for _, r in s.points] == [4.0, 2.0, 1.0, 3.0, 5.0]
    defaults = Ping(PingParams())
    assert defaults.expected_seconds() == pytest.approx(100 * 0.05 + 2.0)


def test_ping_workload_run_without_replies_has_no_series(tmp_path, monkeypatch):
    monkeypatch.setattr(ping, "time", FakeClock())
    ctx = make_ctx(tmp_path)
    ctx.client.handler = lambda argv, kw: result("3 packets transmitted, 0 received, 100% packet loss\n")
    out = Ping(PingParams(count=3)).run(ctx)
    assert metrics(out) == {"ping_loss_pct": 100.0} and out.series == []


# -- streaming: MOS and the arrival analysis --------------------------------------------------------------
def g107_mos(r: float) -> float:
    """ITU-T G.107 Annex B: MOS from R (written out independently of the product)."""
    return 1.0 if r < 0 else 4.5 if r > 100 else 1 + 0.035 * r + r * (r - 60) * (100 - r) * 7e-6


def test_mos_known_values():
    assert mos(0) == pytest.approx(4.409285824, abs=1e-9)  # R = 93.2: the familiar 4.41
    assert mos(-3) == mos(0)  # negative loss is clipped
    # 10 % loss, Bpl 10: Ie_eff = 95 * 10 / 20 = 47.5, R = 45.7
    assert mos(10) == pytest.approx(g107_mos(45.7), abs=1e-12)
    assert mos(10) == pytest.approx(2.3511, abs=1e-4)
    assert mos(50) == pytest.approx(g107_mos(93.2 - 95 * 50 / 60), abs=1e-12)
    # another burst ratio
    assert mos(10, bpl=5) == pytest.approx(g107_mos(93.2 - 95 * 10 / 15), abs=1e-12)
    # R <= 0: MOS 1 (the polynomial would go below 1)
    assert mos(1000) == 1.0 and mos(600) == 1.0
    # 0 < R <= 1: still G.107's polynomial (R = 0.5 at Ppl = 927 / 2.3)
    assert mos(927 / 2.3) == pytest.approx(g107_mos(0.5), abs=1e-9) and mos(927 / 2.3) < 1
    # R >= 100 (only reachable with a negative Bpl): clamped to 4.5
    assert mos(1, bpl=-12) == 4.5
    assert mos(1, bpl=-1 - 95 / 7.3) == 4.5  # R = 100.5
    assert mos(1, bpl=-20) == pytest.approx(g107_mos(93.2 + 5), abs=1e-12)  # R = 98.2: not clamped


def stream_params(**kw) -> StreamingParams:
    return StreamingParams(**{"playout_ms": 100.0, "packet_bytes": 1000, "duration_s": 1.0, **kw})


ARRIVALS = [  # [seq, send time, arrival time] in seconds
    [0, 0.000, 0.010],  # 10 ms (the base delay)
    [1, 0.010, 0.025],  # 15 ms
    [3, 0.030, 0.040],  # 10 ms
    [1, 0.010, 0.030],  # a duplicate of 1
    [5, 0.050, 0.070],  # 20 ms
    [2, 0.020, 0.140],  # 120 ms: more than base + 100 ms: late
    [4, 0.040, 0.150],  # 110 ms: exactly base + 100 ms: on time
    [3, 0.030, 0.160],  # a second duplicate (of 3)
]


def test_analyse_hand_computed():
    out = analyse(ARRIVALS, 10, stream_params(), 1.25)
    m = metrics(out)
    assert out.measure_s == 1.25
    # 6 distinct of 10 sent: 4 lost, 1 late, 5 on time; 2 duplicates
    assert m["lost_pct"] == pytest.approx(40.0) and m["late_pct"] == pytest.approx(10.0)
    assert m["on_time_pct"] == pytest.approx(50.0) and m["duplicates"] == 2
    # delays 10, 15, 10, 20, 120, 110 ms: median 17.5, p99 = 110 + 0.95 * 10
    assert m["delay_p50_ms"] == pytest.approx(17.5) and m["delay_p99_ms"] == pytest.approx(119.5)
    assert m["received_mbps"] == pytest.approx(0.048, rel=1e-12)  # 6 x 1000 bytes in 1 s
    assert m["quality_mos"] == pytest.approx(g107_mos(93.2 - 95 * 50 / 60), abs=1e-9)  # lost + late = 50 %
    # RFC 3550 jitter in arrival order (0, 1, 3, 5, 2, 4): |D| = 5, 5, 10, 100, 10 ms; J += (|D| - J) / 16
    assert m["jitter_ms"] == pytest.approx(7.53258228302002, rel=1e-9)
    assert units(out) == {
        "lost_pct": "%",
        "late_pct": "%",
        "on_time_pct": "%",
        "jitter_ms": "ms",
        "delay_p50_ms": "ms",
        "delay_p99_ms": "ms",
        "quality_mos": "MOS",
        "received_mbps": "Mbit/s",
        "duplicates": "count",
    }


def test_analyse_all_on_time_single_packet_and_more_received_than_counted():
    # one datagram: no jitter, no loss beyond the others, delay = its own delay
    out = analyse([[0, 5.0, 5.002]], 2, stream_params(playout_ms=0.0, packet_bytes=500, duration_s=2.0), 3.0)
    m = metrics(out)
    assert m["jitter_ms"] == 0.0 and m["lost_pct"] == 50.0 and m["late_pct"] == 0.0
    assert m["on_time_pct"] == 50.0 and m["delay_p50_ms"] == pytest.approx(2.0)
    assert m["received_mbps"] == pytest.approx(500 * 8 / 2.0 / 1e6) and m["duplicates"] == 0
    # the sender's count can lag the sink (a datagram in flight when the count was taken): lost is not negative
    arr = [[i, i * 0.01, i * 0.01 + 0.005] for i in range(4)]
    m = metrics(analyse(arr, 3, stream_params(), 1.0))
    assert m["lost_pct"] == 0.0 and m["quality_mos"] == pytest.approx(mos(0))
    assert m["on_time_pct"] == pytest.approx(400 / 3) and m["jitter_ms"] == pytest.approx(0.0, abs=1e-9)
    # a zero playout buffer: anything slower than the fastest datagram is late
    arr = [[0, 0.0, 0.25], [1, 0.5, 0.8125], [2, 1.0, 1.25]]  # 250, 312.5, 250 ms
    m = metrics(analyse(arr, 3, stream_params(playout_ms=0.0), 1.0))
    assert m["late_pct"] == pytest.approx(100 / 3) and m["on_time_pct"] == pytest.approx(200 / 3)
    # float sequence numbers from JSON are the same datagram as ints
    m = metrics(analyse([[0, 0.0, 0.01], [0.0, 0.0, 0.02]], 1, stream_params(), 1.0))
    assert m["duplicates"] == 1


def test_analyse_nothing_arrived():
    with pytest.raises(WorkloadError, match="^no datagram of the stream arrived$"):
        analyse([], 100, stream_params(), 1.0)


def test_streaming_label_and_expected_seconds():
    w = Streaming(StreamingParams(bitrate_mbps=12.5, transport="udp", duration_s=4, playout_ms=250))
    assert w.label() == "streaming-udp-12.5M"
    assert w.expected_seconds() == pytest.approx(4 + 0.25 + 5)
    assert Streaming(StreamingParams()).label() == "streaming-rist-25M"


# -- streaming: run() through fake hosts -----------------------------------------------------------------
def streaming_setup(tmp_path, monkeypatch, transport, sink_opts=None, which=True, write_stats=True):
    clock = FakeClock()
    monkeypatch.setattr(streaming, "time", clock)
    have = {"ristsender", "ristreceiver"} if which is True else {which}
    monkeypatch.setattr(
        streaming, "shutil", SimpleNamespace(which=lambda n: f"/usr/bin/{n}" if n in have else None)
    )
    ctx = make_ctx(tmp_path)
    ctx.server.proc_opts["stream-sink"] = sink_opts or {}

    def source(argv, kw):
        clock.advance(2.5)
        if write_stats:
            (tmp_path / "sink.json").write_text(json.dumps({"arrivals": ARRIVALS}))
        return result(json.dumps({"sent": 10}))

    ctx.client.handler = source
    return ctx, clock


PY = [sys.executable, stream_agent.__file__]


def test_streaming_run_rist(tmp_path, monkeypatch):
    ctx, clock = streaming_setup(tmp_path, monkeypatch, "rist")
    p = StreamingParams(playout_ms=100, packet_bytes=1000, duration_s=1.0, bitrate_mbps=8, rist_buffer_ms=600)
    out = Streaming(p).run(ctx)
    sink, recv = ctx.server.spawned
    (send,) = ctx.client.spawned
    assert sink.argv == [*PY, "sink", "127.0.0.1", "8310", str(1.0 + 3 + 0.1), str(tmp_path / "sink.json")]
    assert (sink.label, sink.log_path) == ("stream-sink", tmp_path / "sink.log")
    assert recv.argv == ["ristreceiver", "-p", "1", "-b", "600", "-S", "0", "-v", "4", "-i",
                         "rist://@10.9.0.2:8200", "-o", "udp://127.0.0.1:8310"]  # fmt: skip
    assert (recv.label, recv.log_path) == ("ristreceiver", tmp_path / "ristreceiver.log")
    assert send.argv == ["ristsender", "-p", "1", "-b", "600", "-S", "0", "-v", "4", "-i",
                         "udp://@127.0.0.1:8300", "-o", "rist://10.9.0.2:8200"]  # fmt: skip
    assert (send.label, send.log_path) == ("ristsender", tmp_path / "ristsender.log")
    ((argv, kw),) = ctx.client.runs
    assert argv == [*PY, "source", "127.0.0.1", "8300", "8.0", "1000", "1.0"]
    assert kw == {"timeout": 31.0}
    assert clock.sleeps == [1.0]  # the RIST handshake
    assert sink.waits == [pytest.approx(10.1)]
    assert ctx.server.stop_order == ["ristsender", "ristreceiver", "stream-sink"]
    assert sink.stopped == recv.stopped == send.stopped == 2
    assert out.measure_s == pytest.approx(2.5)
    assert metrics(out) == metrics(analyse(ARRIVALS, 10, stream_params(), 2.5))


def test_streaming_run_udp(tmp_path, monkeypatch):
    ctx, clock = streaming_setup(tmp_path, monkeypatch, "udp", which=False)  # rist tools not needed
    p = StreamingParams(transport="udp", playout_ms=100, packet_bytes=1000, duration_s=1.0)
    out = Streaming(p).run(ctx)
    (sink,) = ctx.server.spawned
    assert ctx.client.spawned == []
    assert sink.argv == [*PY, "sink", "10.9.0.2", "8310", str(1.0 + 3 + 0.1), str(tmp_path / "sink.json")]
    assert ctx.client.runs[0][0] == [*PY, "source", "10.9.0.2", "8310", "25.0", "1000", "1.0"]
    assert clock.sleeps == [0.3]
    assert ctx.server.stop_order == ["stream-sink"]
    assert metrics(out)["lost_pct"] == pytest.approx(40.0)


def test_streaming_run_needs_both_rist_tools(tmp_path, monkeypatch):
    for present, lacking in (
        (False, "ristsender"),
        ("ristsender", "ristreceiver"),
        ("ristreceiver", "ristsender"),
    ):
        ctx, _ = streaming_setup(tmp_path, monkeypatch, "rist", which=present)
        with pytest.raises(WorkloadError, match=rf"^{lacking} missing \(Debian rist-tools; scripts/setup.sh"):
            Streaming(StreamingParams()).run(ctx)
        assert ctx.server.spawned == []


def test_streaming_run_sink_that_does_not_finish(tmp_path, monkeypatch):
    ctx, _ = streaming_setup(tmp_path, monkeypatch, "udp", sink_opts={"wait_result": None, "alive": True})
    with pytest.raises(WorkloadError, match="^stream sink did not finish$"):
        Streaming(StreamingParams(transport="udp")).run(ctx)
    assert ctx.server.spawned[0].stopped == 2
    # exited already (wait None but not alive), or waited with an exit code while alive() lags: fine
    for opts in ({"wait_result": None, "alive": False}, {"wait_result": 0, "alive": True}):
        ctx, _ = streaming_setup(tmp_path, monkeypatch, "udp", sink_opts=opts)
        Streaming(StreamingParams(transport="udp")).run(ctx)


def test_streaming_run_sink_without_result(tmp_path, monkeypatch):
    ctx, _ = streaming_setup(tmp_path, monkeypatch, "udp", write_stats=False)
    (tmp_path / "sink.log").write_bytes(b"y" * 400 + b"bind: address in use \xff")  # not UTF-8 at the end
    with pytest.raises(WorkloadError) as e:
        Streaming(StreamingParams(transport="udp")).run(ctx)
    assert (
        str(e.value) == "stream sink wrote no result: " + ("y" * 400 + "bind: address in use \ufffd")[-300:]
    )


# -- streaming: source and sink processes on fake sockets and a fake clock ------------------------------------
class FakeSocketModule:
    AF_INET, SOCK_DGRAM = real_socket.AF_INET, real_socket.SOCK_DGRAM
    SOL_SOCKET, SO_SNDBUF, SO_RCVBUF = real_socket.SOL_SOCKET, real_socket.SO_SNDBUF, real_socket.SO_RCVBUF

    def __init__(self, clock: FakeClock, incoming=()):
        self.clock = clock
        self.incoming = list(incoming)  # (monotonic time it arrives, payload)
        self.sockets: list[FakeSocket] = []

    def socket(self, family, kind):
        assert (family, kind) == (self.AF_INET, self.SOCK_DGRAM)
        s = FakeSocket(self)
        self.sockets.append(s)
        return s


class FakeSocket:
    def __init__(self, mod: FakeSocketModule):
        self.mod = mod
        self.opts: dict = {}
        self.sent: list[tuple[float, bytes, tuple]] = []
        self.bound = None
        self.timeout = None
        self.refuse: set[int] = set()

    def setsockopt(self, level, opt, value):
        self.opts[(level, opt)] = value

    def sendto(self, data, addr):
        if len(self.sent) > 100_000:
            raise RuntimeError("runaway send loop")
        if len(self.sent) in self.refuse:
            self.sent.append((self.mod.clock.t, b"", addr))
            raise ConnectionRefusedError
        self.sent.append((self.mod.clock.t, bytes(data), addr))

    def bind(self, addr):
        self.bound = addr

    def settimeout(self, t):
        self.timeout = t

    def recv(self, n):
        assert n == 65535
        clock = self.mod.clock
        if self.mod.incoming and self.mod.incoming[0][0] <= clock.t + self.timeout:
            at, data = self.mod.incoming.pop(0)
            clock.t = max(clock.t, at)
            return data
        clock.advance(self.timeout)
        raise TimeoutError


def test_source_paces_datagrams(monkeypatch, capsys):
    clock = FakeClock(start=50.0)
    mod = FakeSocketModule(clock)
    monkeypatch.setattr(stream_agent, "time", clock)
    monkeypatch.setattr(stream_agent, "socket", mod)
    stream_agent.source("10.9.0.2", 8310, 2.0, 250, 0.02)  # 250 bytes at 2 Mbit/s: one per ms, 20 in 20 ms
    assert json.loads(capsys.readouterr().out) == {"sent": 20}
    (s,) = mod.sockets
    assert s.opts == {(mod.SOL_SOCKET, mod.SO_SNDBUF): 4 << 20}
    assert len(s.sent) == 20
    t0 = 50.0 + 0.01
    for k, (t, data, addr) in enumerate(s.sent):
        assert addr == ("10.9.0.2", 8310) and len(data) == 250
        seq, ts = stream_agent.HDR.unpack_from(data)
        assert seq == k and ts == pytest.approx(clock.wall0 + t)
        assert data[stream_agent.HDR.size :] == bytes(250 - stream_agent.HDR.size)
        # due at t0 + k * 1 ms; sent within one ~1 ms sleep of that (int() rounds the first one's negative
        # lead toward zero, so datagram 0 may leave up to one gap before t0: harmless, it carries its send time)
        earliest = t0 + k * 0.001 if k else t0 - 0.001
        assert earliest - 1e-9 <= t <= t0 + k * 0.001 + 0.0011
    assert all(d == 0.001 for d in clock.sleeps)


def test_source_sends_only_whole_gaps(monkeypatch, capsys):
    # one datagram per ms (250 bytes at 2 Mbit/s): 20.99999 ms hold 20 of them, not 21
    clock = FakeClock()
    monkeypatch.setattr(stream_agent, "time", clock)
    monkeypatch.setattr(stream_agent, "socket", FakeSocketModule(clock))
    stream_agent.source("10.9.0.2", 8310, 2.0, 250, 0.02099999)
    assert json.loads(capsys.readouterr().out) == {"sent": 20}


def test_source_counts_refused_datagrams_as_sent(monkeypatch, capsys):
    clock = FakeClock()
    mod = FakeSocketModule(clock)
    monkeypatch.setattr(stream_agent, "time", clock)
    orig = mod.socket

    def sock(family, kind):
        s = orig(family, kind)
        s.refuse = {1, 2}
        return s

    monkeypatch.setattr(mod, "socket", sock)
    monkeypatch.setattr(stream_agent, "socket", mod)
    stream_agent.source("127.0.0.1", 9, 8.0, 1000, 0.005)  # 1 ms per datagram: 5
    assert json.loads(capsys.readouterr().out) == {"sent": 5}
    assert [stream_agent.HDR.unpack_from(d)[0] for _, d, _ in mod.sockets[0].sent if d] == [0, 3, 4]


def test_sink_records_arrivals_until_the_stream_stops(monkeypatch, tmp_path):
    clock = FakeClock(start=10.0)
    hdr = stream_agent.HDR
    incoming = [
        (10.5, hdr.pack(0, 111.0) + bytes(100)),
        (10.6, hdr.pack(1, 222.0)),  # header only: still a datagram
        (10.7, b"short"),  # shorter than the header: ignored
        (11.9, hdr.pack(2, 333.0)),  # 1.2 s gap: less than 2 s of silence
        (20.0, hdr.pack(3, 444.0)),  # after 2 s of silence: the sink stopped already
    ]
    mod = FakeSocketModule(clock, incoming)
    monkeypatch.setattr(stream_agent, "time", clock)
    monkeypatch.setattr(stream_agent, "socket", mod)
    out = tmp_path / "sink.json"
    stream_agent.sink("127.0.0.1", 8310, 30.0, str(out))
    (s,) = mod.sockets
    assert s.bound == ("127.0.0.1", 8310) and s.timeout == 0.2
    assert s.opts == {(mod.SOL_SOCKET, mod.SO_RCVBUF): 8 << 20}
    arr = json.loads(out.read_text())["arrivals"]
    assert [a[:2] for a in arr] == [[0, 111.0], [1, 222.0], [2, 333.0]]
    assert [a[2] for a in arr] == pytest.approx([clock.wall0 + 10.5, clock.wall0 + 10.6, clock.wall0 + 11.9])
    # stopped at the first 0.2 s receive timeout after more than 2 s without a datagram (not at exactly
    # 2 s), long before the 30 s limit
    assert clock.t == pytest.approx(11.9 + 2.2)


def test_sink_waits_for_a_late_start_and_obeys_its_limit(monkeypatch, tmp_path):
    clock = FakeClock(start=0.0)
    hdr = stream_agent.HDR
    # nothing for 5 s (RIST still connecting): the sink keeps waiting; then datagrams until its 6 s limit
    # (the one received at exactly 6 s ends the loop)
    incoming = [
        (5.0, hdr.pack(0, 1.0)),
        (5.5, hdr.pack(1, 2.0)),
        (6.0, hdr.pack(2, 3.0)),
        (6.05, hdr.pack(3, 4.0)),
    ]
    mod = FakeSocketModule(clock, incoming)
    monkeypatch.setattr(stream_agent, "time", clock)
    monkeypatch.setattr(stream_agent, "socket", mod)
    out = tmp_path / "s.json"
    stream_agent.sink("0.0.0.0", 1, 6.0, str(out))
    arr = json.loads(out.read_text())["arrivals"]
    assert [a[0] for a in arr] == [0, 1, 2]
    assert clock.t == 6.0
    # nothing at all: an empty list after the limit
    clock = FakeClock(start=0.0)
    mod = FakeSocketModule(clock)
    monkeypatch.setattr(stream_agent, "time", clock)
    monkeypatch.setattr(stream_agent, "socket", mod)
    stream_agent.sink("0.0.0.0", 1, 3.0, str(out))
    assert json.loads(out.read_text()) == {"arrivals": []} and 3.0 <= clock.t < 3.3
