"""[fairness] tunnel_mtu: every driver puts the common MTU on the device its tunnel traffic leaves by, and
without one, the default MTU it declares (and records in its settings) is what the device really has."""

from __future__ import annotations

import json

import pytest
from test_vpn_mesh import driver_params  # kernel drivers: their MTU is checked in tests/test_kernel_lane.py

from tunnelbench.catalog import DRIVERS
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.mesh import Mesh

MTU = 1360
# drivers whose settings record has no "mtu" (wireguard-go records its offloads only); every other records it
NO_MTU_RECORD = {"wireguard-go"}


def check_recorded_mtu(vpn: str, driver, mtu: int) -> None:
    """The settings record (shown in the report) has the MTU that was applied."""
    if vpn in NO_MTU_RECORD:
        assert "mtu" not in driver.settings, "it records the MTU now: take it out of NO_MTU_RECORD"
    else:
        assert driver.settings["mtu"] == mtu, driver.settings


def device_mtu(mesh: Mesh) -> tuple[str, int]:
    """The MTU of the device h1 sends h2's tunnel traffic by, as the kernel reports it (`ip -j link`)."""
    h1, h2 = mesh.hosts[0], mesh.hosts[1]
    route = h1.run(["ip", "-o", "route", "get", mesh.tunnel_ip(h2)]).stdout.split()
    dev = route[route.index("dev") + 1]
    (link,) = json.loads(h1.run(["ip", "-j", "link", "show", "dev", dev]).stdout)
    return dev, int(link["mtu"])


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
    driver, (dev, got) = bring_up(cls, lab_factory(3), mtu)
    assert got == mtu, f"{vpn}: {dev} has MTU {got}, not the scenario's {mtu}"
    check_recorded_mtu(vpn, driver, mtu)
    # no common MTU: the device gets the default the driver declares
    driver, (dev, got) = bring_up(cls, lab_factory(2), None)
    assert got == cls.default_mtu, f"{vpn}: {dev} has MTU {got} by default; declared: {cls.default_mtu}"
    check_recorded_mtu(vpn, driver, cls.default_mtu)
