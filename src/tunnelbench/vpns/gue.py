"""GUE (Generic UDP Encapsulation) in the kernel: like FOU, IP in IP in UDP, plus a 4-byte GUE header
that names the inner protocol, so one receive port (5556) serves every inner protocol. One tunnel per
peer. Not a VPN: no encryption, no authentication; 32 bytes of overhead (IPv4 + UDP + GUE)."""

from __future__ import annotations

from tunnelbench.vpns.features import kernel_tunnel_record
from tunnelbench.vpns.fou import Fou


class Gue(Fou):
    name = "gue"
    summary = (
        "GUE (IP in IP over UDP 5556 with a GUE header) in the kernel, one tunnel per peer, no encryption"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_tunnel_record(
        (
            "GUE: IP in IP over UDP with a GUE header",
            "https://datatracker.ietf.org/doc/html/draft-ietf-intarea-gue",
        )
    )
    kernel_features = ("gue",)
    default_mtu = 1468  # 1500 - 20 (IPv4) - 8 (UDP) - 4 (GUE)
    port = 5556
    encap = "gue"
    wire = f"udp dport {port}"

    def fou_args(self) -> list[str]:
        return ["port", str(self.port), "gue"]
