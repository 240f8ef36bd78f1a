"""Kernel drop counters per case (lab/counters.py): the parsers on hand-written /proc text with known counts,
sampling that never fails a case, deltas; a lab test that provokes receive-buffer drops with a plain socket
(independently of any VPN or workload) and checks the product counts them where they happened; a real run
that must store exactly the drops a test-only workload planted; and the headline finding that blames a full
socket buffer, not the path, for a loss."""

from __future__ import annotations

import io
import sqlite3
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from rich.console import Console

from tunnelbench.analysis.analyze import analyze, load_run
from tunnelbench.catalog import WORKLOADS
from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome, Sample
from tunnelbench.lab import counters
from tunnelbench.lab.counters import (
    MACHINE,
    deltas,
    parse_all,
    parse_dev,
    parse_snmp,
    parse_snmp6,
    parse_softnet,
    parse_udp_sockets,
    read_counters,
    sample,
    split_grep,
)
from tunnelbench.lab.host import Result
from tunnelbench.report.headline import build
from tunnelbench.runner.loop import Runner
from tunnelbench.scenario import parse_scenario
from tunnelbench.store import DB_NAME, Store
from tunnelbench.workloads.base import CaseContext, Params, Workload

SNMP = """\
Ip: Forwarding DefaultTTL InReceives InHdrErrors
Ip: 1 64 1000 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 5000 7 321 4000 300 11 0 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 1 99999 99999 1 99999 99999 0 0 0
"""
SNMP6 = """\
Ip6InReceives                   	120
Udp6InDatagrams                 	40
Udp6NoPorts                     	2
Udp6InErrors                    	9
Udp6OutDatagrams                	30
Udp6RcvbufErrors                	8
Udp6SndbufErrors                	1
UdpLite6RcvbufErrors            	77777
"""
DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    6386      58    0    5    0     0          0         0     6386      58    0    6    0     0       0          0
  eth0: 1000000   2000    1   13    0     0          0         0   900000    1800    0   17    0     0       0          0
   wg0:  500000    900    0    2    0     0          0         0   400000     800    0   40    0     0       0          0
