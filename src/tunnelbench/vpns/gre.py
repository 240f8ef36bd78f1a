"""GRE (RFC 2784) in the kernel: an IP-in-GRE tunnel per peer, no key, no checksum. Not a VPN: no
encryption, no authentication; Gentile et al.'s lightest L3 tunnel (24 bytes of overhead: outer IPv4 + GRE)."""

from __future__ import annotations

from tunnelbench.lab.host import Host
from tunnelbench.vpns.features import kernel_tunnel_record
from tunnelbench.vpns.kernel_tunnel import KernelTunnel


class Gre(KernelTunnel):
    name = "gre"
    summary = "GRE in the kernel, one tunnel per peer (full mesh), no encryption: L3 tunnel baseline"
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_tunnel_record(
        ("GRE (RFC 2784), IP protocol 47", "https://www.rfc-editor.org/rfc/rfc2784")
    )
    kernel_features = ("gre",)
    default_mtu = 1476  # 1500 - 20 (IPv4) - 4 (GRE)
    wire = "ip protocol gre"

    def link_args(self, host: Host, peer: Host) -> list[str]:
        return ["type", "gre", "local", host.underlay_ip, "remote", peer.public_ip, "ttl", "64"]
