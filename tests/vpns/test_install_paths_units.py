"""Unit tests (no lab): install sources and the cache, availability states, path scenario validation."""

from __future__ import annotations

import pytest

from tunnelbench.catalog import DRIVERS
from tunnelbench.lab.host import find_binary
from tunnelbench.scenario import ScenarioError, parse_scenario
from tunnelbench.vpns.impossible import IMPOSSIBLE
from tunnelbench.vpns.install import Crate, GoModule


def test_cache_is_keyed_by_name_and_version(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNNELBENCH_CACHE", str(tmp_path))
    c = Crate("boringtun-cli", "0.7.1", ("boringtun-cli",))
    g = GoModule(
        "headscale", "github.com/juanfont/headscale", "v0.29.3", ("x/cmd/headscale",), ("headscale",)
    )
    assert c.bin_dir() == tmp_path / "boringtun-cli-0.7.1" / "bin"
    assert g.bin_dir() == tmp_path / "headscale-0.29.3" / "bin"
    assert not c.cached()
    c.bin_dir().mkdir(parents=True)
    (c.bin_dir() / "boringtun-cli").write_text("#!/bin/sh\n")
    assert c.cached()
    # the cache wins over PATH
    assert find_binary("boringtun-cli", (c,)) == str(c.bin_dir() / "boringtun-cli")
    assert find_binary("no-such-binary-here", (c,)) is None


def test_every_driver_declares_installs_and_paths():
    for name, cls in DRIVERS.items():
        if name == "internal":
            continue
        assert cls.installs, f"{name} declares no install source"
        assert "direct" in cls.paths, name
        assert cls.paths <= {"direct", "relay", "nat"}, name


def _shim(path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_availability_states_are_explained():
    """Whatever this machine has installed, every driver is in one of the three states, with a reason when
    it cannot run (the states themselves are made and checked one by one in the next test)."""
    for name, cls in DRIVERS.items():
        a = cls.availability()
        assert a.state in ("available", "installable", "impossible here")
        assert a.ok == (a.state == "available") and (a.ok or a.reason), name
        assert not a.installable or f"tunnelbench install {name}" in a.reason, (name, a)


def test_each_availability_state_with_a_made_up_machine(tmp_path, monkeypatch):
    """Each state of one driver (nebula, a Go-module build), on a machine made of an empty install cache and a
    PATH of shims: no branch on what this machine happens to have installed."""
    neb = DRIVERS["nebula"]
    cache, tools = tmp_path / "cache", tmp_path / "tools"
    tools.mkdir()
    monkeypatch.setenv("TUNNELBENCH_CACHE", str(cache))
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setattr(neb, "impossible_on", classmethod(lambda cls, hosts=None: None))  # a kernel with TUN
    # no build and no Go toolchain: cannot be installed here, and the reason says why
    a = neb.availability()
    assert (a.state, a.ok, a.installable, a.version) == ("impossible here", False, False, None)
    assert a.reason == "missing binaries: nebula, nebula-cert (the Go toolchain (go) is not installed)"
    # a `go` on PATH: installable, and the reason names the command
    _shim(tools / "go", "exit 0\n")
    a = neb.availability()
    assert (a.state, a.ok, a.installable) == ("installable", False, True)
    assert a.reason == "missing binaries: nebula, nebula-cert; install with `tunnelbench install nebula`"
    # half a build (nebula-cert missing) is not available
    bin_dir = cache / "nebula-1.11.1" / "bin"
    _shim(bin_dir / "nebula", 'echo "Version: 1.11.1"\n')
    a = neb.availability()
    assert a.state == "installable" and a.reason.startswith("missing binaries: nebula-cert;"), a
    # the cache build complete: available, with the version the binary reports and where the build came from
    _shim(bin_dir / "nebula-cert", "exit 0\n")
    a = neb.availability()
    assert (a.state, a.ok, a.version, a.reason) == ("available", True, "1.11.1 (go proxy)", "")
    # a build reporting another version than its cache key says both
    _shim(bin_dir / "nebula", 'echo "Version: 1.11.0-dirty"\n')
    assert neb.availability().version == "1.11.0-dirty (go proxy v1.11.1)"
    # a kernel without what the VPN needs wins over any build
    monkeypatch.setattr(neb, "impossible_on", classmethod(lambda cls, hosts=None: "this kernel has no TUN"))
    a = neb.availability()
    assert (a.state, a.ok, a.installable) == ("impossible here", False, False)
    assert a.reason == "this kernel has no TUN"


def test_impossible_vpns_have_reasons_and_no_driver():
    for name, imp in IMPOSSIBLE.items():
        assert name not in DRIVERS
        assert len(imp.reason) > 30


def _sc(**lab):
    return {"workloads": [{"name": "ping"}], "lab": lab}


def test_path_validation():
    assert parse_scenario(_sc(path="relay")).lab.path == "relay"
    assert parse_scenario(_sc(path="nat", relay="h3")).lab.relay == "h3"
    with pytest.raises(ScenarioError, match="relay must be"):
        parse_scenario(_sc(path="relay", hosts=2))
    with pytest.raises(ScenarioError, match="relay must be"):
        parse_scenario(_sc(path="relay", relay="h1"))
    with pytest.raises(ScenarioError, match="only used with path"):
        parse_scenario(_sc(relay="h3"))
    with pytest.raises(ScenarioError):
        parse_scenario(_sc(path="satellite"))


def test_dpkg_is_asked_once_per_question_and_again_after_an_apt_install(monkeypatch):
    """dpkg's answers are kept per process (a version check asks the same ones for every IPsec driver), but an
    install through apt-get makes every later question go to dpkg again: a fake dpkg-query whose package
    appears only once the fake apt-get ran, and the commands counted."""
    import io
    import subprocess

    from tunnelbench.vpns import install

    installed: set[str] = set()
    calls: list[list[str]] = []

    def run(argv, **kw):
        calls.append(list(argv))
        if argv[0] == "dpkg-query" and argv[1] == "-W":
            pkg = argv[-1]
            out = "install ok installed\t1.2-3" if pkg in installed else ""
            return subprocess.CompletedProcess(argv, 0 if out else 1, out, "")
        if argv[0] == "dpkg-query" and argv[1] == "-S":
            return subprocess.CompletedProcess(argv, 0, "foo: /usr/sbin/foo\n", "")
        if argv[0] == "apt-get":
            installed.update(a for a in argv if a == "foo")
            return subprocess.CompletedProcess(argv, 0, "", "")
        raise AssertionError(argv)

    monkeypatch.setattr(install.subprocess, "run", run)
    monkeypatch.setattr(install.shutil, "which", lambda name: f"/usr/bin/{name}")
    install.debian_package_of.cache_clear()  # answers kept from earlier tests of this process
    install._dpkg_version.cache_clear()
    dpkg = lambda: [c for c in calls if c[0] == "dpkg-query"]  # noqa: E731
    assert install.debian_version("foo") is None
    assert install.debian_version("foo") is None
    assert len(dpkg()) == 1  # the second answer was the kept one
    assert install.debian_package_of("/usr/sbin/foo") == "foo"
    assert install.debian_package_of("/usr/sbin/foo") == "foo"
    assert len(dpkg()) == 2
    install._apt_install(("foo",), io.StringIO())
    assert [c[0] for c in calls].count("apt-get") == 1  # "not installed", as kept, so apt-get ran
    assert install.debian_version("foo") == "1.2-3"  # asked again: the install changed the answer
    assert install.debian_package_of("/usr/sbin/foo") == "foo"
    assert len(dpkg()) == 4
