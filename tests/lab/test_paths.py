"""Path scenarios: with UDP blocked between peers, relay-capable VPNs carry the traffic through the relay
host (proved with byte counters there); with peers behind their own NATs, the mesh still comes up and its
traffic crosses both NATs (proved with counters of the masqueraded bytes in the NAT namespaces).

Results are also recorded as probed facts of the VPNs' feature records (vpns/features.py)."""

from __future__ import annotations

import json
import re

import pytest

from tunnelbench.catalog import DRIVERS
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.features import save_probe
from tunnelbench.vpns.mesh import Mesh

PINGS, SIZE = 300, 1200  # ~360 kB each way between h1 and h2


def _up(vpn, lab, path):
    cls = DRIVERS[vpn]
    driver = cls(
        MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir, path=path, relay=lab.relay)
    )
    driver.configure()
    mesh = Mesh(driver)
    mesh.start()
    return driver, mesh


def _need(vpn, path):
    cls = DRIVERS[vpn]
    a = cls.availability()
    if not a.ok:
        pytest.skip(f"{vpn}: {a.reason}")
    return a


def _drivers(path):
    return sorted(n for n, c in DRIVERS.items() if path in c.paths and n != "internal")


def _ci(drivers: list[str]) -> list:
    """softether's path tests (13-15 s each, its server's start) run in the long lane; its mesh runs in CI."""
    return [pytest.param(v, marks=pytest.mark.long) if v == "softether" else v for v in drivers]


@pytest.mark.lab
@pytest.mark.parametrize("vpn", _ci(_drivers("relay")))
def test_relay_carries_traffic_when_udp_is_blocked(vpn, lab_factory):
    a = _need(vpn, "relay")
    lab = lab_factory(3, path="relay")
    h1, h2, relay = lab.hosts[0], lab.hosts[1], lab.relay
    assert relay is lab.hosts[2]
    driver, mesh = _up(vpn, lab, "relay")
    try:
        mesh.wait_ready(timeout=60)
        lab.watch_relay()
        before = lab.relay_bytes()
        p = h1.run(["ping", "-q", "-c", str(PINGS), "-i", "0.005", "-s", str(SIZE), "-W", "2",
                    mesh.tunnel_ip(h2)], check=False, timeout=60)  # fmt: skip
        after = lab.relay_bytes()
        got = {k: after[k] - before.get(k, 0) for k in after}
        blocked = lab.udp_blocked()
        ok = p.returncode == 0 and got["from_h1"] >= PINGS * SIZE * 0.9 and got["to_h2"] >= PINGS * SIZE * 0.9
        save_probe(
            vpn,
            "relay_probe",
            ok,
            f"UDP h1<->h2 blocked ({blocked} packets dropped on the router); "
            f"h1->h2 pings {PINGS}x{SIZE} B; relay host counted {got}",
            a.version,
        )
        print(f"{vpn}: relay bytes {got}, router dropped {blocked} UDP packets between peers")
        assert p.returncode == 0, p.stdout + p.stderr
        assert got["from_h1"] >= PINGS * SIZE * 0.9, got
        assert got["to_h2"] >= PINGS * SIZE * 0.9, got
    finally:
        mesh.stop()
    assert mesh.leftovers() == []


def watch_nat(nat, wan_ip: str) -> None:
    """Count, in a NAT's namespace, what its masquerade did (kernel counters this test installs after the
    NAT's own rules): packets leaving by its WAN side rewritten to its public address (`ct status snat`, after
    the srcnat hook), packets leaving there with a private source (not rewritten), and packets coming in from
    the WAN side to the host behind it as replies of a masqueraded connection (rewritten back)."""
    nat.run(
        ["nft", "-f", "-"],
        input=f"""table inet tbtestnat {{
  counter out_masq {{ }}
  counter out_private {{ }}
  counter in_unmasq {{ }}
  chain outward {{
    type filter hook postrouting priority 200; policy accept;
    oifname "wan" ip saddr {wan_ip} ct status snat counter name out_masq
    oifname "wan" ip saddr 172.16.0.0/12 counter name out_private
  }}
  chain inward {{
    type filter hook forward priority 10; policy accept;
    iifname "wan" oifname "lan" ct direction reply ct status snat counter name in_unmasq
  }}
}}
""",
    )


def nat_bytes(nat) -> dict[str, int]:
    out = json.loads(nat.run(["nft", "-j", "list", "table", "inet", "tbtestnat"]).stdout)["nftables"]
    return {x["counter"]["name"]: int(x["counter"]["bytes"]) for x in out if "counter" in x}


@pytest.mark.lab
@pytest.mark.parametrize("vpn", _ci(_drivers("nat")))
def test_mesh_connects_behind_nat(vpn, lab_factory):
    a = _need(vpn, "nat")
    lab = lab_factory(3, path="nat")
    assert lab.hosts[0].behind_nat and lab.hosts[1].behind_nat and not lab.hosts[2].behind_nat
    driver, mesh = _up(vpn, lab, "nat")
    try:
        try:
            mesh.wait_ready(timeout=60)
        except Exception as e:
            save_probe(
                vpn, "nat_probe", False, f"mesh did not come up with h1, h2 behind NAT: {e}"[:300], a.version
            )
            raise
        lab.watch_relay()
        before = lab.relay_bytes()
        h1, h2 = lab.hosts[0], lab.hosts[1]
        nats = {h.name: lab.nats[h.name] for h in (h1, h2)}
        for h in (h1, h2):
            # the host's way out is its own NAT (its LAN side, x.x.x.1 of the host's network), as the kernel
            # routes it
            route = h.run(["ip", "-o", "route", "get", lab.relay.public_ip]).stdout
            assert f"via {h.underlay_ip.rsplit('.', 1)[0]}.1 dev eth0 " in route, (h.name, route)
            watch_nat(nats[h.name], h.public_ip)
        p = h1.run(
            ["ping", "-q", "-c", "100", "-i", "0.005", "-s", str(SIZE), mesh.tunnel_ip(h2)], check=False
        )
        after = lab.relay_bytes()
        via_relay = after["from_h1"] - before["from_h1"] >= 100 * SIZE * 0.9
        how = "via the relay host" if via_relay else "directly (NAT traversed peer to peer)"
        # the tunnel's packets really crossed both NATs, either way (to h2 or to the relay): h1's requests left
        # its NAT rewritten to the NAT's public address and entered h2's NAT as replies of a connection it had
        # masqueraded (the hole punched, or h2's own connection to the relay); h2's answers the same way
        # back; nothing left either NAT with a private source
        got = {name: nat_bytes(n) for name, n in nats.items()}
        m = re.search(r"(\d+) received", p.stdout)
        replies = int(m.group(1)) if m else 0
        legs = [(src, dst, n * SIZE) for src, dst, n in (("h1", "h2", 100), ("h2", "h1", replies))]
        crossed = all(got[src]["out_masq"] >= b and got[dst]["in_unmasq"] >= b for src, dst, b in legs)
        private = got["h1"]["out_private"] + got["h2"]["out_private"]
        save_probe(
            vpn,
            "nat_probe",
            p.returncode == 0 and crossed and private == 0,
            f"3-host mesh up with h1, h2 behind their own masquerading NATs; h1->h2 traffic {how}",
            a.version,
        )
        print(f"{vpn}: behind NAT, h1->h2 {how}")
        assert p.returncode == 0, p.stdout + p.stderr
        for src, dst, b in legs:
            assert got[src]["out_masq"] >= b and got[dst]["in_unmasq"] >= b, (src, dst, b, got)
        assert private == 0, got
    finally:
        mesh.stop()
    assert mesh.leftovers() == []
