"""many_clients on a Kubernetes cluster, the parts that are pure functions (the fast lane tests every one): the
run's namespace, Secrets and client pods as manifests, where each pod goes, the pods' logs back into call
records, and a policy refusal as one line.

Safety on a user's cluster: everything the run makes carries RUN_LABEL = the run's tag (and MANAGED_LABEL), in
a namespace of its own named after the tag (or a namespace the user made and names, whose own objects are never
touched); `tunnelbench clean --kubeconfig` deletes what carries RUN_LABEL after a kill. Nothing cluster-wide
is made or changed: no node label, no ClusterRole, no webhook, no CRD.

Placement: pods are pinned by nodeName (no scheduler decides, as seed 000 pinned its pods; the lab's cluster
runs none), "even" = round-robin over the schedulable nodes sorted by name, or a count per node."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tunnelbench.vpns.podclients import FILES_DIR, POD_LOG

RUN_LABEL = "tunnelbench.io/run"
MANAGED_LABEL = "app.kubernetes.io/managed-by"
MANAGER = "tunnelbench"
CONTAINER = "client"
PRIVILEGED_NS_LABEL = "pod-security.kubernetes.io/enforce"


class FleetError(RuntimeError):
    """A refusal or a bad input: one line for the user (the CLI exits 2 with it)."""


def namespace_name(tag: str) -> str:
    """The run's namespace: DNS-1123 (lower case, digits, '-'), from the run's tag."""
    name = "tb-" + re.sub(r"[^a-z0-9-]", "-", tag.lower()).strip("-")
    return name[:63].rstrip("-")


def run_label(tag: str) -> str:
    """The value of RUN_LABEL on everything a run makes: its tag, as the namespace name spells it."""
    return namespace_name(tag).removeprefix("tb-")


def labels(tag: str) -> dict[str, str]:
    return {RUN_LABEL: run_label(tag), MANAGED_LABEL: MANAGER}


def namespace_manifest(name: str, tag: str) -> dict[str, Any]:
    """The run's own namespace; Pod Security `privileged` asked for it (a VPN client needs a TUN device and
    NET_ADMIN), which an admission policy of the cluster may still refuse: the dry run says so first."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {**labels(tag), PRIVILEGED_NS_LABEL: "privileged"}},
    }


def secret_manifest(namespace: str, name: str, tag: str, files: dict[str, bytes]) -> dict[str, Any]:
    """One client's identity (its VPN key or certificate and config) as an Opaque Secret."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(tag)},
        "data": {k: base64.b64encode(v).decode() for k, v in sorted(files.items())},
    }


@dataclass(frozen=True)
class CallLoop:
    """tbcall's arguments (kube/tbcall/main.go): the same call semantics as the namespace generator."""

    server: str
    port: int
    clients: int
    interval_s: float
    duration_s: float
    timeout_s: float
    poll_s: float = 0.2
    wait_s: float = 600.0

    def argv(self, index: int) -> list[str]:
        return ["tbcall", f"-server={self.server}", f"-port={self.port}", f"-id={index}", f"-n={self.clients}",
                f"-interval={self.interval_s}", f"-duration={self.duration_s}", f"-timeout={self.timeout_s}",
                f"-poll={self.poll_s}", f"-wait={self.wait_s}"]  # fmt: skip


def pod_script(setup: str, loop: list[str]) -> str:
    """The pod's shell: the VPN up (its daemon's output in POD_LOG), then the request loop as PID 1's child; a
    loop that fails prints the VPN's log tail after its own lines."""
    body = setup.strip()
    run = " ".join(loop)
    return (("set -e\n" + body + "\nset +e\n") if body else "") + (
        f"{run}\nrc=$?\n[ $rc -ne 0 ] && [ -f {POD_LOG} ] && tail -n 20 {POD_LOG} >&2\nexit $rc\n"
    )


