"""No VPN: workloads run over the underlay addresses. The baseline every ratio is taken against."""

from __future__ import annotations

import platform

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import _VERSION_HOST, VpnDriver


class Internal(VpnDriver):
    name = "internal"
    summary = "no VPN: plain underlay path through the router (the baseline)"
    topologies = frozenset({"mesh", "star"})  # the underlay is a star around the router anyway

    @classmethod
    def version(cls) -> str:
        """The kernel the traffic crosses: the target's own on an SSH lab (uname -r there)."""
        if _VERSION_HOST.get() is not None:
            return f"linux {cls._first_line(['uname', '-r'])}"
        return f"linux {platform.release()}"

    def tunnel_ip(self, host: Host) -> str:
        return host.underlay_ip

    def configure(self) -> None:
        pass

    def start(self, host: Host) -> None:
        pass

    def leftovers(self, host: Host) -> list[str]:
        return []
