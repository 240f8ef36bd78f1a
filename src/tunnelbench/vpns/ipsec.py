"""Kernel IPsec (Gentile et al.): strongSwan's charon does IKEv2, the kernel does ESP (XFRM, no kernel-libipsec).
Four ways to use it, one driver each, all a full mesh of one IKE_SA per pair (PSK per pair, IKE
aes256gcm16-prfsha256-x25519, ESP aes256gcm16 = AES-256-GCM), reusing the `strongswan` driver's charon
set-up (private /run per charon, vici socket, per-host strongswan.conf/swanctl.conf; vpns/strongswan.py):

- ipsec-tunnel     policy-based tunnel mode: CHILD_SA 10.77.0.i/32 <-> 10.77.0.j/32, tunnel address on lo,
                   charon routes the peer's /32 (table 220, route MTU = the tunnel MTU).
- ipsec-transport  transport mode between the underlay addresses: the workloads' addresses ARE the underlay
                   addresses (tunnel_ip = underlay_ip), every packet between a pair is ESP.
- ipsec-vti        route-based, one VTI device per peer (key N = mark_in/mark_out N), tunnel mode SAs
                   10.77.0.i/32 <-> 10.77.0.j/32, `10.77.0.i peer 10.77.0.j` on the device.
- ipsec-xfrmi      route-based, one XFRM interface per peer (if_id N = if_id_in/if_id_out N), same addressing.

Never cleartext: every CHILD_SA is `start_action = trap` on both ends (the higher-numbered host also starts
it at once: `trap|start`), so the kernel holds matching traffic to an SA from the moment charon loads the
config; a packet that meets the trap before its SA exists is dropped (larval state) and triggers IKE, it
is never sent in clear. `unique = never`: when both ends' traps fire at once, the two IKE_SAs coexist
instead of an INITIAL_CONTACT tearing one down.

Teardown: devices first, then charon by PID (it removes its SAs and policies), then whatever XFRM state or
policy the host still has is removed (flushed in a namespace host, whose XFRM tables are the run's; on an
SSH host only the entries naming the mesh's addresses) and leftovers() reports any that remain."""

from __future__ import annotations

import re
from typing import ClassVar

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import DriverOptions, MeshSpec, TunnelOptions
from tunnelbench.vpns.features import SS_ROUTE, XFRM_DATA_PLANE, kernel_ipsec_record
from tunnelbench.vpns.strongswan import ESP_PROPOSAL, IKE_PROPOSAL, StrongSwan

# tunnel mode, AES-GCM, IPv4: 20 (outer IP) + 8 (ESP header) + 8 (IV) + 16 (ICV) + 2 (trailer) + 0..3
# padding = 54..57 bytes: the largest inner packet in 1500 is 1446; 8 bytes of margin
ESP_TUNNEL_MTU = 1438
# transport mode adds 8 + 8 + 16 + 2 + padding (no outer IP): 34 bytes when the payload + 2 is 4-aligned
ESP_TRANSPORT_OVERHEAD = 34
# VTI key / XFRM if_id of the device toward peer j (the same number as the SAs' mark / if_id)
MARK_BASE = 100