def pod_manifest(
    namespace: str,
    name: str,
    tag: str,
    node: str,
    image: str,
    script: str,
    secret: str | None,
    pull: str = "Never",
) -> dict[str, Any]:
    """One client pod: privileged (a TUN device and NET_ADMIN for the VPN client; runc
    1.2.0-1.2.3 drop the TUN device rule for unprivileged containers), pinned by nodeName, never restarted,
    no service account token, its identity mounted read-only."""
    mounts = [{"name": "identity", "mountPath": FILES_DIR, "readOnly": True}] if secret else []
    volumes = [{"name": "identity", "secret": {"secretName": secret, "defaultMode": 0o400}}] if secret else []
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(tag)},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [
                {
                    "name": CONTAINER,
                    "image": image,
                    "imagePullPolicy": pull,
                    "command": ["sh", "-c", script],
                    "securityContext": {"privileged": True},
                    "resources": {"requests": {"cpu": "5m", "memory": "16Mi"}},
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        },
    }


# -- placement ---------------------------------------------------------------------------------------
def place(n: int, nodes: list[str], spread: str | dict[str, int]) -> list[str]:
    """The node of each of the n pods (pod i -> result[i]). "even": round-robin over `nodes` sorted; a dict:
    that many pods on each node named, interleaved (so the pods' staggered call times spread over the nodes)."""
    if not nodes:
        raise FleetError("the cluster has no schedulable Ready node to place client pods on")
    if spread == "even":
        order = sorted(nodes)
        return [order[i % len(order)] for i in range(n)]
    if isinstance(spread, str):
        raise FleetError(
            f'spread = {spread!r}: use "even" or a table of pods per node, e.g. {{ node-a = 5 }}'
        )
    unknown = [k for k in spread if k not in nodes]
    if unknown:
        raise FleetError(
            f"spread: node {unknown[0]!r} is not a schedulable Ready node of the cluster; its nodes: "
            + ", ".join(sorted(nodes))
        )
    if sum(spread.values()) != n:
        raise FleetError(
            f"spread: the counts add up to {sum(spread.values())}, not clients = {n}; make them equal"
        )
    left = dict(spread)
    out: list[str] = []
    while len(out) < n:
        for node in spread:
            if left[node] > 0:
                out.append(node)
                left[node] -= 1
    return out


def schedulable(nodes: list[dict[str, Any]]) -> list[str]:
    """Names of the Ready nodes without a NoSchedule/NoExecute taint and not cordoned (API node objects)."""
    out = []
    for n in nodes:
        spec, status = n.get("spec") or {}, n.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        tainted = any(t.get("effect") in ("NoSchedule", "NoExecute") for t in spec.get("taints") or [])
        if ready and not tainted and not spec.get("unschedulable"):
            out.append(n["metadata"]["name"])
    return out


def node_record(n: dict[str, Any]) -> dict[str, Any]:
    """What the case records of one node: its versions, addresses and pod capacity."""
    info = (n.get("status") or {}).get("nodeInfo") or {}
    return {
        "name": n["metadata"]["name"],
        "kubelet": info.get("kubeletVersion"),
        "runtime": info.get("containerRuntimeVersion"),
        "kernel": info.get("kernelVersion"),
        "os": info.get("osImage"),
        "arch": info.get("architecture"),
        "addresses": {a["type"]: a["address"] for a in (n.get("status") or {}).get("addresses") or []},
        "max_pods": ((n.get("status") or {}).get("allocatable") or {}).get("pods"),
    }


# -- the pods' logs ----------------------------------------------------------------------------------
@dataclass
class PodLog:
    connect_ms: float | None = None  # the first HTTP answer through the tunnel, after the loop started
    t0: float | None = None  # the barrier's start time the pod got
    calls: list[tuple[float, float, float, int]] = field(
        default_factory=list
    )  # (sched s, lag ms, ms, status)
    ended: bool = False  # the loop printed its end line (it ran its whole window)
    other: list[str] = field(default_factory=list)  # lines that are not the loop's (the VPN's complaints)


