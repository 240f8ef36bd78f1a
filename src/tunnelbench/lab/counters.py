"""Kernel drop counters per case: where did a lost datagram die? Sampled on each host before and after a
case; the runner stores the deltas as per-host metrics (`kern_<counter>`, unit "count").

Per host (per network namespace in the embedded lab, per machine over SSH), one command per sample:
  udp_in_errors, udp_rcvbuf_errors, udp_sndbuf_errors, udp_no_ports
      the `Udp:` lines of /proc/net/snmp plus the `Udp6*` ones of /proc/net/snmp6, summed (a datagram counts
      in one of the two). RcvbufErrors = a socket's receive buffer was full (the datagram was dropped on
      arrival; InErrors counts it too), SndbufErrors = a send found the socket's send buffer full. Every UDP
      socket in the namespace counts: iperf3's and a userspace VPN's own.
  if_rx_dropped, if_tx_dropped
      rx/tx `drop` summed over the interfaces of /proc/net/dev except `lo` (veth, tunnel, NIC): on the
      router, a full qdisc or an impairment's drops show here. An interface created or removed during the
      case can make the sum go down: such a delta is not recorded.
  udp_tool_drops, udp_daemon_drops
      who lost the datagrams RcvbufErrors counted, read from the `drops` column of /proc/net/udp and
      /proc/net/udp6 (one line per socket, keyed by inode): a socket open at both samples is long-lived (a
      VPN daemon's underlay socket, the lab's own daemons): its drops are udp_daemon_drops; what RcvbufErrors
      counted beyond those was dropped on sockets opened and closed within the case, the measuring tools'
      (iperf3, sockperf, ...): udp_tool_drops. A tool's socket that overflowed means the tool, not the
      tunnel, lost those datagrams: the case is instrument-bound.
Per machine:
  softnet_dropped, softnet_squeezed
      columns 2 (dropped: a CPU's backlog queue was full) and 3 (time_squeeze: NAPI ran out of budget) of
      /proc/net/softnet_stat, summed over CPUs. The file is per CPU, the same in every namespace: it is read
      once per machine, on the controller for the embedded lab (stored with host "machine") and on each SSH
      host in its own sample (stored with that host's name). It counts everything the machine did, not only
      the case.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from pathlib import Path

from tunnelbench.lab.host import CommandError, Host

SNMP, SNMP6, DEV, SOFTNET = "/proc/net/snmp", "/proc/net/snmp6", "/proc/net/dev", "/proc/net/softnet_stat"
UDP4, UDP6 = "/proc/net/udp", "/proc/net/udp6"
SOCKET = "socket:"  # a sample's per-socket drops: key SOCKET + inode (not a counter of its own)
MACHINE = "machine"  # the host label of the embedded lab's machine-wide counters (softnet)
PREFIX = "kern_"  # metric name = PREFIX + counter
UDP_FIELDS = {
    "InErrors": "udp_in_errors",
    "RcvbufErrors": "udp_rcvbuf_errors",
    "SndbufErrors": "udp_sndbuf_errors",
    "NoPorts": "udp_no_ports",
}
HOST_COUNTERS = (*UDP_FIELDS.values(), "if_rx_dropped", "if_tx_dropped", "udp_tool_drops", "udp_daemon_drops")
MACHINE_COUNTERS = ("softnet_dropped", "softnet_squeezed")


def nft_counter(router: Host, table: str, counter: str) -> int:
    """Packets a named nft counter of the lab's router table counted (the guard's drops); -1: unreadable."""
    try:
        out = router.run(["nft", "-j", "list", "counter", "inet", table, counter]).stdout
    except CommandError:
        return -1
    for item in json.loads(out)["nftables"]:
        if "counter" in item:
            return int(item["counter"]["packets"])
    return -1


def parse_snmp(text: str) -> dict[str, int]:
    """The UDP counters of /proc/net/snmp: a `Udp:` header line of names, then a `Udp:` line of values
    (`UdpLite:` is another protocol and ignored). {} when there is no Udp section."""
    rows = [line.split()[1:] for line in text.splitlines() if line.startswith("Udp:")]
    if len(rows) < 2:
        return {}
    values = dict(zip(rows[0], rows[1], strict=False))
    return {key: int(values[name]) for name, key in UDP_FIELDS.items() if name in values}


def parse_snmp6(text: str) -> dict[str, int]:
    """The UDP counters of /proc/net/snmp6 (`Udp6RcvbufErrors   12` lines; `UdpLite6*` ignored)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].startswith("Udp6"):
            key = UDP_FIELDS.get(parts[0].removeprefix("Udp6"))
            if key:
                out[key] = int(parts[1])
    return out


def parse_udp_sockets(text: str) -> dict[str, int]:
    """Per UDP socket of /proc/net/udp or udp6 (a header line, then `sl local rem st tx:rx tr:when retrnsmt uid
    timeout inode ref pointer drops`): {SOCKET + inode: drops}, and SOCKET + "table": 0 when the table was
    read at all. Sockets with inode 0 (orphaned) are skipped."""
    out: dict[str, int] = {SOCKET + "table": 0} if "inode" in text else {}  # read, even with no socket open
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 13 or not cols[0].endswith(":") or not cols[9].isdigit() or cols[9] == "0":
            continue
        out[SOCKET + cols[9]] = out.get(SOCKET + cols[9], 0) + int(cols[-1])
    return out


