"""What the cluster's parts are told: addresses, config files and command lines, as pure functions of the
cluster's plan (no process runs here: the fast lane tests every line of it).

Addressing (none of it overlaps the lab's 10.100.0.0/14 or the VPNs' tunnel ranges, lab/addressing.py):
  pods       10.244.0.0/16; node hI gets 10.244.I.0/24: its VXLAN device holds 10.244.I.0/32 (flannel's
             scheme), the pods' gateway is 10.244.I.1 (ptp puts it on every pod's host-side veth), host-local
             hands out .2-.239, the no-Kubernetes control's "pods" take .250 and up
  services   10.112.0.0/16 (kubeadm's 10.96.0.0/12 would take 10.96-10.111, next to nothing of the lab's, but
             not needed: no kube-proxy runs); the `kubernetes` service is 10.112.0.1
  overlay    VXLAN VNI 1 on UDP 8472 (flannel's and Calico's Linux port; the lab's own `vxlan` VPN uses 4789),
             `dev` = the interface the host reaches its peers' tunnel addresses by, `local` = its tunnel address,
             MTU = that interface's MTU - 50 (flannel's rule, pkg/backend/vxlan/device.go: 1280 -> 1230, seed
             000's VPN MTU; 1500 -> 1450, its first baseline)

Inside a node's private mount namespace (kube/node.py) the daemons keep their default short paths: /run is a
tmpfs of its own (containerd's sockets and state, runc's state, shims' sockets), /var/lib and /var/log are
overlays whose writes land in the node's folder, /var/lib/containerd, /var/lib/kubelet and /var/log/pods are
bind mounts of folders in the run folder (on the real disk: cAdvisor measures them)."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POD_NETWORK = ipaddress.IPv4Network("10.244.0.0/16")
SERVICE_NETWORK = ipaddress.IPv4Network("10.112.0.0/16")
API_SERVICE_IP = str(SERVICE_NETWORK.network_address + 1)
API_PORT = 6443
ETCD_CLIENT = "http://127.0.0.1:2379"
VXLAN_VNI = 1
VXLAN_PORT = 8472
VXLAN_DEV = "kvx0"
VXLAN_OVERHEAD = 50  # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8
NAMESPACE = "tb"  # the namespace the lab's pods run in
POD_RANGE = (2, 239)  # host-local hands these out in each node's /24
CONTROL_POD_HOST = 250  # the no-Kubernetes control's first "pod" address in a node's /24
CONTAINERD_SOCK = "/run/containerd/containerd.sock"
API_SA = "tb-api"  # the service account the API test's pod lists pods as


def pod_subnet(index: int) -> ipaddress.IPv4Network:
    """Node hI's pod /24 (I = the lab host's number, 1..254)."""
    if not 1 <= index <= 254:
        raise ValueError(f"node index {index} outside 1..254 (one /24 of {POD_NETWORK} per node)")
    return ipaddress.IPv4Network(f"10.244.{index}.0/24")


def vxlan_ip(index: int) -> str:
    return str(pod_subnet(index).network_address)


def pod_gateway(index: int) -> str:
    return str(pod_subnet(index).network_address + 1)


def control_pod_ip(index: int, n: int = 0) -> str:
    return str(pod_subnet(index).network_address + CONTROL_POD_HOST + n)


def vxlan_mac(index: int) -> str:
    """A fixed, locally administered MAC per node (the peers' FDB and neighbour entries name it)."""
    return f"02:6b:38:00:00:{index:02x}"


def overlay_mtu(underlay_mtu: int) -> int:
    return underlay_mtu - VXLAN_OVERHEAD


def cgroup_root(tag: str, host: str) -> str:
    """The kubelet's cgroupRoot for a node: one folder per run and host in every hierarchy."""
    return f"/{tag}-{host}"


# -- node files -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeDirs:
    """A worker's folders in the run folder."""

    root: Path

    @property
    def containerd(self) -> Path:
        return self.root / "containerd"

    @property
    def kubelet(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pods"

    @property
    def cni_conf(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_data(self) -> Path:
        return self.root / "cni" / "networks"

    @property
    def volume_plugins(self) -> Path:
        return self.root / "volume-plugins"

    def overlay(self, name: str) -> tuple[Path, Path]:
        """(upper, work) of the overlay over /var/<name>."""
        return self.root / "overlay" / name / "upper", self.root / "overlay" / name / "work"

    def all(self) -> list[Path]:
        dirs = [
            self.containerd,
            self.kubelet,
            self.pod_logs,
            self.cni_conf,
            self.cni_data,
            self.volume_plugins,
        ]
        for name in ("varlib", "varlog"):
            dirs += list(self.overlay(name))
        return dirs


def mount_script(dirs: NodeDirs, ready: Path) -> str:
    """The holder's shell script (run by `unshare --mount --propagation private`): the node's private mounts,
    a ready mark, then it sleeps holding the namespace (kube/node.py)."""
    vl_up, vl_work = dirs.overlay("varlib")
    vg_up, vg_work = dirs.overlay("varlog")
    lines = [
        "set -e",
        "mount -t tmpfs -o mode=0755 tb-run /run",
        f"mount -t overlay tb-varlib -o lowerdir=/var/lib,upperdir={vl_up},workdir={vl_work} /var/lib",
        f"mount -t overlay tb-varlog -o lowerdir=/var/log,upperdir={vg_up},workdir={vg_work} /var/log",
        "mkdir -p /run/containerd /var/lib/containerd /var/lib/kubelet /var/log/pods",
        f"mount --bind {dirs.containerd} /var/lib/containerd",
        f"mount --bind {dirs.kubelet} /var/lib/kubelet",
        f"mount --bind {dirs.pod_logs} /var/log/pods",
        f"echo ready > {ready}",
        "exec sleep infinity",
    ]
    return "\n".join(lines) + "\n"


def containerd_toml(dirs: NodeDirs, runc: Path, cni_bin: Path, sandbox_image: str) -> str:
    """containerd 1.6's config (version 2) for one node: its own root, state and sockets; the CRI plugin with
    the lab's pause image, the pinned runc, Debian's CNI plugins and the node's CNI config; oom_score_adj not
    lowered (CAP_SYS_RESOURCE is not in this machine's bounding set: every sandbox failed without it); pod
    network namespaces kept under the state folder, not /run/netns."""
    q = json.dumps  # TOML basic strings and JSON strings escape alike
    return f"""version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {q(CONTAINERD_SOCK)}

[ttrpc]
  address = {q(CONTAINERD_SOCK + ".ttrpc")}

[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {q(sandbox_image)}
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  BinaryName = {q(str(runc))}
  SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = {q(str(cni_bin))}
  conf_dir = {q(str(dirs.cni_conf))}
  max_conf_num = 1
"""


def cni_conflist(index: int, mtu: int, data_dir: Path) -> dict[str, Any]:
    """ptp (a veth per pod, host routes, no bridge: Calico's data plane shape) with host-local from the node's
    /24 and masquerade of what leaves the pod network: a VPN accepts only its peers' addresses (WireGuard's
    allowed IPs), so a pod's packet to the apiserver must leave with the node's tunnel address."""
    net = pod_subnet(index)
    base = int(net.network_address)
    return {
        "cniVersion": "0.4.0",
        "name": "tunnelbench",
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": True,
                "mtu": mtu,
                "ipam": {
                    "type": "host-local",
                    # the whole pod network as the subnet: ptp masquerades what leaves it, not pod-to-pod
                    "ranges": [
                        [
                            {
                                "subnet": str(POD_NETWORK),
                                "rangeStart": str(ipaddress.IPv4Address(base + POD_RANGE[0])),
                                "rangeEnd": str(ipaddress.IPv4Address(base + POD_RANGE[1])),
                                "gateway": pod_gateway(index),
                            }
                        ]
                    ],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(data_dir),
                },
            }
        ],
    }


def kubeconfig(server: str, ca: Path, cert: Path, key: Path, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "tb", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "tb", "context": {"cluster": "tb", "user": user}}],
        "current-context": "tb",
    }


