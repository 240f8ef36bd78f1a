"""What an instrument needs of a case: its two ends. A workload's CaseEnds has this shape; an instrument
takes it as this protocol, so it knows hosts and addresses, never a VPN or a workload."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from tunnelbench.lab.host import Host


class CaseEnds(Protocol):
    @property
    def client(self) -> Host: ...

    @property
    def server(self) -> Host: ...

    @property
    def server_ip(self) -> str: ...

    @property
    def artifact_dir(self) -> Path: ...

    @property
    def options(self) -> dict[str, Any]: ...

    def remaining(self, floor: float = 1.0) -> float: ...
