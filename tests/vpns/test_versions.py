"""Versions as a dimension (issue 12): `NAME`, `NAME@debian`, `NAME@X.Y.Z` (catalog.resolve), their installs,
work dirs, options and versions; one lab test brings up the Debian build and the default build in turn."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tunnelbench.catalog import DRIVERS, resolve
from tunnelbench.lab.host import THIS_MACHINE, find_binary
from tunnelbench.scenario import ScenarioError, parse_scenario
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.install import Apt, Crate, GoModule, registry, upstream_version
from tunnelbench.vpns.mesh import Mesh


def _sc(vpns, **extra) -> dict:
    return {"vpns": vpns, "workloads": [{"name": "ping"}], **extra}


# -- parsing -----------------------------------------------------------------------------------------
def test_plain_name_is_the_driver_itself():
    for name, cls in DRIVERS.items():
        assert resolve(name) is cls
        assert cls.key == name and cls.variant is None


@pytest.mark.parametrize(
    ("spec", "variant"),
    [
        ("nebula@1.9.0", "1.9.0"),
        ("nebula@v1.10.3", "1.10.3"),
        ("wireguard-go@0.0.0-20250522210424-abcdef012345", "0.0.0-20250522210424-abcdef012345"),
        ("nebula@debian", "debian"),
        ("yggdrasil@debian", "debian"),
        ("tinc@debian", "debian"),  # Debian-only drivers: @debian is their one build
        ("boringtun@0.6.0", "0.6.0"),
    ],
)
def test_versioned_spec_is_a_pinned_subclass(spec, variant):
    cls = resolve(spec)
    base = DRIVERS[spec.split("@")[0]]
    assert issubclass(cls, base) and cls is not base
    assert cls.name == base.name and cls.key == spec and cls.variant == variant
    assert resolve(spec) is cls  # one class per spec


@pytest.mark.parametrize(
    ("spec", "expect"),
    [
        ("nosuchvpn", "unknown VPN 'nosuchvpn'"),
        ("nosuchvpn@1.0.0", "unknown VPN 'nosuchvpn'"),
        ("netbird", "impossible here"),
        ("nebula@", "malformed version ''"),
        ("nebula@latest", "malformed version 'latest'"),
        ("nebula@1.9", "malformed version '1.9'"),
        ("nebula@1.9.0/../x", "malformed version"),
        ("nebula@1.9.0@2", "malformed version"),
        ("boringtun@debian", "Debian has no build of boringtun"),
        ("tinc@1.0.36", "tinc comes from Debian only"),
        ("internal@debian", "Debian has no build of internal"),
    ],
)
def test_bad_specs_are_refused_with_the_allowed_names(spec, expect):
    with pytest.raises(ValueError, match="allowed") as e:
        resolve(spec)
    assert expect in str(e.value)


def test_scenario_errors_name_the_entry():
    with pytest.raises(ScenarioError) as e:
        parse_scenario(_sc(["nebula@1.x", "nebula"]))
    assert "vpns[0]: 'nebula@1.x': malformed version" in str(e.value)
    with pytest.raises(ScenarioError) as e:
        parse_scenario(_sc(["internal", "wireguard-go@nope"]))
    assert "vpns[1]" in str(e.value) and "wireguard-go@debian" in str(e.value)  # the allowed forms
    with pytest.raises(ScenarioError) as e:
        parse_scenario(_sc(["nebula@1.9.0", "nebula@v1.9.0"]))
    assert "vpns[1]: 'nebula@v1.9.0' is listed twice (as vpns[0] 'nebula@1.9.0')" in str(e.value)
    with pytest.raises(ScenarioError, match=r"vpns\[1\]: 'nebula' is listed twice"):
        parse_scenario(_sc(["nebula", "nebula"]))


def test_scenario_runs_several_versions_of_one_vpn():
    sc = parse_scenario(_sc(["nebula@1.6.1", "nebula", "nebula@debian", "wireguard-go@debian"]))
    assert sc.vpns == ["nebula@1.6.1", "nebula", "nebula@debian", "wireguard-go@debian"]
    assert parse_scenario(_sc(["all"])).vpns == list(DRIVERS)


# -- installs and binaries ---------------------------------------------------------------------------
def test_variant_installs_are_pinned_to_the_version(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNNELBENCH_CACHE", str(tmp_path))
    (go,) = resolve("nebula@1.9.0").installs
    assert isinstance(go, GoModule) and go.version == "v1.9.0" and go.module == "github.com/slackhq/nebula"
    assert go.bin_dir() == tmp_path / "nebula-1.9.0" / "bin"
    assert go.label == "go github.com/slackhq/nebula@v1.9.0"
    # the default is untouched
    assert DRIVERS["nebula"].installs[0].version != "v1.9.0"
    crate = resolve("boringtun@0.6.0").installs[0]
    assert (
        isinstance(crate, Crate)
        and crate.version == "0.6.0"
        and crate.bin_dir() == tmp_path / "boringtun-cli-0.6.0" / "bin"
    )
    # innernet pins both of its crates; tailscale pins tailscale, not its control server
    inn = [s.version for s in resolve("innernet@1.7.1").installs if registry(s)]
    assert inn == ["1.7.1", "1.7.1"]
    ts, hs = resolve("tailscale@1.100.0").installs
    assert ts.version == "v1.100.0" and hs.version == DRIVERS["tailscale"].installs[1].version
    # the Debian build: Apt sources that declare their binaries, no registry source
    deb = resolve("wireguard-go@debian").installs
    assert deb and all(isinstance(s, Apt) for s in deb) and "wireguard-go" in deb[0].binaries
    assert not any(registry(s) for s in resolve("nebula@debian").installs)


def test_every_registry_default_with_a_debian_package_has_a_debian_variant():
    for name in ("wireguard-go", "nebula", "yggdrasil"):
        cls = DRIVERS[name]
        assert any(registry(s) for s in cls.installs), f"{name}: the default must be the registry build"
        assert resolve(f"{name}@debian").installs


def _fake_build(bin_dir: Path, name: str, output: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    f = bin_dir / name
    f.write_text(f"#!/bin/sh\necho '{output}'\n")
    f.chmod(0o755)


def test_a_variant_runs_its_own_cache_build_and_reports_its_version(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNNELBENCH_CACHE", str(tmp_path))
    cls = resolve("nebula@1.9.0")
    a = cls.availability()
    assert not a.ok and a.installable and "tunnelbench install nebula@1.9.0" in a.reason
    # a pinned build never falls back to PATH (the Debian nebula may be there)
    assert (
        find_binary("nebula", cls.installs) is None
        and THIS_MACHINE.binary("nebula", cls.installs) == "nebula"
    )
    for b in ("nebula", "nebula-cert"):
        _fake_build(tmp_path / "nebula-1.9.0" / "bin", b, "Version: 1.9.0")
    assert THIS_MACHINE.binary("nebula", cls.installs) == str(tmp_path / "nebula-1.9.0" / "bin" / "nebula")
    a = cls.availability()
    assert a.ok and a.version == "1.9.0 (go proxy)", a
    # a build that reports no version gets the pinned version of the cache build it came from
    other = resolve("nebula@1.8.0")
    for b in ("nebula", "nebula-cert"):
        _fake_build(tmp_path / "nebula-1.8.0" / "bin", b, "Version: unknown")
    assert other.availability().version == "1.8.0 (go proxy)"


def test_module_version_is_shown_when_the_build_reports_another(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNNELBENCH_CACHE", str(tmp_path))
    cls = resolve("wireguard-go@0.0.0-20260522210424-ecfc5a8d5446")
    _fake_build(
        tmp_path / "wireguard-go-0.0.0-20260522210424-ecfc5a8d5446" / "bin",
        "wireguard-go",
        "wireguard-go v0.0.20250522",
    )
    if find_binary("wg") is None:
        pytest.skip("wg (wireguard-tools) is not installed")
    assert cls.availability().version == "0.0.20250522 (go proxy v0.0.0-20260522210424-ecfc5a8d5446)"


def test_debian_upstream_version():
    assert upstream_version("1.6.1+dfsg-3+b4") == "1.6.1"
    assert upstream_version("0.4.7-1+b5") == "0.4.7"
    assert upstream_version("1:2.6.14-0+deb12u2") == "2.6.14"
    assert upstream_version("22") == "22"


def test_debian_variant_reports_the_debian_version():
    cls = resolve("nebula@debian")
    a = cls.availability()
    if not a.ok:
        pytest.skip(f"nebula@debian: {a.reason}")
    assert THIS_MACHINE.binary("nebula", cls.installs).startswith(("/usr/", "/bin", "/sbin"))
    assert "(debian " in a.version and "unknown" not in a.version


def test_no_driver_reports_unknown():
    for name, cls in DRIVERS.items():
        a = cls.availability()
        if a.ok:
            assert a.version and "unknown" not in a.version.lower(), (name, a.version)


# -- work dirs, rows, options --------------------------------------------------------------------------
class _Host:
    remote = False
    behind_nat = False
    journal = None
    preexisting_links: set[str] = set()

    def __init__(self, name: str, workdir: Path):
        self.name, self.workdir = name, workdir
        self.underlay_ip = self.public_ip = "10.100.1.2"

    def mkdir(self, d: Path) -> None:
        Path(d).mkdir(parents=True, exist_ok=True)


def test_two_versions_of_one_driver_get_different_work_dirs(tmp_path):
    hosts = [_Host(f"h{i}", tmp_path / f"h{i}") for i in (1, 2)]
    dirs = {}
    for spec in ("nebula", "nebula@debian", "nebula@1.9.0", "nebula@v1.9.0"):
        d = resolve(spec)(MeshSpec(hosts=hosts, tag="tbtest", workdir=tmp_path))
        dirs[spec] = d.host_dir(hosts[0])
        assert Mesh(d).vpn == spec  # the run's rows and case folders are keyed by what the user wrote
        assert dirs[spec].parent == hosts[0].workdir and "@" not in dirs[spec].name
    assert len(set(dirs.values())) == len(dirs), dirs
    assert dirs["nebula"].name == "nebula" and dirs["nebula@1.9.0"].name == "nebula-1.9.0"


def test_vpn_options_for_a_base_name_apply_to_every_version():
    sc = parse_scenario(
        _sc(
            ["nebula@1.6.1", "nebula", "nebula@debian"],
            vpn_options={"nebula": {"cipher": "chachapoly"}, "nebula@debian": {"routines": 2}},
        )
    )
    opts = sc.vpn_options
    assert opts["nebula"] == {"cipher": "chachapoly"}
    assert opts["nebula@1.6.1"] == {"cipher": "chachapoly"}
    assert opts["nebula@debian"] == {"cipher": "chachapoly", "routines": 2}  # the version's own keys on top
    # a version's own options override the base name's
    sc = parse_scenario(
        _sc(
            ["nebula@1.6.1"],
            vpn_options={"nebula": {"cipher": "chachapoly"}, "nebula@1.6.1": {"cipher": "aes"}},
        )
    )
    assert sc.vpn_options["nebula@1.6.1"] == {"cipher": "aes"}
    with pytest.raises(ScenarioError, match="options for 'nebula@x'"):
        parse_scenario(_sc(["nebula"], vpn_options={"nebula@x": {}}))


# -- lab: the Debian build and the default build, one after the other ---------------------------------
@pytest.mark.lab
@pytest.mark.parametrize("name", ["nebula", "wireguard-go", "yggdrasil"])
def test_debian_and_default_builds_come_up_with_different_versions(name, lab_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    specs = [f"{name}@debian", name]
    avail = {s: resolve(s).availability() for s in specs}
    for s, a in avail.items():
        if not a.ok:
            pytest.skip(f"{s}: {a.reason}")
    lab = lab_factory(3)
    folders = set()
    for s in specs:
        cls = resolve(s)
        driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir))
        driver.configure()
        mesh = Mesh(driver)
        try:
            mesh.start()
            mesh.wait_ready(timeout=30)
            assert mesh.pairs_down() == []
            # the running daemon is the build the variant names
            exe = os.path.realpath(f"/proc/{driver.daemons(lab.hosts[0])[0].pid}/exe")
            assert exe == os.path.realpath(THIS_MACHINE.binary(cls.binaries[0], cls.installs)), (s, exe)
        finally:
            mesh.stop()
        assert mesh.leftovers() == []
        folders.add(driver.host_dir(lab.hosts[0]))
    deb, default = (avail[s].version for s in specs)
    assert deb != default, (deb, default)
    assert "(debian " in deb and "(go proxy" in default, (deb, default)
    assert len(folders) == 2


def test_every_driver_carries_its_own_feature_record():
    """A subclass (boringtun of wireguard-go, the kernel IPsec family of strongswan) once showed its parent's
    record: kernel WireGuard listed as "userspace (Go)". Each subclassed driver has a record of its own."""
    from tunnelbench.catalog import DRIVERS

    parents = [(n, b.name) for n, d in DRIVERS.items() for b in d.__mro__[1:] if b in DRIVERS.values()]
    assert parents  # the case that broke: subclassed drivers exist
    for n, parent in parents:
        assert "features" in DRIVERS[n].__dict__, n
        assert DRIVERS[n].features != DRIVERS[parent].features, (n, parent)
