"""Yggdrasil: an end-to-end encrypted IPv6 overlay with its own routing (a spanning tree plus greedy
routing on Ed25519 keys).

Builds: by default v0.5.10 from the Go module proxy, built inside its module so its go.sum vouches for
its dependencies (`go install ...@v0.5.10` fails: the checksum database answers 404 for its
github.com/Arceliar/ironwood version), with the version stamped in; v0.5.11 to v0.5.14 need
suah.dev/protect v1.2.4, which the proxy refuses (403); v0.5.8 and v0.5.9 are unknown to the checksum
database (404). `yggdrasil@debian` runs Debian 12's 0.4.7 (it reports "unknown": its version is the
package's). 0.4 and 0.5 both generate their config with `-genconf -json`, and the driver only overrides
keys both read (0.5.10 no longer writes AdminListen into a generated config but still reads it).

Addresses: each node's tunnel address is derived from its key, inside 200::/7 (IPv6 only), so tunnel_ip
is an IPv6 address read back with `yggdrasil -useconffile CONF -address` after key generation.

Links: TCP on port 9001 (Yggdrasil has no UDP transport in 0.5 except QUIC, which is not used here).
direct: every host listens and host j dials every host i < j, so each pair has a direct link.
relay / nat: peers dial only the relay host, so every packet between two peers crosses it (Yggdrasil
routes through the node both are linked to); behind NAT this is also the only way in.
A node that dials before the listener is up retries only after ~60 s, so start() returns only once the
host's own listener accepts connections (hosts start in order). AdminListen is "none" (no admin socket
in /var/run), multicast discovery is off (no LAN peering outside the configured links). The private key
is in the config file (0600)."""

from __future__ import annotations

import json
from pathlib import Path

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver
from tunnelbench.vpns.features import fact
from tunnelbench.vpns.install import Apt, GoModule

# documentation pages the feature record cites
YGG = "https://yggdrasil-network.github.io/"

PORT = 9001
_VERSION_PKG = "github.com/yggdrasil-network/yggdrasil-go/src/version"
GO = GoModule(
    "yggdrasil",
    "github.com/yggdrasil-network/yggdrasil-go",
    "v0.5.10",
    (
        "github.com/yggdrasil-network/yggdrasil-go/cmd/yggdrasil",
        "github.com/yggdrasil-network/yggdrasil-go/cmd/yggdrasilctl",
    ),
    ("yggdrasil", "yggdrasilctl"),
    build_in_module=True,
    ldflags=f"-X {_VERSION_PKG}.buildName=yggdrasil -X {_VERSION_PKG}.buildVersion={{version}}",
)


