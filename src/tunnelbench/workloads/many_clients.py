"""Many clients (Goethals et al.): N client hosts, each calling a REST service on the server host every 250 ms
for a set time (an empty GET answered `200 OK` by nginx, a new TCP connection per call as the seed's curl
did); response-time percentiles and the failure rate (timeouts after 10 s, connection errors, non-200).

Each client is a host of the lab running its own VPN daemon; the server is the hub (scenario `lab.topology
= "star"` keeps N^2 peerings out of it). The clients themselves are light: one load-generator process per
`workers` opens every request's socket inside the calling client's network namespace (setns before
socket(); a socket stays in the namespace it was made in) and drives them all from one asyncio loop, so
1000 clients cost two processes, not 1000 curl loops. Needs the namespace lab (the SSH lab has no netns).

A sweep over N is one scenario entry per N (labels many-clients-n5, -n25, ...) on a lab with as many hosts
as the largest N plus the server. `schedule_lag_p99_ms` tells when the generator itself fell behind.

`on = "kubernetes"` (set for every many_clients entry by `[lab] backend = "kubernetes"`): the N clients are
pods of a Kubernetes cluster instead (kube/fleetrun.py), each running its own VPN client with its own identity
(vpns/podclients.py) and the same call loop (kube/tbcall), spread over the nodes as `spread` says; the server
host (the VPN's server side, nginx, the impairment) stays a host of the lab, outside the cluster. The cluster
is the kubeconfig's (`--kubeconfig`, lab.kubeconfig), or without one the lab's own, brought up on the lab's last
three hosts (kube/labcluster.py) and reached through a kubeconfig all the same. Besides the metrics above
such a case stores each client's connect time, the server's peer count when the window opened, and per node
its pods and its share of the calls (host = the node); its kube.json names the nodes, their versions and
where every pod ran."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome
from tunnelbench.instruments.common import add_percentiles
from tunnelbench.instruments.nginx import start_nginx, stop_nginx
from tunnelbench.workloads.base import (
    TOOL_START_S,
    CaseContext,
    NotApplicable,
    Params,
    Workload,
    WorkloadError,
)

REST_PORT = 8082


class ManyClientsParams(Params):
    clients: int = Field(5, ge=1, le=1022, description="client hosts calling the service (N)")
    interval_s: float = Field(
        0.25, gt=0, le=60, description="seconds between one client's calls (seed: 0.25)"
    )
    duration_s: float = Field(15.0, gt=0, le=3600, description="seconds of calling (seed: 15 minutes)")
    timeout_s: float = Field(10.0, gt=0, le=120, description="a call slower than this fails (seed: 10 s)")
    keepalive: bool = Field(
        False, description="reuse one connection per client (seed: new connection per call)"
    )
    workers: int = Field(2, ge=1, le=16, description="load-generator processes sharing the clients")
    server_workers: int = Field(2, ge=1, le=16, description="nginx worker processes")
    on: Literal["hosts", "kubernetes"] = Field(
        "hosts",
        description="hosts = each client a lab host (namespaces); kubernetes = each client a pod of a cluster "
        '(set by lab.backend = "kubernetes")',
    )
    spread: str | dict[str, int] = Field(
        "even",
        description='on = "kubernetes": "even" (round-robin over the Ready, untainted nodes) or pods per node, '
        "e.g. { h4 = 6, h5 = 4 } (they must add up to clients)",
    )

    @field_validator("spread")
    @classmethod
    def _spread(cls, v: str | dict[str, int]) -> str | dict[str, int]:
        if isinstance(v, str) and v != "even":
            raise ValueError(
                f'{v!r}: use "even" or a table of pods per node, e.g. {{ node-a = 5, node-b = 5 }}'
            )
        if isinstance(v, dict) and (not v or any(c < 1 for c in v.values())):
            raise ValueError("a table of pods per node needs at least one node and counts of 1 or more")
        return v


class ManyClients(Workload):
    name = "many_clients"
    summary = "N client hosts call a REST service every 250 ms (Goethals et al. scalability)"
    tools = ("nginx",)
    headline = ("response_p50_ms", "response_p99_ms", "failure_rate_pct")
    namespace_lab_only = (
        "its clients open sockets in each client host's namespace via setns, from this process"
    )
    Params = ManyClientsParams
    params: ManyClientsParams
    metrics = (
        MetricSpec("response_mean_ms", "ms", "lower", "mean response time of successful calls"),
        MetricSpec("response_p25_ms", "ms", "lower", "25th percentile response time (the seed's box)"),
        MetricSpec("response_p50_ms", "ms", "lower", "median response time of successful calls"),
        MetricSpec("response_p75_ms", "ms", "lower", "75th percentile response time (the seed's box)"),
        MetricSpec("response_p90_ms", "ms", "lower", "90th percentile response time"),
        MetricSpec("response_p99_ms", "ms", "lower", "99th percentile response time"),
        MetricSpec("response_max_ms", "ms", "lower", "slowest successful call"),
        MetricSpec(
            "failure_rate_pct", "%", "lower", "calls that failed (timeout, connection error, not 200)"
        ),
        MetricSpec("timeouts", "count", "lower", "calls that hit timeout_s"),
        MetricSpec("calls", "count", "none", "calls made"),
        MetricSpec("calls_per_s", "1/s", "none", "calls completed per second (N / interval if all keep up)"),
        MetricSpec("clients_calling", "count", "none", "clients with at least one successful call"),
        MetricSpec("schedule_lag_p99_ms", "ms", "lower", "call start behind schedule (generator saturation)"),
        MetricSpec("generator_cpu_pct", "%", "none", "load generator CPU, % of one core summed over workers"),
        MetricSpec("connect_p50_ms", "ms", "lower", "pods: median time from a client's loop start (its VPN client "
                   "just started, its device up) to its first answer through the tunnel"),
        MetricSpec("connect_max_ms", "ms", "lower", "pods: the slowest client's connect time"),
        MetricSpec("clients_connected", "count", "none", "pods: clients that reached the server through the tunnel"),
        MetricSpec("clients_without_calls", "count", "none", "pods: clients that made no call in the window (no "
                   "way through the tunnel to learn its start in time): each call they would have made counted as "
                   "failed after the timeout"),
        MetricSpec("server_peers", "count", "none", "pods: the VPN server's connected peers when the window opened "
                   "(each client its own peer: equals clients)"),
        MetricSpec("pods_on_node", "count", "none", "pods: client pods on a node (host = the node, read from the API)"),
        MetricSpec("node_calls_share_pct", "%", "none", "pods: a node's share of the calls (host = the node)"),
        MetricSpec("nodes_used", "count", "none", "pods: nodes that ran client pods"),
    )  # fmt: skip

    def label(self) -> str:
        return f"many-clients-{'k8s-' if self.params.on == 'kubernetes' else ''}n{self.params.clients}"

    def hosts_needed(self) -> int:
        return 2 if self.params.on == "kubernetes" else self.params.clients + 1

    def pair_path(self) -> bool:
        return False  # N clients (hosts or pods) call the server

    def expected_seconds(self) -> float:
        p = self.params
        pods = (
            150 + 1.5 * p.clients if p.on == "kubernetes" else 0
        )  # a cluster's bring-up, the pods' start and end
        return p.duration_s + p.timeout_s + 5 + p.clients / 100 + pods

    def typical_seconds(self, cases: int = 1) -> float:
        return self.params.duration_s + TOOL_START_S

    def run(self, ctx: CaseContext) -> Outcome:
        if self.params.on == "kubernetes":
            return run_on_kubernetes(self.params, ctx)
        p = self.params
        clients = [h for h in ctx.mesh.hosts if h is not ctx.server][: p.clients]
        if len(clients) < p.clients and ctx.lab is not None and len(ctx.mesh.hosts) < len(ctx.lab.hosts):
            raise NotApplicable(
                f"{ctx.mesh.vpn} runs on {len(ctx.mesh.hosts)} hosts in this scenario "
                f"(lab.hosts_per_vpn): N = {p.clients} needs {p.clients + 1}"
            )
        if len(clients) < p.clients:
            raise WorkloadError(
                f"many_clients needs {p.clients} client hosts besides the server; the lab has "
                f"{len(clients)} (set lab.hosts >= {p.clients + 1})"
            )
        if not all(hasattr(h, "netns") for h in clients):
            raise WorkloadError(f"many_clients needs the namespace lab ({self.namespace_lab_only})")
        ndir = ctx.folder_on(ctx.server, "nginx")
        nginx = start_nginx(ctx.server, ctx.server_ip, REST_PORT, ndir, workers=p.server_workers)
        procs = []
        try:
            go = ctx.artifact_dir / "go"  # the common start time, written once every generator is ready
            for w in range(p.workers):
                mine = clients[w :: p.workers]
                if not mine:
                    continue
                spec = {
                    "server": ctx.server_ip,
                    "port": REST_PORT,
                    "interval": p.interval_s,
                    "duration": p.duration_s,
                    "timeout": p.timeout_s,
                    "keepalive": p.keepalive,
                    "go": str(go),
                    "n_total": p.clients,
                    "clients": [[clients.index(h), f"/run/netns/{h.netns}"] for h in mine],  # type: ignore[attr-defined]  # NetnsHosts (checked above)
                    "out": str(ctx.artifact_dir / f"calls-{w}.npy"),
                }
                spec_path = ctx.artifact_dir / f"generator-{w}.json"
                spec_path.write_text(json.dumps(spec))
                procs.append(
                    ctx.client.spawn(
                        [sys.executable, "-m", "tunnelbench.workloads.many_clients", str(spec_path)],
                        label=f"rest-clients-{w}",
                        log_path=ctx.artifact_dir / f"generator-{w}.log",
                    )
                )
            end = time.monotonic() + 30 + p.clients / 50
            while not all((ctx.artifact_dir / f"generator-{w}.ready").exists() for w in range(len(procs))):
                if time.monotonic() > end or any(not pr.alive() for pr in procs):
                    raise WorkloadError(f"load generators not ready: {procs[0].log_tail(400)}")
                time.sleep(0.05)
            (ctx.artifact_dir / "go.tmp").write_text(str(time.time() + 0.5))
            (ctx.artifact_dir / "go.tmp").rename(go)  # atomic: a generator never reads half of it
            limit = p.duration_s + p.timeout_s + 30
            for pr in procs:
                if pr.wait(max(1.0, limit)) is None and pr.alive():
                    raise WorkloadError(f"load generator did not finish: {pr.log_tail(400)}")
                if pr.returncode() not in (0, None):
                    raise WorkloadError(f"load generator failed: {pr.log_tail(600)}")
        finally:
            for pr in procs:
                pr.stop(grace=1)
            stop_nginx(nginx, ndir)
        rows = np.concatenate([np.load(ctx.artifact_dir / f"calls-{w}.npy") for w in range(len(procs))])
        out = outcome_from_rows(rows, p.duration_s)
        cpu = [json.loads(f.read_text()) for f in ctx.artifact_dir.glob("calls-*.cpu.json")]
        if cpu:  # the load generator's own CPU (% of one core, summed over workers): is the tool the limit?
            out.add("generator_cpu_pct", sum(100 * c["cpu_s"] / c["wall_s"] for c in cpu if c["wall_s"] > 0))
        return out


def outcome_from_rows(rows: np.ndarray, duration_s: float) -> Outcome:
    """The metrics of the calls, wherever they were made. Rows: client, scheduled offset s, lag ms, latency ms,
    status (1 ok, 0 error, -1 timeout, -2 no tunnel: a pod that made no call in the window, lag and latency NaN)."""
    out = Outcome(measure_s=duration_s)
    n = len(rows)
    if n == 0:
        raise WorkloadError("no call was made")
    ok = rows[rows[:, 4] == 1]
    out.add("calls", n)
    out.add("failure_rate_pct", 100.0 * (n - len(ok)) / n)
    out.add("timeouts", int((rows[:, 4] == -1).sum()))
    out.add("calls_per_s", len(ok) / duration_s)
    out.add("clients_calling", len(np.unique(ok[:, 0])) if len(ok) else 0)
    lag = rows[:, 2]
    add_percentiles(out, "schedule_lag", lag[~np.isnan(lag)], "ms", (99,))
    if len(ok):
        add_percentiles(out, "response", ok[:, 3], "ms", (25, 50, 75, 90, 99))
        out.add("response_mean_ms", float(ok[:, 3].mean()))
        out.add("response_max_ms", float(ok[:, 3].max()))
    return out


# -- on Kubernetes -------------------------------------------------------------------------------------
_CASES = itertools.count(1)  # pod and identity names are unique per case (a server's log outlives a case)
KUBE_HOSTS = 3  # the lab's own cluster: a control plane and two workers, the lab's last hosts


def run_on_kubernetes(p: ManyClientsParams, ctx: CaseContext) -> Outcome:
    """The N clients as pods of the kubeconfig's cluster (or the lab's own), the server a host of the lab."""
    from tunnelbench.kube.fleet import CallLoop, FleetError
    from tunnelbench.kube.fleetrun import Barrier, Where, run_fleet
    from tunnelbench.kube.remote import Remote

    kube: dict[str, Any] = ctx.options.get("kube") or {}
    tag = ctx.lab.tag if ctx.lab is not None else "tb"
    image, pull = kube.get("image"), "IfNotPresent"
    try:
        if kube.get("kubeconfig"):
            path = Path(kube["kubeconfig"])
            if not image:
                raise WorkloadError("lab.kube_image: a user's cluster pulls the client image from a registry; "
                                    "push it there and name it (docs/real-hosts.md)")  # fmt: skip
        else:
            from tunnelbench.kube.cluster import ClusterError
            from tunnelbench.kube.labcluster import lab_cluster_for

            if ctx.lab is None or ctx.client.remote:
                raise NotApplicable("the lab's own cluster runs in the namespace lab; give a kubeconfig")
            hosts = list(ctx.lab.hosts)[-KUBE_HOSTS:]
            if len(ctx.lab.hosts) < KUBE_HOSTS + 1 or set(hosts) & set(ctx.mesh.hosts):
                raise WorkloadError(f"the lab's own cluster takes the lab's last {KUBE_HOSTS} hosts, which the VPN "
                                    f"must not run on: set lab.hosts_per_vpn to at most lab.hosts - {KUBE_HOSTS}")  # fmt: skip
            try:
                lc = lab_cluster_for(ctx.mesh, ctx.lab, hosts[0], hosts[1:], ctx.lab.run_dir / "kube-fleet")
            except ClusterError as e:
                raise WorkloadError(f"the lab's cluster did not come up: {e}") from None
            path, image, pull = lc.kubeconfig, lc.image, "Never"
        seq = next(_CASES)
        names = [f"tb{seq}c{i}" for i in range(p.clients)]
        try:
            pods = ctx.mesh.pod_clients(ctx.server, p.clients, names)
        except NotImplementedError as e:
            raise NotApplicable(str(e)) from None
        except ValueError as e:
            raise WorkloadError(str(e)) from None
        where = Where(Remote(path), tag, str(image), pull, kube.get("namespace"))
        ndir = ctx.folder_on(ctx.server, "nginx")
        http_extra, server_extra = Barrier.nginx_lines(ndir)
        nginx = start_nginx(ctx.server, pods.target_ip, REST_PORT, ndir, workers=p.server_workers,
                            http_extra=http_extra, server_extra=server_extra)  # fmt: skip
        try:
            loop = CallLoop(pods.target_ip, REST_PORT, p.clients, p.interval_s, p.duration_s, p.timeout_s)
            res = run_fleet(where, pods, ctx.server, ndir, loop, p.spread, ctx.artifact_dir)
        finally:
            stop_nginx(nginx, ndir)
    except FleetError as e:
        raise WorkloadError(str(e)) from None
    from tunnelbench.kube.fleet import call_rows

    out = outcome_from_rows(call_rows(res.logs, p.interval_s, p.duration_s, p.timeout_s), p.duration_s)
    connect = [lg.connect_ms for lg in res.logs if lg.connect_ms is not None]
    out.add("clients_connected", len(connect))
    out.add("clients_without_calls", sum(not lg.calls for lg in res.logs))
    if connect:
        out.add("connect_p50_ms", float(np.percentile(connect, 50)))
        out.add("connect_max_ms", max(connect))
    if res.peers is not None:
        out.add("server_peers", res.peers)
    calls: dict[str, int] = {}
    pods_on: dict[str, int] = {}
    for node, lg in zip(res.nodes_of, res.logs, strict=True):
        pods_on[node] = pods_on.get(node, 0) + 1
        calls[node] = calls.get(node, 0) + len(lg.calls)
    total = sum(calls.values())
    for node in sorted(pods_on):
        out.add("pods_on_node", pods_on[node], host=node)
        out.add("node_calls_share_pct", 100.0 * calls[node] / total if total else 0.0, host=node)
    out.add("nodes_used", len(pods_on))
    out.artifacts.append(ctx.artifact_dir / "kube.json")
    return out


# -- the load generator (runs as its own process: python -m tunnelbench.workloads.many_clients SPEC) -------
def _generator(spec: dict[str, Any]) -> None:
    import asyncio
    import resource
    import socket

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    clone_newnet = 0x40000000
    if hasattr(os, "setns"):
        setns = os.setns
    else:  # Python 3.11
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)

        def setns(fd: int, nstype: int) -> None:
            if libc.setns(fd, nstype) != 0:
                e = ctypes.get_errno()
                raise OSError(e, os.strerror(e))

    ns_fds = {idx: os.open(path, os.O_RDONLY) for idx, path in spec["clients"]}
    server, port = spec["server"], spec["port"]
    interval, duration, timeout = spec["interval"], spec["duration"], spec["timeout"]
    request = f"GET /api HTTP/1.1\r\nHost: {server}\r\nUser-Agent: tunnelbench\r\nAccept: */*\r\n".encode()
    records: list[tuple[int, float, float, float, int]] = []

    def new_socket(idx: int) -> socket.socket:
        setns(ns_fds[idx], clone_newnet)  # sockets live in the namespace they were created in
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        return s

    async def call(loop: asyncio.AbstractEventLoop, idx: int, conn: list[socket.socket | None]) -> int:
        s = conn[0]
        if s is None:
            s = new_socket(idx)
            await loop.sock_connect(s, (server, port))
            conn[0] = s
        keep = spec["keepalive"]
        await loop.sock_sendall(s, request + (b"\r\n" if keep else b"Connection: close\r\n\r\n"))
        buf = b""
        while b"\r\n\r\n" not in buf or not buf.endswith(b"OK\n"):
            chunk = await loop.sock_recv(s, 4096)
            if not chunk:
                break
            buf += chunk
        if not keep:
            s.close()
            conn[0] = None
        return 1 if buf.startswith(b"HTTP/1.1 200") and buf.endswith(b"OK\n") else 0

    async def client(idx: int, t0: float) -> None:
        loop = asyncio.get_running_loop()
        # evenly staggered first calls (deterministic), then every interval
        first = t0 + interval * (idx / spec["n_total"])
        k = 0
        conn: list[socket.socket | None] = [None]
        while True:
            sched = first + k * interval
            if sched - t0 >= duration:
                return
            now = time.time()
            if sched > now:
                await asyncio.sleep(sched - now)
            start = time.time()
            try:
                status = await asyncio.wait_for(call(loop, idx, conn), timeout)
            except TimeoutError:
                status = -1
            except OSError:
                status = 0
            if status != 1 and conn[0] is not None:
                conn[0].close()
                conn[0] = None
            end = time.time()
            records.append((idx, sched - t0, (start - sched) * 1000, (end - start) * 1000, status))
            k += 1
            if end > sched + interval:  # a slow call: the next one starts when this one is done
                k = max(k, int((end - first) / interval) + 1)

    Path(spec["out"]).with_name(Path(spec["out"]).stem.replace("calls", "generator") + ".ready").touch()
    go = Path(spec["go"])
    while not go.exists():
        time.sleep(0.01)
    time.sleep(0.01)

    async def main() -> None:
        t0 = float(go.read_text())
        await asyncio.sleep(max(0.0, t0 - time.time()))
        await asyncio.gather(*(client(idx, t0) for idx in ns_fds))

    cpu0, wall0 = time.process_time(), time.monotonic()
    asyncio.run(main())
    np.save(spec["out"], np.array(records, dtype=float).reshape(-1, 5))
    usage = {"cpu_s": time.process_time() - cpu0, "wall_s": time.monotonic() - wall0}
    Path(spec["out"]).with_suffix(".cpu.json").write_text(json.dumps(usage))


if __name__ == "__main__":
    _generator(json.loads(Path(sys.argv[1]).read_text()))
