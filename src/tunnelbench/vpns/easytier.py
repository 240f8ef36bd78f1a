"""EasyTier 2.0.3 (crates.io `easytier`, `cargo install --locked`, needs Debian protobuf-compiler): a
decentralised mesh VPN in Rust where every node routes and relays for the others.

Each host runs easytier-core from a TOML config (0600: it holds the network secret) with a fixed tunnel
address, its own tun device and MTU, and UDP listeners on 11010. direct: host j dials every host i < j
(a full mesh of direct UDP connections). relay / nat: peers dial only the relay host; the relay host
also listens on TCP. With UDP between peers blocked (relay path), EasyTier's routing carries h1 <-> h2
through the relay host (it relays for any node by default); behind NAT, EasyTier tries UDP hole punching
and relays through the public node until (unless) that works. The RPC portal listens on the namespace's
loopback only. EasyTier sends STUN to hard-coded public servers at start: the lab router drops and
counts that (router.offlab_drops in the run's environment)."""

from __future__ import annotations

import secrets

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver
from tunnelbench.vpns.features import fact
from tunnelbench.vpns.install import Crate

# documentation pages the feature record cites
ET_GH = "https://github.com/EasyTier/EasyTier"
ET_P2P = "https://www.easytier.cn/en/guide/network/p2p-optimize.html"

VERSION = "2.0.3"
PORT = 11010


