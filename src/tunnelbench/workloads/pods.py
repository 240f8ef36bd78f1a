"""Seed 000 (Kjorveziroski et al.): a VPN as the underlay of a Kubernetes cluster. The lab's hosts become nodes
whose node IPs are the VPN's tunnel addresses (kube/: the control plane on the mesh's first other host, the
case's client and server hosts the two workers), pods talk over a VXLAN overlay inside the VPN.

  pod_tcp  TCP iperf3 from a pod on the client's node to a pod on the server's node (KNB's pod-to-pod test,
           both pods pinned by nodeName); `control = true`: the same between two plain network namespaces on
           the same VXLAN over the VPN, with every daemon of the cluster stopped (SIGSTOP) meanwhile: the
           no-Kubernetes control, which tells the VPN's part of the pod-to-pod number from the cluster's
  pod_udp  the same with UDP (iperf3 -u, unlimited by default: -b 0 as KNB)
  pod_api  the Kubernetes API's response time from a pod: hey in a pod on the client's node listing the pods of
           the lab's namespace at the apiserver's tunnel address (a service account allowed exactly that), at
           10 requests/s for `count` requests (seed: 5000); the path crosses the VPN, not the overlay (the
           apiserver is a host process, as k3s's is)

The baselines of the seed are VPNs of the run: `internal` (no VPN: VXLAN over the underlay at 1500 - 50 = 1450)
and `internal@mtu1280` (the underlay at 1280: VXLAN at 1230, the seed's second baseline: the same packet sizes
on the wire as VXLAN at 1230 over a 1500 link, since no overlay packet is bigger than 1280).

Besides the tool's metrics every case stores the cluster's own CPU (its daemons: etcd, apiserver, controller
manager; per node containerd, kubelet and the shims; not the pods) and memory, and the proof of the path: the
router's count of packets carrying a pod or service address (must be 0) and of VXLAN packets in the clear (0
when the overlay rode inside the VPN). Impairment (the scenario's profiles) sits where the lab puts it: on the
router, the underlay. Seed 000 put tc netem on the Calico interface, the overlay: recorded with each case."""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import shlex
import time
from typing import Any

import numpy as np
from pydantic import Field

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome, Series
from tunnelbench.instruments.common import add_percentiles
from tunnelbench.instruments.iperf3 import PORT, parse_tcp, parse_udp, run_client, udp_window
from tunnelbench.kube import build, config
from tunnelbench.kube.cluster import Cluster, ClusterError, Usage
from tunnelbench.kube.layer import KubeLayer, layer_for
from tunnelbench.kube.overlay import ControlPod
from tunnelbench.lab.host import Host
from tunnelbench.workloads.base import CaseContext, NotApplicable, Params, Workload, WorkloadError
from tunnelbench.workloads.http_api import HttpApi
from tunnelbench.workloads.tcp import TCP_METRICS
from tunnelbench.workloads.udp import Udp

IMPAIRMENT_AT = "underlay (the lab's router); seed 000: tc netem on the Calico (overlay) interface"
ERR_MARK = "@@tunnelbench-stderr@@"

KUBE_METRICS = (
    MetricSpec("k8s_cpu_pct", "%", "none", "the cluster's own processes (not the pods), % of one core over the case"),
    MetricSpec("k8s_control_plane_cpu_pct", "%", "none", "etcd, apiserver and controller manager, % of one core"),
    MetricSpec("k8s_nodes_cpu_pct", "%", "none", "containerd, kubelet and shims of both workers, % of one core"),
    MetricSpec("k8s_rss_mib", "MiB", "none", "resident memory of the cluster's own processes at the case's end"),
    MetricSpec("underlay_pod_packets", "count", "lower", "packets the router forwarded with a pod or service "
               "address (0: every pod packet was inside the overlay)"),
    MetricSpec("underlay_vxlan_packets", "count", "none", "VXLAN packets the router saw in the clear (0: the "
               "overlay rode inside the VPN; a few: a VPN's own probes to overlay addresses it offers as "
               "endpoints left outside its tunnel, docs/kubernetes.md)"),
    MetricSpec("overlay_mtu_bytes", "B", "none", "the pods' MTU: the VPN interface's minus 50 (VXLAN)"),
)  # fmt: skip
_SEQ = itertools.count(1)
BRING_UP_S = 75  # allowance per case for a session's first, which brings the cluster up
KUBE_WORKLOADS = ("pod_tcp", "pod_udp", "pod_api")  # need the Kubernetes build (`plan` says so)