"""
SOFTNET = """\
07db177f 0000000a 00000003 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
0557510c 000000ff 00000010 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001 00000001
"""


# -- parsers -------------------------------------------------------------------------------------------


def test_parse_snmp_reads_the_udp_line_by_its_header_and_ignores_udplite():
    assert parse_snmp(SNMP) == {
        "udp_in_errors": 321,
        "udp_rcvbuf_errors": 300,
        "udp_sndbuf_errors": 11,
        "udp_no_ports": 7,
    }
    # the columns are found by name, not position: an older kernel's shorter header still parses
    old = "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\nUdp: 1 2 3 4 5 6\n"
    assert parse_snmp(old) == {
        "udp_in_errors": 3,
        "udp_rcvbuf_errors": 5,
        "udp_sndbuf_errors": 6,
        "udp_no_ports": 2,
    }
    assert parse_snmp("Ip: Forwarding\nIp: 1\n") == {}


def test_parse_snmp6_reads_the_udp6_counters_only():
    assert parse_snmp6(SNMP6) == {
        "udp_in_errors": 9,
        "udp_rcvbuf_errors": 8,
        "udp_sndbuf_errors": 1,
        "udp_no_ports": 2,
    }


def test_parse_dev_sums_rx_and_tx_drop_over_the_interfaces_but_lo():
    assert parse_dev(DEV) == {"if_rx_dropped": 13 + 2, "if_tx_dropped": 17 + 40}
    assert parse_dev(DEV, skip=()) == {"if_rx_dropped": 5 + 13 + 2, "if_tx_dropped": 6 + 17 + 40}
    assert parse_dev("") == {}


def test_parse_softnet_sums_hex_columns_2_and_3_over_cpus():
    assert parse_softnet(SOFTNET) == {"softnet_dropped": 0x0A + 0xFF, "softnet_squeezed": 0x03 + 0x10}
    assert parse_softnet("") == {}


def test_split_grep_gives_each_file_its_lines_snmp6_not_mistaken_for_snmp():
    files = ["/proc/net/snmp", "/proc/net/snmp6", "/proc/net/dev"]
    text = "".join(
        f"{f}:{line}\n"
        for f, body in zip(files, (SNMP, SNMP6, DEV), strict=True)
        for line in body.splitlines()
    )
    parts = split_grep(text, files)
    assert parts["/proc/net/snmp"] == SNMP.rstrip("\n")
    assert parts["/proc/net/snmp6"] == SNMP6.rstrip("\n")
    assert parts["/proc/net/dev"] == DEV.rstrip("\n")  # its own "name:" colons stay in place


def test_parse_all_sums_udp_v4_and_v6_and_needs_the_udp_section():
    got = parse_all({counters.SNMP: SNMP, counters.SNMP6: SNMP6, counters.DEV: DEV})
    assert got == {
        "udp_in_errors": 330,
        "udp_rcvbuf_errors": 308,
        "udp_sndbuf_errors": 12,
        "udp_no_ports": 9,
        "if_rx_dropped": 15,
        "if_tx_dropped": 57,
    }
    with pytest.raises(ValueError):
        parse_all({counters.DEV: DEV})


# -- sampling and deltas (fake hosts) ------------------------------------------------------------------


class FakeHost:
    """Answers `grep -H '' FILE...` from hand-written texts; `fail`: the command cannot run."""

    def __init__(
        self,
        name: str,
        texts: dict[str, str],
        remote: bool = False,
        address: str | None = None,
        fail: bool = False,
    ):
        self.name, self.texts, self.remote, self.fail = name, texts, remote, fail
        if address:
            self.address = address
        self.calls: list[list[str]] = []

    def run(self, argv, **kw) -> Result:
        self.calls.append(list(argv))
        if self.fail:
            raise RuntimeError("ssh session died")
        files = [a for a in argv if a.startswith("/proc/")]
        out = "".join(f"{f}:{line}\n" for f in files for line in self.texts.get(f, "").splitlines())
        return Result(list(argv), 0, out, "", 0.0)


def _texts(rcvbuf: int = 300, softnet: str = SOFTNET) -> dict[str, str]:
    return {
        counters.SNMP: SNMP.replace("5000 7 321 4000 300", f"5000 7 321 4000 {rcvbuf}"),
        counters.SNMP6: SNMP6,
        counters.DEV: DEV,
        counters.SOFTNET: softnet,
    }


def test_read_counters_runs_one_command_and_reads_softnet_only_when_asked():
    h = FakeHost("h2", _texts())
    assert "softnet_dropped" not in read_counters(h)
    assert read_counters(h, softnet=True)["softnet_dropped"] == 0x0A + 0xFF
    assert len(h.calls) == 2 and h.calls[0][0] == "grep"


def test_sample_leaves_out_a_failed_host_and_never_raises():
    ok, dead, empty = FakeHost("h1", _texts()), FakeHost("h2", {}, fail=True), FakeHost("router", {})
    got = sample([ok, dead, None, empty, ok])
    assert set(got) == {"h1", MACHINE}  # the local machine's softnet once, for the namespace hosts
    assert got["h1"]["udp_rcvbuf_errors"] == 308
    assert len(ok.calls) == 1  # a repeated host is sampled once
    assert sample([dead]) == {}  # nothing local was sampled: no machine entry either


def test_sample_reads_softnet_once_per_ssh_machine_in_that_hosts_entry():
    a = FakeHost("h1", _texts(), remote=True, address="10.0.0.1")
    b = FakeHost("h2", _texts(), remote=True, address="10.0.0.2")
    b2 = FakeHost("relay", _texts(), remote=True, address="10.0.0.2")  # the same machine as h2
    got = sample([a, b, b2])
    assert MACHINE not in got
    assert "softnet_dropped" in got["h1"] and "softnet_dropped" in got["h2"]
    assert "softnet_dropped" not in got["relay"]


def test_deltas_per_host_metric_names_and_a_counter_that_went_down_is_left_out():
    before = {
        "h2": {"udp_rcvbuf_errors": 10, "if_tx_dropped": 50},
        "router": {"if_tx_dropped": 5},
        MACHINE: {"softnet_dropped": 3},
    }
    after = {"h2": {"udp_rcvbuf_errors": 910, "if_tx_dropped": 40}, MACHINE: {"softnet_dropped": 3}}
    assert sorted(deltas(before, after)) == [
        ("kern_softnet_dropped", 0, "count", MACHINE),
        ("kern_udp_rcvbuf_errors", 900, "count", "h2"),
    ]  # h2's interface drops went down (an interface went away); the router's second sample failed


# /proc/net/udp as the kernel prints it (6.x): a header, then one line per socket; inode is column 10, drops last
UDP4 = """\
   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  233: 0100000A:CA6C 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 41001 2 0000000000000000 {wg}
  801: 0200000A:1451 00000000:0000 07 00000000:00034000 00:00000000 00000000     0        0 {tool_inode} 2 0000000000000000 {tool}
  900: 00000000:0044 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 0 1 0000000000000000 99
