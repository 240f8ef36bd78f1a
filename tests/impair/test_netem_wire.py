"""netem decides per wire packet (impair/backend.py, per_wire_netem): a TCP bulk flow's GSO/TSO super-packets
(up to 64 KB, tens of wire packets) reach the router whole over veth, and a root netem drew one loss decision
per super-packet, so `loss-1` gave ~0.05% loss events per wire packet, each dropping ~20 segments at once
(measured in the lane's VM: scripts/netem-wire-measure.py). The segmenting TBF in front of netem makes it one
decision per wire packet."""

from __future__ import annotations

import json
import math

import pytest

from tunnelbench.impair.backend import make_backend
from tunnelbench.impair.profiles import PROFILES
from tunnelbench.impair.tcpcheck import iperf3_tcp
from tunnelbench.lab.host import Host

pytestmark = [pytest.mark.lab, pytest.mark.kernel]

Z = 4.5  # a binomial band this wide misses a correct backend ~7 times in a million


def _tcp(h: Host) -> dict[str, int]:
    lines = [
        ln.split() for ln in h.run(["cat", "/proc/net/snmp"]).stdout.splitlines() if ln.startswith("Tcp:")
    ]
    return dict(zip(lines[0][1:], map(int, lines[1][1:]), strict=True))


def _netem_drops(router: Host, dev: str) -> int:
    qs = json.loads(router.run(["tc", "-s", "-j", "qdisc", "show", "dev", dev]).stdout)
    return sum(q["drops"] for q in qs if q["kind"] == "netem")


def _skbs(router: Host, table: str) -> int:
    out = router.run(["nft", "list", "table", "inet", table]).stdout
    return int(out.split("counter packets ")[1].split()[0])


def test_netem_loss_is_drawn_per_wire_packet_under_gso(lab_factory):
    """A 3 s iperf3 TCP flow h1 -> h2 under `loss-1` on the netem backend. W = the wire packets h1 sent (its
    TCP OutSegs: every segment of a super-packet counted), E = netem's loss decisions on the router's egress
    toward h2 (its drops). With one independent 1% draw per wire packet, E ~ Binomial(W, 0.01): E must lie
    within Z standard deviations of 0.01 W. The path must carry super-packets (skbs forwarded well under W),
    else the test shows nothing; a root netem (the old setup) gives E ~ W / 2000 and fails."""
    p = PROFILES["loss-1"]
    rate = p.expected_loss()
    lab = lab_factory(2)
    h1, h2 = lab.hosts
    r = lab.router
    table = f"{lab.tag}skb"
    rule = f"ip saddr {h1.underlay_ip} ip daddr {h2.underlay_ip} counter"
    r.run(
        ["nft", "-f", "-"],
        input=f"table inet {table} {{\n chain c {{\n  type filter hook forward priority -10; policy accept;\n"
        f"  {rule}\n }}\n}}\n",
    )
    be = make_backend("netem", r, lab.hosts, lab.run_dir / "impair")
    be.apply(p)
    try:
        t0, e0, k0 = _tcp(h1), _netem_drops(r, h2.name), _skbs(r, table)
        iperf3_tcp(h1, h2, h2.underlay_ip, 3, 5297)
        t1, e1, k1 = _tcp(h1), _netem_drops(r, h2.name), _skbs(r, table)
    finally:
        be.clear()
    w, e, skbs = t1["OutSegs"] - t0["OutSegs"], e1 - e0, k1 - k0
    lost = t1["RetransSegs"] - t0["RetransSegs"]
    seen = f"W={w} wire packets, {skbs} skbs at the router, E={e} netem drops, {lost} retransmitted segments"
    assert w >= 3000, f"too few wire packets for the band to mean anything: {seen}"
    assert skbs <= w / 2, f"the path carried no GSO super-packets, nothing to show: {seen}"
    sd = math.sqrt(w * rate * (1 - rate))
    lo, hi = rate * w - Z * sd, rate * w + Z * sd
    assert lo <= e <= hi, (
        f"loss events per wire packet {e / w:.4%}, configured {rate:.2%} (band {lo:.0f}..{hi:.0f}): {seen}"
    )
