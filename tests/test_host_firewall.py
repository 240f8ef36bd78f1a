"""The hosts' stateful firewall (issue 15 item 5, Nebula's benchmark blog's conntrack cost): the rule set really puts every
packet through connection tracking (its counters against the echo requests this test sends and a TCP
connection it opens), a run records it, and it is refused where it cannot be applied."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest
from conftest import lab_missing, tb

from tunnelbench.lab import hostfw
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


def test_the_firewall_is_refused_over_ssh_and_unknown_kinds_are_named():
    base = {"workloads": [{"name": "ping"}]}
    with pytest.raises(ScenarioError, match="hosts.firewall: needs the namespace lab"):
        parse_scenario(
            {**base, "hosts": {"firewall": "stateful"}, "lab": {"backend": "ssh", "inventory": "x.yml"}}, "t"
        )
    with pytest.raises(ScenarioError, match="firewall"):
        parse_scenario({**base, "hosts": {"firewall": "stateless"}}, "t")


@pytest.mark.lab
def test_a_run_records_the_rules_it_installed(tmp_path):
    why = lab_missing()
    if why:
        pytest.skip(why)
    scen = tmp_path / "s.toml"
    scen.write_text(
        'name = "fw"\nvpns = ["internal"]\n[run]\nrepetitions = 1\ndrift_check_s = 0\n'
        '[lab]\nhosts = 2\n[hosts]\nfirewall = "stateful"\n[[workloads]]\nname = "ping"\ncount = 5\n'
        "interval_s = 0.05\n"
    )
    env = {"TUNNELBENCH_REGISTRY": str(tmp_path / "registry")}
    res = tb("run", str(scen), "--results", str(tmp_path / "r"), "--no-html", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    (run_dir,) = (tmp_path / "r").iterdir()
    rows = dict(sqlite3.connect(run_dir / "results.sqlite").execute("SELECT key, value FROM environment"))
    assert rows["hosts.firewall"] == "stateful"
    assert "ct state established,related counter name established accept" in rows["hosts.firewall.rules"]
