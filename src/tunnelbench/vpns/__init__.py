"""The VPN drivers, by name."""

from __future__ import annotations

from tunnelbench.vpns.base import Availability, Mesh, MeshSpec, VpnDriver
from tunnelbench.vpns.internal import Internal
from tunnelbench.vpns.nebula import Nebula
from tunnelbench.vpns.openvpn import OpenVpn
from tunnelbench.vpns.tinc import Tinc
from tunnelbench.vpns.wireguard_go import WireguardGo

DRIVERS: dict[str, type[VpnDriver]] = {d.name: d for d in (Internal, WireguardGo, Nebula, Tinc, OpenVpn)}

__all__ = ["DRIVERS", "Availability", "Mesh", "MeshSpec", "VpnDriver"]
