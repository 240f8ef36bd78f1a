"""[fairness] tunnel_mtu: every driver puts the common MTU on the device its tunnel traffic leaves by (and
records it in its settings). Without one, the default MTU it declares is what the device really has: checked
on tests/vpns/test_vpn_mesh.py's bring-up, which uses no common MTU."""

from __future__ import annotations

import pytest
from test_vpn_mesh import (
    check_recorded_mtu,
    device_mtu,
    driver_params,
)  # kernel drivers: tests/lab/test_kernel_lane.py

from tunnelbench.catalog import DRIVERS
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.mesh import Mesh

MTU = 1360


def bring_up(cls, lab, mtu: int | None):
    driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir, mtu=mtu))
    driver.configure()
    mesh = Mesh(driver)
    try:
        mesh.start()
        mesh.wait_ready(timeout=60)
        return driver, device_mtu(mesh)
    finally:
        mesh.stop()
        assert mesh.leftovers() == []


@pytest.mark.lab
@pytest.mark.parametrize("vpn", [v for v in driver_params() if v != "internal"])
def test_common_tunnel_mtu_is_honoured(vpn, lab_factory):
    cls = DRIVERS[vpn]
    avail = cls.availability()
    if not avail.ok:
        pytest.skip(f"{vpn}: {avail.reason}")
    # a common MTU that is not the driver's default (easytier's is 1360): only then does it show it was applied
    mtu = MTU if cls.default_mtu != MTU else MTU - 8
    driver, (dev, got) = bring_up(cls, lab_factory(2), mtu)
    assert got == mtu, f"{vpn}: {dev} has MTU {got}, not the scenario's {mtu}"
    check_recorded_mtu(vpn, driver, mtu)
