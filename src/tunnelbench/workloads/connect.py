"""Connect time: from starting the VPN daemons on every host (cold, state already configured) to the first
echo reply from the server's tunnel address, and to the whole mesh answering."""

from __future__ import annotations

import time

from pydantic import Field

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome
from tunnelbench.workloads.base import CaseContext, Params, Workload, WorkloadError


class ConnectParams(Params):
    timeout_s: float = Field(60.0, gt=0, le=600, description="give up after this many seconds")
    probe_interval_s: float = Field(0.01, ge=0.002, le=1, description="echo request spacing while waiting")


class Connect(Workload):
    name = "connect"
    summary = "daemon start to first reply over the tunnel (restarts the mesh)"
    tools = ("ping", "fping")
    restarts_mesh = True
    headline = ("connect_s", "mesh_ready_s")
    Params = ConnectParams
    params: ConnectParams
    metrics = (
        MetricSpec("connect_s", "s", "lower", "daemon start to first echo reply client -> server"),
        MetricSpec("mesh_ready_s", "s", "lower", "daemon start until every ordered pair answers"),
    )

    def label(self) -> str:
        return "connect"

    def expected_seconds(self) -> float:
        return 10.0

    def typical_seconds(self, cases: int = 1) -> float:
        """The mesh's stop, start and first reply: 0.2 (internal) to 2.1 s (openvpn) for the default's VPNs."""
        return 1.0

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        ctx.mesh.stop()
        t0 = time.monotonic()
        ctx.mesh.start()
        # -c 1 -w T: keep probing every interval until one reply arrives or T passes
        argv = ["ping", "-n", "-q", "-c", "1", "-i", f"{p.probe_interval_s:g}", "-W", "1",
                "-w", f"{p.timeout_s:g}", ctx.server_ip]  # fmt: skip
        res = ctx.client.run(argv, timeout=p.timeout_s + 10, check=False)
        connect = time.monotonic() - t0
        if res.returncode != 0:
            raise WorkloadError(f"no reply from {ctx.server_ip} within {p.timeout_s:g} s after start")
        ctx.mesh.wait_ready(timeout=max(1.0, p.timeout_s - connect))
        ready = time.monotonic() - t0
        out = Outcome(measure_s=ready)
        out.add("connect_s", connect)
        out.add("mesh_ready_s", ready)
        return out
