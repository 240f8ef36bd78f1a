"""One many_clients step on a Kubernetes cluster (kube/fleet.py has the pure parts, kube/remote.py the calls):

  1. the run's namespace (or the user's pre-made one), then a server-side dry run of one client pod: an admission
     refusal ends the step here with one line naming the policy, nothing left;
  2. one Secret (the client's own VPN identity) and one pod per client, pinned to its node;
  3. the start barrier: every pod brings its VPN up, then asks the server's nginx for /tb-go?c=ID through the
     tunnel until it answers; the product reads the server's log of those asks, and when every ID has asked
     (every tunnel is up) it writes the start time T there: the measured window opens at T for all N at once;
  4. the pods call for the window and end; their logs (JSON lines) are read through the API;
  5. the namespace is deleted (or, in a pre-made one, the run's labelled pods and secrets), always.

Connect time per client = the pod's own time from its loop's start (the VPN already started) to the first answer
through the tunnel. The server's peer count is read when the barrier opens."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import ApiError

from tunnelbench.kube.fleet import (
    CallLoop,
    FleetError,
    PodLog,
    barrier_ids,
    namespace_manifest,
    namespace_name,
    node_record,
    parse_pod_log,
    place,
    pod_manifest,
    pod_script,
    run_label,
    schedulable,
    secret_manifest,
)
from tunnelbench.kube.remote import Remote
from tunnelbench.lab.host import Host
from tunnelbench.vpns.podclients import PodClients

BARRIER_MARGIN_S = 2.0  # T is this far ahead of the moment the last client asked
SETTLE_S = 5.0  # after the window and a call timeout, a pod still running without a start never got one


@dataclass
class Where:
    """Where the fleet runs: the cluster, the namespace, the image."""

    remote: Remote
    tag: str
    image: str
    pull: str = "Never"  # the lab imports the image; a user's registry image: IfNotPresent
    namespace: str | None = None  # a pre-made namespace; None: the run's own (made and deleted here)


@dataclass
class FleetResult:
    logs: list[PodLog]
    nodes_of: list[str]  # each pod's node, as the API reports it
    peers: int | None  # the server's connected peers when the window opened (None: the VPN has no peers)
    timings: dict[str, float] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)


class Barrier:
    """The server side of the start barrier: nginx's log of the asks and the file it serves at /tb-go."""

    def __init__(self, server: Host, nginx_dir: Path):
        self.server = server
        self.log = nginx_dir / "barrier.log"
        self.file = nginx_dir / "www" / "tb-go"

    @staticmethod
    def nginx_lines(nginx_dir: Path) -> tuple[str, str]:
        """(http_extra, server_extra) for start_nginx."""
        http = "  log_format tbbarrier '$arg_c';\n"
        srv = (f"    location = /tb-go {{ access_log {nginx_dir / 'barrier.log'} tbbarrier; "
               "default_type text/plain; try_files /tb-go =404; }\n")  # fmt: skip
        return http, srv

    def asked(self) -> set[int]:
        if not self.server.exists(self.log):
            return set()
        return barrier_ids(self.server.read_file(self.log).decode(errors="replace"))

    def open(self, t0: float) -> None:
        self.server.write_file(self.file, f"{t0:.6f}\n", 0o644)


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _wait_pods(
    w: Where, ns: str, n: int, want: tuple[str, ...], timeout: float, what: str
) -> list[dict[str, Any]]:
    end = time.monotonic() + timeout
    tag_label = run_label(w.tag)
    while True:
        pods = w.remote.pods(ns, tag_label)
        failed = [p for p in pods if _phase(p) == "Failed" and "Failed" not in want]
        if failed:
            name = failed[0]["metadata"]["name"]
            raise FleetError(f"pod {name} failed {what}: {_tail(w, ns, name)}")
        if len(pods) == n and all(_phase(p) in want for p in pods):
            return pods
        if time.monotonic() > end:
            counts: dict[str, int] = {}
            for p in pods:
                counts[_phase(p)] = counts.get(_phase(p), 0) + 1
            raise FleetError(f"client pods not {'/'.join(want)} after {timeout:.0f} s {what}: {counts}")
        time.sleep(1.0)


def _wait_finished(w: Where, ns: str, n: int, loop: CallLoop) -> list[dict[str, Any]]:
    """After the window: every pod ended, but for those still at the barrier a call timeout after the window
    (they never learnt the start: their log has no "go" line) which the namespace's deletion ends."""
    limit_s = loop.timeout_s + 60 + 0.2 * n
    settle = time.monotonic() + loop.timeout_s + SETTLE_S
    end = time.monotonic() + limit_s
    tag_label = run_label(w.tag)
    waiting: set[str] | None = None  # the pods that started their window and have not ended
    while True:
        listed = w.remote.pods(ns, tag_label)
        running = {p["metadata"]["name"] for p in listed if _phase(p) not in ("Succeeded", "Failed")}
        if waiting is None and time.monotonic() > settle:
            waiting = {x for x in running if parse_pod_log(w.remote.log(ns, x)).t0 is not None}
        if len(listed) == n and not (running if waiting is None else running & waiting):
            return listed
        if time.monotonic() > end:
            raise FleetError(f"client pods still running {limit_s:.0f} s after the window: "
                             f"{sorted(running)[:5]}")  # fmt: skip
        time.sleep(1.0)


def _tail(w: Where, ns: str, name: str) -> str:
    try:
        return " | ".join(w.remote.log(ns, name).strip().splitlines()[-6:])[:500]
    except (ApiError, OSError) as e:
        return f"(no log: {e})"[:200]


