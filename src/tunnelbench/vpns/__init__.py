"""The VPN drivers, by name."""

from __future__ import annotations

from tunnelbench.vpns.base import Availability, Mesh, MeshSpec, VpnDriver
from tunnelbench.vpns.boringtun import Boringtun
from tunnelbench.vpns.easytier import EasyTier
from tunnelbench.vpns.fastd import Fastd
from tunnelbench.vpns.innernet import Innernet
from tunnelbench.vpns.internal import Internal
from tunnelbench.vpns.n2n import N2n
from tunnelbench.vpns.nebula import Nebula
from tunnelbench.vpns.openvpn import OpenVpn
from tunnelbench.vpns.softether import SoftEther
from tunnelbench.vpns.strongswan import StrongSwan
from tunnelbench.vpns.tailscale import Tailscale
from tunnelbench.vpns.tinc import Tinc
from tunnelbench.vpns.vpncloud import VpnCloud
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
        Tailscale,
        VpnCloud,
        EasyTier,
        StrongSwan,
        SoftEther,
        Innernet,
    )
}

from tunnelbench.vpns.feature_data import DOCUMENTED  # noqa: E402

for _d in DRIVERS.values():
    if not _d.features and _d.name in DOCUMENTED:
        _d.features = DOCUMENTED[_d.name]

__all__ = ["DRIVERS", "Availability", "Mesh", "MeshSpec", "VpnDriver"]