def kubelet_config(node_ip: str, cgroup: str, ca: Path, dirs: NodeDirs, resolv: Path) -> dict[str, Any]:
    """KubeletConfiguration (kubelet.config.k8s.io/v1beta1, k8s.io/kubelet v0.34.4 types.go)."""
    zero = {
        k: "0%" for k in ("memory.available", "nodefs.available", "nodefs.inodesFree", "imagefs.available")
    }
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},  # only the apiserver's client certificate gets this far
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup,
        "cgroupsPerQOS": True,
        "failCgroupV1": False,  # this machine is cgroup v1 (hybrid); 1.35+ defaults to true
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}",
        "podLogsDir": "/var/log/pods",
        "volumePluginDir": str(dirs.volume_plugins),
        "failSwapOn": False,
        # kind's choice: each kubelet sees the whole machine's disk and memory; it must never evict the lab
        "evictionHard": zero,
        "imageGCHighThresholdPercent": 100,
        "resolvConf": str(resolv),
        "protectKernelDefaults": False,  # it sets 6 global sysctls instead: journaled and restored (system.py)
        "serializeImagePulls": False,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "registerNode": True,
        "clusterDomain": "cluster.local",
        "maxPods": 110,
        "containerLogMaxSize": "50Mi",
    }


def kubelet_argv(kubelet: Path, config: Path, kubeconfig_path: Path, host: str, node_ip: str) -> list[str]:
    return [
        str(kubelet),
        f"--config={config}",
        f"--kubeconfig={kubeconfig_path}",
        f"--hostname-override={host}",
        f"--node-ip={node_ip}",
        "--root-dir=/var/lib/kubelet",
        "--v=1",
    ]


