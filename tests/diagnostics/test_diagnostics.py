"""Per-case diagnostics (issue 19 item 6): the kernel log of a case, the router's bounded pcap, the CPU
profile folded for a flame graph. References the product does not compute: records the test itself writes
into the kernel log, frames counted by this file's own pcap reader against the pings it asked for, and the
daemons' CPU time as the kernel accounts it (/proc, the monitor's daemon_cpu_pct) against perf's samples."""

from __future__ import annotations

import os
import re
import sqlite3
import struct
import subprocess
import uuid
from pathlib import Path

import pytest
from conftest import lab_missing, tb
from tree import ROOT

from tunnelbench.diagnostics.cpuprofile import PERF_HZ, fold, missing_tools, name_threads, parse_folded, tool
from tunnelbench.diagnostics.kmsg import KernelLog, parse_record


def test_kmsg_record_parsed_as_the_kernel_documents_it():
    line = parse_record(b"6,1234,5000123,-;wireguard: WireGuard 1.0.0 loaded\n SUBSYSTEM=net\n")
    assert line is not None
    assert (line.level, line.t_s, line.text) == (6, 5.000123, "wireguard: WireGuard 1.0.0 loaded")
    assert str(line) == "[    5.000123] <6> wireguard: WireGuard 1.0.0 loaded"
    assert parse_record(b"12,7,99,c;x").level == 4  # facility 1 (user), level 4: the low three bits
    assert parse_record(b"no header here") is None
    assert parse_record(b"a,b,c;text") is None


def test_folded_stacks_parsed_and_summed():
    stacks = parse_folded("a;b;c 3\na;b 2\nbroken line\na;b;c 4\n", "h1")
    assert stacks == {"h1;a;b;c": 7, "h1;a;b": 2}


# `perf script -F comm,pid,tid,time,event,ip,sym,dso` as perf 6.1 prints it: a daemon thread perf saw no
# FORK/COMM record for is named `:<tid>`; another process's thread keeps its own comm
PERF_SCRIPT = """\
wireguard-go  3000/3001  100.000001:    cpu-clock:ppp:
\t    4a1b2c runtime.futex (/usr/bin/wireguard-go)

:3033  3000/3033  100.003345:    cpu-clock:ppp:
\t    4b0000 golang.org/x/crypto/chacha20poly1305.chacha20Poly1305Seal.abi0 (/usr/bin/wireguard-go)

:3034  3000/3034  100.006690:    cpu-clock:ppp:
\t    4b0000 golang.org/x/crypto/chacha20poly1305.chacha20Poly1305Seal.abi0 (/usr/bin/wireguard-go)

kworker/0:1 H  42/42  100.010035:    cpu-clock:ppp:
\t ffffffff81000000 worker_thread ([kernel.kallsyms])

"""


def test_a_daemon_thread_perf_could_not_name_is_counted_as_the_daemon():
    named = name_threads(PERF_SCRIPT, {3000: "wireguard-go"})
    heads = [re.match(r"(.*?)\s+\d+/(\d+)", ln).groups() for ln in named.splitlines() if ln[:1].strip()]
    assert heads == [
        ("wireguard-go", "3001"),
        ("wireguard-go", "3033"),
        ("wireguard-go", "3034"),
        ("kworker/0:1 H", "42"),
    ]
    assert name_threads(PERF_SCRIPT, {}) == PERF_SCRIPT
    if tool("inferno-collapse-perf") is None:
        pytest.skip("inferno is built by scripts/setup.sh")
    stacks = fold(named, "h1")
    # all three samples of pid 3000 under the daemon's name; the kernel worker apart
    assert sum(n for s, n in stacks.items() if s.startswith("h1;wireguard-go;")) == 3
    assert stacks["h1;wireguard-go;golang.org/x/crypto/chacha20poly1305.chacha20Poly1305Seal.abi0"] == 2
    assert not [s for s in stacks if s.startswith("h1;:")]


