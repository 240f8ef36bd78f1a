"""IP in IP (RFC 2003) in the kernel, one tunnel per peer: the smallest encapsulation there is (20 bytes:
one more IPv4 header). Not a VPN: no encryption, no authentication."""

from __future__ import annotations

from tunnelbench.lab.host import Host
from tunnelbench.vpns.features import kernel_tunnel_record
from tunnelbench.vpns.kernel_tunnel import KernelTunnel


class Ipip(KernelTunnel):
    name = "ipip"
    summary = "IP in IP in the kernel, one tunnel per peer, no encryption: the smallest L3 encapsulation"
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_tunnel_record(
        ("IP in IP (RFC 2003), IP protocol 4", "https://www.rfc-editor.org/rfc/rfc2003")
    )
    kernel_features = ("ipip",)
    default_mtu = 1480  # 1500 - 20 (IPv4)
    wire = "ip protocol 4"  # nft's "ipip" is protocol 94 (/etc/protocols), not IP in IP

    def link_args(self, host: Host, peer: Host) -> list[str]:
        return ["type", "ipip", "local", host.underlay_ip, "remote", peer.public_ip, "ttl", "64"]
