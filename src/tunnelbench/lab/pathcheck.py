"""Confirmed paths: which way did a case's underlay traffic actually go?

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

import contextlib
import json
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunnelbench.core.results import Outcome
    from tunnelbench.lab.base import Lab
    from tunnelbench.lab.host import Host

MIN_BYTES = 256 * 1024  # underlay bytes of client and server in a case below which no verdict is given
DIRECT_MIN_PCT = 80.0  # a `direct` case must send at least this share straight between client and server
RELAY_MAX_PCT = 20.0  # a `relay` case at most this share
COUNTERS = ("c_s", "s_c", "c_o", "o_c", "s_o", "o_s")


class PathError(RuntimeError):
    """The case's traffic did not take the scenario's path: it is failed, not measured under the wrong label."""

    outcome: Outcome  # the path metrics (the runner stores them)


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
    return PathShare(
        d["c_s"] + d["s_c"],
        d["c_o"] + d["o_c"] + d["s_o"] + d["o_s"],
        {k: d[k] for k in ("c_o", "o_c", "s_o", "o_s")},
    )


def verdict(path: str, s: PathShare, client: str = "client", server: str = "server") -> str | None:
    """None when the case's path matches the scenario's (or there is too little traffic to say), else why."""
    pct = s.direct_pct
    if pct is None or s.total < MIN_BYTES or path == "nat":
        return None
    if path == "direct" and pct < DIRECT_MIN_PCT:
        return (
            f"path not direct: only {pct:.0f}% of the underlay bytes between {client} and {server} went "
            f"straight between them; {s.via} B went to or from other hosts ({client} out {s.others['c_o']}, "
            f"in {s.others['o_c']}; {server} out {s.others['s_o']}, in {s.others['o_s']}): the VPN relayed "
            f"or routed through another node"
        )
    if path == "relay" and pct > RELAY_MAX_PCT:
        return (
            f"path not relayed: {pct:.0f}% of the underlay bytes between {client} and {server} went straight "
            f"between them ({s.direct} B) although the scenario's path is relay"
        )
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
    return {
        item["counter"]["name"]: int(item["counter"]["bytes"])
        for item in json.loads(nft_json)["nftables"]
        if "counter" in item
    }


class PathWatch:
    """The router's per-case path counters of one lab (namespace labs: the router is ours)."""

    def __init__(self, lab: Lab, client: Host, server: Host) -> None:
        assert lab.router is not None  # namespace labs only: their router forwards every underlay byte
        self.router = lab.router
        self.table = f"{lab.tag}pathwatch"
        self.client, self.server = client, server
        self.router.run(["nft", "delete", "table", "inet", self.table], check=False)
        self.router.run(["nft", "-f", "-"], input=rules(self.table, client.public_ip, server.public_ip))

    def read(self) -> dict[str, int]:
        return parse_counters(self.router.run(["nft", "-j", "list", "table", "inet", self.table]).stdout)


# -- path changes within a case ------------------------------------------------------------------------------

TRACK_INTERVAL_S = 1.0
SEGMENT_MIN_BYTES = 64 * 1024  # an interval with less underlay traffic is not classified (keepalives only)


def classify(pct: float) -> str:
    return "direct" if pct >= DIRECT_MIN_PCT else "relayed" if pct <= RELAY_MAX_PCT else "mixed"


def changes(samples: list[tuple[float, dict[str, int]]]) -> tuple[int, list[tuple[float, float]]]:
    """(path changes, [(t, direct %)]) from timed counter readings: every interval with at least
    SEGMENT_MIN_BYTES is classified direct / relayed / mixed by its own share; a change is a direct interval
    after a relayed one or the reverse (mixed intervals, the moment of a switch, neither start nor end one)."""
    points: list[tuple[float, float]] = []
    n, last = 0, None
    for (_, a), (t, b) in zip(samples, samples[1:], strict=False):
        s = share(a, b)
        if s.total < SEGMENT_MIN_BYTES or s.direct_pct is None:
            continue
        points.append((t, s.direct_pct))
        c = classify(s.direct_pct)
        if c == "mixed":
            continue
        if last is not None and c != last:
            n += 1
        last = c
    return n, points


class PathTrack:
    """Reads a PathWatch every TRACK_INTERVAL_S in a thread for the length of a case."""

    def __init__(self, watch: PathWatch, interval_s: float = TRACK_INTERVAL_S) -> None:
        self.watch = watch
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="path-track", daemon=True)
        self._t0 = 0.0

    def _read(self) -> None:
        # a lost reading narrows the record, it does not fail the case
        with contextlib.suppress(Exception):
            self.samples.append((time.monotonic() - self._t0, self.watch.read()))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def start(self, first: dict[str, int]) -> None:
        self._t0 = time.monotonic()
        self.samples = [(0.0, first)]
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._read()
