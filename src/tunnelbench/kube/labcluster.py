"""The lab's own Kubernetes cluster for many_clients on Kubernetes: a control plane and two workers on lab hosts
that the VPN under test does not run on, their node addresses the lab's underlay (an `internal` mesh of them:
no VPN between the nodes), the client pod image imported on each worker, and the API exposed as a user's is: a
kubeconfig naming a loopback-only forwarder (kube/access.py). many_clients then uses that kubeconfig and
nothing else (kube/remote.py), exactly as with a user's cluster.

The server host (the VPN's server side and nginx) is outside the cluster, as the seed's was: the pods reach it
through their nodes, which masquerade what leaves the pod network (the CNI's ipMasq), so the lab's router sees
only lab addresses. The cluster lives as long as the VPN's mesh session (it is one of the mesh's layers)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from tunnelbench.kube import config
from tunnelbench.kube.access import Forwarder, kubeconfig, write_kubeconfig
from tunnelbench.kube.cluster import Cluster, ClusterError
from tunnelbench.kube.fleetimage import FLEET_IMAGE, ensure_image
from tunnelbench.kube.layer import layer_for
from tunnelbench.lab.base import Lab
from tunnelbench.lab.host import Host
from tunnelbench.vpns.internal import Internal
from tunnelbench.vpns.mesh import Mesh
from tunnelbench.vpns.session import end_mesh, make_mesh, start_mesh

_CLUSTERS: dict[int, LabCluster] = {}  # id(the VPN's mesh) -> its lab cluster


class LabCluster:
    def __init__(self, lab: Lab, control: Host, workers: list[Host], root: Path):
        self.lab, self.control, self.workers, self.root = lab, control, workers, root
        self.router, self.tag = lab.router, lab.tag
        self.mesh: Mesh | None = None
        self.cluster: Cluster | None = None
        self.forwarder: Forwarder | None = None
        self.kubeconfig = root / "kubeconfig.yaml"
        self.image = FLEET_IMAGE
        self.image_digest = ""

    def up(self) -> None:
        netns = getattr(self.control, "netns", None)
        if not netns:
            raise ClusterError("the lab's own cluster runs in the namespace lab only")
        self.root.mkdir(parents=True, exist_ok=True)
        hosts = [self.control, *self.workers]
        self.mesh = make_mesh(Internal, self.lab, hosts=hosts)
        start_mesh(self.mesh, None, warm_up=False)
        lay = layer_for(self.mesh, self.control, self.workers, self.router, self.tag, self.root)
        self.cluster = cluster = lay.ensure_cluster()
        # a late reply to a deleted pod (the node's conntrack still maps it to the pod's address) goes nowhere, not
        # to the lab's router: the nodes' routes to live pods and to the other nodes' /24s are more specific
        for h in self.workers:
            h.run(["ip", "route", "replace", "unreachable", str(config.POD_NETWORK)])
        archive, self.image_digest = ensure_image()
        for w in cluster.workers:
            w.ctr(["-n", "k8s.io", "images", "import", str(archive)], timeout=300)
        self.forwarder = Forwarder(str(netns), (cluster.plan.control_ip, config.API_PORT))
        pki = cluster.pki
        write_kubeconfig(self.kubeconfig, kubeconfig(f"https://127.0.0.1:{self.forwarder.port}",
                                                     pki.cert("ca").read_bytes(), pki.cert("admin").read_bytes(),
                                                     pki.key("admin").read_bytes()))  # fmt: skip

    def stop(self) -> list[str]:
        for k, v in list(_CLUSTERS.items()):
            if v is self:
                del _CLUSTERS[k]
        if self.forwarder is not None:
            self.forwarder.stop()
            self.forwarder = None
        with contextlib.suppress(OSError):
            self.kubeconfig.unlink()  # it holds a private key
        # the nodes' `unreachable` pod network stays until the lab goes: their conntrack maps a VPN server's late
        # packets to the pods for minutes after the pods and the cluster went (nebula's server kept probing 100
        # deleted pods; with the route taken away first, 22 of those packets reached the lab's router)
        left: list[str] = []
        if self.mesh is not None:
            left = end_mesh(self.mesh)  # its layer (the cluster, the overlay) first
            left += self.mesh.layer_leftovers
            self.mesh = None
        self.cluster = None
        return left


def lab_cluster_for(vpn_mesh: Mesh, lab: Lab, control: Host, workers: list[Host], root: Path) -> LabCluster:
    """The VPN mesh's lab cluster, brought up on first use and registered to go before that mesh stops."""
    lc = _CLUSTERS.get(id(vpn_mesh))
    if lc is not None and lc in vpn_mesh.layers:
        return lc
    lc = LabCluster(lab, control, workers, root)
    try:
        lc.up()
    except BaseException:
        lc.stop()
        raise
    _CLUSTERS[id(vpn_mesh)] = lc
    vpn_mesh.layers.append(lc)
    return lc
