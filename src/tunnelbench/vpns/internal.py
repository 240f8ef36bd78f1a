"""No VPN: workloads run over the underlay addresses. The baseline every ratio is taken against.

`internal@mtuNNNN` is a second baseline with every host's underlay interface at MTU NNNN while it runs
(Kjorveziroski et al. ran its no-VPN baseline at 1450 and 1230 besides 1500, the MTUs the VPNs leave a packet): it is
reported as its own row, a baseline, never a contender, and the ratios stay against plain `internal`."""

from __future__ import annotations

import functools
import json
import re

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import VpnDriver
from tunnelbench.vpns.podclients import PodClient, PodClients

MTU_VARIANT = re.compile(r"mtu([0-9]{3,4})")  # ASCII digits: `\d` takes any script's
MTU_RANGE = (576, 9000)  # IPv4 minimum (below 1280 the kernel takes IPv6 off the link; internal is IPv4)


class Internal(VpnDriver):
    name = "internal"
    summary = "no VPN: plain underlay path through the router (the baseline)"
    topologies = frozenset({"mesh", "star"})  # the underlay is a star around the router anyway
    underlay_mtu: int | None = None  # internal@mtuNNNN: the hosts' underlay MTU while this baseline runs

    @classmethod
    def version(cls, host: Host) -> str:
        """The kernel the traffic crosses: `host`'s (an SSH lab's target; this machine's for namespaces)."""
        return f"linux {cls._first_line(host, ['uname', '-r'])}"

    def tunnel_ip(self, host: Host) -> str:
        return host.underlay_ip

    def configure(self) -> None:
        pass

    def pod_clients(self, server: Host, n: int, names: list[str]) -> PodClients:
        """No VPN: the pods call the server's underlay address (their nodes masquerade them); no identity."""
        return PodClients(self.key, [PodClient(nm, "", {}) for nm in names], server.public_ip, "", ())

    def start(self, host: Host) -> None:
        if self.underlay_mtu is None:
            return
        if host.remote:
            raise RuntimeError(
                f"{self.key}: changing a real host's interface MTU is not done over SSH; "
                "use the namespace lab"
            )
        link = json.loads(host.run(["ip", "-j", "link", "show", "dev", host.underlay_if]).stdout)[0]
        self._saved_mtu = getattr(self, "_saved_mtu", {})
        self._saved_mtu.setdefault(host.name, int(link["mtu"]))
        host.run(["ip", "link", "set", "dev", host.underlay_if, "mtu", str(self.underlay_mtu)])

    def after_stop(self, host: Host) -> None:
        saved = getattr(self, "_saved_mtu", {}).pop(host.name, None)
        if saved is not None:  # the lab's own MTU again for the VPNs after this baseline
            host.run(["ip", "link", "set", "dev", host.underlay_if, "mtu", str(saved)], check=False)

    def leftovers(self, host: Host) -> list[str]:
        return []


@functools.cache
def mtu_variant(spec: str) -> type[Internal]:
    """The class of `internal@mtuNNNN` (catalog.resolve); the same spec always gives the same class."""
    _, _, variant = spec.partition("@")
    m = MTU_VARIANT.fullmatch(variant)
    if not m or not MTU_RANGE[0] <= int(m.group(1)) <= MTU_RANGE[1]:
        why = "Debian has no build of internal (it is the kernel's path); " if variant == "debian" else ""
        raise ValueError(
            f"{spec!r}: {why}internal's variant is mtuNNNN, an underlay MTU from {MTU_RANGE[0]} to "
            f"{MTU_RANGE[1]}; allowed: internal, internal@mtuNNNN (e.g. internal@mtu1450)"
        )
    mtu = int(m.group(1))

    class Variant(Internal):
        __doc__ = f"internal with the hosts' underlay MTU at {mtu}"
        key = spec
        variant = f"mtu{mtu}"
        underlay_mtu = mtu
        summary = f"no VPN, underlay MTU {mtu}: a second baseline"

        @classmethod
        def version(cls, host: Host) -> str:
            return f"{Internal.version(host)} (underlay MTU {mtu})"

    Variant.__name__ = Variant.__qualname__ = f"Internal_mtu{mtu}"
    return Variant
