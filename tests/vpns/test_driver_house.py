"""The driver class is the whole VPN: its feature record is written in its own class, its summary names no
version (the version shown beside it comes from its installs), and every binary it runs and every version
it reads goes through the host that runs it (`Host.binary`, `host.run`), with no context variable.

References are hand-made: the eleven field names of a feature record, fake hosts whose `binary()` answers a
path of their own, and a fake `--version` answer."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from tree import SRC

from tunnelbench.catalog import DRIVERS
from tunnelbench.lab.host import THIS_MACHINE, Host, Result, find_binary
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.boringtun import Boringtun
from tunnelbench.vpns.install import VERSION_RE, Apt, Crate, registry
from tunnelbench.vpns.nebula import Nebula
from tunnelbench.vpns.openvpn import OpenVpn
from tunnelbench.vpns.wireguard_go import WireguardGo

VPNS = SRC / "tunnelbench" / "vpns"
FIELDS = {
    "protocol",
    "ciphers",
    "data_plane",
    "topology",
    "nat_traversal",
    "relay",
    "acl",
    "unattended_join",
    "self_hosted_control",
    "platforms",
    "license",
}


def test_every_driver_writes_its_own_feature_record_in_its_own_class():
    assert not (VPNS / "feature_data.py").exists()
    for name, cls in DRIVERS.items():
        if name == "internal":  # the baseline is no VPN: nothing to describe
            assert cls.features == {}
            continue
        # its own attribute, written in the class's own text (not inherited, not patched on from outside)
        assert "features" in cls.__dict__, name
        body = ast.parse(inspect.getsource(cls).lstrip()).body[0]
        assert isinstance(body, ast.ClassDef)
        own = [
            s
            for s in body.body
            if isinstance(s, ast.Assign) and any(getattr(t, "id", "") == "features" for t in s.targets)
        ]
        assert len(own) == 1, f"{name}: `features = ...` is not in class {cls.__name__}'s body"
        assert set(cls.features) == FIELDS, (name, set(cls.features) ^ FIELDS)
        for field, fact in cls.features.items():
            assert fact["value"] and fact["source"], (name, field, fact)
    for p in VPNS.glob("*.py"):  # nothing assigns records to classes from outside them
        assert not re.search(r"\w\.features\s*=", p.read_text()), p.name


def test_no_summary_names_a_version_its_installs_hold():
    for name, cls in DRIVERS.items():
        assert not VERSION_RE.search(cls.summary), (name, cls.summary)
        for s in cls.installs:
            if registry(s):
                assert s.version.removeprefix("v") not in cls.summary, (name, cls.summary)


def test_no_driver_keeps_a_binary_lookup_of_its_own():
    """One lookup, the host's: no `bin` classmethod, no context variable, no direct shutil.which."""
    for p in VPNS.glob("*.py"):
        if p.name == "install.py":  # installs look for apt-get, go and cargo, not for a VPN's binaries
            continue
        text = p.read_text()
        for banned in ("ContextVar", "_VERSION_HOST", "def bin(", ".bin(", "shutil.which("):
            assert banned not in text, (p.name, banned)


class OwnFolderHost(Host):
    """A host whose binaries live in its own folder (/opt/<name>/), and whose commands are recorded and
    answered with a version line: nothing runs."""

    def __init__(self, name: str, workdir: Path):
        self.name, self.underlay_ip, self.workdir, self.journal = name, "10.100.0.1", workdir, None
        self.underlay_if = "eth0"
        self.ran: list[list[str]] = []
        self.spawned: list[list[str]] = []

    def argv(self, argv):
        return list(argv)

    def binary(self, name, installs=()):
        return f"/opt/{self.name}/{name}"

    def run(self, argv, **kw):
        self.ran.append(list(argv))
        return Result(list(argv), 0, "Version: 9.8.7\n", "", 0.0)

    def spawn(self, argv, **kw):
        self.spawned.append(list(argv))


def test_versions_are_read_on_the_host_with_the_binary_it_resolves(tmp_path):
    far = OwnFolderHost("far", tmp_path)
    assert Nebula.version(far) == "9.8.7"
    assert far.ran == [["/opt/far/nebula", "-version"]]


def test_daemons_start_with_the_binary_their_own_host_resolves(tmp_path):
    hosts: list[Host] = [OwnFolderHost(f"h{i}", tmp_path / f"h{i}") for i in (1, 2)]
    spec = MeshSpec(hosts=hosts, tag="tbhouse", workdir=tmp_path)
    h1, h2 = hosts
    assert OpenVpn(spec)._argv(h1, h2, 0, True)[0] == "/opt/h1/openvpn"
    assert OpenVpn(spec)._argv(h2, h1, 0, False)[0] == "/opt/h2/openvpn"
    wg = WireguardGo(spec)
    wg._has_offloads = lambda host: False  # type: ignore[method-assign]  # no TUN to look at here
    wg._spawn_daemon(h2, "tbhouse2", tmp_path)
    assert h2.spawned == [["/opt/h2/wireguard-go", "-f", "tbhouse2"]]  # type: ignore[attr-defined]
    Boringtun(spec)._spawn_daemon(h1, "tbhouse1", tmp_path)
    assert h1.spawned[0][0] == "/opt/h1/boringtun-cli"  # type: ignore[attr-defined]


def test_this_machine_resolves_registry_builds_from_the_cache_and_apt_ones_off_path(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNNELBENCH_CACHE", str(tmp_path / "cache"))
    crate = Crate("tbcrate", "1.2.3", ("tbtool",))
    assert THIS_MACHINE.binary("tbtool", (crate,)) == "tbtool"  # not built: the bare name says missing
    built = crate.bin_dir() / "tbtool"
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    assert THIS_MACHINE.binary("tbtool", (crate,)) == str(built)
    # a system package's binary kept off PATH is found in the source's libexec folder, and only there
    off = tmp_path / "libexec"
    off.mkdir()
    (off / "tbdaemon").write_text("#!/bin/sh\n")
    (off / "tbdaemon").chmod(0o755)
    assert find_binary("tbdaemon") is None
    assert find_binary("tbdaemon", (Apt(("tbpkg",), ("tbdaemon",), libexec=(str(off),)),)) == str(
        off / "tbdaemon"
    )
