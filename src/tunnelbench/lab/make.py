"""`make_lab` is the one place that picks a backend: the namespace lab on this machine, or real hosts over SSH
(lab/ssh_lab.py, from an Ansible inventory)."""

from __future__ import annotations

from pathlib import Path

from tunnelbench.lab.base import Lab
from tunnelbench.lab.journal import Journal
from tunnelbench.lab.spec import LabCfg


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
        from tunnelbench.lab.ssh_lab import SshLab

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
