"""The Kubernetes layer on top of a running VPN mesh, made on first use by a case and kept for the mesh's session:
the overlay (always), the cluster (for the pod workloads), the no-Kubernetes control's "pods" (for the control),
and the router's proof counters. It goes before the mesh stops (Mesh.layers), while the tunnels still carry
the cluster's own teardown; a mesh restart (a case's heal) takes it down too, and the next case makes it again.

Roles: the first host of the mesh is the control plane, the case's client and server hosts are the workers (the
client's pod sends, the server's pod receives: seed 000 pinned its iperf3 pods to the two workers).

The router's counters (nftables, in the router's namespace, gone with the lab): packets forwarded with a pod
or service address as source or destination (0 when every pod packet rode inside VXLAN: the underlay never saw
a pod address), and UDP packets to the overlay's port (the VXLAN packets themselves: seen in the clear on the
no-VPN baselines, 0 when the overlay rode inside the VPN)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunnelbench.kube import config
from tunnelbench.kube.cluster import Cluster, Plan, start
from tunnelbench.kube.overlay import ControlPod, Overlay, OverlayNode
from tunnelbench.lab.host import Host
from tunnelbench.vpns.mesh import Mesh

_LAYERS: dict[int, KubeLayer] = {}  # id(mesh) -> its layer, while the mesh runs
_SESSIONS = itertools.count(1)


@dataclass
class Counts:
    pod_packets: int
    vxlan_packets: int


def index_of(host: Host) -> int:
    """The lab host's number (h2 -> 2): its pod /24."""
    return int(host.name.lstrip("h"))


class KubeLayer:
    def __init__(
        self, mesh: Mesh, control: Host, workers: list[Host], router: Host | None, tag: str, root: Path
    ):
        self.mesh = mesh
        self.control = control
        self.workers = workers
        self.router = router
        self.tag = tag
        self.root = root
        self.nodes = [OverlayNode(h, index_of(h), mesh.tunnel_ip(h)) for h in workers]
        self.overlay: Overlay | None = None
        self.cluster: Cluster | None = None
        self.control_pods: list[ControlPod] = []
        self.pods: dict[str, str] = {}  # long-lived pods of the cluster (iperf3 servers): name -> pod IP
        self.table = f"{tag}k8s"

    # -- parts, made on demand ---------------------------------------------------------------------------
    def ensure_overlay(self) -> Overlay:
        if self.overlay is None:
            ov = Overlay(self.nodes)
            self.overlay = ov
            ov.up()
            self._router_counters()
            # the control-plane host runs no pods and has no route to them: a VPN that advertises the nodes'
            # overlay addresses as its endpoints (Tailscale does: seed 000's loop, §3.2.3) gets an error there,
            # instead of a probe the router would count as off-lab
            for net in (config.POD_NETWORK, config.SERVICE_NETWORK):
                self.control.run(["ip", "route", "replace", "unreachable", str(net)])
            (self.root / "overlay.json").write_text(json.dumps(ov.record(), indent=1) + "\n")
        return self.overlay

    def ensure_cluster(self) -> Cluster:
        ov = self.ensure_overlay()
        if self.cluster is None:
            plan = Plan(
                tag=self.tag,
                control=self.control,
                control_ip=self.mesh.tunnel_ip(self.control),
                workers=[(n.host, n.index, n.tunnel_ip) for n in self.nodes],
                dir=self.root,
                mtu=ov.mtu,
            )
            self.cluster = start(plan)
            (self.root / "nodes.json").write_text(json.dumps(self.cluster.nodes(), indent=1) + "\n")
        self.cluster.thaw()
        return self.cluster

    def ensure_control_pods(self) -> list[ControlPod]:
        ov = self.ensure_overlay()
        if not self.control_pods:
            for n in self.nodes:
                cp = ControlPod(n, self.tag, ov.mtu)
                self.control_pods.append(cp)
                cp.up()
        return self.control_pods

    # -- the router's proof ------------------------------------------------------------------------------
    def _router_counters(self) -> None:
        if self.router is None:
            return
        nets = f"{{ {config.POD_NETWORK}, {config.SERVICE_NETWORK} }}"
        rules = f"""
table inet {self.table} {{
  counter pod_packets {{ }}
  counter vxlan_packets {{ }}
  chain prerouting {{
    type filter hook prerouting priority -310; policy accept;
    meta nfproto ipv4 ip saddr {nets} counter name pod_packets
    meta nfproto ipv4 ip daddr {nets} counter name pod_packets
    meta nfproto ipv4 udp dport {config.VXLAN_PORT} counter name vxlan_packets
  }}
}}
"""
        self.router.run(["nft", "delete", "table", "inet", self.table], check=False)
        self.router.run(["nft", "-f", "-"], input=rules)

    def counts(self) -> Counts | None:
        if self.router is None:
            return None
        out = self.router.run(["nft", "-j", "list", "table", "inet", self.table]).stdout
        c = {
            i["counter"]["name"]: int(i["counter"]["packets"])
            for i in json.loads(out)["nftables"]
            if "counter" in i
        }
        return Counts(c["pod_packets"], c["vxlan_packets"])

    # -- teardown ------------------------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Everything the layer made; what could not be undone."""
        _LAYERS.pop(id(self.mesh), None)
        if self in self.mesh.layers:
            self.mesh.layers.remove(self)
        problems: list[str] = []
        if self.cluster is not None:
            problems += self.cluster.down()
            self.cluster = None
            self.pods = {}
        for cp in self.control_pods:
            problems += cp.down()
        self.control_pods = []
        if self.overlay is not None:
            self.overlay.down()
            self.overlay = None
            for net in (config.POD_NETWORK, config.SERVICE_NETWORK):
                self.control.run(["ip", "route", "del", "unreachable", str(net)], check=False)
        if self.router is not None:
            self.router.run(["nft", "delete", "table", "inet", self.table], check=False)
        return problems

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"control_plane": self.control.name, "workers": [h.name for h in self.workers]}
        if self.overlay is not None:
            out["overlay"] = self.overlay.record()
        if self.cluster is not None:
            out["timings"] = self.cluster.timings
        return out


def layer_for(
    mesh: Mesh, control: Host, workers: list[Host], router: Host | None, tag: str, root: Path
) -> KubeLayer:
    """The mesh's layer, made (and registered to go before the mesh stops) on first use."""
    layer = _LAYERS.get(id(mesh))
    if layer is not None and layer.mesh is mesh:
        if layer.overlay is not None and not layer.overlay.present():  # the VPN was restarted under it
            layer.stop()
        else:
            return layer
    root = root / f"{mesh.vpn.replace('/', '_')}-{next(_SESSIONS)}"  # a folder per layer: logs, configs, PKI
    root.mkdir(parents=True, exist_ok=True)
    layer = KubeLayer(mesh, control, workers, router, tag, root)
    _LAYERS[id(mesh)] = layer
    mesh.layers.append(layer)
    return layer
