"""n2n v1 (Debian `n2n` 1.3.x, ntop): a layer-2 peer-to-peer VPN with a supernode.

The supernode (UDP 7654) runs on the relay host when the lab has one (path relay/nat), else on h1; every
host runs an edge (TAP device, fixed MAC, tunnel address) registered with the supernode. Edges learn
each other's public address from the supernode and then send directly (peer to peer); when they cannot
(UDP blocked between them, or both behind NAT), the supernode forwards their packets: that is n2n's relay.
`-r` lets edges forward packets for others. Encryption: n2n v1's Twofish with a shared community key,
passed in the N2N_KEY environment variable (not on the command line, where `ps` would show it); the
key file in the run folder is 0600. Old and unmaintained upstream (v1 protocol), measured as packaged."""

from __future__ import annotations

import secrets

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver
from tunnelbench.vpns.features import fact
from tunnelbench.vpns.install import Apt, debian_version

SUPERNODE_PORT = 7654


class N2n(VpnDriver):
    name = "n2n"
    summary = "n2n v1 (Debian), supernode on the relay host / h1, edges peer to peer, Twofish, TAP"
    # the feature record (vpns/features.py): each fact with its source
    features = {
        "protocol": fact("n2n v1 over UDP, layer 2 (TAP)", "https://www.ntop.org/products/n2n/"),
        "ciphers": fact("Twofish with a shared community key (v1)", "driver: edge -k / N2N_KEY"),
        "data_plane": fact("userspace (C), TAP", "https://www.ntop.org/products/n2n/"),
        "topology": fact("peer to peer edges, supernode for discovery", "https://www.ntop.org/products/n2n/"),
        "nat_traversal": fact(
            "via the supernode (registration keeps NAT mappings)", "https://www.ntop.org/products/n2n/"
        ),
        "relay": fact(
            "supernode forwards when edges cannot reach each other (UDP)",
            "https://www.ntop.org/products/n2n/",
        ),
        "acl": fact("community name + key only", "https://www.ntop.org/products/n2n/"),
        "unattended_join": fact("yes (command line)", "driver"),
        "self_hosted_control": fact("yes (supernode)", "https://www.ntop.org/products/n2n/"),
        "platforms": fact("Linux, BSD, macOS, Windows", "https://www.ntop.org/products/n2n/"),
        "license": fact("GPL-3.0", "https://github.com/ntop/n2n"),
    }
    binaries = ("edge", "supernode")
    installs = (Apt(("n2n",)),)
    default_mtu = 1400  # edge's default -M
    Options = TunnelOptions  # vpn_options: mtu
    paths = frozenset({"direct", "relay", "nat"})

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.super_host = self.control_host(spec)
        self.community = f"tb{spec.tag}"
        self.settings = {
            "mode": "edges peer to peer, supernode relays when direct fails",
            "supernode": self.super_host.name,
            "cipher": "Twofish (n2n v1, shared key)",
            "mtu": self.mtu,
            "supernode_port": SUPERNODE_PORT,
            "packet_forwarding": True,
        }

    @classmethod
    def control_host(cls, spec: MeshSpec) -> Host:
        """The supernode: the relay host when the lab has one, else h1."""
        return spec.relay or spec.hosts[0]

    @classmethod
    def version(cls, host: Host) -> str:
        line = cls._first_line(host, [host.binary("edge", cls.installs), "-h"], "n2n v.")
        v = line.split("n2n v.", 1)[1].split()[0]
        deb = debian_version("n2n")
        return f"{v} (debian {deb})" if deb else v

    def configure(self) -> None:
        self.community_key = secrets.token_hex(16)
        for h in self.spec.hosts:
            h.write_file(self.host_dir(h) / "community.key", self.community_key + "\n", 0o600)

    def mac(self, host: Host) -> str:
        i = self.index(host)
        return f"02:78:00:00:{i // 256:02x}:{i % 256:02x}"

    def start(self, host: Host) -> None:
        d = self.host_dir(host)
        sh = self.super_host
        if not any(p.label == "supernode" and p.alive() for p in self.procs[sh.name]):
            # edges register once at start and then only every minute or so: the supernode comes first,
            # whichever host starts first
            sn = sh.spawn(
                [sh.binary("supernode", self.installs), "-l", str(SUPERNODE_PORT)],
                label="supernode",
                log_path=self.host_dir(sh) / "supernode.log",
            )
            self.procs[sh.name].insert(0, sn)
            self.wait_for(
                "n2n supernode UDP port",
                lambda: (
                    not sn.alive()
                    or bool(sh.run(["ss", "-Hlun", f"sport = :{SUPERNODE_PORT}"], check=False).stdout.strip())
                ),
                timeout=10,
            )
            if not sn.alive():
                raise RuntimeError(f"n2n supernode exited: {sn.log_tail()}")
        ifname = self.ifname(host)
        argv = [host.binary("edge", self.installs), "-d", ifname, "-a", self.tunnel_ip(host), "-s", "255.255.255.0",
                "-c", self.community, "-l", f"{self.super_host.public_ip}:{SUPERNODE_PORT}",
                "-m", self.mac(host), "-M", str(self.mtu), "-r"]  # fmt: skip
        proc = host.spawn(argv, label="edge", log_path=d / "edge.log", env={"N2N_KEY": self.community_key})
        self.procs[host.name].append(proc)

        def addressed() -> bool:
            out = host.run(["ip", "-o", "-4", "addr", "show", "dev", ifname], check=False).stdout
            return not proc.alive() or f" {self.tunnel_ip(host)}/" in out

        self.wait_for("n2n edge tap address", addressed, timeout=10)
        if not proc.alive():
            raise RuntimeError(f"n2n edge exited: {proc.log_tail()}")
