"""Nebula (`nebula` / `nebula-cert`): Noise IX handshakes, AES-256-GCM data path, one UDP port.

Builds: by default v1.11.1 from the Go module proxy, built into the install cache (1.12.0 needs go >= 1.27.3,
1.11.2 a dependency the proxy refuses); `nebula@debian` runs Debian 12's 1.6.1; `nebula@X.Y.Z` any other
release (`tunnelbench install nebula@X.Y.Z`). The one difference the driver handles between them: since
1.10 `nebula-cert sign` takes the certificate's address as `-networks` (`-ip` is deprecated); older ones
only know `-ip`. Which flag a build takes is read from its `nebula-cert sign -h`. The config below is
accepted unchanged by 1.6 to 1.11.

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
from typing import Literal

from pydantic import Field

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import TunnelOptions, VpnDriver, udp_socket_buffer
from tunnelbench.vpns.install import Apt, GoModule

LISTEN_PORT = 4242
CIPHERS = {"aes": "AES-256-GCM", "chachapoly": "ChaCha20-Poly1305"}
GO = GoModule("nebula", "github.com/slackhq/nebula", "v1.11.1",
              ("github.com/slackhq/nebula/cmd/nebula", "github.com/slackhq/nebula/cmd/nebula-cert"),
              ("nebula", "nebula-cert"))  # fmt: skip


class Nebula(VpnDriver):
    name = "nebula"
    summary = "Nebula full mesh (lighthouse h1, static host map), Noise IX + AES-256-GCM over UDP 4242"
    binaries = ("nebula", "nebula-cert")
    installs = (GO,)
    debian_installs = (Apt(("nebula",), ("nebula", "nebula-cert")),)
    default_mtu = 1300  # nebula's own default tun.mtu
    # relay / nat paths: the relay host is lighthouse and relay (am_relay); the others use it as their
    # relay when no direct tunnel can be made (UDP blocked, or NATs that do not punch)
    paths = frozenset({"direct", "relay", "nat"})

    class Options(TunnelOptions):
        routines: int = Field(1, ge=1, le=256, description="top-level `routines`: tun/UDP reader pairs "
                              "(> 1: a multi-queue tun and SO_REUSEPORT sockets; Linux only)")  # fmt: skip
        cipher: Literal["aes", "chachapoly"] = Field(
            "aes", description="top-level `cipher`: aes = AES-256-GCM, chachapoly = ChaCha20-Poly1305"
        )
        udp_socket_buffer: int | None = udp_socket_buffer(
            "listen.read_buffer and listen.write_buffer (set with SO_RCVBUFFORCE/SO_SNDBUFFORCE, "
            "so net.core.rmem_max/wmem_max do not cap them)"
        )

    def __init__(self, spec):
        super().__init__(spec)
        cipher = self.options.cipher
        self.settings: dict = {
            "mode": "full mesh, direct UDP tunnels (h1 is also lighthouse)",
            "cipher": CIPHERS[cipher],
            "nebula_cipher": cipher,
            "handshake": "Noise IX, Curve25519",
            "mtu": self.mtu,
            "port": LISTEN_PORT,
            "firewall": "allow any in/out (conntrack on)",
            "routines": self.options.routines,
            "udp_socket_buffer": self.options.udp_socket_buffer or "OS default",
        }

    @classmethod
    def version(cls) -> str:
        # nebula -version prints "Version: 1.6.1"; a `go install` build of 1.9 and older prints "Version: " (its
        # version comes from release ldflags): "", and availability() takes the cache build's pinned version
        return cls._first_line([cls.bin("nebula"), "-version"], "version").partition(":")[2].strip()

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
        cert = self.bin("nebula-cert")
        # the certificate's address: -networks since 1.10 (-ip deprecated there), -ip before
        sign_help = signer.run([cert, "sign", "-h"], check=False)
        ip_flag = "-networks" if "-networks" in sign_help.stdout + sign_help.stderr else "-ip"
        self.settings["cert_address_flag"] = ip_flag
        signer.run([cert, "ca", "-name", f"tunnelbench {self.spec.tag}", "-duration", "720h",
                    "-out-crt", str(ca / "ca.crt"), "-out-key", str(ca / "ca.key")])  # fmt: skip
        signer.run(["chmod", "600", str(ca / "ca.key")])
        ca_crt = signer.read_file(ca / "ca.crt")
        for h in hosts:
            d = self.host_dir(h)
            h.run([cert, "keygen", "-out-key", str(d / "host.key"), "-out-pub", str(d / "host.pub")])
            h.run(["chmod", "600", str(d / "host.key")])
            # the signer sees only the public key
            pub_at_ca = ca / f"{h.name}.pub"
            signer.write_file(pub_at_ca, h.read_file(d / "host.pub"), 0o644)
            crt_at_ca = ca / f"{h.name}.crt"
            signer.run([cert, "sign", "-ca-crt", str(ca / "ca.crt"), "-ca-key", str(ca / "ca.key"),
                        "-name", h.name, ip_flag, f"{self.tunnel_ip(h)}/{self.tunnel_prefixlen}",
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
        listen: dict = {"host": "0.0.0.0", "port": LISTEN_PORT}
        if self.options.udp_socket_buffer:
            listen["read_buffer"] = listen["write_buffer"] = self.options.udp_socket_buffer
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
            "listen": listen,
            "routines": self.options.routines,
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
        proc = host.spawn([self.bin("nebula"), "-config", str(self._config_path(host))], label="nebula",
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
