"""The router's drop counters, per VPN: the lab's router drops and counts every packet not addressed to the lab
(`offlab`: a VPN probing the internet) and every packet to a tunnel range sent unencapsulated (`tunnel_leak`).
Only one mesh is up at a time, so the counters' growth from before a session's start to after its stop is that
VPN's share; the shares, summed over a VPN's sessions, add up to the run's total (`router.<key>`), which also
counts what earlier processes of a resumed run counted. Stored in the environment: `<key>.<vpn>`,
`offlab_dests.<vpn>` (dropped packets per off-lab destination), `router.<key>`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tunnelbench.lab.base import Lab

# router drop counters (Lab.offlab_drops) -> the environment key prefix of each VPN's share
DROP_COUNTERS = {"offlab": "offlab_drops", "tunnel_leak": "tunnel_leak_drops"}


class DropLedger:
    def __init__(self) -> None:
        self.drops: dict[str, dict[str, int]] = {}  # per VPN, the router's drops while its mesh was up
        self.dests: dict[str, dict[str, int]] = {}  # per VPN, off-lab destination -> dropped packets
        self.before: dict[str, int] | None = None  # the router's counters when this session began
        self.dests_before: dict[str, int] = {}
        self.base: dict[str, int] = {}  # what earlier processes of a resumed run counted, per counter

    def resume(self, env: Mapping[str, str]) -> None:
        """Take over what a resumed run's earlier processes stored."""
        for k, val in env.items():
            if k.startswith("offlab_dests."):
                self.dests[k[len("offlab_dests.") :]] = json.loads(val)
        for counter, key in DROP_COUNTERS.items():
            shares = {k[len(key) + 1 :]: int(v) for k, v in env.items() if k.startswith(f"{key}.")}
            for vpn, n in shares.items():
                self.drops.setdefault(vpn, {})[key] = n
            # a killed process never stored the router's total: its VPNs' shares stand for it
            total = int(env.get(f"router.{key}", sum(shares.values())))
            self.base[counter] = max(total, 0)

    @staticmethod
    def counters(lab: Lab) -> dict[str, int]:
        """The router's drop counters now; -1 where the lab does not count one (an SSH lab has no `offlab`)."""
        return {c: lab.offlab_drops(c) for c in DROP_COUNTERS}

    def begin(self, lab: Lab) -> None:
        """A VPN's session begins (before its mesh starts)."""
        self.before = self.counters(lab)
        self.dests_before = lab.offlab_destinations()

    def attribute(self, lab: Lab, vpn: str) -> dict[str, Any]:
        """The session's share to `vpn` (after its mesh stopped); returns the environment keys to store (none
        when no session was open)."""
        before, self.before = self.before, None
        if before is None:
            return {}
        now = self.counters(lab)
        out: dict[str, Any] = {}
        share = self.drops.setdefault(vpn, {})
        for counter, key in DROP_COUNTERS.items():
            if before[counter] >= 0 and now[counter] >= 0:
                share[key] = share.get(key, 0) + now[counter] - before[counter]
        out.update({f"{key}.{vpn}": n for key, n in share.items()})
        dests = self.dests.setdefault(vpn, {})
        for addr, n in lab.offlab_destinations().items():
            if n > self.dests_before.get(addr, 0):
                dests[addr] = dests.get(addr, 0) + n - self.dests_before.get(addr, 0)
        if dests:
            out[f"offlab_dests.{vpn}"] = dict(sorted(dests.items(), key=lambda kv: -kv[1]))
        return out

    def totals(self, lab: Lab) -> dict[str, int]:
        """`router.<key>`: the router's drops over the whole run, this lab's counter plus earlier processes'."""
        out = {}
        for counter, key in DROP_COUNTERS.items():
            now = lab.offlab_drops(counter)
            out[f"router.{key}"] = now if now < 0 else now + self.base.get(counter, 0)
        return out
