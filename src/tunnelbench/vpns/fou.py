"""FOU (Foo over UDP) in the kernel: IP in IP carried in UDP, one tunnel per peer; every host listens on
one FOU receive port (`ip fou add port 5555 ipproto 4`) and each tunnel sends to the peer's, from a source
port hashed per flow (`encap-sport auto`, so RSS/ECMP spread flows). Not a VPN: no encryption, no
authentication; 28 bytes of overhead (IPv4 + UDP), as in Gentile et al.'s listing."""

from __future__ import annotations

from typing import ClassVar

from tunnelbench.lab.host import Host
from tunnelbench.vpns.features import kernel_tunnel_record
from tunnelbench.vpns.kernel_tunnel import KernelTunnel


class Fou(KernelTunnel):
    name = "fou"
    summary = "FOU (IP in IP over UDP 5555) in the kernel, one tunnel per peer, no encryption"
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_tunnel_record(("FOU: IP in IP over UDP", "https://lwn.net/Articles/614348/"))
    kernel_features = ("fou",)
    default_mtu = 1472  # 1500 - 20 (IPv4) - 8 (UDP)
    port: ClassVar[int] = 5555
    encap: ClassVar[str] = "fou"
    wire = f"udp dport {port}"

    def fou_args(self) -> list[str]:
        return ["port", str(self.port), "ipproto", "4"]

    def before_links(self, host: Host) -> None:
        # FOU ports are set over generic netlink, which does not load the module on demand
        host.run(["modprobe", "-q", "fou"], check=False)
        host.run(["ip", "fou", "add", *self.fou_args()])

    def link_args(self, host: Host, peer: Host) -> list[str]:
        return [
            "type",
            "ipip",
            "local",
            host.underlay_ip,
            "remote",
            peer.public_ip,
            "ttl",
            "64",
            "encap",
            self.encap,
            "encap-sport",
            "auto",
            "encap-dport",
            str(self.port),
        ]

    def after_links(self, host: Host) -> None:
        if f"port {self.port}" in host.run(["ip", "fou", "show"], check=False).stdout:
            host.run(["ip", "fou", "del", "port", str(self.port)], check=False)

    def leftovers(self, host: Host) -> list[str]:
        found = super().leftovers(host)
        ports = host.run(["ip", "fou", "show"], check=False).stdout.strip()
        if ports:
            found.append(f"fou receive ports: {ports}")
        return found
