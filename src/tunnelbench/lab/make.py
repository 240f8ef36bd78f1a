"""One way to bring a lab up and down. `make_lab` is the one place that picks a backend: the namespace lab on
this machine, or real hosts over SSH (lab/ssh_lab.py, from an Ansible inventory); `end_lab` the one way a lab
ends (its journal ended only when nothing was left); `lab_session` both around a block, for a lab that lives
for one command or one point of a sweep (nat-matrix cells, mesh-scale sizes, calibrate, bench-engine). A mesh
on it comes up and goes the one way vpns/session.py says (a `mesh_session` inside the lab's block). A
benchmark run (runner/loop.py) holds its lab across many blocks (and rebuilds it after a dirty teardown) and calls
make_lab and end_lab itself; `up`/`down` (interactive.py) keep a lab made by make_lab across processes, and
`down` ends its journal after releasing its own entries in it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunnelbench.lab.base import Lab
from tunnelbench.lab.journal import Journal
from tunnelbench.lab.spec import LabCfg
from tunnelbench.lab.tags import new_run_id, new_tag


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


def end_lab(lab: Lab, journal: Journal) -> list[str]:
    """Destroy the lab; its journal is ended only when the teardown undid everything: what it could not undo
    stays registered, so `tunnelbench clean` finds and retries it. Returns the problems."""
    problems = lab.destroy()
    if not problems:
        journal.end()
    return problems


@dataclass
class LabSession:
    lab: Lab
    tag: str
    run_dir: Path
    journal: Journal


@contextmanager
def lab_session(cfg: LabCfg, root: Path, out: dict[str, Any] | None = None) -> Iterator[LabSession]:
    """A fresh lab (its own tag and run folder below `root`), built and its links up on entry; ended on exit
    (end_lab). What its teardown could not undo is put in `out` (`teardown`), with the whole session's
    `seconds`."""
    out = out if out is not None else {}
    t0 = time.monotonic()
    tag = new_tag()
    run_dir = root / new_run_id(tag)
    journal = Journal(run_dir, run_dir.name)
    lab = make_lab(cfg, tag, run_dir, journal)
    session = LabSession(lab, tag, run_dir, journal)
    try:
        lab.build()
        lab.wait_links()
        yield session
    finally:
        problems = end_lab(lab, journal)
        if problems:
            out["teardown"] = problems
        out["seconds"] = round(time.monotonic() - t0, 1)
