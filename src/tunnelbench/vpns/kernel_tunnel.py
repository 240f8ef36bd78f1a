"""The common shape of the kernel's point-to-point tunnels (GRE, GREtap, IPIP, FOU, GUE, GENEVE, and the
carriers under MACsec and IPsec overlays): a full mesh of one tunnel device per peer.

Host i has one tunnel address 10.77.0.i, put on each of its tunnel devices as `10.77.0.i peer 10.77.0.j`,
so the kernel has a /32 route per peer through that peer's device: traffic to j is encapsulated toward
j's underlay address, directly, with no hub. L2 tunnels (GREtap, GENEVE) get fixed MACs and a permanent
neighbour entry per peer, so no ARP runs over them. Devices are named <tag>k<peer index> (unique per
namespace; the run tag lets `tunnelbench clean` find them). No daemon runs: there is no process to stop,
so teardown deletes the devices and `leftovers()` proves they are gone.

What each kernel needs is probed on the machine that runs the tunnel (lab/kernel.py): the namespace lab's
kernel, or every SSH host's own."""

from __future__ import annotations

from typing import ClassVar

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver
from tunnelbench.vpns.install import Apt


class KernelTunnel(VpnDriver):
    binaries = ("ip",)
    installs = (Apt(("iproute2",)),)
    Options = TunnelOptions  # vpn_options: mtu
    paths = frozenset({"direct"})
    paths_why = {
        "relay": "a kernel tunnel has no relay: it sends straight to each peer's underlay address",
        "nat": "a kernel tunnel has no NAT traversal: peers must reach each other's underlay address",
    }
    # "ip link add NAME type <kind> ..." for L3 tunnels; L2 ones (an Ethernet device) set l2 = True
    l2: ClassVar[bool] = False
    encrypted: ClassVar[bool] = False

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.settings = {
            "mode": "full mesh of point-to-point kernel tunnels (one device per peer)",
            "encapsulation": self.wire,
            "cipher": "none",
            "mtu": self.mtu,
        }

    @classmethod
    def version(cls, host: Host) -> str:
        return f"linux {cls._first_line(host, ['uname', '-r'])}"

    def configure(self) -> None:
        pass

    def link_name(self, host: Host, peer: Host) -> str:
        return f"{self.spec.tag}k{self.index(peer)}"

    def mac(self, host: Host) -> str:
        i = self.index(host)
        return f"02:78:00:00:{i // 256:02x}:{i % 256:02x}"

    def link_args(self, host: Host, peer: Host) -> list[str]:
        """`type <kind> ...` of the device on `host` toward `peer`."""
        raise NotImplementedError

    def before_links(self, host: Host) -> None:  # noqa: B027 (optional hook)
        """Host-wide set-up before the per-peer devices (e.g. a FOU receive port)."""

    def start(self, host: Host) -> None:
        self.before_links(host)
        for peer in self.peers(host):
            self.add_link(host, peer)

    def add_link(self, host: Host, peer: Host) -> str:
        name = self.link_name(host, peer)
        mac = ["address", self.mac(host)] if self.l2 else []
        host.run(["ip", "link", "add", name, *mac, *self.link_args(host, peer)])
        self.address(host, peer, name)
        return name

    def address(self, host: Host, peer: Host, dev: str) -> None:
        host.run(
            ["ip", "addr", "add", self.tunnel_ip(host), "peer", f"{self.tunnel_ip(peer)}/32", "dev", dev]
        )
        host.run(["ip", "link", "set", dev, "mtu", str(self.mtu), "up"])
        if self.l2:
            host.run(
                [
                    "ip",
                    "neigh",
                    "replace",
                    self.tunnel_ip(peer),
                    "lladdr",
                    self.mac(peer),
                    "dev",
                    dev,
                    "nud",
                    "permanent",
                ]
            )

    def after_links(self, host: Host) -> None:  # noqa: B027 (optional hook)
        """Host-wide teardown after the devices are gone."""

    def stop_links(self, host: Host) -> list[str]:
        return [self.link_name(host, peer) for peer in self.peers(host)]

    def after_stop(self, host: Host) -> None:
        super().after_stop(host)
        self.after_links(host)
