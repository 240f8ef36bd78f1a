"""The workloads, by name."""

from __future__ import annotations

from tunnelbench.workloads.base import CaseContext, MetricSpec, Outcome, Workload, WorkloadError
from tunnelbench.workloads.connect import Connect
from tunnelbench.workloads.ping import Ping
from tunnelbench.workloads.tcp import Tcp
from tunnelbench.workloads.udp import Udp

WORKLOADS: dict[str, type[Workload]] = {w.name: w for w in (Tcp, Udp, Ping, Connect)}

__all__ = ["WORKLOADS", "CaseContext", "MetricSpec", "Outcome", "Workload", "WorkloadError"]
