"""The pod network's data plane over a VPN: the kernel's VXLAN, programmed statically, as flannel's VXLAN
backend programs it without its daemon (and as Calico's VXLAN mode carries pods, seed 000's CNI): per node one
VXLAN device bound to the interface the host reaches its peers' tunnel addresses by, sourced from its own
tunnel address; per peer a forwarding entry (the peer's device MAC -> the peer's tunnel address), a permanent
neighbour entry (the peer's VXLAN address -> its MAC) and a route (the peer's pod /24 via that address, onlink).
So every pod packet between nodes is a VXLAN packet between tunnel addresses: inside the VPN.

Why this and not flannel or Calico: Calico has no version the Go proxy serves; flannel's daemon builds but its
CNI plugin is refused, and its data plane is this same kernel VXLAN. Without a CNI daemon the cluster's CPU is
the kubelets', containerd's and the control plane's only.

The no-Kubernetes control uses the same overlay with plain network namespaces as "pods" (`ControlPod`), each
joined to its host by a veth the way ptp joins a pod (the pods' gateway on the host side, a host route to the
pod), so the two differ in what runs around the data path, not in the path."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tunnelbench.kube import config
from tunnelbench.lab.host import Host
from tunnelbench.lab.netns import NetnsHost, add_veth, destroy_netns, netns_exists, sh


@dataclass(frozen=True)
class OverlayNode:
    host: Host
    index: int  # the lab host's number: its pod /24 is 10.244.<index>.0/24
    tunnel_ip: str


def underlay_dev(host: Host, peer_tunnel_ip: str) -> tuple[str, int]:
    """(interface, MTU) by which `host` reaches a peer's tunnel address: the VPN's interface (eth0 without a
    VPN), as the kernel routes it (policy rules included: Tailscale's table 52)."""
    out = host.run(["ip", "-j", "route", "get", peer_tunnel_ip]).stdout
    dev = json.loads(out)[0]["dev"]
    (link,) = json.loads(host.run(["ip", "-j", "link", "show", "dev", dev]).stdout)
    return dev, int(link["mtu"])


def vxlan_commands(me: OverlayNode, peers: list[OverlayNode], dev: str, mtu: int) -> list[list[str]]:
    """The commands that make `me`'s side of the overlay (pure: the fast lane checks them)."""
    v = config.VXLAN_DEV
    cmds = [
        ["ip", "link", "add", v, "address", config.vxlan_mac(me.index), "type", "vxlan", "id", str(config.VXLAN_VNI),
         "dev", dev, "local", me.tunnel_ip, "dstport", str(config.VXLAN_PORT), "nolearning"],
        ["ip", "link", "set", v, "mtu", str(mtu), "up"],
        ["ip", "addr", "add", f"{config.vxlan_ip(me.index)}/32", "dev", v],
    ]  # fmt: skip
    for p in peers:
        if p.index == me.index:
            continue
        cmds += [
            ["bridge", "fdb", "append", config.vxlan_mac(p.index), "dev", v, "dst", p.tunnel_ip],
            ["ip", "neigh", "replace", config.vxlan_ip(p.index), "lladdr", config.vxlan_mac(p.index), "dev", v,
             "nud", "permanent"],
            ["ip", "route", "replace", str(config.pod_subnet(p.index)), "via", config.vxlan_ip(p.index), "dev", v,
             "onlink"],
        ]  # fmt: skip
    return cmds


class Overlay:
    """The VXLAN overlay over `nodes` (hosts whose pods talk), up until down()."""

    def __init__(self, nodes: list[OverlayNode]):
        self.nodes = nodes
        self.mtu = 0
        self.devs: dict[str, str] = {}
        self.dev_addrs: dict[str, list[str]] = {}  # the kernel's answer: the addresses on each node's device
        self._forward: dict[str, str] = {}

    def up(self) -> None:
        """Every node's device and entries; the overlay MTU is the smallest underlay MTU - 50."""
        found = {
            n.host.name: underlay_dev(n.host, next(p.tunnel_ip for p in self.nodes if p is not n))
            for n in self.nodes
        }
        self.mtu = config.overlay_mtu(min(m for _, m in found.values()))
        for n in self.nodes:
            dev = self.devs[n.host.name] = found[n.host.name][0]
            (link,) = json.loads(n.host.run(["ip", "-j", "-4", "addr", "show", "dev", dev]).stdout)
            self.dev_addrs[n.host.name] = [a["local"] for a in link.get("addr_info", [])]
            self._forward[n.host.name] = n.host.run(["sysctl", "-n", "net.ipv4.ip_forward"]).stdout.strip()
            n.host.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])  # the node routes its pods' packets
            for cmd in vxlan_commands(n, self.nodes, dev, self.mtu):
                n.host.run(cmd)

    def down(self) -> None:
        for n in self.nodes:
            n.host.run(["ip", "link", "del", config.VXLAN_DEV], check=False)
            if n.host.name in self._forward:
                n.host.run(
                    ["sysctl", "-qw", f"net.ipv4.ip_forward={self._forward.pop(n.host.name)}"], check=False
                )

    def present(self) -> bool:
        """Every node still has its VXLAN device (a VPN restart deletes the interface it was bound to)."""
        return all(
            n.host.run(["ip", "link", "show", "dev", config.VXLAN_DEV], check=False).returncode == 0
            for n in self.nodes
        )

    def record(self) -> dict[str, Any]:
        return {"device": config.VXLAN_DEV, "vni": config.VXLAN_VNI, "port": config.VXLAN_PORT, "mtu": self.mtu,
                "underlay": self.devs, "underlay_addresses": self.dev_addrs}  # fmt: skip


