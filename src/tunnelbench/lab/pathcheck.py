"""Confirmed paths (issue 19 item 2): which way did a case's underlay traffic actually go?

The router forwards every underlay packet between hosts, so nftables counters there (a forward chain at
priority 10: after the relay scenario's UDP block at -10, so dropped packets are not counted) split the bytes
the client and the server exchanged during a case into
  direct  client <-> server, and
  via     client or server <-> any other lab host (a relay, a lighthouse, a DERP server, another node
          that routes for them).
A relayed byte crosses the router twice (client -> relay, relay -> server), so the direct share is
direct / (direct + via / 2). The scenario's path is then confirmed or refuted per case: `direct` needs
>= 80% direct, `relay` <= 20%; `nat` records the share (direct after hole punching, or relayed: both are
outcomes of the traversal, not errors). Under MIN_BYTES (a ping case) the share is recorded when there is
any traffic but not judged: keepalives and control traffic to other hosts can outweigh 50 echo requests."""

from __future__ import annotations

import json
from dataclasses import dataclass

MIN_BYTES = 256 * 1024  # underlay bytes of client and server in a case below which no verdict is given
DIRECT_MIN_PCT = 80.0  # a `direct` case must send at least this share straight between client and server
RELAY_MAX_PCT = 20.0  # a `relay` case at most this share
COUNTERS = ("c_s", "s_c", "c_o", "o_c", "s_o", "o_s")


class PathError(RuntimeError):
    """The case's traffic did not take the scenario's path: it is failed, not measured under the wrong label."""


@dataclass
class PathShare:
    direct: int  # bytes client <-> server
    via: int  # bytes client/server <-> other hosts (each relayed byte counted on both legs)
    others: dict[str, int]  # "to other hosts" broken down for the message: c_o, o_c, s_o, o_s

    @property
    def total(self) -> int:
        return self.direct + self.via

    @property
    def direct_pct(self) -> float | None:
        denom = self.direct + self.via / 2
        return 100.0 * self.direct / denom if denom else None


def share(before: dict[str, int], after: dict[str, int]) -> PathShare:
    d = {k: max(0, after.get(k, 0) - before.get(k, 0)) for k in COUNTERS}
    return PathShare(d["c_s"] + d["s_c"], d["c_o"] + d["o_c"] + d["s_o"] + d["o_s"],
                     {k: d[k] for k in ("c_o", "o_c", "s_o", "o_s")})  # fmt: skip


def verdict(path: str, s: PathShare, client: str = "client", server: str = "server") -> str | None:
    """None when the case's path matches the scenario's (or there is too little traffic to say), else why."""
    pct = s.direct_pct
    if pct is None or s.total < MIN_BYTES or path == "nat":
        return None
    if path == "direct" and pct < DIRECT_MIN_PCT:
        return (f"path not direct: only {pct:.0f}% of the underlay bytes between {client} and {server} went "
                f"straight between them; {s.via} B went to or from other hosts ({client} out {s.others['c_o']}, "
                f"in {s.others['o_c']}; {server} out {s.others['s_o']}, in {s.others['o_s']}): the VPN relayed "
                f"or routed through another node")  # fmt: skip
    if path == "relay" and pct > RELAY_MAX_PCT:
        return (f"path not relayed: {pct:.0f}% of the underlay bytes between {client} and {server} went straight "
                f"between them ({s.direct} B) although the scenario's path is relay")  # fmt: skip
    return None


def rules(table: str, client_ip: str, server_ip: str) -> str:
    c, s = client_ip, server_ip
    return f"""table inet {table} {{
  counter c_s {{ }}
  counter s_c {{ }}
  counter c_o {{ }}
  counter o_c {{ }}
  counter s_o {{ }}
  counter o_s {{ }}
  chain forward {{
    type filter hook forward priority 10; policy accept;
    ip saddr {c} ip daddr {s} counter name c_s
    ip saddr {s} ip daddr {c} counter name s_c
    ip saddr {c} ip daddr != {s} counter name c_o
    ip daddr {c} ip saddr != {s} counter name o_c
    ip saddr {s} ip daddr != {c} counter name s_o
    ip daddr {s} ip saddr != {c} counter name o_s
  }}
}}
"""


def parse_counters(nft_json: str) -> dict[str, int]:
    """Bytes per counter from `nft -j list table ...`."""
    return {item["counter"]["name"]: int(item["counter"]["bytes"])
            for item in json.loads(nft_json)["nftables"] if "counter" in item}  # fmt: skip


class PathWatch:
    """The router's per-case path counters of one lab (namespace labs: the router is ours)."""

    def __init__(self, lab, client, server):
        self.router = lab.router
        self.table = f"{lab.tag}pathwatch"
        self.client, self.server = client, server
        self.router.run(["nft", "delete", "table", "inet", self.table], check=False)
        self.router.run(["nft", "-f", "-"], input=rules(self.table, client.public_ip, server.public_ip))

    def read(self) -> dict[str, int]:
        return parse_counters(self.router.run(["nft", "-j", "list", "table", "inet", self.table]).stdout)