def parse_dev(text: str, skip: Iterable[str] = ("lo",)) -> dict[str, int]:
    """rx and tx `drop` summed over the interfaces of /proc/net/dev (two header lines, then
    `name: rx bytes packets errs drop fifo frame compressed multicast tx bytes packets errs drop ...`)."""
    skip = set(skip)
    rx = tx = 0
    seen = False
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep or "|" in line:
            continue
        cols = rest.split()
        if len(cols) < 16 or name.strip() in skip:
            continue
        rx += int(cols[3])
        tx += int(cols[11])
        seen = True
    return {"if_rx_dropped": rx, "if_tx_dropped": tx} if seen or "|" in text else {}


def parse_softnet(text: str) -> dict[str, int]:
    """/proc/net/softnet_stat: one line per CPU of hex columns; column 2 = dropped, column 3 = time_squeeze."""
    dropped = squeezed = 0
    seen = False
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 3:
            continue
        dropped += int(cols[1], 16)
        squeezed += int(cols[2], 16)
        seen = True
    return {"softnet_dropped": dropped, "softnet_squeezed": squeezed} if seen else {}


def split_grep(text: str, files: Iterable[str]) -> dict[str, str]:
    """The output of `grep -H '' FILE...` (every line prefixed with `FILE:`) back into one text per file."""
    out: dict[str, list[str]] = {f: [] for f in files}  # "/proc/net/snmp:" is no prefix of "/proc/net/snmp6:"
    for line in text.splitlines():
        for f in files:
            if line.startswith(f + ":"):
                out[f].append(line[len(f) + 1 :])
                break
    return {f: "\n".join(lines) for f, lines in out.items()}


def parse_all(texts: dict[str, str]) -> dict[str, int]:
    """One host's counters from its files' texts; UDP v4 and v6 summed. Raises ValueError without a Udp
    section in /proc/net/snmp (the sample failed)."""
    udp = parse_snmp(texts.get(SNMP, ""))
    if not udp:
        raise ValueError(f"no Udp counters in {SNMP}")
    for key, n in parse_snmp6(texts.get(SNMP6, "")).items():
        udp[key] = udp.get(key, 0) + n
    socks = {**parse_udp_sockets(texts.get(UDP4, "")), **parse_udp_sockets(texts.get(UDP6, ""))}
    return {**udp, **parse_dev(texts.get(DEV, "")), **parse_softnet(texts.get(SOFTNET, "")), **socks}


def read_counters(host: Host, softnet: bool = False) -> dict[str, int]:
    """One sample of a host's counters, with one command run on it (inside its namespace, or over SSH);
    `softnet`: also the machine's softnet_stat (for an SSH host: its machine). Raises when it cannot read."""
    files = [SNMP, SNMP6, DEV, UDP4, UDP6, *([SOFTNET] if softnet else [])]
    # -s: a kernel without IPv6 has no snmp6 (grep then exits 2 but prints the rest)
    res = host.run(["grep", "-Hs", "", *files], timeout=10, check=False)
    return parse_all(split_grep(res.stdout, files))


def read_local_softnet() -> dict[str, int]:
    """This machine's softnet counters (the embedded lab's hosts all live here)."""
    return parse_softnet(Path(SOFTNET).read_text())


def sample(hosts: Iterable[Host | None]) -> dict[str, dict[str, int]]:
    """Counters of each host (None entries and repeats skipped), keyed by host name, plus the machine-wide
    softnet counters: per SSH machine in that host's entry, and for local (namespace) hosts once, as
    MACHINE. A host whose sample fails is left out: the case goes on, its counters are not recorded."""
    out: dict[str, dict[str, int]] = {}
    machines: set[str] = set()
    local = False
    for h in hosts:
        if h is None or h.name in out:
            continue
        remote = bool(getattr(h, "remote", False))
        machine = str(getattr(h, "address", h.name))
        try:
            out[h.name] = read_counters(h, softnet=remote and machine not in machines)
        except Exception:  # bookkeeping: a missing file or a dead SSH session must not fail the case
            continue
        if remote:
            machines.add(machine)
        else:
            local = True
    if local:
        with contextlib.suppress(OSError, ValueError):
            out[MACHINE] = read_local_softnet()
    return out


def deltas(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> list[tuple[str, int, str, str]]:
    """(metric, after - before, "count", host) for every counter sampled both times; a counter that went
    down (an interface removed, a machine rebooted) is left out. The per-socket drops become udp_daemon_drops
    (sockets open at both samples) and udp_tool_drops (the rest of RcvbufErrors' increase)."""
    out = []
    for host, b in before.items():
        a = after.get(host, {})
        for key, v0 in b.items():
            if not key.startswith(SOCKET) and key in a and a[key] >= v0:
                out.append((PREFIX + key, a[key] - v0, "count", host))
        rcvbuf = a.get("udp_rcvbuf_errors", -1) - b.get("udp_rcvbuf_errors", 0)
        if rcvbuf < 0 or not any(k.startswith(SOCKET) for k in (*a, *b)):
            continue  # no UDP sample, or no socket table read (an old sample): no attribution
        daemon = sum(max(0, a[k] - v) for k, v in b.items() if k.startswith(SOCKET) and k in a)
        out.append((PREFIX + "udp_daemon_drops", daemon, "count", host))
        out.append((PREFIX + "udp_tool_drops", max(0, rcvbuf - daemon), "count", host))
    return out
