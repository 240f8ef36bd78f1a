"""VpnCloud 2.3.0 (crates.io `vpncloud`, built into the install cache): a fully meshed peer-to-peer VPN.

Every host runs one vpncloud in tun mode on UDP 3210 and is given the others' addresses (`-c`); peers
exchange their peer lists, so each pair talks directly (full mesh, no hub). Crypto: a shared password
(in a 0600 config file, never on the command line), from which vpncloud derives Ed25519 identities and
runs its own handshake, then AES-256-GCM or ChaCha20-Poly1305 (negotiated, the fastest both support).

Gotchas: with current Rust, `--ip` assigns a wrong address, so the driver assigns the
address and MTU itself and claims it (`--no-auto-claim --claim <ip>/32`); vpncloud UDP-connects to a
public address at start to learn its own IP and panics without a default route, so lab hosts have a
default route into the lab and the router drops (and counts) anything not addressed to the lab. No UPnP
port forwarding (`--no-port-forwarding`).

Paths: direct only. No relay (vpncloud never forwards between peers). Behind NAT (lab path nat), the NATed
peers each reached the public peer but never each other within 60 s, so nat is not claimed (the probe is
recorded in the feature record)."""

from __future__ import annotations

import secrets

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver
from tunnelbench.vpns.features import fact
from tunnelbench.vpns.install import Crate

# documentation pages the feature record cites
VPNCLOUD_GH = "https://github.com/dswd/vpncloud"

VERSION = "2.3.0"
PORT = 3210


class VpnCloud(VpnDriver):
    name = "vpncloud"
    summary = f"VpnCloud full mesh (peer exchange, UDP {PORT}), tun, password-derived keys"
    # the feature record (vpns/features.py): each fact with its source
    features = {
        "protocol": fact("own peer-to-peer protocol over UDP", VPNCLOUD_GH),
        "ciphers": fact("Curve25519 keys; AES-256-GCM / AES-128-GCM / ChaCha20-Poly1305", VPNCLOUD_GH),
        "data_plane": fact("userspace (Rust), TUN or TAP", VPNCLOUD_GH),
        "topology": fact("automatic full mesh, no central server", VPNCLOUD_GH),
        "nat_traversal": fact("hole punching, UPnP port forwarding", VPNCLOUD_GH),
        "relay": fact("none", VPNCLOUD_GH),
        "acl": fact("shared password or trusted public keys", VPNCLOUD_GH),
        "unattended_join": fact("yes (password or key in config)", VPNCLOUD_GH),
        "self_hosted_control": fact("no control plane", VPNCLOUD_GH),
        "platforms": fact("Linux", VPNCLOUD_GH),
        "license": fact("GPL-3.0", "https://docs.rs/crate/vpncloud/2.3.0/source/"),
    }
    binaries = ("vpncloud",)
    installs = (Crate("vpncloud", VERSION, ("vpncloud",)),)
    default_mtu = 1427  # what vpncloud 2.3.0 sets on its tun device itself over a 1500-byte IPv4 underlay
    Options = TunnelOptions  # vpn_options: mtu
    secret_patterns = ("vpncloud.yaml",)  # holds the crypto password
    paths = frozenset({"direct"})
    paths_why = {
        "relay": "vpncloud has no relay: peers never forward traffic for each other",
        # probed: with h1, h2 behind their own NATs and h3 public, h1 <-> h2 never came up within 60 s
        # (each NATed peer only ever connected to h3; vpncloud 2.3.0 did not hole-punch between them)
        "nat": "probed: two peers behind different NATs did not connect to each other within 60 s",
    }

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.settings = {
            "mode": "full mesh via peer exchange",
            "port": PORT,
            "mtu": self.mtu,
            "crypto": "password-derived Ed25519 identity; AES-256-GCM or ChaCha20-Poly1305 (negotiated)",
            "port_forwarding": False,
        }

    @classmethod
    def version(cls, host: Host) -> str:
        return (
            cls._first_line(host, [host.binary("vpncloud", cls.installs), "--version"], "vpncloud")
            .split()[-1]
            .lstrip("v")
        )

    def configure(self) -> None:
        password = secrets.token_urlsafe(24)
        for h in self.spec.hosts:
            h.write_file(self.host_dir(h) / "vpncloud.yaml", f'crypto:\n  password: "{password}"\n', 0o600)

    def start(self, host: Host) -> None:
        d = self.host_dir(host)
        ifname = self.ifname(host)
        peers = [p for p in self.spec.hosts if p is not host and not p.behind_nat]
        argv = [host.binary("vpncloud", self.installs), "--config", str(d / "vpncloud.yaml"), "-t", "tun", "-d", ifname,
                "-l", str(PORT), "--claim", f"{self.tunnel_ip(host)}/32", "--no-auto-claim",
                "--no-port-forwarding", "--log-file", str(d / "vpncloud.log")]  # fmt: skip
        for p in peers:
            argv += ["-c", f"{p.public_ip}:{PORT}"]
        proc = host.spawn(argv, label="vpncloud", log_path=d / "daemon.log")
        self.procs[host.name].append(proc)
        self.wait_for(
            "vpncloud tun device", lambda: not proc.alive() or self.link_exists(host, ifname), timeout=10
        )
        if not proc.alive():
            raise RuntimeError(f"vpncloud exited: {proc.log_tail()}")
        host.run(["ip", "addr", "add", f"{self.tunnel_ip(host)}/{self.tunnel_prefixlen}", "dev", ifname])
        host.run(["ip", "link", "set", ifname, "mtu", str(self.mtu), "up"])
