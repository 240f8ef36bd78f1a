"""A short-lived lab for impairment work outside a benchmark run (calibrate, bench-engine, tests)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tunnelbench.impair.backend import Backend, make_backend
from tunnelbench.lab.journal import Journal
from tunnelbench.lab.netns import NetnsLab
from tunnelbench.lab.tags import new_run_id, new_tag


@contextlib.contextmanager
def impair_lab(root: Path, n_hosts: int = 2, backend: str = "auto") -> Iterator[tuple[NetnsLab, Backend]]:
    tag = new_tag()
    run_dir = root / new_run_id(tag)
    journal = Journal(run_dir, run_dir.name)
    lab = NetnsLab(tag, n_hosts, run_dir, journal)
    be: Backend | None = None
    try:
        lab.build()
        lab.wait_links()
        be = make_backend(backend, lab.router, lab.hosts, run_dir / "impair")
        yield lab, be
    finally:
        if be is not None:
            with contextlib.suppress(Exception):
                be.clear()
        lab.destroy()
        journal.end()
