"""Drivers' generated configs and keys for a 3-host mesh, without a lab: configure() runs against hosts that
are plain folders on this machine (commands run here, no namespace, nothing started). Each config is parsed
back (YAML/JSON, TOML, tinc's and fastd's formats) and checked for peers, addresses, ports and MTU, and, where
the VPN has a config check of its own (`nebula -test`, `fastd --verify-config`), passed through it; private
keys must be 0600."""

from __future__ import annotations

import json
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from tunnelbench.catalog import DRIVERS
from tunnelbench.lab.host import THIS_MACHINE, Host
from tunnelbench.vpns.base import MeshSpec


class FolderHost(Host):
    """A host that is a folder: commands run on this machine, files go under `workdir`."""

    def __init__(self, i: int, root: Path):
        self.name, self.underlay_ip, self.journal = f"h{i}", f"10.99.0.{i}", None
        self.workdir = root / self.name

    def argv(self, argv):
        return list(argv)


def mesh(name: str, tmp_path: Path, mtu: int | None = None):
    cls = DRIVERS[name]
    a = cls.availability()
    if not a.ok:
        pytest.skip(f"{name}: {a.reason}")
    hosts = [FolderHost(i, tmp_path) for i in (1, 2, 3)]
    d = cls(MeshSpec(hosts=hosts, tag="tbcf00", workdir=tmp_path, mtu=mtu))
    d.configure()
    return d, hosts


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_nebula_config_for_3_hosts_parses_and_passes_nebula_test(tmp_path):
    d, hosts = mesh("nebula", tmp_path, mtu=1380)
    for h in hosts:
        path = d.host_dir(h) / "config.yml"
        conf = json.loads(path.read_text())  # written as JSON, which is YAML
        others = [p for p in hosts if p is not h]
        assert conf["static_host_map"] == {f"10.77.0.{p.name[1]}": [f"{p.underlay_ip}:4242"] for p in others}
        assert conf["listen"]["port"] == 4242 and conf["tun"]["mtu"] == 1380
        assert conf["tun"]["dev"] == f"tbcf00v{h.name[1]}"
        assert conf["pki"]["key"] == str(d.host_dir(h) / "host.key")
        assert mode(d.host_dir(h) / "host.key") == 0o600 and mode(path) == 0o600
        # the certificate nebula-cert signed carries the host's tunnel address
        crt = subprocess.run([THIS_MACHINE.binary("nebula-cert", d.installs), "print", "-json", "-path", conf["pki"]["cert"]],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        cert = json.loads(crt)
        cert = cert[0] if isinstance(cert, list) else cert
        details = cert["details"]
        nets = details.get("networks") or details.get("ips")
        assert nets == [f"10.77.0.{h.name[1]}/24"] and details["name"] == h.name, details
        # nebula's own check: it loads the config, the CA, the certificate and the key, then exits
        r = subprocess.run([THIS_MACHINE.binary("nebula", d.installs), "-test", "-config", str(path)], capture_output=True, text=True,
                           timeout=30)  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
    assert mode(d.host_dir(hosts[0]) / "ca" / "ca.key") == 0o600


def test_fastd_config_for_3_hosts_names_each_peer_key_and_passes_verify_config(tmp_path):
    d, hosts = mesh("fastd", tmp_path, mtu=1400)
    pubs = {}
    for h in hosts:
        secret = d.host_dir(h) / "secret.key.conf"
        assert mode(secret) == 0o600
        pubs[h.name] = subprocess.run([THIS_MACHINE.binary("fastd", d.installs), "--show-key", "--machine-readable", "--config",
                                       str(secret)], capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert len(set(pubs.values())) == 3
    for h in hosts:
        conf = (d.host_dir(h) / "fastd.conf").read_text()
        assert f"bind {h.underlay_ip}:10000;" in conf and "mtu 1400;" in conf
        peers = [line for line in conf.splitlines() if line.startswith("peer ")]
        assert len(peers) == 2
        for p in hosts:
            if p is h:
                assert pubs[h.name] not in conf  # its own public key is not a peer
                continue
            line = next(x for x in peers if x.startswith(f'peer "{p.name}"'))
            assert f'key "{pubs[p.name]}";' in line
        r = subprocess.run([THIS_MACHINE.binary("fastd", d.installs), "--verify-config", "--config", str(d.host_dir(h) / "fastd.conf")],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr


def test_yggdrasil_config_for_3_hosts_parses_back(tmp_path):
    d, hosts = mesh("yggdrasil", tmp_path)
    addrs = set()
    for h in hosts:
        path = d.host_dir(h) / "yggdrasil.conf"
        conf = json.loads(path.read_text())
        assert mode(path) == 0o600  # holds the private key
        assert conf["Listen"] == [f"tcp://{h.underlay_ip}:9001"]
        # every pair is dialled exactly once: a host dials the ones before it
        assert conf["Peers"] == [f"tcp://{p.underlay_ip}:9001" for p in hosts[: int(h.name[1]) - 1]]
        assert conf["IfName"] == f"tbcf00v{h.name[1]}" and conf["AdminListen"] == "none"
        addrs.add(d.tunnel_ip(h))
    assert len(addrs) == 3 and all(a.startswith("2") for a in addrs)  # 200::/7, one per key


def test_easytier_config_for_3_hosts_parses_as_toml(tmp_path):
    d, hosts = mesh("easytier", tmp_path)
    secrets = set()
    for h in hosts:
        path = d.host_dir(h) / "easytier.toml"
        conf = tomllib.loads(path.read_text())
        assert mode(path) == 0o600  # holds the network secret
        assert conf["ipv4"] == f"10.77.0.{h.name[1]}" and conf["hostname"] == h.name
        assert conf["listeners"] == ["udp://0.0.0.0:11010"]
        assert conf["flags"]["dev_name"] == f"tbcf00v{h.name[1]}" and conf["flags"]["enable_encryption"]
        secrets.add(conf["network_identity"]["network_secret"])
        peers = sorted(p["uri"] for p in conf.get("peer", []))
        dialled = [f"udp://{p.underlay_ip}:11010" for p in hosts if p is not h]
        assert set(peers) <= set(dialled)
    assert len(secrets) == 1  # one network
    # every pair is connected from at least one side
    pairs = set()
    for h in hosts:
        for p in tomllib.loads((d.host_dir(h) / "easytier.toml").read_text()).get("peer", []):
            ip = p["uri"].removeprefix("udp://").split(":")[0]
            pairs.add(frozenset((h.underlay_ip, ip)))
    assert len(pairs) == 3


def test_tinc_config_for_3_hosts_carries_every_peer_and_its_key(tmp_path):
    d, hosts = mesh("tinc", tmp_path, mtu=1400)
    own_keys = {}
    for h in hosts:
        conf = d.confdir(h)
        assert mode(conf / "rsa_key.priv") == 0o600
        own_keys[h.name] = (conf / "hosts" / h.name).read_text()
    for h in hosts:
        conf = d.confdir(h)
        main = dict(line.split(" = ", 1) for line in (conf / "tinc.conf").read_text().splitlines())
        assert main["Name"] == h.name and main["Interface"] == f"tbcf00v{h.name[1]}"
        for p in hosts:
            text = (conf / "hosts" / p.name).read_text()
            assert text == own_keys[p.name]  # every host has every peer's own file, key included
            assert f"Address = {p.underlay_ip}\n" in text and "Port = 655\n" in text
            assert f"Subnet = 10.77.0.{p.name[1]}/32\n" in text and "BEGIN RSA PUBLIC KEY" in text
        up = (conf / "tinc-up").read_text()
        assert (
            f"ip addr add 10.77.0.{h.name[1]}/24" in up
            and "mtu 1400" in up
            and mode(conf / "tinc-up") == 0o755
        )
