"""A short-lived lab for impairment work outside a benchmark run (calibrate, bench-engine, tests): the lab's
one bring-up (lab.make.lab_session) with an impairment backend on its router."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tunnelbench.impair.backend import Backend, make_backend
from tunnelbench.lab.make import lab_session
from tunnelbench.lab.netns import NetnsLab
from tunnelbench.lab.spec import LabCfg


@contextlib.contextmanager
def impair_lab(root: Path, n_hosts: int = 2, backend: str = "auto") -> Iterator[tuple[NetnsLab, Backend]]:
    with lab_session(LabCfg(hosts=n_hosts), root) as s:
        assert isinstance(s.lab, NetnsLab)  # LabCfg's default backend
        be = make_backend(backend, s.lab.router, s.lab.hosts, s.run_dir / "impair")
        try:
            yield s.lab, be
        finally:
            with contextlib.suppress(Exception):
                be.clear()
