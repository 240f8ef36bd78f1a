"""The one way a mesh comes up and goes (vpns/session.py): the spec from the lab it runs on with the one merge of
vpn_options, configure before any start, a stop and a verified teardown on the way out even when the block
raises, and the readiness probe's timeout under a delay profile. No lab: a driver that records what it is asked
to do; the references are hand-written option tables and the probe formula worked by hand."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tunnelbench.lab.host import ThisMachine
from tunnelbench.vpns.base import DriverOptions, VpnDriver
from tunnelbench.vpns.session import make_mesh, mesh_session, vpn_options


class NamedHost(ThisMachine):
    def __init__(self, name: str):
        self.name = name


class Recording(VpnDriver):
    """Records configure/start/stop in `calls`; h2 keeps an interface after stop."""

    name = "tbtest-session"
    summary = "test-only driver"
    calls: list[str] = []

    class Options(DriverOptions):
        a: int = 0
        b: int = 0

    @classmethod
    def version(cls, host) -> str:
        return "1.0 (test)"

    def tunnel_ip(self, host) -> str:
        return f"10.0.0.{host.name[1:]}"

    def configure(self) -> None:
        self.calls.append("configure")

    def start(self, host) -> None:
        self.calls.append(f"start {host.name}")

    def stop(self, host) -> None:
        self.calls.append(f"stop {host.name}")

    def leftovers(self, host) -> list[str]:
        return ["interface tbx0"] if host.name == "h2" else []


def lab(tmp_path: Path, relay: bool = False) -> SimpleNamespace:
    hosts = [NamedHost(f"h{i}") for i in (1, 2, 3)]
    return SimpleNamespace(hosts=hosts, tag="tb1234", run_dir=tmp_path, relay=hosts[2] if relay else None)


def test_vpn_options_merge_the_base_name_then_the_version_key_by_key():
    opts = {"nebula": {"cipher": "aes", "mtu": 1300}, "nebula@1.9.0": {"mtu": 1280}, "tinc": {"x": 1}}
    assert vpn_options(opts, "nebula@1.9.0") == {"cipher": "aes", "mtu": 1280}
    assert vpn_options(opts, "nebula") == {"cipher": "aes", "mtu": 1300}
    assert vpn_options(opts, "wireguard-go") == {}


def test_make_mesh_builds_the_spec_from_the_lab_and_merges_the_options(tmp_path):
    cls = type("RecordingAt", (Recording,), {"key": "tbtest-session@2.0"})
    lb = lab(tmp_path, relay=True)
    mesh = make_mesh(
        cls, lb, hosts=lb.hosts[:2], path="relay",
        options={"tbtest-session": {"a": 1, "b": 1}, "tbtest-session@2.0": {"b": 2}},
    )  # fmt: skip
    spec = mesh.driver.spec
    assert (spec.tag, spec.workdir, spec.path) == ("tb1234", tmp_path, "relay")
    assert spec.relay is lb.hosts[2] and [h.name for h in spec.hosts] == ["h1", "h2"]
    assert spec.options == {"a": 1, "b": 2} and mesh.vpn == "tbtest-session@2.0"
    assert (mesh.driver.options.a, mesh.driver.options.b) == (1, 2)


def test_a_mesh_session_configures_first_and_stops_and_verifies_even_when_the_block_raises(tmp_path):
    Recording.calls = []
    out: dict = {}
    with (
        pytest.raises(RuntimeError, match="the sweep point broke"),
        mesh_session(Recording, lab(tmp_path), None, out) as (_mesh, started),
    ):
        assert Recording.calls == ["configure", "start h1", "start h2", "start h3"]
        assert started.waited_s is None and started.start_s >= 0
        raise RuntimeError("the sweep point broke")
    assert Recording.calls[4:] == ["stop h1", "stop h2", "stop h3"]
    assert out == {"leftovers": ["h2: interface tbx0"]}


def test_expect_delay_sets_the_probe_timeout_and_the_extra_wait(tmp_path):
    """delay 50 ms, jitter 10 ms each way: the probe waits 300 + 2 x 2 x (50 + 3 x 10) = 620 ms, and a
    readiness wait gets 4 x (50 + 10) ms = 0.24 s more."""
    mesh = make_mesh(Recording, lab(tmp_path))
    assert mesh.probe_ms == 300
    assert mesh.expect_delay(50, 10) == pytest.approx(0.24)
    assert mesh.probe_ms == 620
