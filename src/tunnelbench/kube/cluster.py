"""A Kubernetes cluster on the lab's hosts whose nodes talk over the VPN under test.

    h1   control plane: etcd (127.0.0.1), kube-apiserver serving on h1's tunnel address only, the controller
         manager; no kubelet (seed 000's master ran no workloads), no scheduler (pods are placed by nodeName)
    h2.. workers: containerd + kubelet each (kube/node.py), node IP = the host's tunnel address, so heartbeats,
         the kubelets' API calls and (kube/overlay.py) every pod packet between nodes cross the VPN

Bring-up order: the global sysctls the kubelets change are journaled first (kube/system.py), the PKI made, etcd,
the apiserver (ready), the namespace and the API test's identity, the controller manager, then the workers
(runtime, images, kubelet) until every node is Ready with InternalIP = its tunnel address. Teardown in reverse,
the pods deleted through the API first (the CNI's DEL runs), the sysctls restored, the private keys removed.

`freeze()` stops every daemon of the cluster (SIGSTOP) for the no-Kubernetes control, so it measures the same
overlay with none of the cluster's housekeeping running; `thaw()` continues the kubelets before the controller
manager, whose node monitor then sees fresh heartbeats."""

from __future__ import annotations

import json
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tunnelbench.kube import build, config, pki
from tunnelbench.kube.api import Api, ApiError
from tunnelbench.kube.node import NodeError, Worker
from tunnelbench.kube.system import NsenterHost, restore_sysctls, save_sysctls
from tunnelbench.lab.host import Host, Process

APISERVER_READY_S = 120.0
NODES_READY_S = 180.0
POD_S = 120.0


class ClusterError(RuntimeError):
    pass


@dataclass
class Plan:
    """Who is what: the control-plane host and the workers, each with its tunnel address (node IP)."""

    tag: str
    control: Host
    control_ip: str
    workers: list[tuple[Host, int, str]]  # (host, index in the lab, tunnel address)
    dir: Path
    mtu: int  # the pods' MTU (the overlay's)


@dataclass
class Usage:
    """CPU seconds and RSS of the cluster's own processes (pods excluded), at one moment."""

    cpu_s: dict[str, float] = field(default_factory=dict)  # "control-plane", "h2", ...
    rss_b: dict[str, int] = field(default_factory=dict)


def _netns(host: Host) -> str:
    ns = getattr(host, "netns", None)
    if not ns:
        raise ClusterError(f"{host.name}: the Kubernetes layer runs in the namespace lab only")
    return str(ns)


