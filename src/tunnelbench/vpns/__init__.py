"""The VPN drivers, by name."""

from __future__ import annotations

from tunnelbench.vpns.base import Availability, Mesh, MeshSpec, VpnDriver
from tunnelbench.vpns.boringtun import Boringtun
from tunnelbench.vpns.fastd import Fastd
from tunnelbench.vpns.internal import Internal
from tunnelbench.vpns.n2n import N2n
from tunnelbench.vpns.nebula import Nebula
from tunnelbench.vpns.openvpn import OpenVpn
from tunnelbench.vpns.tinc import Tinc
from tunnelbench.vpns.vxlan import Vxlan
from tunnelbench.vpns.wireguard_go import WireguardGo
from tunnelbench.vpns.wireguard_kernel import WireguardKernel
from tunnelbench.vpns.yggdrasil import Yggdrasil

DRIVERS: dict[str, type[VpnDriver]] = {
    d.name: d
    for d in (
        Internal,
        WireguardGo,
        Nebula,
        Tinc,
        OpenVpn,
        Vxlan,
        WireguardKernel,
        Boringtun,
        Fastd,
        N2n,
        Yggdrasil,
    )
}

__all__ = ["DRIVERS", "Availability", "Mesh", "MeshSpec", "VpnDriver"]