def _roles(ctx: CaseContext) -> tuple[Host, list[Host]]:
    """(control plane, [sender's node, receiver's node]): the mesh's first host that is neither end."""
    control = next((h for h in ctx.mesh.hosts if h not in (ctx.client, ctx.server)), None)
    if control is None:
        raise NotApplicable(
            "the cluster needs a third host of the mesh for its control plane (lab.hosts >= 3)"
        )
    return control, [ctx.client, ctx.server]


def layer(ctx: CaseContext) -> KubeLayer:
    if ctx.lab is None or ctx.client.remote:
        raise NotApplicable("the Kubernetes layer runs in the namespace lab")
    control, workers = _roles(ctx)
    return layer_for(ctx.mesh, control, workers, ctx.lab.router, ctx.lab.tag, ctx.lab.run_dir / "kube")


class Measure:
    """The cluster's use and the router's counts around one case."""

    def __init__(self, lay: KubeLayer):
        self.lay = lay
        self.t0 = time.monotonic()
        self.u0 = lay.cluster.usage() if lay.cluster is not None else None
        self.c0 = lay.counts()

    def add_to(self, out: Outcome) -> None:
        lay, took = self.lay, max(time.monotonic() - self.t0, 1e-6)
        c1 = lay.counts()
        if self.c0 is not None and c1 is not None:
            out.add("underlay_pod_packets", c1.pod_packets - self.c0.pod_packets)
            out.add("underlay_vxlan_packets", c1.vxlan_packets - self.c0.vxlan_packets)
        if lay.overlay is not None:
            out.add("overlay_mtu_bytes", lay.overlay.mtu)
        if self.u0 is not None and lay.cluster is not None:
            add_usage(out, self.u0, lay.cluster.usage(), took)


def add_usage(out: Outcome, u0: Usage, u1: Usage, seconds: float) -> None:
    """CPU % of one core per part over `seconds`, and the RSS at the end (u1)."""

    def pct(names: list[str]) -> float:
        return 100.0 * sum(max(0.0, u1.cpu_s.get(n, 0.0) - u0.cpu_s.get(n, 0.0)) for n in names) / seconds

    nodes = [n for n in u1.cpu_s if n != "control-plane"]
    out.add("k8s_cpu_pct", pct(list(u1.cpu_s)))
    out.add("k8s_control_plane_cpu_pct", pct(["control-plane"]))
    out.add("k8s_nodes_cpu_pct", pct(nodes))
    out.add("k8s_rss_mib", sum(u1.rss_b.values()) / 2**20)


def split_log(log: str) -> tuple[str, str]:
    """A pod's output as the pods write it: stdout, then ERR_MARK on a line, then stderr."""
    out, _, err = log.partition(ERR_MARK + "\n")
    return out, err


def wrapped(script: str, tmp: str = "/tmp") -> list[str]:
    """A shell command line run in a pod so its stdout comes first and whole, then the mark, then its stderr,
    with its exit code: the pod's log (one stream through the API) parses back with split_log. `tmp`: a writable
    folder (the pod's emptyDir)."""
    o, e = f"{tmp}/tb-out", f"{tmp}/tb-err"
    return ["sh", "-c", f"({script}) >{o} 2>{e}; rc=$?; cat {o}; echo {ERR_MARK}; cat {e}; exit $rc"]


def run_pod_to_end(
    cluster: Cluster, name: str, node: str, argv: list[str], timeout: float, **kw: Any
) -> tuple[str, str]:
    """Run argv in a pod on `node` to its end; (stdout, stderr). The pod is deleted afterwards."""
    manifest = config.pod(name, node, build.TOOLS_IMAGE, wrapped(shlex.join(argv)), **kw)
    try:
        cluster.run_pod(manifest)
        pod = cluster.wait_pod(name, ("Succeeded", "Failed"), timeout)
        out, err = split_log(cluster.pod_log(pod))
        if pod["status"]["phase"] == "Failed" and not out.strip():
            raise WorkloadError(f"pod {name} failed: {err[-400:]}")
        return out, err
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            cluster.delete_pod(name)


class PodParams(Params):
    duration_s: int = Field(10, ge=1, le=3600, description="measured seconds (seed 000: 60)")
    omit_s: int = Field(1, ge=0, le=60, description="warm-up seconds excluded (iperf3 -O)")
    control: bool = Field(
        False, description="the no-Kubernetes control: plain namespaces as pods, cluster stopped"
    )


class PodUdpParams(PodParams):
    bitrate: str = Field("0", pattern=r"^\d+(\.\d+)?[KMG]?$", description="iperf3 -b: 0 = unlimited (KNB)")