"""
UDP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  101: 00000000000000000000000000000000:0BB8 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 41002 2 0000000000000000 {ygg}
"""


def _udp_texts(rcvbuf: int, wg: int, ygg: int, tool: int | None, tool_inode: int = 52000) -> dict[str, str]:
    t = _texts(rcvbuf)
    lines = UDP4.format(wg=wg, tool=tool or 0, tool_inode=tool_inode).splitlines()
    t[counters.UDP4] = "\n".join(x for x in lines if tool is not None or str(tool_inode) not in x)
    t[counters.UDP6] = UDP6.format(ygg=ygg)
    return t


def test_parse_udp_sockets_keys_drops_by_inode_and_skips_the_header_and_orphans():
    got = parse_udp_sockets(UDP4.format(wg=7, tool=3, tool_inode=52000))
    assert got == {"socket:table": 0, "socket:41001": 7, "socket:52000": 3}  # inode 0 (orphaned) left out
    assert parse_udp_sockets("") == {}  # not read: no attribution


def test_drops_are_split_between_long_lived_sockets_and_the_measuring_tools():
    """RcvbufErrors went up by 500 on h2 (v4 + v6 summed: 300 -> 800 in snmp, snmp6's 8 unchanged). The VPN's
    v4 socket dropped 40 and its v6 one 60 over the case (open at both samples): 100 are the daemons'. The
    tool's socket opened after the first sample: the other 400 are the tool's."""
    before = sample([FakeHost("h2", _udp_texts(300, wg=10, ygg=5, tool=None))])
    after = sample([FakeHost("h2", _udp_texts(800, wg=50, ygg=65, tool=None))])
    d = {(n, h): v for n, v, _, h in deltas(before, after)}
    assert d[("kern_udp_rcvbuf_errors", "h2")] == 500
    assert d[("kern_udp_daemon_drops", "h2")] == 100
    assert d[("kern_udp_tool_drops", "h2")] == 400
    assert not any(n.startswith("kern_socket") for n, _ in d)  # per-socket values are no metrics
    # the same tool socket open at both samples is long-lived: its 400 count as a daemon's
    before = sample([FakeHost("h2", _udp_texts(300, wg=10, ygg=5, tool=0))])
    after = sample([FakeHost("h2", _udp_texts(800, wg=50, ygg=65, tool=400))])
    d = {(n, h): v for n, v, _, h in deltas(before, after)}
    assert (d[("kern_udp_daemon_drops", "h2")], d[("kern_udp_tool_drops", "h2")]) == (500, 0)
    # a sample without the socket tables (an older run's) attributes nothing
    assert not [
        x
        for x in deltas({"h2": {"udp_rcvbuf_errors": 1}}, {"h2": {"udp_rcvbuf_errors": 9}})
        if "tool" in x[0]
    ]