class ControlPod:
    """A "pod" of the no-Kubernetes control: a network namespace of the run joined to its host by a veth as ptp
    joins a pod (gateway 10.244.I.1 on the host side, a /32 route to the pod, the overlay MTU)."""

    def __init__(self, node: OverlayNode, tag: str, mtu: int, n: int = 0):
        self.node = node
        self.netns = f"{tag}-c{node.index}{n}"
        self.ip = config.control_pod_ip(node.index, n)
        self.mtu = mtu
        self.host_if = f"tbc{node.index}{n}"
        base = node.host
        self.host = NetnsHost(
            f"pod-{base.name}", self.netns, self.ip, base.workdir, getattr(base, "journal", None)
        )
        self._entry: dict[str, Any] | None = None

    def up(self) -> None:
        h = self.node.host
        if self.host.journal is not None:
            self._entry = self.host.journal.netns(self.netns)  # journal first: clean finds a half-made one
        sh(["ip", "netns", "add", self.netns])
        add_veth("eth0", self.netns, self.host_if, getattr(h, "netns", ""))
        gw = config.pod_gateway(self.node.index)
        self.host.run(["ip", "link", "set", "lo", "up"])
        self.host.run(["ip", "link", "set", "eth0", "mtu", str(self.mtu), "up"])
        self.host.run(["ip", "addr", "add", f"{self.ip}/32", "dev", "eth0"])
        self.host.run(["ip", "route", "add", f"{gw}/32", "dev", "eth0", "scope", "link"])
        self.host.run(["ip", "route", "add", "default", "via", gw, "dev", "eth0"])
        h.run(["ip", "link", "set", self.host_if, "mtu", str(self.mtu), "up"])
        h.run(["ip", "addr", "add", f"{gw}/32", "dev", self.host_if])
        h.run(["ip", "route", "replace", f"{self.ip}/32", "dev", self.host_if])

    def down(self) -> list[str]:
        problems = destroy_netns(self.netns)
        if self._entry is not None and not netns_exists(self.netns) and self.host.journal is not None:
            self.host.journal.release(self._entry)
        return problems
