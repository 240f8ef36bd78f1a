"""A throw-away namespace lab for one point of a sweep (nat-matrix cells, mesh-scale sizes): built on entry;
on exit the mesh the caller put in `point.mesh` is stopped, the lab destroyed, its journal ended, and what
went wrong on the way out recorded in the caller's result dict (`stop_error`, `teardown`) with `seconds`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunnelbench.lab.journal import Journal
from tunnelbench.lab.netns import NetnsLab
from tunnelbench.lab.tags import new_run_id, new_tag


@dataclass
class LabPoint:
    lab: NetnsLab
    tag: str
    run_dir: Path
    mesh: Any = None  # anything with stop(): the running mesh, stopped before the lab goes


@contextmanager
def fresh_lab(n_hosts: int, workdir: Path, out: dict[str, Any], **lab_kw: Any) -> Iterator[LabPoint]:
    t0 = time.monotonic()
    tag = new_tag()
    run_dir = workdir / new_run_id(tag)
    journal = Journal(run_dir, run_dir.name)
    lab = NetnsLab(tag, n_hosts, run_dir, journal, **lab_kw)
    point = LabPoint(lab, tag, run_dir)
    try:
        lab.build()
        lab.wait_links()
        yield point
    finally:
        if point.mesh is not None:
            try:
                point.mesh.stop()
            except Exception as e:  # noqa: BLE001 - the lab's teardown below still runs
                out["stop_error"] = str(e)[:200]
        problems = lab.destroy()
        if problems:
            out["teardown"] = problems
        journal.end()
        out["seconds"] = round(time.monotonic() - t0, 1)
