"""iputils ping's output (`ping -D`): the one parser of its echo replies and summary (the ping, resilience,
acl, leak and latency-under-load workloads and the impairment calibration read it)."""

from __future__ import annotations

import re
from typing import Any

from tunnelbench.core.results import WorkloadError

# an echo reply line of `ping -D` ("[ts] 64 bytes from ...: icmp_seq=N ttl=64 time=0.05 ms"), never an ICMP
# error ping prints with a timestamp too ("From 10.77.0.2 icmp_seq=N Destination Host Unreachable", e.g. a TAP
# VPN whose peer stopped answering ARP). The one parser of ping's replies (ping and resilience use it).
REPLY = re.compile(r"^\[(?P<ts>[\d.]+)\] \d+ bytes from .*icmp_seq=(?P<seq>\d+) .*time=(?P<rtt>[\d.]+) ms")
SUMMARY = re.compile(r"(?P<tx>\d+) packets transmitted, (?P<rx>\d+) (packets )?received")
RTT_LINE = re.compile(r"= (?P<min>[\d.]+)/(?P<avg>[\d.]+)/(?P<max>[\d.]+)/(?P<mdev>[\d.]+) ms")


def echo_replies(text: str) -> list[tuple[float, int, float]]:
    """(timestamp, icmp_seq, RTT ms) of every echo reply in `ping -D` output, in output order; lines ping
    marks (DUP!) and ICMP errors skipped. A seq may repeat (unmarked duplicates, or wrapped past 65535)."""
    return [
        (float(m["ts"]), int(m["seq"]), float(m["rtt"]))
        for line in text.splitlines()
        if (m := REPLY.match(line)) and "DUP!" not in line
    ]


def parse_ping(text: str) -> dict[str, Any]:
    """Parse `ping -D` output: per-reply RTTs (first reply per seq; duplicates ignored) and the summary."""
    rtts: dict[int, tuple[float, float]] = {}
    for ts, seq, rtt in echo_replies(text):
        rtts.setdefault(seq, (ts, rtt))
    s = SUMMARY.search(text)
    if not s:
        raise WorkloadError("ping printed no summary line")
    tx, rx = int(s["tx"]), int(s["rx"])
    return {"transmitted": tx, "received": rx, "replies": rtts, "summary": RTT_LINE.search(text)}
