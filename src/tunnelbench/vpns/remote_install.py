"""`tunnelbench install --inventory F`: the pinned VPNs and the lab's tools on every inventory host.

What goes where: the lab's tools on every host (and the router's on the router host), each named VPN's
install sources on every peer (a host that is only a router gets no VPN). How it gets there is the lab's
provisioning (lab/provision.py, one Ansible play): Debian packages with apt-get on the host, registry builds
(Go modules, Rust crates) copied from the local cache (`tunnelbench install NAME` fills it), never built on
the targets."""

from __future__ import annotations

from tunnelbench.lab.inventory import Inventory, InvHost
from tunnelbench.lab.provision import (
    ROUTER_APT,
    TOOLS_APT,
    AptStep,
    CopyStep,
    DebianPackages,
    KernelStep,
    RemoteResult,
    Step,
    install_hosts,
)
from tunnelbench.vpns.base import VpnDriver
from tunnelbench.vpns.install import Apt, Source, debian_version


def step(what: str, s: Source | DebianPackages) -> Step:
    """One install source as a step on a host: apt-get for Debian packages (pinned to this machine's versions,
    the ones its own runs measure), a copy for a registry build."""
    if isinstance(s, (Apt, DebianPackages)):
        pins = tuple(debian_version(p) or "" for p in s.packages)
        return AptStep(what, s.label, tuple(s.packages), pins)
    return CopyStep(what, s.label, tuple(s.binaries), s.bin_dir() if s.cached() else None)


def kernel_features(cls: type[VpnDriver]) -> tuple[str, ...]:
    """What a VPN's data path needs of the kernel: its tunnel types, or TUN for a userspace daemon."""
    return cls.kernel_features or ("tun",)


def host_steps(vpns: dict[str, type[VpnDriver]], router: bool) -> list[Step]:
    """The lab's tools (and the router's, on the router host), then each VPN's install sources and kernel
    features (by name)."""
    steps = [step("tools", TOOLS_APT)]
    if router:
        steps.append(step("router tools", ROUTER_APT))
    for n, cls in vpns.items():
        steps += [step(n, s) for s in cls.installs]
        feats = kernel_features(cls)
        steps.append(KernelStep(n, "kernel " + " ".join(feats), feats))
    return steps


def install_inventory(
    inventory: Inventory, vpns: dict[str, type[VpnDriver]], insecure: bool = False
) -> tuple[list[RemoteResult], dict[str, tuple[int, float]]]:
    """Every host at once; results in inventory order, one per host and thing installed, and per host the
    number of changes Ansible made (0 everywhere on a second run) and its seconds there."""
    router = inventory.router()

    def steps_for(h: InvHost) -> list[Step]:
        only_router = "router" in h.roles and "peer" not in h.roles
        return host_steps({} if only_router else vpns, router is not None and h.name == router.name)

    return install_hosts(inventory, steps_for, insecure)