class _Iperf(Workload):
    """pod_tcp and pod_udp: iperf3 between pods on the two workers, or between the control's namespaces."""

    tools = ("iperf3",)
    namespace_lab_only = "its nodes are the namespace lab's hosts (kube/)"
    udp = False
    params: PodParams

    def label(self) -> str:
        return f"pod-{'udp' if self.udp else 'tcp'}" + ("-control" if self.params.control else "")

    def expected_seconds(self) -> float:
        # the pod's start and end, and on a session's first case the cluster's bring-up (its timeout is twice this)
        return self.params.duration_s + self.params.omit_s + (15 if self.params.control else BRING_UP_S)

    def iperf_args(self, client: Host, server: Host) -> list[str]:
        if not self.udp:
            return []
        assert isinstance(self.params, PodUdpParams)
        return ["-u", "-b", self.params.bitrate, *udp_window(client, server)]

    def run(self, ctx: CaseContext) -> Outcome:
        lay = layer(ctx)
        if self.params.control:
            return self._control(ctx, lay)
        try:
            cluster = lay.ensure_cluster()
        except ClusterError as e:
            raise WorkloadError(f"cluster did not come up: {e}") from None
        p = self.params
        server_ip = self._server_pod(cluster, lay, ctx.server.name)
        m = Measure(lay)
        name = f"{self.label()}-{next(_SEQ)}"
        argv = ["iperf3", "-c", server_ip, "-p", str(PORT), "-J", "-t", str(p.duration_s), "-O", str(p.omit_s),
                "--connect-timeout", "5000", *self.iperf_args(ctx.client, ctx.server)]  # fmt: skip
        t0 = time.monotonic()
        try:
            out_text, err = run_pod_to_end(cluster, name, ctx.client.name, argv, p.duration_s + p.omit_s + 60)
        except ClusterError as e:
            raise WorkloadError(str(e)) from None
        ran = time.monotonic() - t0
        (ctx.artifact_dir / f"{name}.json").write_text(out_text)
        out = self.parse(out_text, err, min(ran, p.duration_s))
        m.add_to(out)
        self._record(ctx, lay, server_ip)
        return out

    def parse(self, text: str, err: str, measure_s: float) -> Outcome:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            raise WorkloadError(f"iperf3 in the pod printed no JSON: {err[-400:] or text[-400:]}") from None
        if "error" in data:
            raise WorkloadError(f"iperf3: {data['error']}")
        out = Outcome(measure_s=measure_s)
        (parse_udp if self.udp else parse_tcp)(data, out)
        return out

    def _server_pod(self, cluster: Cluster, lay: KubeLayer, node: str) -> str:
        """The iperf3 server pod on the receiver's node (one per cluster, serving test after test): its IP."""
        name = f"iperf3-server-{node}"
        ip = lay.pods.get(name)
        if ip is None:
            pod = cluster.run_pod(
                config.pod(name, node, build.TOOLS_IMAGE, ["iperf3", "-s", "-p", str(PORT)])
            )
            if pod["status"]["phase"] != "Running":
                raise WorkloadError(
                    f"iperf3 server pod {pod['status']['phase']}: {json.dumps(pod['status'])[:400]}"
                )
            ip = lay.pods[name] = str(pod["status"]["podIP"])
            time.sleep(0.5)  # iperf3 binds its port right after it starts
        return ip

    def _control(self, ctx: CaseContext, lay: KubeLayer) -> Outcome:
        pods = lay.ensure_control_pods()
        frozen = lay.cluster is not None
        if lay.cluster is not None:
            lay.cluster.freeze()
        try:
            m = Measure(lay)
            out = self._control_iperf(ctx, pods)
            m.add_to(out)
        finally:
            if lay.cluster is not None and frozen:
                lay.cluster.thaw()
        self._record(ctx, lay, pods[1].ip)
        return out

    def _control_iperf(self, ctx: CaseContext, pods: list[ControlPod]) -> Outcome:
        p = self.params
        ends = _Ends(pods[0].host, pods[1].host, pods[1].ip, ctx)
        data, ran = run_client(
            ends, self.iperf_args(ctx.client, ctx.server), p.duration_s, p.omit_s, self.label()
        )
        out = Outcome(measure_s=min(ran, p.duration_s))
        (parse_udp if self.udp else parse_tcp)(data, out)
        return out

    def _record(self, ctx: CaseContext, lay: KubeLayer, server_ip: str) -> None:
        rec = lay.record() | {"impairment_at": IMPAIRMENT_AT, "server_pod_ip": server_ip}
        (ctx.artifact_dir / "kubernetes.json").write_text(json.dumps(rec, indent=1) + "\n")


class _Ends:
    """The control's two namespaces as an instrument's case ends (instruments/base.py CaseEnds)."""

    def __init__(self, client: Host, server: Host, server_ip: str, ctx: CaseContext):
        self.client, self.server, self.server_ip = client, server, server_ip
        self.artifact_dir, self._ctx = ctx.artifact_dir, ctx
        self.options: dict[str, Any] = {}

    def remaining(self, floor: float = 1.0) -> float:
        return self._ctx.remaining(floor)