@pytest.mark.lab
def test_kernel_log_holds_exactly_the_lines_written_during_the_case():
    if os.geteuid() != 0:
        pytest.skip("needs root to write to /dev/kmsg")
    before, during, after = (
        f"tunnelbench-test {w} {uuid.uuid4().hex}" for w in ("before", "during", "after")
    )
    Path("/dev/kmsg").write_text(before + "\n")
    k = KernelLog()
    k.start()
    Path("/dev/kmsg").write_text(during + "\n")
    lines = k.read()
    Path("/dev/kmsg").write_text(after + "\n")
    texts = [x.text for x in lines]
    assert during in texts
    assert before not in texts and after not in texts
    assert k.fd is None  # closed: nothing left open after the case


def _pcap_records(data: bytes) -> int:
    """How many frames a pcap file holds, whatever their type."""
    order = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    n, off = 0, 24
    while off + 16 <= len(data):
        off += 16 + struct.unpack_from(order + "I", data, off + 8)[0]
        n += 1
    return n


def _pcap_ip_frames(data: bytes) -> list[tuple[int, str, str, int | None]]:
    """(IP protocol, source, destination, ICMP type) of every IPv4 frame of a Linux cooked capture (-i any)."""
    magic = data[:4]
    order = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    linktype = struct.unpack_from(order + "I", data, 20)[0]
    hdr, proto_at = {276: (20, 0), 113: (16, 14)}[linktype]  # LINUX_SLL2, LINUX_SLL
    out, off = [], 24
    while off + 16 <= len(data):
        incl = struct.unpack_from(order + "I", data, off + 8)[0]
        frame = data[off + 16 : off + 16 + incl]
        off += 16 + incl
        if frame[proto_at : proto_at + 2] != b"\x08\x00":
            continue
        ip = frame[hdr:]
        ihl = (ip[0] & 0x0F) * 4
        icmp = ip[ihl] if ip[9] == 1 and len(ip) > ihl else None
        out.append((ip[9], ".".join(map(str, ip[12:16])), ".".join(map(str, ip[16:20])), icmp))
    return out


SCENARIO = """
name = "diagnostics"
vpns = ["internal", "wireguard-go"]
[run]
repetitions = 1
retries = 0
drift_check_s = 0
capture = "{capture}"
[lab]
hosts = 2
[[workloads]]
name = "tcp"
duration_s = 3
omit_s = 0
[[workloads]]
name = "ping"
count = 25
interval_s = 0.02
"""