class EasyTier(VpnDriver):
    name = "easytier"
    summary = f"EasyTier mesh (UDP {PORT}), nodes route and relay for each other, encrypted"
    # the feature record (vpns/features.py): each fact with its source
    features = {
        "protocol": fact("own protocol over UDP/TCP/WebSocket/QUIC/WireGuard transports", ET_GH),
        "ciphers": fact(
            "AES-GCM (default) with a key from the network secret",
            "https://wiki.metacubex.one/en/config/proxies/easytier/",
        ),
        "data_plane": fact("userspace (Rust, tokio), TUN", ET_GH),
        "topology": fact("decentralised mesh; every node routes and relays", ET_GH),
        "nat_traversal": fact("UDP hole punching", ET_P2P),
        "relay": fact("any node relays (UDP or TCP links)", ET_P2P),
        "acl": fact("network name + secret; whitelists for relaying", ET_GH),
        "unattended_join": fact("yes (config file with the network secret)", ET_GH),
        "self_hosted_control": fact("no control plane needed (public or own relay nodes)", ET_GH),
        "platforms": fact("Linux, macOS, Windows (iOS/Android later)", ET_GH),
        "license": fact("LGPL-3.0", ET_GH),
    }
    binaries = ("easytier-core",)
    installs = (
        Crate(
            "easytier",
            VERSION,
            ("easytier-core", "easytier-cli"),
            locked=True,
            apt_build_deps=("protobuf-compiler", "libprotobuf-dev"),
        ),
    )
    # easytier's tun MTU with encryption on: its default `mtu` 1380 minus the 20 bytes it reserves for
    # encryption (it subtracts them from whatever `flags.mtu` says, so the driver sets the MTU itself)
    default_mtu = 1360
    Options = TunnelOptions  # vpn_options: mtu
    secret_patterns = ("easytier.toml",)  # holds the network secret
    paths = frozenset({"direct", "relay", "nat"})

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.settings = {
            "mode": "direct UDP full mesh"
            if spec.path == "direct"
            else "peers dial the relay host; EasyTier routes/relays, hole punching on",
            "port": PORT,
            "mtu": self.mtu,
            "encryption": "on (EasyTier default, key from the network secret)",
            "default_protocol": "udp",
        }

    @classmethod
    def control_host(cls, spec: MeshSpec) -> Host | None:
        """Direct path: none (every node dials the lower-numbered ones; routes spread peer to peer). Path
        relay/nat: the relay host, the one public node every peer dials to find the others."""
        return spec.relay if spec.path != "direct" else None

    @classmethod
    def version(cls, host: Host) -> str:
        # "easytier-core 2.0.3-<git>"
        return cls._first_line(
            host, [host.binary("easytier-core", cls.installs), "--version"], "easytier"
        ).split()[-1]

    def _dials(self, host: Host) -> list[Host]:
        if self.spec.path == "direct" or self.spec.relay is None:
            return [p for p in self.spec.hosts if self.index(p) < self.index(host)]
        return [] if host is self.spec.relay else [self.spec.relay]

    def configure(self) -> None:
        secret = secrets.token_urlsafe(24)
        for h in self.spec.hosts:
            listeners = [f'"udp://0.0.0.0:{PORT}"']
            if h is self.spec.relay:
                listeners.append(f'"tcp://0.0.0.0:{PORT}"')
            conf = [
                f'instance_name = "{self.spec.tag}-{h.name}"',
                f'hostname = "{h.name}"',
                f'ipv4 = "{self.tunnel_ip(h)}"',
                "dhcp = false",
                f"listeners = [{', '.join(listeners)}]",
                "exit_nodes = []",
                'rpc_portal = "127.0.0.1:15888"',
                "",
                "[network_identity]",
                f'network_name = "tb-{self.spec.tag}"',
                f'network_secret = "{secret}"',
                "",
            ]
            for p in self._dials(h):
                conf += ["[[peer]]", f'uri = "udp://{p.public_ip}:{PORT}"', ""]
            conf += [
                "[flags]",
                'default_protocol = "udp"',
                f'dev_name = "{self.ifname(h)}"',
                "enable_encryption = true",
                "enable_ipv6 = false",
            ]
            h.write_file(self.host_dir(h) / "easytier.toml", "\n".join(conf) + "\n", 0o600)

    def start(self, host: Host) -> None:
        d = self.host_dir(host)
        proc = host.spawn(
            [host.binary("easytier-core", self.installs), "-c", str(d / "easytier.toml")],
            label="easytier",
            log_path=d / "daemon.log",
        )
        self.procs[host.name].append(proc)
        ifname = self.ifname(host)

        def addressed() -> bool:
            out = host.run(["ip", "-o", "-4", "addr", "show", "dev", ifname], check=False).stdout
            return not proc.alive() or f" {self.tunnel_ip(host)}/" in out

        self.wait_for("easytier tun address", addressed, timeout=20)
        if not proc.alive():
            raise RuntimeError(f"easytier-core exited: {proc.log_tail()}")
        host.run(["ip", "link", "set", ifname, "mtu", str(self.mtu)])

    def unsettled(self) -> list[str]:
        """Direct path: every node's route to every other must be DIRECT. Pairs answer as soon as any
        route exists, and EasyTier first routes over whichever node connected first (seen in CI: 63% of a
        case's h1 <-> h2 bytes went through h3 until the h2 -> h1 link came up)."""
        if self.spec.path != "direct":
            return []
        out: list[str] = []
        for h in self.spec.hosts:
            res = h.run(
                [h.binary("easytier-cli", self.installs), "-p", "127.0.0.1:15888", "route"],
                check=False,
                timeout=10,
            )
            hops = route_next_hops(res.stdout) if res.returncode == 0 else {}
            for p in self.peers(h):
                hop = hops.get(p.name)
                if hop != "DIRECT":
                    out.append(f"{h.name} -> {p.name} via {hop or 'no route'}")
        return out


def route_next_hops(table: str) -> dict[str, str]:
    """`easytier-cli route`'s box table -> {hostname: next hop}: "DIRECT", a relay's hostname, or "Local"."""
    header: list[str] | None = None
    hops: dict[str, str] = {}
    for line in table.splitlines():
        if "│" not in line:
            continue
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if header is None:
            header = cells
            continue
        row = dict(zip(header, cells, strict=False))
        name, via = row.get("hostname", ""), row.get("next_hop_ipv4", "")
        if name:
            hops[name] = via if via in ("DIRECT", "-") else (row.get("next_hop_hostname") or via)
    return hops