class Cluster:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.pki = config.Pki(plan.dir / "pki")
        self.cp: list[Process] = []
        self.workers = [
            Worker(h, _netns(h), i, ip, plan.tag, config.NodeDirs(plan.dir / h.name))
            for h, i, ip in plan.workers
        ]
        self.sysctl_entry: dict[str, Any] | None = None
        self.api: Api | None = None
        self.frozen = False
        self.timings: dict[str, float] = {}

    # -- bring-up -------------------------------------------------------------------------------------
    def up(self) -> None:
        if not build.installed():
            raise ClusterError(build.NOT_CACHED)
        t0 = time.monotonic()
        p = self.plan
        self.sysctl_entry = save_sysctls(p.control.journal)
        self._make_pki()
        self._control_plane()
        self.timings["control_plane_s"] = round(time.monotonic() - t0, 1)
        t1 = time.monotonic()
        for w in self.workers:
            w.start_runtime(p.mtu)
        for w in self.workers:
            kc = w.dirs.root / "kubelet.kubeconfig"
            kc.write_text(json.dumps(config.kubeconfig(self.server, self.pki.cert("ca"), self.pki.cert(f"node-{w.name}"),
                                                       self.pki.key(f"node-{w.name}"), f"system:node:{w.name}")))  # fmt: skip
            w.start_kubelet(self.pki.cert("ca"), kc)
        self._wait_nodes()
        self.timings["nodes_ready_s"] = round(time.monotonic() - t1, 1)

    @property
    def server(self) -> str:
        return f"https://{self.plan.control_ip}:{config.API_PORT}"

    def _make_pki(self) -> None:
        p, d = self.plan, self.pki
        d.dir.mkdir(parents=True, exist_ok=True)
        ca = pki.make_ca()
        pairs: dict[str, pki.Pair] = {
            "ca": ca,
            "apiserver": pki.issue(ca, "kube-apiserver", ips=[p.control_ip, config.API_SERVICE_IP, "127.0.0.1"],
                                   dns=["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                        "kubernetes.default.svc.cluster.local", "localhost"], server=True),
            "apiserver-kubelet-client": pki.issue(ca, "kube-apiserver-kubelet-client", ["system:masters"], client=True),
            "admin": pki.issue(ca, "tunnelbench", ["system:masters"], client=True),
            "controller-manager": pki.issue(ca, "system:kube-controller-manager", client=True),
            "sa": pki.signing_key(),
        }  # fmt: skip
        for w in self.workers:
            pairs[f"node-{w.name}"] = pki.issue(ca, f"system:node:{w.name}", ["system:nodes"], client=True)
        for name, pair in pairs.items():
            p.control.write_file(d.cert(name), pair.cert_pem, 0o644)
            p.control.write_file(d.key(name), pair.key_pem, 0o600)

    def _spawn(self, argv: list[str], label: str) -> Process:
        h = NsenterHost(self.plan.control, _netns(self.plan.control))
        proc = h.spawn(argv, label=label, log_path=self.plan.dir / "control-plane" / f"{label}.log")
        self.cp.append(proc)
        return proc

    def _control_plane(self) -> None:
        p, d = self.plan, self.pki
        etcd = self._spawn(config.etcd_argv(build.bin_path("etcd"), p.dir / "control-plane" / "etcd"), "etcd")
        apiserver = self._spawn(
            config.apiserver_argv(build.bin_path("kube-apiserver"), p.control_ip, d), "kube-apiserver"
        )
        self.api = Api(
            _netns(p.control), p.control_ip, config.API_PORT, d.cert("ca"), d.cert("admin"), d.key("admin")
        )
        end = time.monotonic() + APISERVER_READY_S
        try:
            self.api.ready(end)
        except TimeoutError as e:
            dead = [x for x in (etcd, apiserver) if not x.alive()]
            tail = dead[0].log_tail(800) if dead else apiserver.log_tail(800)
            raise ClusterError(f"{e}; {dead[0].label + ' exited: ' if dead else ''}{tail}") from None
        self.api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": config.NAMESPACE}})  # fmt: skip
        for path, obj in config.api_access():
            self.api.create(path, obj)
        kc = p.dir / "control-plane" / "controller-manager.kubeconfig"
        kc.write_text(json.dumps(config.kubeconfig(self.server, d.cert("ca"), d.cert("controller-manager"),
                                                   d.key("controller-manager"), "system:kube-controller-manager")))  # fmt: skip
        self._spawn(
            config.controller_manager_argv(build.bin_path("kube-controller-manager"), kc, d),
            "kube-controller-manager",
        )

    def nodes(self) -> list[dict[str, Any]]:
        assert self.api is not None
        return list(self.api.get("/api/v1/nodes")["items"])

    def _wait_nodes(self) -> None:
        end = time.monotonic() + NODES_READY_S
        want = {w.name: w.node_ip for w in self.workers}
        seen: dict[str, str] = {}
        while True:
            self.check_alive()
            seen = {}
            for n in self.nodes():
                ready = any(
                    c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])
                )
                ip = next(
                    (a["address"] for a in n["status"].get("addresses", []) if a["type"] == "InternalIP"), ""
                )
                seen[n["metadata"]["name"]] = ip if ready else "not ready"
            if all(seen.get(k) == v for k, v in want.items()):
                break
            if any(seen.get(k) not in (None, "not ready", v) for k, v in want.items()):
                raise ClusterError(f"a node's InternalIP is not its tunnel address: {seen} (want {want})")
            if time.monotonic() > end:
                raise ClusterError(
                    f"nodes not Ready after {NODES_READY_S:.0f} s: {seen or 'none registered'} (want {want})"
                )
            time.sleep(1)
        # a pod needs its namespace's default service account and the CA bundle its token volume projects (the
        # controller manager's serviceaccount and root-ca-cert-publisher controllers make them)
        self.wait_for(f"/api/v1/namespaces/{config.NAMESPACE}/serviceaccounts/default", 60)
        self.wait_for(f"/api/v1/namespaces/{config.NAMESPACE}/configmaps/kube-root-ca.crt", 60)

    def wait_for(self, path: str, timeout: float) -> Any:
        assert self.api is not None
        end = time.monotonic() + timeout
        while True:
            try:
                return self.api.get(path)
            except ApiError as e:
                if e.status != 404 or time.monotonic() > end:
                    raise
            time.sleep(0.5)

    def check_alive(self) -> None:
        dead = [p for p in self.daemons() if not p.alive()]
        if dead:
            raise ClusterError(f"{dead[0].label} exited: {dead[0].log_tail(800)}")

    def daemons(self) -> list[Process]:
        return [*self.cp, *(p for w in self.workers for p in w.procs)]

    # -- pods -----------------------------------------------------------------------------------------
    def run_pod(self, manifest: dict[str, Any], timeout: float = POD_S) -> dict[str, Any]:
        """Create a pod and wait until it runs (or has ended); its status."""
        assert self.api is not None
        name = manifest["metadata"]["name"]
        self.api.request("POST", f"/api/v1/namespaces/{config.NAMESPACE}/pods", manifest, ok=(201,))
        return self.wait_pod(name, ("Running", "Succeeded", "Failed"), timeout)

    def wait_pod(self, name: str, phases: tuple[str, ...], timeout: float) -> dict[str, Any]:
        assert self.api is not None
        end = time.monotonic() + timeout
        path = f"/api/v1/namespaces/{config.NAMESPACE}/pods/{name}"
        while True:
            pod: dict[str, Any] = self.api.get(path)
            phase = pod.get("status", {}).get("phase", "")
            if phase in phases:
                return pod
            if time.monotonic() > end:
                raise ClusterError(f"pod {name}: {phase or 'no phase'} after {timeout:.0f} s, not {'/'.join(phases)}: "
                                   f"{json.dumps(pod.get('status', {}))[:600]}")  # fmt: skip
            self.check_alive()
            time.sleep(0.2)

    def pod_log(self, pod: dict[str, Any]) -> str:
        """A pod's output (its only container's, both streams in order), read from its node's podLogsDir (the
        CRI log file the kubelet keeps): no bytes cross the VPN for it, so the case's path share is its
        workload's. `GET .../pods/NAME/log` through the apiserver returns the same text."""
        node = next(w for w in self.workers if w.name == pod["spec"]["nodeName"])
        meta = pod["metadata"]
        folder = node.dirs.pod_logs / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        return cri_log_text(sorted(folder.glob("*/0.log"))[0].read_text(errors="replace"))

    def delete_pod(self, name: str) -> None:
        assert self.api is not None
        self.api.delete(f"/api/v1/namespaces/{config.NAMESPACE}/pods/{name}")

    def delete_all_pods(self, timeout: float = 60.0) -> None:
        assert self.api is not None
        path = f"/api/v1/namespaces/{config.NAMESPACE}/pods"
        self.api.request("DELETE", path, {"gracePeriodSeconds": 0}, ok=(200, 202))
        end = time.monotonic() + timeout
        while self.api.get(path)["items"] and time.monotonic() < end:
            time.sleep(0.5)

    # -- the control's freeze, the daemons' use --------------------------------------------------
    def freeze(self) -> None:
        """SIGSTOP every daemon of the cluster, the controller manager first."""
        for p in reversed(self.daemons()):
            p.host.signal(p.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        """SIGCONT etcd, the apiserver, containerd and the kubelets, wait until every kubelet renewed its lease
        (or 15 s), then the controller manager."""
        if not self.frozen:
            return
        t0 = time.time()
        cm = [p for p in self.cp if p.label == "kube-controller-manager"]
        for p in self.daemons():
            if p not in cm:
                p.host.signal(p.pid, signal.SIGCONT)
        end = time.monotonic() + 15
        while time.monotonic() < end and not self._leases_after(t0):
            time.sleep(0.3)
        for p in cm:
            p.host.signal(p.pid, signal.SIGCONT)
        self.frozen = False

    def _leases_after(self, t: float) -> bool:
        import datetime as dt

        assert self.api is not None
        try:
            items = self.api.get("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")["items"]
        except (OSError, ApiError):
            return False
        renewed = {
            i["metadata"]["name"]
            for i in items
            if dt.datetime.fromisoformat(
                i["spec"].get("renewTime", "1970-01-01T00:00:00Z").replace("Z", "+00:00")
            ).timestamp()
            >= t
        }
        return all(w.name in renewed for w in self.workers)

    def usage(self) -> Usage:
        """CPU seconds and RSS now, per part: the control plane's daemons, each node's (its mount namespace)."""
        u = Usage()
        groups = {"control-plane": [p.pid for p in self.cp if p.alive()]}
        groups |= {w.name: w.pids() for w in self.workers}
        for name, pids in groups.items():
            cpu, rss = 0.0, 0
            for pid in pids:
                try:
                    pr = psutil.Process(pid)
                    t = pr.cpu_times()
                    cpu += t.user + t.system
                    rss += pr.memory_info().rss
                except psutil.Error:
                    continue
            u.cpu_s[name], u.rss_b[name] = cpu, rss
        return u

    # -- teardown -------------------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Everything in reverse; what could not be undone."""
        problems: list[str] = []
        if self.frozen:
            self.thaw()
        if self.api is not None and all(p.alive() for p in self.cp):
            try:
                self.delete_all_pods()
            except (OSError, ApiError) as e:
                problems.append(f"pods not deleted through the API: {e}"[:300])
        for w in reversed(self.workers):
            problems += w.stop()
        for p in reversed(self.cp):
            if not p.stop(grace=5):
                problems.append(f"{p.label} (pid {p.pid}) survived SIGKILL")
        if self.sysctl_entry is not None:
            problems += restore_sysctls(self.sysctl_entry, self.plan.control.journal)
            self.sysctl_entry = None
        for key in self.pki.dir.glob("*.key"):  # nothing secret stays in the run folder
            key.unlink(missing_ok=True)
        for w in self.workers:  # images and pod files: hundreds of MB per node; the logs stay
            for d in (w.dirs.containerd, w.dirs.root / "overlay"):
                shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(self.plan.dir / "control-plane" / "etcd", ignore_errors=True)
        return problems


def cri_log_text(log: str) -> str:
    """The text a container wrote, from its CRI log file: each line `<RFC 3339 time> <stream> <P|F> <text>`, P a
    part of a line the runtime split (continued by the next), F a line's end."""
    out: list[str] = []
    for line in log.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        text = parts[3] if len(parts) == 4 else ""
        out.append(text if parts[2] == "P" else text + "\n")
    return "".join(out)


def start(plan: Plan) -> Cluster:
    """A cluster up and Ready, or ClusterError with everything it had started undone."""
    c = Cluster(plan)
    try:
        c.up()
    except BaseException as e:
        left = c.down()
        if isinstance(e, (NodeError, ApiError, OSError, TimeoutError)):
            raise ClusterError(f"{e}" + (f" (teardown left: {left})" if left else "")) from None
        raise
    return c
