"""Request/response (Kjorveziroski et al.'s Kubernetes API test: 5000 requests at 10 req/s): an HTTP API endpoint
(nginx) on the server host and a load generator, `hey` (Go, github.com/rakyll/hey v0.1.5, pinned in
scripts/setup.sh), at a fixed request rate for a fixed count. Latency mean (the seed plots it) and
percentiles from hey's per-request CSV, and the error rate (transport errors + non-200).

Like the seed's API server, the endpoint can speak TLS (`tls`: a self-signed P-256 certificate made for the
case; new connections pay the handshake) and answer with a JSON object list of realistic size (`objects`:
a Kubernetes-style PodList of that many pods, about 1 KB each, as `kubectl get pods -o json` returns);
`objects = 0` answers "OK"."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

import numpy as np
from pydantic import Field

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome, Series
from tunnelbench.instruments.common import add_percentiles, tool_on
from tunnelbench.instruments.nginx import make_certificate, start_nginx, stop_nginx
from tunnelbench.workloads.base import TOOL_START_S, CaseContext, Params, Workload, WorkloadError

API_PORT = 8081
HEY_VERSION = "v0.1.5"


class HttpApiParams(Params):
    count: int = Field(200, ge=1, le=10_000_000, description="requests in total (Kjorveziroski et al.: 5000)")
    rate_per_s: float = Field(
        20.0, gt=0, le=100_000, description="request rate over all workers (Kjorveziroski et al.: 10)"
    )
    concurrency: int = Field(1, ge=1, le=10_000, description="hey workers (-c); each runs rate/concurrency")
    keepalive: bool = Field(True, description="reuse connections (an API client does); False = new TCP each")
    timeout_s: int = Field(10, ge=1, le=600, description="a request slower than this is an error")
    tls: bool = Field(False, description="HTTPS with a certificate made for the case (the seed's API server)")
    objects: int = Field(
        0, ge=0, le=100_000, description='answer a JSON list of this many pod objects (~1 KB each); 0 = "OK"'
    )


def pod_list(n: int) -> bytes:
    """A Kubernetes-style PodList of n pods: the shape and size `kubectl get pods -o json` returns."""
    items = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"api-{i:05d}-7d9f8c6b5-x{i % 97:02d}",
                "namespace": "default",
                "uid": f"{i:08x}-1b2c-4d5e-8f90-{i * 7919 % 16**12:012x}",
                "resourceVersion": str(100000 + i),
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"app": "api", "pod-template-hash": "7d9f8c6b5", "tier": "backend"},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": "api-7d9f8c6b5",
                        "uid": f"rs-{i % 13:04d}",
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "containers": [
                    {
                        "name": "api",
                        "image": "registry.local/api:1.4.2",
                        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    }
                ],
                "nodeName": f"node-{i % 16:02d}",
                "restartPolicy": "Always",
            },
            "status": {
                "phase": "Running",
                "podIP": f"10.244.{i // 250 % 256}.{i % 250 + 2}",
                "hostIP": f"192.168.0.{i % 16 + 10}",
                "startTime": "2026-01-01T00:00:05Z",
                "conditions": [
                    {"type": t, "status": "True"} for t in ("Initialized", "Ready", "PodScheduled")
                ],
            },
        }
        for i in range(n)
    ]
    return json.dumps(
        {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "100000"}, "items": items}
    ).encode()


class HttpApi(Workload):
    name = "http_api"
    summary = "HTTP API calls at a fixed rate for a fixed count (hey -> nginx /api), Kjorveziroski et al."
    tools = ("nginx", "hey")
    headline = ("request_p50_ms", "request_p99_ms", "error_rate_pct")
    Params = HttpApiParams
    params: HttpApiParams
    metrics = (
        MetricSpec("request_mean_ms", "ms", "lower", "mean response time (what Kjorveziroski et al. plots)"),
        MetricSpec("request_p50_ms", "ms", "lower", "median response time"),
        MetricSpec("request_p90_ms", "ms", "lower", "90th percentile response time"),
        MetricSpec("request_p99_ms", "ms", "lower", "99th percentile response time"),
        MetricSpec("request_max_ms", "ms", "lower", "slowest response"),
        MetricSpec("error_rate_pct", "%", "lower", "requests failed (transport error, timeout or not 200)"),
        MetricSpec("achieved_rate_per_s", "1/s", "none", "requests completed per second"),
        MetricSpec("response_bytes", "B", "none", "size of one response body"),
    )

    def label(self) -> str:
        p = self.params
        return (
            f"http-api-{p.rate_per_s:g}rps"
            + (f"-{p.objects}obj" if p.objects else "")
            + ("-tls" if p.tls else "")
        )

    def expected_seconds(self) -> float:
        p = self.params
        return p.count / p.rate_per_s + 5

    def typical_seconds(self, cases: int = 1) -> float:
        return self.params.count / self.params.rate_per_s + 2 * TOOL_START_S  # nginx, then hey

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        ndir = ctx.folder_on(ctx.server, "nginx")
        root = ndir / "www"
        body = pod_list(p.objects) if p.objects else b"OK\n"
        if p.objects:
            ctx.server.write_file(root / "api.json", body)
        tls = make_certificate(ctx.server, ndir) if p.tls else None
        try:
            nginx = start_nginx(
                ctx.server, ctx.server_ip, API_PORT, ndir, root=root, tls=tls, api_json=bool(p.objects)
            )
        except BaseException:
            _drop_key(ctx, tls)
            raise
        try:
            argv = [tool_on(ctx.client, "hey"), "-n", str(p.count), "-c", str(p.concurrency), "-q", f"{p.rate_per_s / p.concurrency:g}",
                    "-t", str(p.timeout_s), "-o", "csv"] + ([] if p.keepalive else ["-disable-keepalive"])  # fmt: skip
            argv.append(f"{'https' if p.tls else 'http'}://{ctx.server_ip}:{API_PORT}/api")
            t0 = time.monotonic()
            res = ctx.client.run(argv, timeout=ctx.remaining(), check=False)
            took = time.monotonic() - t0
        finally:
            stop_nginx(nginx, ndir)
            _drop_key(ctx, tls)
        (ctx.artifact_dir / "hey.csv").write_text(res.stdout)
        if res.returncode != 0 and not res.stdout:
            raise WorkloadError(f"hey failed (exit {res.returncode}): {res.stderr[-300:]}")
        rows = list(csv.DictReader(io.StringIO(res.stdout)))
        # hey writes a row per completed request (any status); transport errors and timeouts have none
        ok = [r for r in rows if r.get("status-code") == "200"]
        lat = np.array([float(r["response-time"]) * 1000 for r in ok])
        out = Outcome(measure_s=took)
        out.add("error_rate_pct", 100.0 * (p.count - len(ok)) / p.count)
        out.add("achieved_rate_per_s", len(rows) / took if took > 0 else None)
        if lat.size == 0:
            raise WorkloadError(f"no request succeeded: {res.stderr[-300:]}")
        out.add("request_mean_ms", float(lat.mean()))
        add_percentiles(out, "request", lat, "ms", (50, 90, 99))
        out.add("response_bytes", len(body))
        out.add("request_max_ms", float(lat.max()))
        pts = sorted((float(r["offset"]), float(r["response-time"]) * 1000) for r in ok)
        out.series.append(Series("request_ms", "ms", pts))
        return out


def _drop_key(ctx: CaseContext, tls: tuple[Path, Path] | None) -> None:
    """The case's TLS key goes with the case: nothing secret stays in the run folder."""
    if tls is not None:
        ctx.server.remove(tls[1])
