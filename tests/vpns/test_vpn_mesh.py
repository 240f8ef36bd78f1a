"""Each driver brings up a 3-host mesh, every ordered pair answers over the tunnel, teardown leaves nothing,
every file holding a secret is 0600 or stricter while the mesh is up, and the tunnel device has the MTU the
driver declares as its default."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from tunnelbench.catalog import DRIVERS
from tunnelbench.lab.kernel import LANE_FEATURES
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.mesh import Mesh

# private key material recognised by what a file holds, whatever it is called: a PEM private key block (nebula,
# openvpn, openconnect, tinc) or a secret setting with a literal value (yggdrasil PrivateKey, easytier
# network_secret, vpncloud password, strongswan secret, innernet PrivateKey); a value that is a path names a
# key file, it is none
SECRET_CONTENT = re.compile(
    rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"
    rb"|^[ \t\"']*[\w-]*(?:private[_-]?key|secret|password|passwd|psk)[\"']?[ \t]*[:=][ \t]*"
    rb"[\"']?(?:0x)?[A-Za-z0-9+=_-][A-Za-z0-9+/=_.~-]{11,}",
    re.I | re.M,
)


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


def driver_params() -> list:
    """Every driver but those needing kernel modules this machine may lack: those get the same checks, and
    their encapsulation on the wire, in tests/lab/test_kernel_lane.py (one bring-up each: the lane's time)."""
    return [v for v in sorted(DRIVERS) if not set(DRIVERS[v].kernel_features) & set(LANE_FEATURES)]


def secret_files_by_content(root: Path) -> list[Path]:
    """Every regular file under `root` whose bytes hold private key material (SECRET_CONTENT)."""
    out = []
    for f in sorted(root.rglob("*")):
        if f.is_file() and not f.is_symlink():
            try:
                data = f.read_bytes()
            except OSError:
                continue
            if SECRET_CONTENT.search(data):
                out.append(f)
    return out


def test_secret_content_finds_keys_by_what_files_hold(tmp_path):
    files = {
        "a.txt": "-----BEGIN NEBULA X25519 PRIVATE KEY-----\nAAAA\n-----END NEBULA X25519 PRIVATE KEY-----\n",
        "b.conf": '{\n  "PrivateKey": "3f0a9c1d7e2b4a6f8091a2b3c4d5e6f7",\n  "Peers": []\n}\n',
        "c.toml": 'network_name = "x"\nnetwork_secret = "Zq3xV9kTp2LmN8wR4sY6"\n',
        "d.yaml": 'crypto:\n  password: "Zq3xV9kTp2LmN8wR4sY6"\n',
        "e.conf": "[Interface]\nPrivateKey = eA1bC2dE3fG4hI5jK6lM7nO8pQ9rS0tU1vW2xY3zA4B=\n",
        # not secrets: a public key, a path to a key file, a short value
        "f.pem": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        "g.yml": "pki:\n  key: /run/x/hosts/h1/nebula/host.key\nprivate_key: /run/x/host.key\n",
        "h.conf": "PublicKey = eA1bC2dE3fG4hI5jK6lM7nO8pQ9rS0tU1vW2xY3zA4B=\nsecret = no\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert [f.name for f in secret_files_by_content(tmp_path)] == [
        "a.txt",
        "b.conf",
        "c.toml",
        "d.yaml",
        "e.conf",
    ]


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
        # private keys never group- or world-readable: every file the driver declares secret and every file
        # whose content holds key material (a config that embeds a key counts, whatever its name), by the
        # mode the kernel reports for it
        declared = {f.resolve() for h in lab.hosts for f in driver.secret_files(h)}
        found = {f.resolve() for f in secret_files_by_content(lab.run_dir)}
        modes = {f: stat.S_IMODE(os.stat(f).st_mode) for f in sorted(declared | found)}
        open_ = {str(f.relative_to(lab.run_dir.resolve())): f"{m:04o}" for f, m in modes.items() if m & 0o077}
        assert open_ == {}, f"{vpn}: secret files readable by group or others: {open_}"
        # no common MTU: the device gets the default the driver declares, and records (tests/vpns/test_vpn_mtu.py
        # has the common MTU; one bring-up here serves both)
        if cls.default_mtu is not None:
            dev, got = device_mtu(mesh)
            assert got == cls.default_mtu, (
                f"{vpn}: {dev} has MTU {got} by default; declared: {cls.default_mtu}"
            )
            check_recorded_mtu(vpn, driver, cls.default_mtu)
    finally:
        mesh.stop()
    assert mesh.leftovers() == []
