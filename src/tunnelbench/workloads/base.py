"""The workload interface: parameters and metrics declared as data, and a runner that drives real tools
between tunnel addresses. A workload never knows which VPN is under test."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tunnelbench.core.metrics import MetricSpec, declare
from tunnelbench.core.results import Outcome, WorkloadError
from tunnelbench.core.schema import Strict
from tunnelbench.lab.base import Lab
from tunnelbench.lab.host import Host
from tunnelbench.vpns.mesh import Mesh

__all__ = ["CaseContext", "NotApplicable", "Params", "Workload", "WorkloadError"]

# Typical, not bounds (`Workload.typical_seconds`), measured in the namespace lab on a shared 2-CPU machine
# (runs 20261128-165704-tba4bb and 20261128-165852-tb1159: `run default --vpn internal,wireguard-go -n 2`, and
# connect + tcp 8 s for the default's five VPNs):
TOOL_START_S = 0.05  # one measuring tool's start, set-up and exit: iperf3 -t 1 probes took 1.03-1.08 s
PING_LAG_S = 0.005  # ping -i I sends every I + this: 50 requests at -i 0.02 were spaced 25.2 ms apart


class NotApplicable(WorkloadError):
    """The workload does not apply to this VPN (e.g. control_loss without a central control plane): the
    runner records the case as n/a with the reason, neither failed nor measured (nor a reason to exit 1)."""


class Params(Strict):
    """A workload's parameters: a file schema like the scenario's (core/schema.py: unknown keys refused, every
    number finite and bounded)."""


_Params = Params  # Workload's own `Params` (the class attribute) hides this name in its body


@dataclass
class CaseContext:
    mesh: Mesh
    client: Host
    server: Host
    artifact_dir: Path
    deadline: float  # time.monotonic() by which the case must end
    options: dict[str, Any] = field(default_factory=dict)  # scenario-wide knobs such as MSS clamping
    # the lab the case runs in: its router, relay host and path policies (None: a workload run on its own)
    lab: Lab | None = None

    def remaining(self, floor: float = 1.0) -> float:
        return max(floor, self.deadline - time.monotonic())

    def folder_on(self, host: Host, name: str) -> Path:
        """A folder for this case's files on `host` (a server's config, a client's request list): in the
        case's artifact folder on this machine, below the host's work folder on a remote one (a path of this
        machine means nothing there; the run's teardown removes the work folder)."""
        if not host.remote:
            return self.artifact_dir / name
        # the artifact folder's last parts (vpn/profile/workload/attempt) name the case within the run
        return host.workdir / "cases" / "-".join(self.artifact_dir.parts[-4:]) / name

    @property
    def server_ip(self) -> str:
        return self.mesh.tunnel_ip(self.server)

    @property
    def client_ip(self) -> str:
        return self.mesh.tunnel_ip(self.client)


class Workload(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]
    tools: ClassVar[tuple[str, ...]] = ()
    Params: ClassVar[type[Params]] = Params
    metrics: ClassVar[tuple[MetricSpec, ...]] = ()
    headline: tuple[str, ...] = ()  # the metrics the terminal summary shows (a workload may set its own)
    restarts_mesh: ClassVar[bool] = False  # the runner lets the tunnel settle again afterwards
    # why the workload runs in the namespace lab only (a scenario with lab.backend = "ssh" is refused with it)
    namespace_lab_only: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declare(cls.metrics, f"workload {getattr(cls, 'name', cls.__name__)}")

    def label(self) -> str:
        """Case key of this parameterisation (e.g. tcp-p4, udp-100M)."""
        return self.name

    def moves_path(self) -> bool:
        """True when the workload itself changes the underlay path (a failover event): the runner then
        records the case's path share but does not hold it to the scenario's path."""
        return False

    def __init__(self, params: _Params):
        self.params = params

    @abstractmethod
    def expected_seconds(self) -> float:
        """How long one case should take when all is well (the case timeout is derived from it)."""

    def typical_seconds(self, cases: int = 1) -> float | None:
        """How long one case typically takes, from the parameters (`tunnelbench plan`'s estimate when no
        earlier run measured it; expected_seconds() is the timeout's upper bound): the mean over `cases`
        consecutive cases of one VPN and condition (a workload that starts from its previous case's answer is
        quicker after the first). The runner's own time per case is not in it. None: no model (the time is
        the tunnel's, e.g. a fixed byte count); plan then takes the upper bound and says so."""
        return None

    def hosts_needed(self) -> int:
        """Hosts of the VPN's mesh one case uses (client and server); `tunnelbench plan` counts a case whose VPN
        runs on fewer (lab.hosts_per_vpn) as skipped."""
        return 2

    def pair_path(self) -> bool:
        """Whether the case's traffic is between its client and server host only (the runner confirms that
        pair's path on the router); not so when the server talks to more hosts, or to pods."""
        return self.hosts_needed() <= 2

    @abstractmethod
    def run(self, ctx: CaseContext) -> Outcome: ...
