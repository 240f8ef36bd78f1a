"""`tunnelbench install --inventory F`: the pinned VPNs and the lab's tools on every inventory host.

What goes where: the lab's tools on every host (and the router's on the router host), each named VPN's
install sources on every peer (a host that is only a router gets no VPN). How it gets there is the lab's
transport (lab/ssh_install.py): Debian packages with apt-get on the host, registry builds (Go modules, Rust
crates) copied from the local cache (`tunnelbench install NAME` fills it), never built on the targets."""

from __future__ import annotations

from collections.abc import Sequence

from tunnelbench.lab.inventory import Inventory, InvHost
from tunnelbench.lab.ssh_install import (
    ROUTER_APT,
    TOOLS_APT,
    DebianPackages,
    RemoteResult,
    Step,
    apt_install,
    copy_binaries,
    install_hosts,
)
from tunnelbench.vpns.install import Apt, Source


def step(what: str, s: Source | DebianPackages) -> Step:
    """One install source as a step on a host: apt-get for Debian packages, a copy for a registry build."""
    if isinstance(s, (Apt, DebianPackages)):
        packages = s.packages
        return what, s.label, lambda h, arch: apt_install(h, packages)
    local = s.bin_dir() if s.cached() else None
    return what, s.label, lambda h, arch: copy_binaries(h, s.binaries, local, s.label, arch)


def host_steps(vpns: dict[str, Sequence[Source]], router: bool) -> list[Step]:
    """The lab's tools (and the router's, on the router host), then each VPN's install sources (by name)."""
    steps = [step("tools", TOOLS_APT)]
    if router:
        steps.append(step("router tools", ROUTER_APT))
    for n, installs in vpns.items():
        steps += [step(n, s) for s in installs]
    return steps


def install_inventory(inventory: Inventory, vpns: dict[str, Sequence[Source]]) -> list[RemoteResult]:
    """Every host at once; results in inventory order, one per host and thing installed."""
    router = inventory.router()

    def steps_for(h: InvHost) -> list[Step]:
        only_router = "router" in h.roles and "peer" not in h.roles
        return host_steps({} if only_router else vpns, router is not None and h.name == router.name)

    return install_hosts(inventory, steps_for)
