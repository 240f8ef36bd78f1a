"""Hosts, topology, process supervision and teardown.

`make_lab` is the one place that picks a backend: the namespace lab on this machine, or (later) real hosts
over SSH. Everything above the lab uses only the `Lab` protocol and `Host`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tunnelbench.lab.host import Host
    from tunnelbench.lab.journal import Journal
    from tunnelbench.scenario import LabCfg


class Lab(Protocol):
    tag: str
    run_dir: Path
    journal: Journal
    hosts: list[Host]  # the peers, h1..hN
    router: Host  # forwards every underlay packet between peers: impairment and firewall policies live here

    def build(self) -> None: ...
    def wait_links(self, timeout: float = 5.0) -> None: ...
    def destroy(self) -> list[str]: ...
    def offlab_drops(self, counter: str = "offlab") -> int: ...


def make_lab(cfg: LabCfg, tag: str, run_dir: Path, journal: Journal) -> Lab:
    if cfg.backend == "netns":
        from tunnelbench.lab.netns import NetnsLab

        return NetnsLab(tag, cfg.hosts, run_dir, journal)
    raise ValueError(f"lab.backend {cfg.backend!r} is not supported")
