"""A stateful firewall on every lab host: Nebula's benchmark blog measured that one conntrack rule on the
hosts costs about 10% of a VPN's throughput, and real deployments run one. `[hosts] firewall = "stateful"`
installs this nftables table in every host namespace before any VPN starts: input, output and forward
accept established/related connections, drop invalid ones and accept (and count) new ones, so every packet
of the host, underlay and tunnel alike, goes through connection tracking. Its counters are the proof that
it did (tests/lab/test_host_firewall.py); the rules are recorded with the run."""

from __future__ import annotations

import json
from collections.abc import Sequence

from tunnelbench.lab.host import Host

FIREWALLS = ("none", "stateful")


def rules(table: str) -> str:
    chains = "\n".join(
        f"""  chain {hook} {{
    type filter hook {hook} priority 0; policy accept;
    ct state established,related counter name established accept
    ct state invalid counter name invalid drop
    ct state new counter name new accept
  }}"""
        for hook in ("input", "output", "forward")
    )
    return f"table inet {table} {{\n  counter established {{ }}\n  counter invalid {{ }}\n  counter new {{ }}\n{chains}\n}}\n"


def install(hosts: Sequence[Host], table: str) -> None:
    text = rules(table)
    for h in hosts:
        h.run(["nft", "-f", "-"], input=text)


def counters(host: Host, table: str) -> dict[str, int]:
    """Packets per counter (established, invalid, new) of one host's table."""
    out = json.loads(host.run(["nft", "-j", "list", "table", "inet", table]).stdout)["nftables"]
    return {x["counter"]["name"]: int(x["counter"]["packets"]) for x in out if "counter" in x}
