"""The catalog: every VPN driver and every workload by name, and a VPN's versions (`resolve("nebula@1.9.0")`).
The only module that imports every plugin; importing it also declares the runner's own metrics
(case_metrics.py), so every metric a stored case can hold has its MetricSpec."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import tunnelbench.case_metrics  # noqa: F401  (declares the runner's own metrics)
from tunnelbench.vpns.base import VpnDriver
from tunnelbench.vpns.boringtun import Boringtun
from tunnelbench.vpns.easytier import EasyTier
from tunnelbench.vpns.fastd import Fastd
from tunnelbench.vpns.fou import Fou
from tunnelbench.vpns.geneve import Geneve
from tunnelbench.vpns.gre import Gre
from tunnelbench.vpns.gretap import GreTap
from tunnelbench.vpns.gue import Gue
from tunnelbench.vpns.innernet import Innernet
from tunnelbench.vpns.install import VERSION_RE, Source, pinned, registry
from tunnelbench.vpns.internal import Internal
from tunnelbench.vpns.ipip import Ipip
from tunnelbench.vpns.ipsec import IpsecTransport, IpsecVti, IpsecXfrmi, KernelIpsec
from tunnelbench.vpns.ipsec_overlay import GeneveIpsec, GreIpsec, GreTapIpsec, VxlanIpsec
from tunnelbench.vpns.macsec import Macsec
from tunnelbench.vpns.n2n import N2n
from tunnelbench.vpns.nebula import Nebula
from tunnelbench.vpns.openconnect import OpenConnect
from tunnelbench.vpns.openvpn import OpenVpn
from tunnelbench.vpns.openvpn_dco import OpenVpnDco
from tunnelbench.vpns.softether import SoftEther
from tunnelbench.vpns.strongswan import StrongSwan
from tunnelbench.vpns.tailscale import Tailscale
from tunnelbench.vpns.tinc import Tinc
from tunnelbench.vpns.vpncloud import VpnCloud
from tunnelbench.vpns.vxlan import Vxlan
from tunnelbench.vpns.wireguard_go import WireguardGo
from tunnelbench.vpns.wireguard_kernel import WireguardKernel
from tunnelbench.vpns.yggdrasil import Yggdrasil
from tunnelbench.workloads.acl import Acl
from tunnelbench.workloads.base import Workload
from tunnelbench.workloads.connect import Connect
from tunnelbench.workloads.crr import Crr
from tunnelbench.workloads.http_api import HttpApi
from tunnelbench.workloads.http_download import HttpDownload
from tunnelbench.workloads.latency_load import LatencyLoad
from tunnelbench.workloads.leak import Leak
from tunnelbench.workloads.many_clients import ManyClients
from tunnelbench.workloads.multihost import Multihost
from tunnelbench.workloads.overhead import Overhead
from tunnelbench.workloads.ping import Ping
from tunnelbench.workloads.pods import PodApi, PodTcp, PodUdp
from tunnelbench.workloads.quic import Quic
from tunnelbench.workloads.resilience import Resilience
from tunnelbench.workloads.revoke import Revoke
from tunnelbench.workloads.rr import Rr
from tunnelbench.workloads.streaming import Streaming
from tunnelbench.workloads.tcp import Tcp
from tunnelbench.workloads.udp import Udp
from tunnelbench.workloads.udp_ceiling import UdpCeiling

DRIVERS: dict[str, type[VpnDriver]] = {
    d.name: d
    for d in (
        Internal,
        WireguardGo,
        Nebula,
        Tinc,
        OpenVpn,
        OpenConnect,
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
        # kernel data paths (Gentile et al.): need the modules lab/kernel.py probes for
        Gre,
        GreTap,
        Ipip,
        Fou,
        Gue,
        Geneve,
        Macsec,
        # OpenVPN's data channel in the kernel: needs the ovpn-dco module
        OpenVpnDco,
        # kernel IPsec (Gentile et al.): strongSwan IKEv2, kernel ESP
        KernelIpsec,
        IpsecTransport,
        IpsecVti,
        IpsecXfrmi,
        GreIpsec,
        GreTapIpsec,
        VxlanIpsec,
        GeneveIpsec,
    )
}


def debian_build(cls: type[VpnDriver]) -> tuple[Source, ...]:
    """The install sources of the driver's Debian build (`NAME@debian`): its own `debian_installs`, or its
    installs when they all come from Debian; () when Debian has no build of it."""
    own = cls.__dict__.get("debian_installs", ())
    if own:
        return tuple(own)
    if cls.installs and not any(registry(s) for s in cls.installs):
        return tuple(cls.installs)
    return ()


def _forms(name: str) -> str:
    cls = DRIVERS[name]
    forms = [name]
    if debian_build(cls):
        forms.append(f"{name}@debian")
    if any(registry(s) for s in cls.installs):
        forms.append(f"{name}@X.Y.Z")
    return ", ".join(forms)


@functools.cache
def resolve(spec: str) -> type[VpnDriver]:
    """The driver class for a VPN as a scenario or `--vpn` names it:

    - "nebula": the driver itself (its default: the pinned current release);
    - "nebula@debian": a subclass whose installs are Debian's build (`debian_build`);
    - "nebula@1.9.0" (or "@v1.9.0"): a subclass whose registry source (Go module or crate; the first one, or
      every source named in the driver's `versioned_sources`) is pinned to that version, so its binaries,
      `version()` and `tunnelbench install` use that build in the cache.

    A variant keeps the driver's `name` (options, features) and has `key` = `spec` (the run's name for it,
    its rows and folders) and `variant` = "debian" or the version without "v". The same spec always gives
    the same class. Unknown names and malformed versions raise ValueError saying what is allowed."""
    if not isinstance(spec, str):
        raise ValueError(f"a VPN is a string, not {spec!r}")
    name, at, version = spec.partition("@")
    if name not in DRIVERS:
        from tunnelbench.vpns.impossible import IMPOSSIBLE

        why = f" ({name} is impossible here: {IMPOSSIBLE[name].reason})" if name in IMPOSSIBLE else ""
        raise ValueError(
            f"unknown VPN {name!r}{why}; allowed: {', '.join(sorted(DRIVERS))} "
            "(NAME, NAME@debian or NAME@X.Y.Z)"
        )
    cls = DRIVERS[name]
    if not at:
        return cls
    if name == "internal":  # no build to pin: its variant is a second baseline at another underlay MTU
        from tunnelbench.vpns.internal import mtu_variant

        return mtu_variant(spec)
    if version == "debian":
        installs = debian_build(cls)
        if not installs:
            raise ValueError(f"{spec!r}: Debian has no build of {name}; allowed: {_forms(name)}")
        variant = "debian"
    else:
        if not VERSION_RE.fullmatch(version):
            raise ValueError(
                f"{spec!r}: malformed version {version!r}: expected NAME@debian or NAME@X.Y.Z "
                f"(an exact release, e.g. 1.9.0 or v1.9.0); allowed: {_forms(name)}"
            )
        regs = [s for s in cls.installs if registry(s)]
        if not regs:
            raise ValueError(
                f"{spec!r}: {name} comes from Debian only, which has one version; allowed: {_forms(name)}"
            )
        names = getattr(cls, "versioned_sources", ()) or (regs[0].name,)
        installs = tuple(pinned(s, version) if registry(s) and s.name in names else s for s in cls.installs)
        variant = version.removeprefix("v")
    slug = re.sub(r"\W", "_", variant)
    meta: Callable[..., type[VpnDriver]] = type(cls)  # the drivers' metaclass (ABCMeta)
    return meta(
        f"{cls.__name__}_{slug}",
        (cls,),
        {
            "key": spec,
            "variant": variant,
            "installs": installs,
            "debian_installs": (),
            "__module__": cls.__module__,
            "__qualname__": f"{cls.__qualname__}_{slug}",
            "__doc__": f"{cls.__name__} pinned to {spec} (catalog.resolve)",
        },
    )


WORKLOADS: dict[str, type[Workload]] = {
    w.name: w
    for w in (
        Tcp,
        Udp,
        UdpCeiling,
        Ping,
        Connect,
        Multihost,
        LatencyLoad,
        HttpDownload,
        HttpApi,
        Crr,
        Rr,
        Quic,
        Overhead,
        ManyClients,
        Streaming,
        Resilience,
        Leak,
        Acl,
        Revoke,
        PodTcp,
        PodUdp,
        PodApi,
    )
}