def run_fleet(
    w: Where,
    pods: PodClients,
    server: Host,
    nginx_dir: Path,
    loop: CallLoop,
    spread: str | dict[str, int],
    artifact_dir: Path,
) -> FleetResult:
    n = len(pods.clients)
    own = w.namespace is None
    ns = w.namespace or namespace_name(w.tag)
    nodes = w.remote.nodes()
    where = place(n, schedulable(nodes), spread)
    record: dict[str, Any] = {"namespace": ns, "own_namespace": own, "image": w.image, "spread": spread,
                              "nodes": [node_record(x) for x in nodes]}  # fmt: skip
    t_start = time.monotonic()
    timings: dict[str, float] = {}
    made_namespace = False
    try:
        if own:
            w.remote.create(namespace_manifest(ns, w.tag))
            made_namespace = True
        elif not w.remote.namespace_exists(ns):
            raise FleetError(
                f"lab.kube_namespace = {ns!r}: no such namespace in the cluster; make it or leave the field out"
            )
        manifests = []
        for i, c in enumerate(pods.clients):
            secret = f"{c.name}-id" if c.files else None
            script = pod_script(pods.setup, loop.argv(i))
            manifests.append(
                (c, secret, pod_manifest(ns, c.name, w.tag, where[i], w.image, script, secret, w.pull))
            )
        w.remote.dry_run_pod(manifests[0][2])
        for c, secret, pod in manifests:
            if secret:
                w.remote.create(secret_manifest(ns, secret, w.tag, c.files))
            w.remote.create(pod)
        timings["create_s"] = round(time.monotonic() - t_start, 2)
        running = _wait_pods(w, ns, n, ("Running", "Succeeded"), 120 + 1.0 * n, "to start")
        timings["pods_running_s"] = round(time.monotonic() - t_start, 2)
        # the barrier
        barrier = Barrier(server, nginx_dir)
        end = time.monotonic() + 60 + 0.5 * n + loop.timeout_s
        while True:
            asked = barrier.asked()
            if len(asked) >= n:
                break
            if time.monotonic() > end:
                # the seed's degradation sweeps (90-100% loss, delays beyond the call timeout): clients that never
                # get through are measured as failures, not a failed case; the window opens for those that did
                missing = sorted(set(range(n)) - asked)
                record["barrier_incomplete"] = {
                    "asked": len(asked),
                    "clients": n,
                    "example": f"{pods.clients[missing[0]].name}: {_tail(w, ns, pods.clients[missing[0]].name)}",
                }
                break
            time.sleep(0.5)
        timings["barrier_s"] = round(time.monotonic() - t_start, 2)
        peers = pods.peer_count()
        t0 = time.time() + BARRIER_MARGIN_S
        barrier.open(t0)
        record["window_start_unix"] = t0
        time.sleep(max(0.0, t0 - time.time()) + loop.duration_s)
        done = _wait_finished(w, ns, n, loop)
        timings["window_end_s"] = round(time.monotonic() - t_start, 2)
        by_name = {p["metadata"]["name"]: p for p in done}
        logs, nodes_of = [], []
        for c in pods.clients:
            text = w.remote.log(ns, c.name)
            (artifact_dir / "pods").mkdir(exist_ok=True)
            (artifact_dir / "pods" / f"{c.name}.log").write_text(text)
            logs.append(parse_pod_log(text))
            nodes_of.append(str(by_name[c.name]["spec"]["nodeName"]))
        record["placement"] = {c.name: nodes_of[i] for i, c in enumerate(pods.clients)}
        record["placement_asked"] = {c.name: where[i] for i, c in enumerate(pods.clients)}
        record["running_at_start"] = len(running)
        return FleetResult(logs, nodes_of, peers, timings, record)
    finally:
        t1 = time.monotonic()
        try:
            if made_namespace:
                gone = w.remote.delete_namespace(ns)
                record["namespace_deleted"] = gone
            elif not own:
                w.remote.delete_labelled(ns, run_label(w.tag))
        finally:
            pods.undo()
            timings["cleanup_s"] = round(time.monotonic() - t1, 2)
            (artifact_dir / "kube.json").write_text(
                json.dumps({**record, "timings": timings}, indent=1, default=str) + "\n"
            )


def preflight(kubeconfig: Path, namespace: str | None, image: str) -> None:
    """Before a run on a user's cluster: the nodes can be listed and one client pod would be admitted (a
    server-side dry run, in the run's kind of namespace: a throwaway one of its own, labelled, deleted here;
    or the pre-made one). FleetError with one line otherwise; nothing is left in the cluster either way."""
    import secrets

    remote = Remote(kubeconfig)
    if not schedulable(remote.nodes()):
        raise FleetError(f"kubeconfig {kubeconfig}: the cluster has no Ready node that takes pods")
    tag = "preflight-" + secrets.token_hex(3)
    ns = namespace or namespace_name(tag)
    pod = pod_manifest(ns, "tb-preflight", tag, "n", image, "true", "tb-preflight-id")
    pod["spec"].pop("nodeName")  # no node is asked for: admission only
    if namespace is not None:
        if not remote.namespace_exists(namespace):
            raise FleetError(f"lab.kube_namespace = {namespace!r}: no such namespace in the cluster; make it "
                             "(privileged pods allowed) or leave the field out")  # fmt: skip
        remote.dry_run_pod(pod)
        return
    try:
        remote.create(namespace_manifest(ns, tag))
    except ApiError as e:
        raise FleetError(f"the cluster refused the run's namespace {ns} ({e.status.message}); give a pre-made one "
                         "with lab.kube_namespace (docs/real-hosts.md)") from None  # fmt: skip
    try:
        remote.dry_run_pod(pod)
    finally:
        remote.delete_namespace(ns, wait_s=60)