# -- the lab: provoke receive-buffer drops with a plain socket -----------------------------------------

RECEIVER = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
s.bind(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
sys.stdin.readline()  # not reading the socket until told: its tiny buffer fills, the rest is dropped
s.setblocking(False)
n = 0
while True:
    try:
        s.recv(65535)
    except BlockingIOError:
        break
    n += 1
print(n, flush=True)
"""
SENDER = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[3])):
    s.sendto(b"x" * 200, (sys.argv[1], int(sys.argv[2])))
    if i % 50 == 49:
        time.sleep(0.005)  # paced: the path (veth backlog, router) must not be what drops
"""


@pytest.mark.lab
@pytest.mark.parametrize("opened", ["before", "within"])
def test_receive_buffer_drops_are_counted_on_the_receiver_only(lab_factory, opened):
    """`opened` before the first sample, the receiver is a long-lived socket (a VPN daemon's): its drops are
    udp_daemon_drops; opened within the case (after it), it is a tool's: udp_tool_drops."""
    lab = lab_factory(2)
    h1, h2 = lab.hosts
    n, port = 400, 45123
    if opened == "within":
        before = sample([h1, h2, lab.router])
    rx = subprocess.Popen(
        h2.argv([sys.executable, "-c", RECEIVER, str(port)]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rx.stdout is not None and rx.stdin is not None
        assert rx.stdout.readline().strip() == "ready"
        if opened == "before":
            before = sample([h1, h2, lab.router])
        h1.run([sys.executable, "-c", SENDER, h2.underlay_ip, str(port), str(n)])
        time.sleep(0.3)  # the last datagrams land
        if opened == "before":
            after = sample([h1, h2, lab.router])
        out, _ = rx.communicate("go\n", timeout=20)
        if opened == "within":  # the receiver's socket is closed now, as a finished tool's
            after = sample([h1, h2, lab.router])
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    received = int(out.split()[-1])
    d = {(name, host): v for name, v, _, host in deltas(before, after)}
    assert 0 < received < n / 4  # the tiny buffer held a few datagrams, most were dropped
    # every datagram the receiver did not get was dropped by its full buffer, counted on h2
    rcvbuf = d[("kern_udp_rcvbuf_errors", "h2")]
    assert n - received - 5 <= rcvbuf <= n - received, (n, received, rcvbuf)
    assert d[("kern_udp_in_errors", "h2")] >= rcvbuf  # InErrors counts buffer drops too
    # who dropped them: the socket's own drops column, by whether it was open at the first sample
    if opened == "before":
        assert d[("kern_udp_daemon_drops", "h2")] == rcvbuf and d[("kern_udp_tool_drops", "h2")] == 0
    else:
        assert d[("kern_udp_tool_drops", "h2")] == rcvbuf and d[("kern_udp_daemon_drops", "h2")] == 0
    # the sender's namespace saw none of it, and the path dropped nothing
    for name in ("kern_udp_rcvbuf_errors", "kern_udp_sndbuf_errors", "kern_udp_in_errors"):
        assert d[(name, "h1")] == 0
    assert d[("kern_if_tx_dropped", "router")] == 0 and d[("kern_if_rx_dropped", "h2")] == 0
    assert ("kern_softnet_dropped", MACHINE) in d


# -- the headline finding ------------------------------------------------------------------------------

RUN = "20260101-000000-tbkern"


def make_store(root: Path, groups: dict[tuple[str, str, str], tuple[float | None, dict[str, Any]]]) -> Path:
    """One run: per (vpn, workload, label) 3 ok repetitions, each with `lost` udp_lost_packets (None: no loss
    metric) and the given per-host kernel counter deltas {"metric@host": value, or one per repetition (None:
    not sampled)}."""
    run_dir = root / RUN
    run_dir.mkdir(parents=True)
    st = Store(run_dir / DB_NAME)
    st.begin_run(RUN, "tbkern", 'name = "hand-made"\n', "0.1.0")
    for vpn in dict.fromkeys(k[0] for k in groups):
        st.set_vpn(RUN, vpn, "1.0", "ok")
    for (vpn, wl, label), (lost, kern) in groups.items():
        for rep in range(1, 4):
            adir = run_dir / "cases" / vpn / label / f"r{rep}"
            adir.mkdir(parents=True)
            cid = st.start_case(RUN, vpn, "baseline", wl, label, {}, rep, 0, "h1", "h2", adir)
            samples = [Sample("goodput_mbps", 100.0 + rep, "Mbit/s")]
            if lost is not None:
                samples.append(Sample("udp_lost_packets", lost, "count"))
            for key, v in kern.items():
                name, host = key.split("@")
                v = v[rep - 1] if isinstance(v, list) else v
                if v is not None:
                    samples.append(Sample(name, v, "count", host))
            st.finish_case(cid, "ok", Outcome(samples=samples))
    st.end_run(RUN, "ok")
    st.close()
    return run_dir


def _findings(run_dir: Path) -> list[str]:
    return [t for t, _ in build(analyze([load_run(run_dir)])).findings]


def test_headline_blames_a_full_socket_buffer_only_when_it_explains_the_loss(tmp_path):
    run_dir = make_store(
        tmp_path,
        {
            # 910 of 1000 lost per case on h2's full receive buffer: the socket, not the path
            ("wireguard-go", "udp", "udp-unlimited"): (
                1000,
                {
                    "kern_udp_rcvbuf_errors@h2": 910,
                    "kern_udp_rcvbuf_errors@h1": 0,
                    "kern_udp_sndbuf_errors@h1": 0,
                    "kern_if_tx_dropped@router": 90,
                },
            ),
            # 100 of 1000: the path lost most of it, no line
            ("internal", "udp", "udp-unlimited"): (1000, {"kern_udp_rcvbuf_errors@h2": 100}),
            # drops on the router do not count: it is the path
            ("internal", "udp", "udp-100M"): (
                50,
                {
                    "kern_udp_rcvbuf_errors@router": 50,
                    "kern_if_tx_dropped@router": 50,
                    "kern_udp_rcvbuf_errors@h2": 0,
                },
            ),
            # a TCP case has no loss count: any socket-buffer drops are worth a line (interface drops alone are not)
            ("wireguard-go", "tcp", "tcp"): (
                None,
                {"kern_udp_rcvbuf_errors@h2": 40, "kern_if_tx_dropped@h1": 7},
            ),
            ("internal", "tcp", "tcp"): (None, {"kern_udp_rcvbuf_errors@h2": 0, "kern_if_tx_dropped@h1": 70}),
            # loss, but no counters sampled (an older run): nothing can be said
            ("wireguard-go", "udp", "udp-100M"): (500, {}),
        },
    )
    found = [t for t in _findings(run_dir) if "dropped" in t]
    assert found == [
        "wireguard-go udp-unlimited @ baseline: 91% of the 3,000 lost datagrams were dropped by a full UDP "
        "socket buffer on h2 (RcvbufErrors 2,730 on h2), not by the path",
        "full UDP socket buffers dropped datagrams in workloads without a loss count (a VPN's own socket under "
        "TCP load: retransmissions, not loss): wireguard-go tcp @ baseline 120 (RcvbufErrors 120 on h2)",
    ]


def test_headline_counts_sender_sndbuf_errors_and_the_threshold_is_half(tmp_path):
    run_dir = make_store(
        tmp_path,
        {
            ("a", "udp", "udp-unlimited"): (
                1000,
                {"kern_udp_sndbuf_errors@h1": 300, "kern_udp_rcvbuf_errors@h2": 200},
            ),
            ("b", "udp", "udp-unlimited"): (
                1000,
                {"kern_udp_sndbuf_errors@h1": 249, "kern_udp_rcvbuf_errors@h2": 250},
            ),
        },
    )
    found = [t for t in _findings(run_dir) if "dropped" in t]
    assert found == [
        "a udp-unlimited @ baseline: 50% of the 3,000 lost datagrams were dropped by a full UDP socket buffer "
        "on h1, h2 (SndbufErrors 900 on h1, RcvbufErrors 600 on h2), not by the path"
    ]


def test_headline_splits_host_drops_into_interface_queues_and_socket_buffers(tmp_path):
    # the shape of a real wireguard-go -b 0 case: the sender's tun queue overflows, the receiver's socket too
    run_dir = make_store(
        tmp_path,
        {
            ("wireguard-go", "udp", "udp-unlimited"): (
                258366,
                {"kern_if_tx_dropped@h1": 244311, "kern_udp_rcvbuf_errors@h2": 14538},
            ),
            # interface drops explain less than half: no line
            ("tinc", "udp", "udp-unlimited"): (
                1000,
                {"kern_if_tx_dropped@h1": 300, "kern_if_rx_dropped@h2": 199},
            ),
        },
    )
    found = [t for t in _findings(run_dir) if "dropped" in t]
    assert found == [
        "wireguard-go udp-unlimited @ baseline: 100% of the 775,098 lost datagrams were dropped on the hosts, "
        "not by the path: full interface queues on h1 (tx_dropped 732,933 on h1); a full UDP "
        "socket buffer on h2 (RcvbufErrors 43,614 on h2)"
    ]


# -- the runner stores them: one small real run --------------------------------------------------------


class OverflowParams(Params):
    datagrams: int = Field(400, ge=0, le=100_000)  # sent to a receiver whose tiny buffer holds a few
    closed: int = Field(25, ge=0, le=100_000)  # sent to a port nothing listens on


class Overflow(Workload):
    """Plants known counts within its case: `datagrams` sent from the client to a tiny-buffer receiver the
    workload opens on the server (RECEIVER: those it did not read were dropped by its full buffer) and
    `closed` datagrams to a port with no socket there (each one a NoPorts). Records what the receiver read."""

    name = "tbtest-overflow"
    summary = "test-only workload: known UDP drops on the server"
    Params = OverflowParams
    metrics = (MetricSpec("tbtest_received", "count", "none", "datagrams the tiny-buffer receiver read"),)

    def expected_seconds(self) -> float:
        return 2.0

    def run(self, ctx: CaseContext) -> Outcome:
        p, port = self.params, 45124
        rx = subprocess.Popen(
            ctx.server.argv([sys.executable, "-c", RECEIVER, str(port)]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
            ctx.client.run([sys.executable, "-c", SENDER, ctx.server_ip, str(port), str(p.datagrams)])
            ctx.client.run([sys.executable, "-c", SENDER, ctx.server_ip, str(port + 1), str(p.closed)])
            time.sleep(0.3)  # the last datagrams land
            got, _ = rx.communicate("go\n", timeout=20)
        finally:
            if rx.poll() is None:
                rx.kill()
                rx.wait()
        out = Outcome(measure_s=0.5)
        out.add("tbtest_received", int(got.split()[-1]))
        return out


RUN_SCENARIO = """
name = "kern-counters"
vpns = ["internal"]
[run]
repetitions = 1
retries = 0
drift_check_s = 0
[lab]
hosts = 2
[[workloads]]
name = "udp"
bitrate = "0"
duration_s = 1
[[workloads]]
name = "tbtest-overflow"
"""


@pytest.mark.lab
@pytest.mark.slow
def test_a_real_run_stores_the_deltas_per_host_and_the_machine(tmp_path, lab_factory, monkeypatch):
    """A real run (the Runner in this process): every counter stored per host and for the machine, and in a
    case that planted known drops on h2 (Overflow), exactly those: a reader or a delta that always gave 0,
    or put them on the wrong host, fails."""
    del lab_factory  # only for its skip when the lab cannot be built
    monkeypatch.setitem(WORKLOADS, Overflow.name, Overflow)
    sc = parse_scenario(tomllib.loads(RUN_SCENARIO), "test")
    buf = io.StringIO()
    res = Runner(sc, RUN_SCENARIO, Console(file=buf, width=300), results_root=tmp_path / "r").run()
    assert res.status == "ok", buf.getvalue()[-3000:]
    con = sqlite3.connect(res.run_dir / DB_NAME)
    rows = con.execute(
        'SELECT c.workload, m.name, m.host, m.value FROM metric m JOIN "case" c ON c.id = m.case_id '
        "WHERE c.status = 'ok'"
    ).fetchall()
    con.close()
    by: dict[str, dict[tuple[str, str | None], float]] = {}
    for wl, name, host, v in rows:
        by.setdefault(wl, {})[(name, host)] = v
    assert sorted(by) == ["tbtest-overflow", "udp"], sorted(by)
    for got in by.values():
        for host in ("h1", "h2", "router"):
            for counter in counters.HOST_COUNTERS:
                assert (f"kern_{counter}", host) in got, (counter, host)
        for counter in counters.MACHINE_COUNTERS:
            assert (f"kern_{counter}", MACHINE) in got
    # no VPN: every datagram h2's full receive buffer dropped was one iperf3 counted lost (give or take the
    # last ones, after the highest sequence number iperf3 saw)
    got = by["udp"]
    lost, sent = got[("udp_lost_packets", None)], got[("udp_packets", None)]
    assert got[("kern_udp_rcvbuf_errors", "h2")] <= lost + 0.01 * sent
    assert got[("kern_udp_rcvbuf_errors", "h1")] == 0
    # the planted case: what the receiver did not read was dropped by its full buffer, counted on h2 for a
    # socket opened within the case (a tool's); each datagram to the closed port is one NoPorts on h2
    got, p = by["tbtest-overflow"], OverflowParams()
    missed = p.datagrams - got[("tbtest_received", None)]
    assert missed > p.datagrams / 2, got  # the tiny buffer dropped most
    rcvbuf = got[("kern_udp_rcvbuf_errors", "h2")]
    assert missed - 5 <= rcvbuf <= missed, (missed, rcvbuf)
    assert got[("kern_udp_tool_drops", "h2")] == rcvbuf and got[("kern_udp_daemon_drops", "h2")] == 0
    assert got[("kern_udp_in_errors", "h2")] >= rcvbuf
    assert p.closed <= got[("kern_udp_no_ports", "h2")] <= p.closed + 2, got
    for name in ("kern_udp_rcvbuf_errors", "kern_udp_in_errors", "kern_udp_no_ports", "kern_udp_tool_drops"):
        assert got[(name, "h1")] == 0 and got[(name, "router")] == 0, name


def test_headline_weighs_the_loss_of_only_the_cases_whose_counters_were_sampled(tmp_path):
    # repetition 1's sample failed: its 1000 lost datagrams cannot be explained, nor blamed on the path
    run_dir = make_store(
        tmp_path, {("x", "udp", "udp-unlimited"): (1000, {"kern_udp_rcvbuf_errors@h2": [None, 900, 900]})}
    )
    found = [t for t in _findings(run_dir) if "dropped" in t]
    assert found == [
        "x udp-unlimited @ baseline: 90% of the 2,000 lost datagrams were dropped by a full UDP socket buffer "
        "on h2 (RcvbufErrors 1,800 on h2), not by the path"
    ]
