"""The `Lab` contract every lab keeps (the namespace lab, real hosts over SSH), and what a lab cannot do."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tunnelbench.lab.host import Host
    from tunnelbench.lab.journal import Journal


class LabError(RuntimeError):
    """What this lab cannot do (e.g. a path policy on real hosts over SSH)."""


class Lab(Protocol):
    tag: str
    run_dir: Path
    journal: Journal

    # read-only here: each lab holds its own kind of host (NetnsHost, SshHost)
    @property
    def hosts(self) -> Sequence[Host]: ...  # the peers, h1..hN

    # forwards every underlay packet between peers: impairment and firewall policies live here. The SSH lab
    # may have none (an inventory without a router host): then no router-side policies can be applied
    @property
    def router(self) -> Host | None: ...

    # the relay path's relay host (lab.path relay/nat); None on a direct path and in the SSH lab
    @property
    def relay(self) -> Host | None: ...

    # True: the lab can drop UDP between peers and count a relay's bytes (the path policies below); the SSH
    # lab cannot (real networks are not the benchmark's to filter), and its policy methods raise LabError
    path_policies: bool

    def build(self) -> None: ...
    def wait_links(self, timeout: float = 5.0) -> None: ...
    def destroy(self) -> list[str]: ...
    def offlab_drops(self, counter: str = "offlab") -> int: ...
    # dropped packets per off-lab address; {}: none known
    def offlab_destinations(self) -> dict[str, int]: ...
    def all_hosts(self) -> Sequence[Host]: ...  # every machine a run's monitors and diagnostics read
    def mapping(self) -> str | None: ...  # "h1=inventory-name, ...", None when hosts have no other name
    def block_udp_between_peers(self, except_host: Host | None = None) -> None: ...
    def block_udp_pair(self, a: Host, b: Host) -> None: ...  # lab.plant_fault "udp-blocked"
    def unblock(self) -> None: ...
    def watch_relay(self, relay: Host | None = None) -> None: ...
    def relay_bytes(self, relay: Host | None = None) -> dict[str, int]: ...
