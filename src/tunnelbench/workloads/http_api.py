"""Request/response (seed 000's Kubernetes API test: 5000 requests at 10 req/s): an HTTP API endpoint
(nginx `location = /api { return 200 }`) on the server host and a load generator, `hey` (Go,
github.com/rakyll/hey v0.1.5, pinned in scripts/setup.sh), at a fixed request rate for a fixed count.
Latency percentiles from hey's per-request CSV, and the error rate (transport errors + non-200)."""

from __future__ import annotations

import csv
import io
import time

import numpy as np
from pydantic import Field

from tunnelbench.workloads.base import (
    CaseContext,
    MetricSpec,
    Outcome,
    Params,
    Series,
    Workload,
    WorkloadError,
)
from tunnelbench.workloads.common import add_percentiles, tool
from tunnelbench.workloads.nginx import start_nginx, stop_nginx

API_PORT = 8081
HEY_VERSION = "v0.1.5"


class HttpApiParams(Params):
    count: int = Field(200, ge=1, le=10_000_000, description="requests in total (seed 000: 5000)")
    rate_per_s: float = Field(
        20.0, gt=0, le=100_000, description="request rate over all workers (seed 000: 10)"
    )
    concurrency: int = Field(1, ge=1, le=10_000, description="hey workers (-c); each runs rate/concurrency")
    keepalive: bool = Field(True, description="reuse connections (an API client does); False = new TCP each")
    timeout_s: int = Field(10, ge=1, le=600, description="a request slower than this is an error")


class HttpApi(Workload):
    name = "http_api"
    summary = "HTTP API calls at a fixed rate for a fixed count (hey -> nginx /api), seed 000"
    tools = ("nginx", "hey")
    headline = ("request_p50_ms", "request_p99_ms", "error_rate_pct")
    Params = HttpApiParams
    metrics = (
        MetricSpec("request_p50_ms", "ms", "lower", "median response time"),
        MetricSpec("request_p90_ms", "ms", "lower", "90th percentile response time"),
        MetricSpec("request_p99_ms", "ms", "lower", "99th percentile response time"),
        MetricSpec("request_max_ms", "ms", "lower", "slowest response"),
        MetricSpec("error_rate_pct", "%", "lower", "requests failed (transport error, timeout or not 200)"),
        MetricSpec("achieved_rate_per_s", "1/s", "none", "requests completed per second"),
    )

    def label(self) -> str:
        p = self.params
        return f"http-api-{p.rate_per_s:g}rps"

    def expected_seconds(self) -> float:
        p = self.params
        return p.count / p.rate_per_s + 5

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        ndir = ctx.artifact_dir / "nginx"
        nginx = start_nginx(ctx.server, ctx.server_ip, API_PORT, ndir)
        try:
            argv = [tool("hey"), "-n", str(p.count), "-c", str(p.concurrency), "-q", f"{p.rate_per_s / p.concurrency:g}",
                    "-t", str(p.timeout_s), "-o", "csv"] + ([] if p.keepalive else ["-disable-keepalive"])  # fmt: skip
            argv.append(f"http://{ctx.server_ip}:{API_PORT}/api")
            t0 = time.monotonic()
            res = ctx.client.run(argv, timeout=ctx.remaining(), check=False)
            took = time.monotonic() - t0
        finally:
            stop_nginx(nginx, ndir)
        (ctx.artifact_dir / "hey.csv").write_text(res.stdout)
        if res.returncode != 0 and not res.stdout:
            raise WorkloadError(f"hey failed (exit {res.returncode}): {res.stderr[-300:]}")
        rows = list(csv.DictReader(io.StringIO(res.stdout)))
        # hey writes a row per completed request (any status); transport errors and timeouts have none
        ok = [r for r in rows if r.get("status-code") == "200"]
        lat = np.array([float(r["response-time"]) * 1000 for r in ok])
        out = Outcome(measure_s=took)
        out.add("error_rate_pct", 100.0 * (p.count - len(ok)) / p.count, "%")
        out.add("achieved_rate_per_s", len(rows) / took if took > 0 else None, "1/s")
        if lat.size == 0:
            raise WorkloadError(f"no request succeeded: {res.stderr[-300:]}")
        add_percentiles(out, "request", lat, "ms", (50, 90, 99))
        out.add("request_max_ms", float(lat.max()), "ms")
        pts = sorted((float(r["offset"]), float(r["response-time"]) * 1000) for r in ok)
        out.series.append(Series("request_ms", "ms", pts))
        return out
