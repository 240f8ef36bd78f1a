"""VXLAN (kernel, RFC 7348): the unencrypted overlay baseline. Not a VPN: no encryption, no authentication.

Every host gets a vxlan device (VNI 77, UDP 4789, `nolearning`) with a fixed MAC 02:77:00:00:00:<i>; the
full mesh is static: for every peer one FDB entry maps the peer's MAC to its underlay address (unicast,
no flooding for known hosts), an all-zero FDB entry per peer carries broadcasts by head-end replication,
and a permanent neighbour entry per peer means no ARP is needed at all. So what it measures is the cost
of encapsulation alone (kernel data plane, no crypto): the floor every VPN is compared against."""

from __future__ import annotations

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver
from tunnelbench.vpns.features import fact
from tunnelbench.vpns.install import Apt

VNI = 77
PORT = 4789


class Vxlan(VpnDriver):
    name = "vxlan"
    summary = (
        "VXLAN in the kernel, static full mesh (FDB + neighbour entries), no encryption: overlay baseline"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = {
        "protocol": fact("VXLAN (RFC 7348), UDP 4789", "https://www.rfc-editor.org/rfc/rfc7348"),
        "ciphers": fact("none (no encryption, no authentication)", "https://www.rfc-editor.org/rfc/rfc7348"),
        "data_plane": fact("kernel", "https://docs.kernel.org/networking/vxlan.html"),
        "topology": fact("static full mesh (FDB entries)", "driver: bridge fdb per peer"),
        "nat_traversal": fact("none", "https://www.rfc-editor.org/rfc/rfc7348"),
        "relay": fact("none", "https://www.rfc-editor.org/rfc/rfc7348"),
        "acl": fact("none", "https://www.rfc-editor.org/rfc/rfc7348"),
        "unattended_join": fact("static", "driver"),
        "self_hosted_control": fact("no control plane", "driver"),
        "platforms": fact("Linux, BSD, most switches", "https://docs.kernel.org/networking/vxlan.html"),
        "license": fact("GPL-2.0 (Linux)", "https://docs.kernel.org/networking/vxlan.html"),
    }
    binaries = ("ip", "bridge")
    installs = (Apt(("iproute2",)),)
    kernel_features = ("vxlan",)
    wire = f"udp dport {PORT}"
    default_mtu = 1450  # 1500 - 50 bytes of VXLAN/UDP/IPv4/Ethernet
    Options = TunnelOptions  # vpn_options: mtu
    paths = frozenset({"direct"})
    paths_why = {
        "relay": "VXLAN has no relay: it sends UDP 4789 straight to each peer",
        "nat": "VXLAN has no NAT traversal: peers must reach each other's underlay address",
    }

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.settings = {
            "mode": "static full mesh (FDB + permanent neighbours)",
            "vni": VNI,
            "port": PORT,
            "cipher": "none",
            "mtu": self.mtu,
        }

    @classmethod
    def version(cls, host: Host) -> str:
        return f"linux {cls._first_line(host, ['uname', '-r'])}"

    def mac(self, host: Host) -> str:
        i = self.index(host)
        return f"02:77:00:00:{i // 256:02x}:{i % 256:02x}"

    def configure(self) -> None:
        pass

    def start(self, host: Host) -> None:
        ifname = self.ifname(host)
        if host.journal:
            self._link_entry = host.journal.add(
                {"kind": "link", "netns": getattr(host, "netns", ""), "name": ifname}
            )
        host.run(
            [
                "ip",
                "link",
                "add",
                ifname,
                "address",
                self.mac(host),
                "type",
                "vxlan",
                "id",
                str(VNI),
                "dstport",
                str(PORT),
                "local",
                host.underlay_ip,
                "nolearning",
            ]
        )
        for peer in self.spec.hosts:
            if peer is host:
                continue
            host.run(["bridge", "fdb", "append", "00:00:00:00:00:00", "dev", ifname, "dst", peer.public_ip])
            host.run(["bridge", "fdb", "add", self.mac(peer), "dev", ifname, "dst", peer.public_ip])
        host.run(["ip", "addr", "add", f"{self.tunnel_ip(host)}/{self.tunnel_prefixlen}", "dev", ifname])
        host.run(["ip", "link", "set", ifname, "mtu", str(self.mtu), "up"])
        for peer in self.spec.hosts:
            if peer is not host:
                host.run(
                    [
                        "ip",
                        "neigh",
                        "replace",
                        self.tunnel_ip(peer),
                        "lladdr",
                        self.mac(peer),
                        "dev",
                        ifname,
                        "nud",
                        "permanent",
                    ]
                )

    def after_stop(self, host: Host) -> None:
        super().after_stop(host)
        if host.journal:
            name = self.ifname(host)
            host.journal.release({"kind": "link", "netns": getattr(host, "netns", ""), "name": name})
