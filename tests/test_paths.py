"""Path scenarios: with UDP blocked between peers, relay-capable VPNs carry the traffic through the relay
host (proved with byte counters there); with peers behind their own NATs, the mesh still comes up.

Results are also recorded as probed facts of the VPNs' feature records (vpns/features.py)."""

from __future__ import annotations

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


@pytest.mark.lab
@pytest.mark.parametrize("vpn", _drivers("relay"))
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


@pytest.mark.lab
@pytest.mark.parametrize("vpn", _drivers("nat"))
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
        p = h1.run(
            ["ping", "-q", "-c", "100", "-i", "0.005", "-s", str(SIZE), mesh.tunnel_ip(h2)], check=False
        )
        after = lab.relay_bytes()
        via_relay = after["from_h1"] - before["from_h1"] >= 100 * SIZE * 0.9
        how = "via the relay host" if via_relay else "directly (NAT traversed peer to peer)"
        save_probe(
            vpn,
            "nat_probe",
            p.returncode == 0,
            f"3-host mesh up with h1, h2 behind their own masquerading NATs; h1->h2 traffic {how}",
            a.version,
        )
        print(f"{vpn}: behind NAT, h1->h2 {how}")
        assert p.returncode == 0
    finally:
        mesh.stop()
    assert mesh.leftovers() == []
