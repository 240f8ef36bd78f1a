"""[fairness] tunnel_mtu: every driver puts the common MTU on the device its tunnel traffic leaves by."""

from __future__ import annotations

import pytest
from test_vpn_mesh import driver_params  # kernel drivers: their MTU is checked in tests/test_kernel_lane.py

from tunnelbench.vpns import DRIVERS, Mesh, MeshSpec

MTU = 1360


@pytest.mark.lab
@pytest.mark.parametrize("vpn", [v for v in driver_params() if v != "internal"])
def test_common_tunnel_mtu_is_honoured(vpn, lab_factory):
    cls = DRIVERS[vpn]
    avail = cls.availability()
    if not avail.ok:
        pytest.skip(f"{vpn}: {avail.reason}")
    lab = lab_factory(3)
    driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir, mtu=MTU))
    driver.configure()
    mesh = Mesh(driver)
    try:
        mesh.start()
        mesh.wait_ready(timeout=60)
        h1, h2 = lab.hosts[0], lab.hosts[1]
        route = h1.run(["ip", "-o", "route", "get", mesh.tunnel_ip(h2)]).stdout.split()
        dev = route[route.index("dev") + 1]
        mtu = int(h1.run(["cat", f"/sys/class/net/{dev}/mtu"]).stdout)
        assert mtu == MTU, f"{vpn}: {dev} has MTU {mtu}, not the scenario's {MTU}"
        assert getattr(driver, "settings", {}).get("mtu", MTU) == MTU
    finally:
        mesh.stop()
    assert mesh.leftovers() == []