def _run(tmp_path: Path, *args: str, capture: str = "on-failure") -> tuple[Path, subprocess.CompletedProcess]:
    scen = tmp_path / "s.toml"
    scen.write_text(SCENARIO.format(capture=capture))
    env = {"TUNNELBENCH_REGISTRY": str(tmp_path / "registry")}
    res = tb("run", str(scen), "--results", str(tmp_path / "r"), *args, timeout=600, columns=120, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    (run_dir,) = (tmp_path / "r").iterdir()
    return run_dir, res


@pytest.mark.lab
@pytest.mark.long  # 23 s, run --flamegraph / --capture always (opt-in); the folding and the kernel log: above
def test_flamegraph_samples_match_the_daemons_cpu_time_and_the_pcap_holds_every_ping(tmp_path):
    why = lab_missing() or missing_tools()
    if why:
        pytest.skip(why)
    run_dir, _ = _run(tmp_path, "--flamegraph", "--capture", "always")
    db = sqlite3.connect(run_dir / "results.sqlite")
    cases = {
        (v, lb): (cid, Path(d), t1 - t0)
        for cid, v, lb, d, t0, t1 in db.execute(
            "SELECT id, vpn, label, artifact_dir, started, ended FROM \"case\" WHERE status = 'ok'"
        )
    }
    assert len(cases) == 4, cases

    # perf's samples of each wireguard-go daemon against the CPU time the kernel accounted to it in the case
    cid, adir, _ = cases[("wireguard-go", "tcp")]
    stacks = parse_folded((adir / "cpu-profile.folded").read_text())
    for host in ("h1", "h2"):
        samples = sum(n for s, n in stacks.items() if s.startswith(f"{host};wireguard-go;"))
        (pct,) = db.execute(
            "SELECT value FROM metric WHERE case_id = ? AND name = 'daemon_cpu_pct' AND host = ?", (cid, host)
        ).fetchone()
        # the monitor's window: its last sample's time plus at most one sampling interval (0.5 s)
        (last_t,) = db.execute(
            "SELECT max(t) FROM series WHERE case_id = ? AND name = 'daemon_cpu_pct' AND host = ?",
            (cid, host),
        ).fetchone()
        cpu_s = pct / 100 * (last_t + 0.25)
        assert cpu_s > 0.1, (host, pct, last_t)  # TCP through the tunnel keeps the daemon busy
        assert 0.5 * cpu_s < samples / PERF_HZ < 1.5 * cpu_s, (host, samples, cpu_s)
    assert not [s for s in stacks if s.split(";")[1] != "wireguard-go"]  # only the daemons were profiled
    # the tunnel's cipher is where a userspace WireGuard spends its time under load
    assert any("chacha20poly1305" in s for s in stacks), sorted(stacks, key=stacks.get)[-5:]

    # the report: one flame graph per VPN x workload, summed from the cases, embedded
    fg = run_dir / "flamegraphs"
    svg = (fg / "wireguard-go.baseline.tcp.svg").read_text()
    assert "<svg" in svg and "chacha20poly1305" in svg
    assert parse_folded((fg / "wireguard-go.baseline.tcp.folded").read_text()) == stacks  # one case: same sum
    html = (run_dir / "report.html").read_text()
    assert 'id="flamegraphs"' in html and html.count("data:image/svg+xml;base64,") >= 2
    assert "flamegraphs/wireguard-go.baseline.tcp.svg" in (run_dir / "report.md").read_text()

    # the router's pcap of the ping case on the plain path: each echo request and reply crosses it once,
    # in on the sender's veth and out on the receiver's: 4 ICMP frames per ping, nothing lost
    _, adir, _ = cases[("internal", "ping")]
    frames = _pcap_ip_frames((adir / "router.pcap").read_bytes())
    icmp = [f for f in frames if f[0] == 1]
    assert len([f for f in icmp if f[3] == 8]) == 2 * 25 and len([f for f in icmp if f[3] == 0]) == 2 * 25
    notes = (adir / "diagnostics.txt").read_text()
    assert re.search(r"router\.pcap, \d+ packets captured", notes) and "dmesg.txt" in notes
    # a bounded capture: the TCP case's pcap stops at capture_packets
    _, adir, _ = cases[("internal", "tcp")]
    # (every frame counts: an ARP or neighbour-discovery frame may be among them)
    assert _pcap_records((adir / "router.pcap").read_bytes()) == 2000
    assert "(the bound: later packets not captured)" in (adir / "diagnostics.txt").read_text()


@pytest.mark.lab
def test_a_successful_case_keeps_no_capture_by_default(tmp_path):
    why = lab_missing()
    if why:
        pytest.skip(why)
    run_dir, _ = _run(tmp_path, "--vpn", "internal", "--no-html")
    leftovers = [
        p for p in (run_dir / "cases").rglob("*") if p.name in ("router.pcap", "router.log", "dmesg.txt")
    ]
    assert not leftovers
    assert not list((run_dir / "cases").rglob("cpu-profile.folded"))


def test_setup_builds_the_inferno_version_the_profiler_looks_for():
    from tunnelbench.diagnostics.cpuprofile import INFERNO_VERSION

    setup = (ROOT / "scripts" / "build-tools.sh").read_text()
    assert re.search(r"^INFERNO_VERSION=(\S+)$", setup, re.M).group(1) == INFERNO_VERSION
