"""Driver options (vpn_options.<vpn>): typed per driver, refused at scenario load, recorded in settings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tunnelbench.catalog import DRIVERS
from tunnelbench.lab.host import THIS_MACHINE, Host
from tunnelbench.scenario import ScenarioError, parse_scenario
from tunnelbench.vpns.base import DriverOptions, MeshSpec, OptionsError, TunnelOptions
from tunnelbench.vpns.mesh import Mesh
from tunnelbench.vpns.nebula import Nebula
from tunnelbench.vpns.openvpn import OpenVpn
from tunnelbench.vpns.strongswan import StrongSwan
from tunnelbench.vpns.tinc import Tinc
from tunnelbench.vpns.wireguard_go import IFF_VNET_HDR, TUN_FD_HELPER, WireguardGo


class FakeHost(Host):
    """A host that runs nothing remote: commands run here, files land under workdir."""

    def __init__(self, name: str, ip: str, workdir: Path):
        self.name, self.underlay_ip, self.workdir, self.journal = name, ip, workdir, None

    def argv(self, argv):
        return list(argv)


def hosts(tmp_path: Path, n: int = 3) -> list[Host]:
    return [FakeHost(f"h{i}", f"10.100.{i}.2", tmp_path / f"h{i}") for i in range(1, n + 1)]


def spec(tmp_path: Path, **kw) -> MeshSpec:
    return MeshSpec(hosts=hosts(tmp_path), tag="tbopt", workdir=tmp_path, **kw)


def load(vpn_options: dict) -> None:
    parse_scenario(
        {"vpns": ["internal"], "workloads": [{"name": "tcp"}], "vpn_options": vpn_options}, "t.toml"
    )


# -- refused at load time, the field named ----------------------------------------------------------
def test_bad_value_is_refused_at_load_with_the_field_named():
    with pytest.raises(ScenarioError) as e:
        load({"nebula": {"routines": 0}})
    assert "vpn_options.nebula.routines: Input should be greater than or equal to 1 (got 0)" in str(e.value)
    with pytest.raises(ScenarioError) as e:
        load({"openvpn": {"cipher": "BF-CBC"}})
    assert "vpn_options.openvpn.cipher:" in str(e.value) and "'BF-CBC'" in str(e.value)
    with pytest.raises(ScenarioError) as e:
        load({"wireguard-go": {"mtu": 500}})
    assert "vpn_options.wireguard-go.mtu: Input should be greater than or equal to 1280 (got 500)" in str(
        e.value
    )


def test_unknown_key_is_refused_at_load_with_a_hint_and_the_allowed_keys():
    with pytest.raises(ScenarioError) as e:
        load({"nebula": {"routnes": 4}})
    msg = str(e.value)
    assert "vpn_options.nebula.routnes: unknown option (did you mean 'routines'?)" in msg
    assert "allowed: mtu, routines, cipher, udp_socket_buffer" in msg
    with pytest.raises(ScenarioError) as e:
        load({"internal": {"mtu": 1400}})
    assert "vpn_options.internal.mtu: unknown option; allowed: none (internal has no options)" in str(e.value)


def test_versioned_vpn_names_are_validated_against_their_driver():
    load({"nebula@1.6.1": {"routines": 2}})
    with pytest.raises(ScenarioError) as e:
        load({"nebula@1.6.1": {"routines": "many"}})
    assert "vpn_options.nebula@1.6.1.routines:" in str(e.value)
    with pytest.raises(ScenarioError, match="options for 'nebul@1.6.1': unknown VPN 'nebul'"):
        load({"nebul@1.6.1": {}})
    # a version listed in `vpns` inherits the base name's options: a bad one is reported once
    with pytest.raises(ScenarioError) as e:
        parse_scenario(
            {
                "vpns": ["nebula@1.6.1"],
                "workloads": [{"name": "tcp"}],
                "vpn_options": {"nebula": {"routines": 0}},
            },
            "t.toml",
        )
    assert str(e.value).count("routines") == 1 and "vpn_options.nebula.routines" in str(e.value)


def test_every_problem_is_listed():
    with pytest.raises(ScenarioError) as e:
        load({"nebula": {"routines": 0, "cipher": "des"}, "tinc": {"tinc_meta": "ring"}})
    msg = str(e.value)
    assert "vpn_options.nebula.routines" in msg and "vpn_options.nebula.cipher" in msg
    assert "vpn_options.tinc.tinc_meta" in msg


# -- each driver's default model validates --------------------------------------------------------
@pytest.mark.parametrize("vpn", sorted(DRIVERS))
def test_default_options_validate(vpn):
    cls = DRIVERS[vpn]
    assert issubclass(cls.Options, DriverOptions)
    opts = cls.Options.model_validate({})
    load({vpn: {}})
    # every driver that sets a tunnel MTU takes the common `mtu` option
    assert isinstance(opts, TunnelOptions) == (cls.default_mtu is not None)


def test_option_defaults():
    assert Nebula.Options().model_dump() == {
        "mtu": None,
        "routines": None,  # half the host's CPUs (nproc), at least 1
        "cipher": "aes",
        "udp_socket_buffer": None,
        "acl": "off",  # vpns/acl.py: no policy unless asked
    }
    assert Tinc.Options().model_dump() == {
        "mtu": None,
        "cipher": "blowfish",
        "digest": "sha1",
        "tinc_meta": "star",
        "udp_socket_buffer": None,
    }
    assert OpenVpn.Options().model_dump() == {"mtu": None, "cipher": "AES-256-GCM", "udp_socket_buffer": None}
    assert WireguardGo.Options().model_dump() == {"mtu": None, "offloads": True}
    assert StrongSwan.Options().model_dump() == {"mtu": None, "esp": "userspace"}
    # boringtun reuses wireguard-go's mesh but not its offloads switch
    assert "offloads" not in DRIVERS["boringtun"].Options.model_fields


# -- drivers read typed values; what ran is recorded ----------------------------------------------
def test_nebula_routines_reach_the_config_and_settings(tmp_path):
    d = Nebula(spec(tmp_path, options={"routines": 4, "udp_socket_buffer": 8_388_608}))
    assert d.options.routines == 4
    cfg = d._config(d.spec.hosts[1])
    assert cfg["routines"] == 4  # nebula reads `routines` at the top level
    assert cfg["listen"]["read_buffer"] == cfg["listen"]["write_buffer"] == 8_388_608
    assert d.settings["routines"] == 4
    assert d.settings["options"] == {
        "mtu": None,
        "routines": 4,
        "cipher": "aes",
        "udp_socket_buffer": 8_388_608,
        "acl": "off",
    }


class CpuHost(FakeHost):
    """A fake host whose `nproc` answers a given CPU count."""

    def __init__(self, name: str, ip: str, workdir: Path, cpus: int):
        super().__init__(name, ip, workdir)
        self.cpus_seen = cpus

    def argv(self, argv):
        return ["echo", str(self.cpus_seen)] if list(argv) == ["nproc"] else list(argv)


@pytest.mark.parametrize(("cpus", "routines"), [(1, 1), (2, 1), (3, 1), (8, 4), (16, 8)])
def test_nebula_routines_default_to_half_the_hosts_cpus(tmp_path, cpus, routines):
    # nebula's docs: "The maximum recommended setting is half of the available CPU cores"
    hs = [CpuHost(f"h{i}", f"10.100.{i}.2", tmp_path / f"h{i}", cpus) for i in (1, 2)]
    d = Nebula(MeshSpec(hosts=hs, tag="tbopt", workdir=tmp_path))
    assert d.settings["routines"].startswith("auto: half the host's CPUs")
    cfg = d._config(hs[1])
    assert cfg["routines"] == d.routines(hs[1]) == routines
    # the other multi-core knobs at the authors' values (1.11.1 examples/config.yml)
    assert cfg["listen"]["batch"] == 64 and cfg["tun"]["tx_queue"] == 500
    assert d.settings["listen_batch"] == 64 and d.settings["tx_queue"] == 500
    # an explicit value wins
    d = Nebula(MeshSpec(hosts=hs, tag="tbopt", workdir=tmp_path, options={"routines": 3}))
    assert d._config(hs[0])["routines"] == 3 and d.settings["routines"] == 3


@pytest.mark.skipif(shutil.which("nebula-cert") is None, reason="nebula-cert not installed")
def test_nebula_routines_in_the_written_config_file(tmp_path):
    d = Nebula(spec(tmp_path, options={"routines": 4}))
    d.configure()  # nebula-cert needs no root; configs land under the fake hosts' workdirs
    for h in d.spec.hosts:
        written = json.loads(d._config_path(h).read_text())
        assert written["routines"] == 4 and written["cipher"] == "aes"


def test_driver_validates_options_itself(tmp_path):
    with pytest.raises(OptionsError) as e:
        Nebula(spec(tmp_path, options={"routines": 0}))
    assert e.value.problems == ["routines: Input should be greater than or equal to 1 (got 0)"]
    with pytest.raises(OptionsError, match="unknown option"):
        Tinc(spec(tmp_path, options={"meta": "full"}))


def test_defaults_are_recorded_in_settings(tmp_path):
    for cls in (Nebula, Tinc, OpenVpn, StrongSwan, WireguardGo):
        d = cls(spec(tmp_path))
        assert d.settings["options"] == cls.Options().model_dump(mode="json"), cls.name


def test_mtu_option_overrides_the_common_mtu_and_the_default(tmp_path):
    assert Nebula(spec(tmp_path)).mtu == 1300  # the driver's default
    assert Nebula(spec(tmp_path, mtu=1380)).mtu == 1380  # fairness.tunnel_mtu
    d = Nebula(spec(tmp_path, mtu=1380, options={"mtu": 1400}))
    assert d.mtu == 1400 and d.settings["mtu"] == 1400
    assert d._config(d.spec.hosts[0])["tun"]["mtu"] == 1400


def test_tinc_cipher_digest_and_buffers(tmp_path):
    d = Tinc(spec(tmp_path, options={"cipher": "aes"}))
    assert (d.settings["cipher"], d.settings["digest"]) == ("aes-256-cbc", "sha256")
    d = Tinc(spec(tmp_path, options={"cipher": "aes", "digest": "sha512", "tinc_meta": "full"}))
    assert (d.settings["cipher"], d.settings["digest"], d.meta) == ("aes-256-cbc", "sha512", "full")
    d = Tinc(
        spec(tmp_path, options={"cipher": "chacha20", "digest": "sha256", "udp_socket_buffer": 4_194_304})
    )
    assert (d.settings["cipher"], d.settings["digest"]) == ("chacha20", "sha256")
    assert d._buffer_keys() == ("UDPRcvBuf", "UDPSndBuf")


def test_openvpn_cipher_and_socket_buffers_reach_the_command_line(tmp_path):
    d = OpenVpn(spec(tmp_path, options={"cipher": "CHACHA20-POLY1305", "udp_socket_buffer": 4_194_304}))
    h1, h2 = d.spec.hosts[:2]
    argv = d._argv(h1, h2, 0, True)
    assert argv[argv.index("--data-ciphers") + 1] == "CHACHA20-POLY1305"
    assert argv[argv.index("--cipher") + 1] == "CHACHA20-POLY1305"
    assert argv[argv.index("--sndbuf") + 1] == argv[argv.index("--rcvbuf") + 1] == "4194304"
    assert d.settings["cipher"] == "CHACHA20-POLY1305"
    assert "--sndbuf" not in OpenVpn(spec(tmp_path))._argv(h1, h2, 0, True)


def test_wireguard_go_without_offloads_starts_through_the_tun_fd_helper(tmp_path, monkeypatch):
    d = WireguardGo(spec(tmp_path, options={"offloads": False}))
    h = d.spec.hosts[0]
    spawned = []
    monkeypatch.setattr(h, "spawn", lambda argv, **kw: spawned.append(list(argv)), raising=False)
    monkeypatch.setattr(d, "_has_offloads", lambda host: True)
    d._spawn_daemon(h, "tboptv1", tmp_path)
    argv = spawned[0]
    assert argv[1:4] == ["-c", TUN_FD_HELPER, "tboptv1"]
    assert argv[4:] == [THIS_MACHINE.binary("wireguard-go", d.installs), "-f", "tboptv1"]
    # a build without offloads (Debian's 0.0.20220316) is started as is
    monkeypatch.setattr(d, "_has_offloads", lambda host: False)
    d._spawn_daemon(h, "tboptv1", tmp_path)
    assert spawned[1] == [THIS_MACHINE.binary("wireguard-go", d.installs), "-f", "tboptv1"]


# -- the offloads switch takes effect (root) -----------------------------------------------------
def _tun_tx(host: Host, ifname: str) -> tuple[int, int]:
    s = json.loads(host.run(["ip", "-j", "-s", "link", "show", ifname]).stdout)[0]["stats64"]["tx"]
    return s["bytes"], s["packets"]


@pytest.mark.lab
@pytest.mark.parametrize("offloads", [True, False])
def test_wireguard_go_offloads_switch_takes_effect(offloads, lab_factory):
    """IFF_VNET_HDR on the TUN, and the size of what the kernel hands wireguard-go: TSO super-packets
    (avg far above the MTU) only with offloads on a build that has them."""
    avail = WireguardGo.availability()
    if not avail.ok:
        pytest.skip(avail.reason)
    lab = lab_factory(2)
    d = WireguardGo(
        MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir, options={"offloads": offloads})
    )
    h1, h2 = lab.hosts
    capable = d._has_offloads(h1)
    if offloads and not capable:
        pytest.skip(f"this wireguard-go build ({avail.version}) has no offloads")
    d.configure()
    mesh = Mesh(d)
    try:
        mesh.start()
        mesh.wait_ready(30)
        ifname = d.ifname(h1)
        flags = int(h1.run(["cat", f"/sys/class/net/{ifname}/tun_flags"]).stdout, 16)
        assert bool(flags & IFF_VNET_HDR) == offloads
        assert d.settings["tun_vnet_hdr"] == {"h1": offloads, "h2": offloads}
        srv = h2.spawn(["iperf3", "-s", "-1"], label="iperf3-server", log_path=None)
        h1.run(["sleep", "0.3"])
        b0, p0 = _tun_tx(h1, ifname)
        h1.run(["iperf3", "-c", d.tunnel_ip(h2), "-t", "2"], timeout=30)
        b1, p1 = _tun_tx(h1, ifname)
        srv.wait(5)
        avg = (b1 - b0) / max(1, p1 - p0)
        if offloads:
            assert avg > 2 * d.mtu, f"no TSO super-packets reached wireguard-go (avg {avg:.0f} B)"
        else:
            assert avg <= d.mtu, f"TSO super-packets reached wireguard-go with offloads off (avg {avg:.0f} B)"
    finally:
        mesh.stop()
    assert mesh.leftovers() == []
