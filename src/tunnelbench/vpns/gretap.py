"""GREtap in the kernel: Ethernet frames in GRE (transparent Ethernet bridging, protocol 0x6558), one
tunnel per peer. Not a VPN: no encryption, no authentication; 38 bytes of overhead (IPv4 + GRE + inner
Ethernet). Also the Ethernet carrier the MACsec driver runs over on a routed underlay."""

from __future__ import annotations

from tunnelbench.lab.host import Host
from tunnelbench.vpns.features import KTUN, kernel_tunnel_record
from tunnelbench.vpns.kernel_tunnel import KernelTunnel


class GreTap(KernelTunnel):
    name = "gretap"
    summary = (
        "GREtap (Ethernet over GRE) in the kernel, one tunnel per peer, no encryption: L2 tunnel baseline"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_tunnel_record(("Ethernet over GRE (protocol 0x6558)", KTUN))
    kernel_features = ("gretap",)
    default_mtu = 1462  # 1500 - 20 (IPv4) - 4 (GRE) - 14 (inner Ethernet)
    l2 = True
    wire = "ip protocol gre"

    def link_args(self, host: Host, peer: Host) -> list[str]:
        return ["type", "gretap", "local", host.underlay_ip, "remote", peer.public_ip, "ttl", "64"]