class PodTcp(_Iperf):
    name = "pod_tcp"
    summary = "Kubernetes pod-to-pod TCP over a VXLAN overlay inside the VPN (seed 000; control = no cluster)"
    headline = ("goodput_mbps", "k8s_cpu_pct")
    Params = PodParams
    metrics = (*TCP_METRICS, *KUBE_METRICS)


class PodUdp(_Iperf):
    name = "pod_udp"
    summary = "Kubernetes pod-to-pod UDP (iperf3 -b 0) over a VXLAN overlay inside the VPN (seed 000)"
    headline = ("goodput_mbps", "udp_loss_pct", "k8s_cpu_pct")
    Params = PodUdpParams
    params: PodUdpParams
    udp = True
    metrics = (*Udp.metrics, *KUBE_METRICS)


class PodApiParams(Params):
    count: int = Field(200, ge=1, le=1_000_000, description="requests (seed 000: 5000 per iteration)")
    rate_per_s: float = Field(10.0, gt=0, le=1000, description="requests per second (seed 000: at most 10)")
    timeout_s: int = Field(10, ge=1, le=600, description="a request slower than this is an error")


class PodApi(Workload):
    name = "pod_api"
    summary = "Kubernetes API response time from a pod (hey listing pods at the apiserver's tunnel address)"
    tools = ("hey",)
    namespace_lab_only = "its nodes are the namespace lab's hosts (kube/)"
    headline = ("request_p50_ms", "request_p99_ms", "error_rate_pct")
    Params = PodApiParams
    params: PodApiParams
    metrics = (*(m for m in HttpApi.metrics if m.name != "response_bytes"), *KUBE_METRICS)

    def label(self) -> str:
        return f"pod-api-{self.params.rate_per_s:g}rps"

    def expected_seconds(self) -> float:
        return self.params.count / self.params.rate_per_s + BRING_UP_S

    def hosts_needed(self) -> int:
        """The client's node and the control plane: its traffic is not between the case's client and server, so
        the runner's pair path check does not apply (the router's pod-address count still does)."""
        return 3

    def run(self, ctx: CaseContext) -> Outcome:
        lay = layer(ctx)
        try:
            cluster = lay.ensure_cluster()
        except ClusterError as e:
            raise WorkloadError(f"cluster did not come up: {e}") from None
        p = self.params
        url = f"https://{ctx.mesh.tunnel_ip(lay.control)}:{config.API_PORT}{config.pods_list_path()}"
        token = "$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)"
        hey = (f"hey -n {p.count} -c 1 -q {p.rate_per_s:g} -t {p.timeout_s} -o csv "
               f"-H \"Authorization: Bearer {token}\" {url}")  # fmt: skip
        name = f"pod-api-{next(_SEQ)}"
        m = Measure(lay)
        t0 = time.monotonic()
        manifest = config.pod(
            name, ctx.client.name, build.TOOLS_IMAGE, wrapped(hey), service_account=config.API_SA
        )
        try:
            cluster.run_pod(manifest)
            pod = cluster.wait_pod(name, ("Succeeded", "Failed"), p.count / p.rate_per_s + p.timeout_s + 60)
            text, err = split_log(cluster.pod_log(pod))
        except ClusterError as e:
            raise WorkloadError(str(e)) from None
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                cluster.delete_pod(name)
        took = time.monotonic() - t0
        (ctx.artifact_dir / "hey.csv").write_text(text)
        out = hey_outcome(text, p.count, took)
        if out is None:
            raise WorkloadError(f"no API request succeeded: {err[-400:]}")
        m.add_to(out)
        return out


def hey_outcome(csv_text: str, count: int, took: float) -> Outcome | None:
    """Response times and errors from hey's per-request CSV (a row per completed request, any status; a
    transport error or timeout has none): None when no request got a 200."""
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    ok = [r for r in rows if r.get("status-code") == "200"]
    lat = np.array([float(r["response-time"]) * 1000 for r in ok])
    if lat.size == 0:
        return None
    out = Outcome(measure_s=took)
    out.add("error_rate_pct", 100.0 * (count - len(ok)) / count)
    out.add("achieved_rate_per_s", len(rows) / took if took > 0 else None)
    out.add("request_mean_ms", float(lat.mean()))
    add_percentiles(out, "request", lat, "ms", (50, 90, 99))
    out.add("request_max_ms", float(lat.max()))
    out.series.append(
        Series("request_ms", "ms", sorted((float(r["offset"]), float(r["response-time"]) * 1000) for r in ok))
    )
    return out
