"""Deterministic lab addressing. Host i (1-based) sits alone on 10.(100 + i // 256).(i % 256).0/24 with the
router at .1 and the host at .2, so the lab holds up to 1023 hosts inside LAB_PREFIX."""

from __future__ import annotations

import ipaddress

LAB_PREFIX = ipaddress.ip_network("10.100.0.0/14")
MAX_HOSTS = 1023
# address ranges VPNs put on their tunnels (ours, Tailscale's CGNAT range, Yggdrasil): a packet to one of
# these on the underlay means a tunnel was not up yet, which the router counts apart from off-lab probes
TUNNEL_RANGES_V4 = "10.64.0.0/12, 100.64.0.0/10"
TUNNEL_RANGES_V6 = "200::/7, fd00::/8"


def host_subnet(index: int) -> ipaddress.IPv4Network:
    if not 1 <= index <= MAX_HOSTS:
        raise ValueError(f"host index {index} outside 1..{MAX_HOSTS}")
    return ipaddress.IPv4Network(f"10.{100 + index // 256}.{index % 256}.0/24")


def host_ip(index: int) -> str:
    return str(host_subnet(index).network_address + 2)


def router_ip(index: int) -> str:
    return str(host_subnet(index).network_address + 1)