class Yggdrasil(VpnDriver):
    name = "yggdrasil"
    summary = "Yggdrasil IPv6 overlay (200::/7), direct TCP links between every pair (relay/nat: via the relay host)"
    # the feature record (vpns/features.py): each fact with its source
    features = {
        "protocol": fact(
            "own routing protocol (spanning tree + greedy routing) over TCP/TLS/QUIC links", YGG
        ),
        "ciphers": fact("Ed25519 node keys, end-to-end encrypted sessions", YGG),
        "data_plane": fact(
            "userspace (Go), TUN, IPv6 200::/7 only", "https://pkg.go.dev/github.com/vikulin/yggdrasil-go"
        ),
        "topology": fact("self-arranging mesh over configured peerings", YGG),
        "nat_traversal": fact("outbound peerings to a reachable node (no hole punching)", YGG),
        "relay": fact("every node routes for others (TCP links)", YGG),
        "acl": fact("AllowedPublicKeys for incoming peerings only", YGG),
        "unattended_join": fact("yes (generated config)", YGG),
        "self_hosted_control": fact("no control plane", YGG),
        "platforms": fact(
            "Linux, macOS, Windows, BSD, OpenWrt", "https://pkg.go.dev/github.com/vikulin/yggdrasil-go"
        ),
        "license": fact("LGPL-3.0", "https://openwrt.org/packages/pkgdata/yggdrasil"),
    }
    binaries = ("yggdrasil",)
    installs = (GO,)
    debian_installs = (Apt(("yggdrasil",), ("yggdrasil",)),)
    default_mtu = 65535  # Yggdrasil's default IfMTU
    Options = TunnelOptions  # vpn_options: mtu
    secret_patterns = ("yggdrasil.conf",)  # holds PrivateKey
    paths = frozenset({"direct", "relay", "nat"})

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.addrs: dict[str, str] = {}
        self.settings = {
            "mode": "direct TCP link per pair"
            if spec.path == "direct"
            else "every peer linked to the relay host",
            "links": f"tcp:{PORT}",
            "crypto": "Ed25519 keys, end-to-end sessions (X25519 + XSalsa20-Poly1305 / ChaCha20-Poly1305)",
            "mtu": self.mtu,
            "multicast": False,
        }

    @classmethod
    def version(cls, host: Host) -> str:
        # "Build version: 0.5.10" (stamped by the install); unstamped builds (Debian's, a plain `go install`)
        # say "unknown": availability() then takes the cache key's or the Debian package's version
        return cls._first_line(host, [host.binary("yggdrasil", cls.installs), "-version"], "version").split()[
            -1
        ]

    def tunnel_ip(self, host: Host) -> str:
        return self.addrs[host.name]

    def _conf(self, host: Host) -> Path:
        return self.host_dir(host) / "yggdrasil.conf"

    def _dials(self, host: Host) -> list[Host]:
        if self.spec.path == "direct" or self.spec.relay is None:
            return [p for p in self.spec.hosts if self.index(p) < self.index(host)]
        return [] if host is self.spec.relay else [self.spec.relay]

    def configure(self) -> None:
        for h in self.spec.hosts:
            conf = json.loads(h.run([h.binary("yggdrasil", self.installs), "-genconf", "-json"]).stdout)
            listen = not h.behind_nat and (self.spec.path == "direct" or h is self.spec.relay)
            conf.update(
                {
                    "Listen": [f"tcp://{h.underlay_ip}:{PORT}"] if listen else [],
                    "Peers": [f"tcp://{p.public_ip}:{PORT}" for p in self._dials(h)],
                    "AdminListen": "none",
                    "MulticastInterfaces": [],
                    "IfName": self.ifname(h),
                    "IfMTU": self.mtu,
                    "NodeInfoPrivacy": True,
                }
            )
            h.write_file(self._conf(h), json.dumps(conf, indent=2) + "\n", 0o600)
            self.addrs[h.name] = h.run(
                [h.binary("yggdrasil", self.installs), "-useconffile", str(self._conf(h)), "-address"]
            ).stdout.strip()

    def start(self, host: Host) -> None:
        if any(p.alive() for p in self.procs[host.name]):
            return  # already started ahead of its turn (the relay host, below)
        relay = self.spec.relay
        if relay is not None and self.spec.path != "direct" and host is not relay:
            self.start(relay)  # everyone dials it: its listener must be up first (else a 60 s retry)
        d = self.host_dir(host)
        proc = host.spawn([host.binary("yggdrasil", self.installs), "-useconffile", str(self._conf(host)), "-logto", "stdout"],
                          label="yggdrasil", log_path=d / "daemon.log")  # fmt: skip
        self.procs[host.name].append(proc)
        ifname = self.ifname(host)
        listens = bool(json.loads(host.read_file(self._conf(host)))["Listen"])

        def ready() -> bool:
            if not proc.alive():
                return True
            if f" {self.addrs[host.name]}/" not in host.run(["ip", "-o", "-6", "addr", "show", "dev", ifname],
                                                            check=False).stdout:  # fmt: skip
                return False
            return not listens or bool(
                host.run(["ss", "-Hltn", f"sport = :{PORT}"], check=False).stdout.strip()
            )

        self.wait_for("yggdrasil tun address and listener", ready, timeout=30)
        if not proc.alive():
            raise RuntimeError(f"yggdrasil exited: {proc.log_tail()}")
