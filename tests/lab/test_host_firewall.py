"""The hosts' stateful firewall (issue 15 item 5, Nebula's benchmark blog's conntrack cost): the rule set really puts every
packet through connection tracking (its counters against the echo requests this test sends and a TCP
connection it opens), a run installs in every host the rules it records and they see its case's packets (read
back from the kernel while the run is up), and it is refused where it cannot be applied."""

from __future__ import annotations

import io
import json
import re
import sqlite3
import subprocess
import sys
import tomllib

import pytest
from conftest import lab_missing
from rich.console import Console

from tunnelbench.catalog import WORKLOADS
from tunnelbench.lab import hostfw
from tunnelbench.runner.loop import Runner
from tunnelbench.scenario import ScenarioError, parse_scenario


@pytest.mark.lab
def test_every_packet_goes_through_conntrack(lab_factory):
    lab = lab_factory(2)
    h1, h2 = lab.hosts
    table = f"{lab.tag}hostfw"
    hostfw.install([h1, h2], table)
    c1, c2 = hostfw.counters(h1, table), hostfw.counters(h2, table)
    n = 8
    h1.run(["ping", "-n", "-q", "-c", str(n), "-i", "0.05", h2.underlay_ip])
    d1 = {k: v - c1[k] for k, v in hostfw.counters(h1, table).items()}
    d2 = {k: v - c2[k] for k, v in hostfw.counters(h2, table).items()}
    # one ICMP echo flow: its first request is new on each side, everything else established
    # (n - 1 requests and n replies); IPv6 neighbour discovery may add a few of its own
    assert d1["new"] >= 1 and d2["new"] >= 1
    assert 2 * n - 1 <= d1["established"] <= 2 * n + 4 and 2 * n - 1 <= d2["established"] <= 2 * n + 4, (
        d1,
        d2,
    )
    assert d1["invalid"] == d2["invalid"] == 0
    # a TCP segment no connection expects is invalid for conntrack, and dropped
    before = hostfw.counters(h2, table)["invalid"]
    code = (
        "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)\n"
        "import struct; hdr = struct.pack('!HHIIBBHHH', 40000, 9, 1, 1, 5 << 4, 0x10, 1024, 0, 0)\n"
        f"s.sendto(hdr, ('{h2.underlay_ip}', 0))"
    )
    subprocess.run(h1.argv([sys.executable, "-c", code]), check=True, timeout=30)
    assert hostfw.counters(h2, table)["invalid"] >= before + 1
    # the product's reader gives what this test reads from the kernel itself
    assert hostfw.counters(h2, table) == kernel_rules(h2, table)[1]


def test_the_firewall_is_refused_over_ssh_and_unknown_kinds_are_named():
    base = {"workloads": [{"name": "ping"}]}
    with pytest.raises(ScenarioError, match="hosts.firewall: needs the namespace lab"):
        parse_scenario(
            {**base, "hosts": {"firewall": "stateful"}, "lab": {"backend": "ssh", "inventory": "x.yml"}}, "t"
        )
    with pytest.raises(ScenarioError, match="firewall"):
        parse_scenario({**base, "hosts": {"firewall": "stateless"}}, "t")


def kernel_rules(host, table: str) -> tuple[set[tuple[str, str, str]], dict[str, int]]:
    """What the kernel holds in `host`'s namespace for inet `table`, read by this test with nft: the rules as
    (hook, counter, verdict) and each named counter's packets. (set(), {}) when there is no such table."""
    r = host.run(["nft", "-j", "list", "table", "inet", table], check=False)
    if r.returncode != 0:
        return set(), {}
    items = json.loads(r.stdout)["nftables"]
    hooks = {x["chain"]["name"]: x["chain"].get("hook") for x in items if "chain" in x}
    rules, packets = set(), {}
    for x in items:
        if "counter" in x:
            packets[x["counter"]["name"]] = int(x["counter"]["packets"])
        if "rule" in x:
            expr = x["rule"]["expr"]
            counter = next((e["counter"] for e in expr if "counter" in e), None)
            verdict = next((k for e in expr for k in ("accept", "drop") if k in e), None)
            rules.add((hooks[x["rule"]["chain"]], str(counter), str(verdict)))
    return rules, packets


def recorded_rules(text: str) -> set[tuple[str, str, str]]:
    """The same triples from the rule set text a run recorded."""
    out, hook = set(), None
    for line in text.splitlines():
        if m := re.search(r"type filter hook (\w+)", line):
            hook = m.group(1)
        elif m := re.search(r"counter name (\w+) (accept|drop)", line):
            out.add((str(hook), m.group(1), m.group(2)))
    return out


@pytest.mark.lab
def test_a_run_records_the_rules_it_installed(tmp_path, monkeypatch):
    """A real run (in this process) with `firewall = "stateful"`: while its ping case runs, the test reads both
    hosts' tables from the kernel. They hold the rules the run recorded, and their counters saw the case's
    echo requests and replies go through connection tracking (new, then established)."""
    why = lab_missing()
    if why:
        pytest.skip(why)
    count = 5
    toml = (
        'name = "fw"\nvpns = ["internal"]\n[run]\nrepetitions = 1\ndrift_check_s = 0\n'
        '[lab]\nhosts = 2\n[hosts]\nfirewall = "stateful"\n[[workloads]]\nname = "ping"\n'
        f"count = {count}\ninterval_s = 0.05\n"
    )
    buf = io.StringIO()
    runner = Runner(
        parse_scenario(tomllib.loads(toml), "t"),
        toml,
        Console(file=buf, width=300),
        results_root=tmp_path / "r",
    )
    table = f"{runner.tag}hostfw"
    seen: list[dict[str, tuple]] = []  # per case: host -> (rules, packets before, packets after)
    ping_run = WORKLOADS["ping"].run

    def watched(self, ctx):
        hosts = (ctx.client, ctx.server)
        before = {h.name: kernel_rules(h, table) for h in hosts}
        out = ping_run(self, ctx)
        seen.append({h.name: (*before[h.name], kernel_rules(h, table)[1]) for h in hosts})
        return out

    monkeypatch.setattr(WORKLOADS["ping"], "run", watched)
    res = runner.run()
    assert res.status == "ok", buf.getvalue()[-3000:]
    rows = dict(sqlite3.connect(res.run_dir / "results.sqlite").execute("SELECT key, value FROM environment"))
    assert rows["hosts.firewall"] == "stateful"
    recorded = recorded_rules(rows["hosts.firewall.rules"])
    assert len(recorded) == 9, recorded  # 3 hooks x (established accept, invalid drop, new accept)
    assert seen
    case = seen[-1]  # the measured attempt (one set aside as disturbed by a busy machine may come before)
    assert sorted(case) == ["h1", "h2"]
    for host, (rules, c0, c1) in case.items():
        assert rules == recorded, f"{host}: the kernel holds {rules}, the run recorded {recorded}"
        d = {k: c1[k] - c0[k] for k in c1}
        # one ICMP echo flow: its first request is new on each host, every other packet of it established
        assert d["new"] >= 1 and 2 * count - 1 <= d["established"] <= 2 * count + 4 and d["invalid"] == 0, (
            host,
            d,
        )
