"""Nebula (Debian `nebula` / `nebula-cert`): Noise IX handshakes, AES-256-GCM data path, one UDP port.

Host 1 is the lighthouse; every host gets a static_host_map entry for every other host's underlay
address, so all tunnels are direct (a real full mesh: the lighthouse relays nothing). Nebula drops
all traffic by default: the config allows any inbound/outbound so the firewall does not skew results
(its conntrack still runs, as in every real deployment).

PKI: the CA lives on host 1 (ca.key 0600). Each host makes its own key pair with `nebula-cert keygen`
(the private key never leaves its host); host 1 signs the public key with the host's 10.77.0.i/24.
Nebula assigns the address from the certificate and the MTU from the config to the tun device itself.
The config is written as JSON, which is valid YAML."""

from __future__ import annotations

import json
from pathlib import Path

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import VpnDriver
from tunnelbench.vpns.install import Apt

LISTEN_PORT = 4242
CIPHERS = {"aes": "AES-256-GCM", "chachapoly": "ChaCha20-Poly1305"}


class Nebula(VpnDriver):
    name = "nebula"
    summary = "Nebula 1.6 full mesh (lighthouse h1, static host map), Noise IX + AES-256-GCM over UDP 4242"
    binaries = ("nebula", "nebula-cert")
    installs = (Apt(("nebula",)),)
    default_mtu = 1300  # nebula's own default tun.mtu
    # relay / nat paths: the relay host is lighthouse and relay (am_relay); the others use it as their
    # relay when no direct tunnel can be made (UDP blocked, or NATs that do not punch)
    paths = frozenset({"direct", "relay", "nat"})

    def __init__(self, spec):
        super().__init__(spec)
        # options: cipher = "aes" (default) | "chachapoly"
        cipher = spec.options.get("cipher", "aes")
        if cipher not in CIPHERS:
            raise ValueError(f"nebula: cipher must be one of {sorted(CIPHERS)}, not {cipher!r}")
        self.settings: dict = {
            "mode": "full mesh, direct UDP tunnels (h1 is also lighthouse)",
            "cipher": CIPHERS[cipher],
            "nebula_cipher": cipher,
            "handshake": "Noise IX, Curve25519",
            "mtu": self.mtu,
            "port": LISTEN_PORT,
            "firewall": "allow any in/out (conntrack on)",
            "routines": 1,
        }

    @classmethod
    def version(cls) -> str:
        # nebula -version prints "Version: 1.6.1"
        return cls._first_line(["nebula", "-version"], "version").split()[-1]

    # -- paths -------------------------------------------------------------------------------------
    def _ca_dir(self) -> Path:
        return self.host_dir(self.spec.hosts[0]) / "ca"

    def _config_path(self, host: Host) -> Path:
        return self.host_dir(host) / "config.yml"

    # -- configure ---------------------------------------------------------------------------------
    def configure(self) -> None:
        hosts = self.spec.hosts
        signer = hosts[0]
        ca = self._ca_dir()
        signer.mkdir(ca)
        signer.run(["nebula-cert", "ca", "-name", f"tunnelbench {self.spec.tag}", "-duration", "720h",
                    "-out-crt", str(ca / "ca.crt"), "-out-key", str(ca / "ca.key")])  # fmt: skip
        signer.run(["chmod", "600", str(ca / "ca.key")])
        ca_crt = signer.read_file(ca / "ca.crt")
        for h in hosts:
            d = self.host_dir(h)
            h.run(["nebula-cert", "keygen", "-out-key", str(d / "host.key"), "-out-pub", str(d / "host.pub")])
            h.run(["chmod", "600", str(d / "host.key")])
            # the signer sees only the public key
            pub_at_ca = ca / f"{h.name}.pub"
            signer.write_file(pub_at_ca, h.read_file(d / "host.pub"), 0o644)
            crt_at_ca = ca / f"{h.name}.crt"
            signer.run(["nebula-cert", "sign", "-ca-crt", str(ca / "ca.crt"), "-ca-key", str(ca / "ca.key"),
                        "-name", h.name, "-ip", f"{self.tunnel_ip(h)}/{self.tunnel_prefixlen}",
                        "-in-pub", str(pub_at_ca), "-out-crt", str(crt_at_ca)])  # fmt: skip
            h.write_file(d / "host.crt", signer.read_file(crt_at_ca), 0o600)
            h.write_file(d / "ca.crt", ca_crt, 0o644)
            h.write_file(self._config_path(h), json.dumps(self._config(h), indent=2) + "\n", 0o600)

    def _config(self, host: Host) -> dict:
        d = self.host_dir(host)
        relayed = self.spec.path != "direct" and self.spec.relay is not None
        lighthouse = self.spec.relay if relayed else self.spec.hosts[0]
        am_lighthouse = host is lighthouse
        anyrule = [{"port": "any", "proto": "any", "host": "any"}]
        return {
            "pki": {"ca": str(d / "ca.crt"), "cert": str(d / "host.crt"), "key": str(d / "host.key")},
            "static_host_map": {
                self.tunnel_ip(p): [f"{p.public_ip}:{LISTEN_PORT}"]
                for p in self.spec.hosts
                if p is not host and not p.behind_nat
            },
            "lighthouse": {
                "am_lighthouse": am_lighthouse,
                "interval": 60,
                "hosts": [] if am_lighthouse else [self.tunnel_ip(lighthouse)],
            },
            "listen": {"host": "0.0.0.0", "port": LISTEN_PORT},
            "punchy": {"punch": True, "respond": True},
            "cipher": self.settings["nebula_cipher"],
            "relay": {
                "am_relay": relayed and am_lighthouse,
                "use_relays": relayed,
                "relays": [self.tunnel_ip(lighthouse)] if relayed and not am_lighthouse else [],
            },
            "tun": {
                "disabled": False,
                "dev": self.ifname(host),
                "drop_local_broadcast": False,
                "drop_multicast": False,
                "tx_queue": 500,
                "mtu": self.mtu,
            },
            "logging": {"level": "info", "format": "text"},
            "firewall": {
                "conntrack": {"tcp_timeout": "12m", "udp_timeout": "3m", "default_timeout": "10m"},
                "outbound": anyrule,
                "inbound": anyrule,
            },
        }

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, host: Host) -> None:
        d = self.host_dir(host)
        proc = host.spawn(["nebula", "-config", str(self._config_path(host))], label="nebula",
                          log_path=d / "daemon.log")  # fmt: skip
        self.procs[host.name].append(proc)
        ifname = self.ifname(host)
        # nebula creates the device and assigns the certificate's address and the MTU itself
        self.wait_for(
            "nebula tun device", lambda: self.link_exists(host, ifname) or not proc.alive(), timeout=10
        )
        if not proc.alive():
            raise RuntimeError(f"nebula exited: {proc.log_tail()}")

    def after_stop(self, host: Host) -> None:
        ifname = self.ifname(host)
        if self.link_exists(host, ifname):
            host.run(["ip", "link", "del", ifname], check=False)