def parse_pod_log(text: str) -> PodLog:
    """tbcall's JSON lines (kube/tbcall/main.go) back into a PodLog; any other line is kept aside."""
    out = PodLog()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line) if line.startswith("{") else None
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            out.other.append(line)
            continue
        ev = rec.get("ev")
        if ev == "connected":
            out.connect_ms = float(rec["ms"])
        elif ev == "go":
            out.t0 = float(rec["t0"])
        elif ev == "end":
            out.ended = True
        elif ev is None and "st" in rec:
            out.calls.append((float(rec["s"]), float(rec["lag"]), float(rec["ms"]), int(rec["st"])))
        else:
            out.other.append(line)
    return out


# a call's status when its client made no call in the window: no way through the tunnel to the server
NO_TUNNEL = -2


def slots(
    index: int, clients: int, interval_s: float, duration_s: float, takes_s: float = 0.0
) -> list[float]:
    """When client `index` calls in the window if each call takes `takes_s`, as tbcall schedules them: staggered
    by interval * index / N, one every interval, a call longer than that pushing the next to the first slot after
    it ended (kube/tbcall/main.go)."""
    first = interval_s * index / clients
    out: list[float] = []
    k = 0
    while (sched := first + k * interval_s) < duration_s:
        out.append(sched)
        k += 1
        if takes_s > interval_s:
            k = max(k, int((sched + takes_s - first) / interval_s) + 1)
    return out


def call_rows(logs: list[PodLog], interval_s: float, duration_s: float, timeout_s: float) -> np.ndarray:
    """The calls of every pod as the namespace generator's rows: client, scheduled offset s, lag ms, latency
    ms, status (1 ok, 0 error, -1 timeout). A client that made no call in the window (it never learnt the start
    through the tunnel, or learnt it after the window: heavy loss, a delay beyond the call timeout) is counted as
    a client of the namespace lab without a path counts: each call it would have made fails after the timeout
    (two in a 15-s window with the seed's 10-s timeout), status NO_TUNNEL, lag and latency unknown (NaN)."""
    rows: list[tuple[float, float, float, float, float]] = []
    nan = float("nan")
    for i, lg in enumerate(logs):
        if not lg.calls:
            lost = slots(i, len(logs), interval_s, duration_s, timeout_s)
            rows += [(float(i), s, nan, nan, float(NO_TUNNEL)) for s in lost]
        else:
            rows += [(float(i), s, lag, ms, float(st)) for s, lag, ms, st in lg.calls]
    return np.array(rows, dtype=float).reshape(-1, 5)


def barrier_ids(access_log: str) -> set[int]:
    """The client numbers that asked the barrier (nginx logs each ask's `c` argument, one per line)."""
    return {int(x) for x in access_log.split() if x.isdigit()}


# -- refusals --------------------------------------------------------------------------------------------
def refusal_message(status: int, message: str, namespace: str) -> str:
    """An admission refusal of the dry-run pod as one line naming the policy and the fix."""
    msg = " ".join(message.split())
    m = re.search(r'violates PodSecurity "([^"]+)"', msg)
    if m:
        level = m.group(1).split(":")[0]
        return (f"the cluster refused the client pod: Pod Security \"{m.group(1)}\" of namespace {namespace} "
                f"forbids it ({msg.split(': ', 2)[-1][:200]}); a VPN client pod needs a privileged pod: label "
                f"the namespace {PRIVILEGED_NS_LABEL}=privileged (it is {level}) or name one that is, with "
                "lab.kube_namespace (docs/real-hosts.md); nothing was created")  # fmt: skip
    m = re.search(r'admission webhook "([^"]+)" denied the request', msg)
    policy = f'admission webhook "{m.group(1)}"' if m else f"HTTP {status}"
    return (f"the cluster refused the client pod ({policy}): {msg[:300]}; allow privileged pods in namespace "
            f"{namespace} (docs/real-hosts.md); nothing was created")  # fmt: skip
