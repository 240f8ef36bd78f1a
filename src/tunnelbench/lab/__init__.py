"""Hosts, topology, process supervision and teardown.

`make_lab` is the one place that picks a backend: the namespace lab on this machine, or real hosts over
SSH (lab/ssh.py, from an Ansible-style inventory). Everything above the lab uses only the `Lab` protocol and `Host`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tunnelbench.lab.host import Host
    from tunnelbench.lab.journal import Journal
    from tunnelbench.scenario import LabCfg


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


def make_lab(cfg: LabCfg, tag: str, run_dir: Path, journal: Journal) -> Lab:
    if cfg.backend == "netns":
        from tunnelbench.lab.netns import NetnsLab

        return NetnsLab(
            tag,
            cfg.hosts,
            run_dir,
            journal,
            cfg.path,
            cfg.relay,
            cfg.nat_type,
            cfg.nat_types,
            cfg.underlay_mtu,
        )
    if cfg.backend == "ssh":
        from tunnelbench.lab.inventory import load_inventory
        from tunnelbench.lab.ssh import SshLab

        if cfg.underlay_mtu is not None:
            raise ValueError(
                "lab.underlay_mtu needs the namespace lab: the MTU of real hosts' interfaces is "
                "theirs to set, not the benchmark's"
            )
        if not cfg.inventory:
            raise ValueError("lab.backend 'ssh' needs lab.inventory (or --inventory FILE)")
        inv = load_inventory(cfg.inventory)
        if cfg.path != "direct":
            raise ValueError(
                f"lab.path {cfg.path!r} needs the namespace lab (the SSH lab has no path policies yet)"
            )
        if cfg.insecure_no_host_key_check:
            inv.insecure()
        return SshLab(inv, cfg.hosts, tag, run_dir, journal)
    raise ValueError(f"lab.backend {cfg.backend!r} is not supported")
