"""Seed 002's overlays encapsulated via IPsec transport mode: the `gre`, `gretap`, `vxlan` and `geneve`
drivers' devices (vpns/gre.py, ...), with strongSwan IKEv2 + kernel ESP protecting exactly the overlay's
packets between each pair's underlay addresses (vpns/ipsec.py has the charon side).

Per pair, transport-mode CHILD_SAs restricted to the overlay's protocol: GRE/GREtap `A[gre] <-> B[gre]`;
VXLAN and GENEVE send from a random source port to the peer's well-known port, so two CHILD_SAs cover the
two directions: `A[udp] <-> B[udp/4789]` and `A[udp/4789] <-> B[udp]` (6081 for GENEVE). Trap policies on
both ends, installed before the overlay's devices exist and removed only after they are gone: the overlay
never leaves a host in clear (a packet that meets a trap before its SA is dropped and starts IKE). On the
wire: ESP only. Tunnel MTU = the overlay's default - 34 (transport-mode ESP with AES-GCM: 8 header + 8 IV
+ 16 ICV + 2 trailer, the padding absorbed by a 4-aligned payload)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import MeshSpec, VpnDriver
from tunnelbench.vpns.features import XFRM_DATA_PLANE, kernel_ipsec_record
from tunnelbench.vpns.geneve import Geneve
from tunnelbench.vpns.gre import Gre
from tunnelbench.vpns.gretap import GreTap
from tunnelbench.vpns.install import Apt
from tunnelbench.vpns.ipsec import ESP_TRANSPORT_OVERHEAD, KernelIpsec
from tunnelbench.vpns.strongswan import StrongSwan
from tunnelbench.vpns.vxlan import PORT as VXLAN_PORT
from tunnelbench.vpns.vxlan import Vxlan

GENEVE_PORT = 6081


class OverlayIpsec(KernelIpsec):
    overlay: ClassVar[type[VpnDriver]]
    # the overlay's packets: an IP protocol ("gre"), or "udp/<port>" for a UDP overlay on a well-known port
    protects: ClassVar[str]
    binaries: ClassVar[tuple[str, ...]] = (*StrongSwan.binaries, "ip")
    installs = (*StrongSwan.installs, Apt(("iproute2",)))
    mode = "transport"
    install_routes = False
    lo_address = False

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        # the overlay's own driver makes and deletes its devices, at this driver's MTU
        self.inner = self.overlay(dataclasses.replace(spec, mtu=self.mtu, options={}))
        self.settings = {
            **self.settings,
            "overlay": self.overlay.name,
            "mode": f"{self.overlay.name} devices of the `{self.overlay.name}` driver, its packets in "
            f"IPsec transport mode (CHILD_SAs {self.protects} per pair)",
        }

    def children(self, host: Host, peer: Host) -> dict[str, dict[str, str]]:
        a, b = f"{host.underlay_ip}/32", f"{peer.public_ip}/32"
        if not self.protects.startswith("udp/"):
            return {
                peer.name: {
                    "local_ts": f"{a}[{self.protects}]",
                    "remote_ts": f"{b}[{self.protects}]",
                    **self.child(host, peer),
                }
            }
        # to the peer's port from any of ours, and to our port from any of the peer's
        return {
            f"{peer.name}-out": {
                "local_ts": f"{a}[udp]",
                "remote_ts": f"{b}[{self.protects}]",
                **self.child(host, peer),
            },
            f"{peer.name}-in": {
                "local_ts": f"{a}[{self.protects}]",
                "remote_ts": f"{b}[udp]",
                **self.child(host, peer),
            },
        }

    def start(self, host: Host) -> None:
        self.start_charon(host)
        self.load(host)  # the trap policies exist before the overlay can send anything
        self.inner.start(host)

    def remove_devices(self, host: Host) -> None:
        self.inner.after_stop(host)


class GreIpsec(OverlayIpsec):
    name = "gre-ipsec"
    summary = (
        "GRE tunnels per peer (kernel) in IPsec transport mode (strongSwan IKEv2, kernel ESP AES-256-GCM)"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_ipsec_record(
        "GRE (RFC 2784) in IKEv2 + ESP transport mode",
        XFRM_DATA_PLANE,
        "CHILD_SA selectors: GRE between the pair",
    )
    kernel_features = ("esp", "gre")
    overlay = Gre
    protects = "gre"
    default_mtu = Gre.default_mtu - ESP_TRANSPORT_OVERHEAD  # 1442


class GreTapIpsec(OverlayIpsec):
    name = "gretap-ipsec"
    summary = (
        "GREtap tunnels per peer (kernel) in IPsec transport mode (strongSwan IKEv2, kernel ESP AES-256-GCM)"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_ipsec_record(
        "GREtap (Ethernet over GRE) in IKEv2 + ESP transport mode",
        XFRM_DATA_PLANE,
        "CHILD_SA selectors: GRE between the pair",
    )
    kernel_features = ("esp", "gretap")
    overlay = GreTap
    protects = "gre"
    default_mtu = GreTap.default_mtu - ESP_TRANSPORT_OVERHEAD  # 1428


class VxlanIpsec(OverlayIpsec):
    name = "vxlan-ipsec"
    summary = "VXLAN static mesh (kernel) in IPsec transport mode (strongSwan IKEv2, kernel ESP AES-256-GCM)"
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_ipsec_record(
        "VXLAN (RFC 7348, UDP 4789) in IKEv2 + ESP transport mode",
        XFRM_DATA_PLANE,
        "CHILD_SA selectors: UDP to/from port 4789 between the pair",
    )
    binaries = (*OverlayIpsec.binaries, "bridge")
    kernel_features = ("esp", "vxlan")
    overlay = Vxlan
    protects = f"udp/{VXLAN_PORT}"
    default_mtu = Vxlan.default_mtu - ESP_TRANSPORT_OVERHEAD  # 1416


class GeneveIpsec(OverlayIpsec):
    name = "geneve-ipsec"
    summary = (
        "GENEVE devices per peer (kernel) in IPsec transport mode (strongSwan IKEv2, kernel ESP AES-256-GCM)"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_ipsec_record(
        "GENEVE (RFC 8926, UDP 6081) in IKEv2 + ESP transport mode",
        XFRM_DATA_PLANE,
        "CHILD_SA selectors: UDP to/from port 6081 between the pair",
    )
    kernel_features = ("esp", "geneve")
    overlay = Geneve
    protects = f"udp/{GENEVE_PORT}"
    default_mtu = Geneve.default_mtu - ESP_TRANSPORT_OVERHEAD  # 1416