def etcd_argv(etcd: Path, data_dir: Path) -> list[str]:
    peer = "http://127.0.0.1:2380"
    return [
        str(etcd),
        "--name=tb",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={ETCD_CLIENT}",
        f"--advertise-client-urls={ETCD_CLIENT}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=tb={peer}",
        "--logger=zap",
        "--log-level=warn",
    ]


@dataclass(frozen=True)
class Pki:
    """Where the cluster's certificates and keys are (kube/pki.py makes them)."""

    dir: Path

    def cert(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"


def apiserver_argv(apiserver: Path, advertise: str, pki: Pki) -> list[str]:
    """Serving on the control-plane host's tunnel address only: every call from a node crosses the VPN."""
    return [
        str(apiserver),
        f"--etcd-servers={ETCD_CLIENT}",
        f"--bind-address={advertise}",
        f"--advertise-address={advertise}",
        f"--secure-port={API_PORT}",
        f"--tls-cert-file={pki.cert('apiserver')}",
        f"--tls-private-key-file={pki.key('apiserver')}",
        f"--client-ca-file={pki.cert('ca')}",
        f"--service-cluster-ip-range={SERVICE_NETWORK}",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki.cert('sa')}",
        f"--service-account-signing-key-file={pki.key('sa')}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",  # many_clients' VPN-client pods (kube/fleet.py); Pod Security still applies
        f"--kubelet-client-certificate={pki.cert('apiserver-kubelet-client')}",
        f"--kubelet-client-key={pki.key('apiserver-kubelet-client')}",
        # the node's InternalIP (its tunnel address), never a DNS lookup of its name (none answers in the lab)
        "--kubelet-preferred-address-types=InternalIP",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_argv(cm: Path, kubeconfig_path: Path, pki: Pki) -> list[str]:
    """Every default controller (the cluster's housekeeping is part of what the seed measured), no leader
    election (one instance), no node CIDR allocation (the lab gives each node its /24 itself). The node
    monitor's grace period is long enough that freezing the cluster for the no-Kubernetes control never
    marks a node NotReady (cluster.py thaws the kubelets first)."""
    return [
        str(cm),
        f"--kubeconfig={kubeconfig_path}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        "--allocate-node-cidrs=false",
        f"--root-ca-file={pki.cert('ca')}",
        f"--service-account-private-key-file={pki.key('sa')}",
        "--use-service-account-credentials=true",  # each controller its own identity (kubeadm: their RBAC roles)
        "--node-monitor-grace-period=10m",
        "--profiling=false",
        "--v=1",
    ]


# -- manifests ----------------------------------------------------------------------------------------
TOLERATE_ALL = [{"operator": "Exists"}]  # a benchmark pod stays where it was put, whatever the node's taints


def pod(
    name: str,
    node: str,
    image: str,
    command: list[str],
    service_account: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A bare pod pinned to `node` by nodeName (no scheduler runs; seed 000 pinned its iperf3 pods to the two
    workers), the image imported on the node (never pulled), a writable /tmp (iperf3 needs one)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app": "tunnelbench", **(labels or {})},
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "tolerations": TOLERATE_ALL,
            "automountServiceAccountToken": service_account is not None,
            **({"serviceAccountName": service_account} if service_account else {}),
            "enableServiceLinks": False,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }


def api_access() -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object): the API test's identity, allowed to list pods in the lab's namespace only."""
    ns = NAMESPACE
    role = "tb-list-pods"
    return [
        (f"/api/v1/namespaces/{ns}/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount",
                                                      "metadata": {"name": API_SA, "namespace": ns}}),
        (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": role, "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        }),
        (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": role, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": API_SA, "namespace": ns}],
        }),
    ]  # fmt: skip


def pods_list_path() -> str:
    """What the API test asks for: the pods of the lab's namespace (seed 000: hey listing pods)."""
    return f"/api/v1/namespaces/{NAMESPACE}/pods"
