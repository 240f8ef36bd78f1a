"""GENEVE (RFC 8926) in the kernel: Ethernet in UDP 6081 with a VNI, one device per peer (the kernel's
GENEVE device has a single remote; a shared device would need an external control plane). Not a VPN: no
encryption, no authentication; 50 bytes of overhead (IPv4 + UDP + GENEVE + inner Ethernet), like VXLAN."""

from __future__ import annotations

from tunnelbench.lab.host import Host
from tunnelbench.vpns.features import kernel_tunnel_record
from tunnelbench.vpns.kernel_tunnel import KernelTunnel

VNI_BASE = 7700


class Geneve(KernelTunnel):
    name = "geneve"
    summary = "GENEVE (Ethernet over UDP 6081) in the kernel, one device per peer, no encryption"
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_tunnel_record(("GENEVE (RFC 8926), UDP 6081", "https://www.rfc-editor.org/rfc/rfc8926"))
    kernel_features = ("geneve",)
    default_mtu = 1450  # 1500 - 20 (IPv4) - 8 (UDP) - 8 (GENEVE) - 14 (inner Ethernet)
    l2 = True
    wire = "udp dport 6081"

    def link_args(self, host: Host, peer: Host) -> list[str]:
        # one VNI per pair (the same on both ends): two devices with one remote and one VNI would collide
        a, b = sorted((self.index(host), self.index(peer)))
        vni = VNI_BASE + a * 1000 + b
        return ["type", "geneve", "id", str(vni), "remote", peer.public_ip, "ttl", "64"]
