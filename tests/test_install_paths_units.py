"""Unit tests (no lab): install sources and the cache, availability states, path scenario validation."""

from __future__ import annotations

import pytest

from tunnelbench.scenario import ScenarioError, parse_scenario
from tunnelbench.vpns import DRIVERS
from tunnelbench.vpns.impossible import IMPOSSIBLE
from tunnelbench.vpns.install import Crate, GoModule, binary


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
    assert binary("boringtun-cli", (c,)) == str(c.bin_dir() / "boringtun-cli")
    assert binary("no-such-binary-here", (c,)) is None


def test_every_driver_declares_installs_and_paths():
    for name, cls in DRIVERS.items():
        if name == "internal":
            continue
        assert cls.installs, f"{name} declares no install source"
        assert "direct" in cls.paths, name
        assert cls.paths <= {"direct", "relay", "nat"}, name


def test_availability_states_are_explained():
    for name, cls in DRIVERS.items():
        a = cls.availability()
        assert a.state in ("available", "installable", "impossible here")
        if not a.ok:
            assert a.reason, name
        if a.installable:
            assert f"tunnelbench install {name}" in a.reason


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