class KernelIpsec(StrongSwan):
    name = "ipsec-tunnel"
    summary = (
        "strongSwan IKEv2 + kernel ESP, policy-based tunnel mode per pair (full mesh, PSK), AES-256-GCM, "
        "trap policies"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_ipsec_record(
        "IKEv2 + ESP tunnel mode (policy-based)",
        XFRM_DATA_PLANE,
        "traffic selectors per CHILD_SA (trap policies)",
    )
    kernel_features: ClassVar[tuple[str, ...]] = ("esp",)
    wire = "ip protocol esp"
    encrypted: ClassVar[bool] = True
    default_mtu: ClassVar[int | None] = ESP_TUNNEL_MTU
    # vpn_options: mtu (the kernel does ESP: no esp option); IpsecTransport has none
    Options: ClassVar[type[DriverOptions]] = TunnelOptions  # type: ignore[assignment]  # not StrongSwan's
    mode: ClassVar[str] = "tunnel"
    install_routes: ClassVar[bool] = True  # charon routes the peers' tunnel addresses (policy-based)
    describe: ClassVar[str] = "policy-based tunnel mode, CHILD_SA 10.77.0.i/32 <-> 10.77.0.j/32 per pair"

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.esp = "kernel"
        self.settings = {
            "mode": f"full mesh of IKEv2 SAs: {self.describe}",
            "ike": IKE_PROPOSAL,
            "cipher": "AES-256-GCM (ESP aes256gcm16)",
            "esp": "kernel",
            "auth": "PSK per pair",
            "encapsulation": f"ESP (IP protocol 50), {self.mode} mode, no UDP encapsulation",
            "policies": "trap on both ends (higher-numbered host also starts), unique = never",
            "mtu": self.mtu,
        }

    # -- charon's configuration -------------------------------------------------------------------
    def charon_settings(self) -> dict[str, str]:
        return {**super().charon_settings(), "install_routes": "yes" if self.install_routes else "no"}

    def plugin_settings(self) -> dict[str, dict[str, str]]:
        # the MTU of the routes charon installs (table 220): the tunnel's MTU for policy-based tunnel mode
        return {"kernel-netlink": {"mtu": str(self.mtu)}} if self.install_routes and self.mtu else {}

    def connection(self, host: Host, peer: Host) -> dict[str, str]:
        return {**super().connection(host, peer), "unique": "never"}

    def child(self, host: Host, peer: Host) -> dict[str, str]:
        """What every CHILD_SA of the pair has: kernel ESP proposal, mode, trap policies."""
        start = "trap|start" if self.index(host) > self.index(peer) else "trap"
        return {"esp_proposals": ESP_PROPOSAL, "mode": self.mode, "start_action": start}

    def children(self, host: Host, peer: Host) -> dict[str, dict[str, str]]:
        return {
            peer.name: {
                "local_ts": f"{self.tunnel_ip(host)}/32",
                "remote_ts": f"{self.tunnel_ip(peer)}/32",
                **self.child(host, peer),
            }
        }

    # -- teardown -----------------------------------------------------------------------------------
    def remove_devices(self, host: Host) -> None:  # noqa: B027 (optional hook)
        """Delete the driver's devices (before charon stops: nothing may go out once its policies are gone)."""

    def stop(self, host: Host) -> None:
        self.remove_devices(host)
        super().stop(host)

    def after_stop(self, host: Host) -> None:
        super().after_stop(host)
        self.remove_devices(host)
        if not host.remote:  # a namespace host: its XFRM tables hold nothing but the run's
            host.run(["ip", "xfrm", "policy", "flush"], check=False)
            host.run(["ip", "xfrm", "state", "flush"], check=False)
            return
        for what, block in self.xfrm_entries(host):
            argv = _delete_argv(what, block)
            if argv:
                host.run(argv, check=False)

    def mesh_addresses(self) -> set[str]:
        out: set[str] = set()
        for h in self.spec.hosts:
            out |= {h.underlay_ip, h.public_ip, self.tunnel_ip(h)}
        return out

    def xfrm_entries(self, host: Host) -> list[tuple[str, list[str]]]:
        """The host's XFRM states and policies (socket policies aside); on an SSH host only those naming one
        of the mesh's addresses."""
        ours = self.mesh_addresses()
        found = []
        for what in ("state", "policy"):
            for block in _blocks(host.run(["ip", "xfrm", what], check=False).stdout):
                if what == "policy" and any(line.startswith("socket ") for line in block):
                    continue
                text = " ".join(block)
                if host.remote and not any(
                    re.search(rf"(?<![\d.]){re.escape(a)}(?![\d])", text) for a in ours
                ):
                    continue
                found.append((what, block))
        return found

    def leftovers(self, host: Host) -> list[str]:
        found = super().leftovers(host)
        found += [f"xfrm {what} {' | '.join(block[:3])}" for what, block in self.xfrm_entries(host)]
        return found


def _blocks(text: str) -> list[list[str]]:
    """`ip xfrm state|policy` output as one list of stripped lines per entry."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            blocks.append([line.strip()])
        elif blocks:
            blocks[-1].append(line.strip())
    return blocks


def _mark(block: list[str]) -> list[str]:
    for line in block:
        if line.startswith("mark "):
            v, _, m = line.split()[1].partition("/")
            return ["mark", v, "mask", m or "0xffffffff"]
    return []


def _delete_argv(what: str, block: list[str]) -> list[str] | None:
    """`ip xfrm ... delete` of one entry (mark and if_id included: the kernel matches them on delete)."""
    first = block[0].split()
    if what == "policy":
        d = next((ln.split() for ln in block if ln.startswith("dir ")), None)
        if d is None:
            return None
        if_id = next((ln.split()[:2] for ln in block if ln.startswith("if_id ")), [])
        return ["ip", "xfrm", "policy", "delete", *first, "dir", d[1], *_mark(block), *if_id]
    words = " ".join(block[1:2]).split()
    if len(first) < 4 or "proto" not in words or "spi" not in words:
        return None
    proto, spi = words[words.index("proto") + 1], words[words.index("spi") + 1]
    return ["ip", "xfrm", "state", "delete", *first[:4], "proto", proto, "spi", spi, *_mark(block)]


class IpsecTransport(KernelIpsec):
    name = "ipsec-transport"
    summary = (
        "strongSwan IKEv2 + kernel ESP, transport mode between the underlay addresses (full mesh, PSK), "
        "AES-256-GCM, trap policies: no cleartext between the hosts"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_ipsec_record(
        "IKEv2 + ESP transport mode between the hosts' addresses",
        XFRM_DATA_PLANE,
        "traffic selectors per CHILD_SA (trap policies: nothing in clear)",
    )
    # no tunnel device: workloads use the underlay interface and its MTU; the kernel's PMTU accounting of
    # the ESP overhead (1500 - 34..37 for TCP) is what limits packet sizes
    default_mtu = None
    Options = DriverOptions
    mode = "transport"
    install_routes = False
    lo_address = False
    describe = "transport mode between the underlay addresses (all traffic of the pair)"

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.settings = {
            **self.settings,
            "mtu": None,
            "mtu_note": "no tunnel device: the underlay interface's MTU, ESP overhead via PMTU",
        }

    def tunnel_ip(self, host: Host) -> str:
        return host.underlay_ip

    def children(self, host: Host, peer: Host) -> dict[str, dict[str, str]]:
        return {
            peer.name: {
                "local_ts": f"{host.underlay_ip}/32",
                "remote_ts": f"{peer.public_ip}/32",
                **self.child(host, peer),
            }
        }


class IpsecVti(KernelIpsec):
    name = "ipsec-vti"
    summary = (
        "strongSwan IKEv2 + kernel ESP, route-based with one VTI device per peer (marks), tunnel mode, "
        "AES-256-GCM, full mesh, PSK"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_ipsec_record(
        "IKEv2 + ESP tunnel mode, route-based (VTI devices, marks)",
        ("kernel XFRM via VTI devices (ip_vti)", SS_ROUTE),
        "routes to the VTI devices; selectors per CHILD_SA",
    )
    kernel_features = ("esp", "vti")
    install_routes = False  # the peer's /32 is on its device
    lo_address = False
    describe = "route-based tunnel mode, one VTI device per peer (key = mark_in/mark_out)"

    def route_key(self, peer: Host) -> int:
        return MARK_BASE + self.index(peer)

    def link_name(self, host: Host, peer: Host) -> str:
        return f"{self.spec.tag}k{self.index(peer)}"

    def children(self, host: Host, peer: Host) -> dict[str, dict[str, str]]:
        kids = super().children(host, peer)
        kids[peer.name].update(self.route_ids(peer))
        return kids

    def route_ids(self, peer: Host) -> dict[str, str]:
        return {"mark_in": str(self.route_key(peer)), "mark_out": str(self.route_key(peer))}

    def link_args(self, host: Host, peer: Host) -> list[str]:
        return [
            "type",
            "vti",
            "local",
            host.underlay_ip,
            "remote",
            peer.public_ip,
            "key",
            str(self.route_key(peer)),
        ]

    def start(self, host: Host) -> None:
        self.start_charon(host)
        self.load(host)
        for peer in self.peers(host):
            dev = self.link_name(host, peer)
            host.run(["ip", "link", "add", dev, *self.link_args(host, peer)])
            self.after_link(host, dev)
            host.run(
                ["ip", "addr", "add", self.tunnel_ip(host), "peer", f"{self.tunnel_ip(peer)}/32", "dev", dev]
            )
            host.run(["ip", "link", "set", dev, "mtu", str(self.mtu), "up"])

    def after_link(self, host: Host, dev: str) -> None:
        # decrypted packets arrive on the VTI with the SA's mark cleared: the inbound policy was checked with
        # the mark by the VTI itself, the device-level check (no mark, no matching policy) must be off
        host.run(["sysctl", "-qw", f"net.ipv4.conf.{dev}.disable_policy=1"])

    def remove_devices(self, host: Host) -> None:
        for peer in self.peers(host):
            if self.link_exists(host, dev := self.link_name(host, peer)):
                host.run(["ip", "link", "del", dev], check=False)


class IpsecXfrmi(IpsecVti):
    name = "ipsec-xfrmi"
    summary = (
        "strongSwan IKEv2 + kernel ESP, route-based with one XFRM interface per peer (if_id), tunnel "
        "mode, AES-256-GCM, full mesh, PSK"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_ipsec_record(
        "IKEv2 + ESP tunnel mode, route-based (XFRM interfaces, if_id)",
        ("kernel XFRM via XFRM interfaces (xfrm_interface)", SS_ROUTE),
        "routes to the XFRM interfaces; selectors per CHILD_SA",
    )
    kernel_features = ("esp", "xfrmi")
    describe = "route-based tunnel mode, one XFRM interface per peer (if_id = if_id_in/if_id_out)"

    def route_ids(self, peer: Host) -> dict[str, str]:
        return {"if_id_in": str(self.route_key(peer)), "if_id_out": str(self.route_key(peer))}

    def link_args(self, host: Host, peer: Host) -> list[str]:
        return [
            "type",
            "xfrm",
            "dev",
            getattr(host, "underlay_if", "eth0"),
            "if_id",
            str(self.route_key(peer)),
        ]

    def after_link(self, host: Host, dev: str) -> None:
        pass
