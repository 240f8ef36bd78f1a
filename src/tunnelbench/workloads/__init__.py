"""The workloads, by name."""

from __future__ import annotations

from tunnelbench.workloads.acl import Acl
from tunnelbench.workloads.base import CaseContext, MetricSpec, Outcome, Workload, WorkloadError
from tunnelbench.workloads.connect import Connect
from tunnelbench.workloads.crr import Crr
from tunnelbench.workloads.http_api import HttpApi
from tunnelbench.workloads.http_download import HttpDownload
from tunnelbench.workloads.latency_load import LatencyLoad
from tunnelbench.workloads.leak import Leak
from tunnelbench.workloads.many_clients import ManyClients
from tunnelbench.workloads.multihost import Multihost
from tunnelbench.workloads.overhead import Overhead
from tunnelbench.workloads.ping import Ping
from tunnelbench.workloads.quic import Quic
from tunnelbench.workloads.resilience import Resilience
from tunnelbench.workloads.revoke import Revoke
from tunnelbench.workloads.rr import Rr
from tunnelbench.workloads.streaming import Streaming
from tunnelbench.workloads.tcp import Tcp
from tunnelbench.workloads.udp import Udp
from tunnelbench.workloads.udp_ceiling import UdpCeiling

WORKLOADS: dict[str, type[Workload]] = {
    w.name: w
    for w in (
        Tcp,
        Udp,
        UdpCeiling,
        Ping,
        Connect,
        Multihost,
        LatencyLoad,
        HttpDownload,
        HttpApi,
        Crr,
        Rr,
        Quic,
        Overhead,
        ManyClients,
        Streaming,
        Resilience,
        Leak,
        Acl,
        Revoke,
    )
}

__all__ = ["WORKLOADS", "CaseContext", "MetricSpec", "Outcome", "Workload", "WorkloadError"]
