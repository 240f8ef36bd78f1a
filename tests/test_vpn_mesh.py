"""Each driver brings up a 3-host mesh, every ordered pair answers over the tunnel, teardown leaves nothing."""

from __future__ import annotations

import pytest

from tunnelbench.catalog import DRIVERS
from tunnelbench.lab.kernel import LANE_FEATURES
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.mesh import Mesh


def driver_params() -> list:
    """Every driver but those needing kernel modules this machine may lack: those get the same checks, and
    their encapsulation on the wire, in tests/test_kernel_lane.py (one bring-up each: the lane's time)."""
    return [v for v in sorted(DRIVERS) if not set(DRIVERS[v].kernel_features) & set(LANE_FEATURES)]


@pytest.mark.lab
@pytest.mark.parametrize("vpn", driver_params())
def test_three_host_mesh(vpn, lab_factory):
    cls = DRIVERS[vpn]
    avail = cls.availability()
    if not avail.ok:
        pytest.skip(f"{vpn}: {avail.reason}")
    lab = lab_factory(3)
    driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir))
    driver.configure()
    mesh = Mesh(driver)
    try:
        mesh.start()
        mesh.wait_ready(timeout=30)
        assert mesh.pairs_down() == []
        # private keys never world- or group-readable
        for f in lab.run_dir.rglob("*"):
            if f.is_file() and any(k in f.name for k in ("key", ".pem", "priv")) and "pub" not in f.name:
                assert f.stat().st_mode & 0o077 == 0, f
    finally:
        mesh.stop()
    assert mesh.leftovers() == []
