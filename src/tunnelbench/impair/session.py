"""A short-lived lab for impairment work outside a benchmark run (calibrate, bench-engine, tests): the lab's
one bring-up (lab.make.lab_session) with an impairment backend on its router; `calibrate`'s measurement on it."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from tunnelbench.impair.backend import Backend, ImpairError, make_backend
from tunnelbench.impair.calibrate import Calibration, calibrate, measure_base
from tunnelbench.impair.profiles import Profile
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


def calibration_backends(lab: NetnsLab, names: list[str]) -> list[Backend]:
    """One backend per name over the same lab (the router's interfaces toward each host); `auto` resolves to
    netem where the kernel has it. Two names that resolve to the same backend are refused (ImpairError)."""
    bes = [make_backend(n, lab.router, lab.hosts, lab.run_dir / f"impair-{n}") for n in names]
    if len({b.name for b in bes}) != len(bes):
        raise ImpairError(
            f"{', '.join(names)} resolve to the same backend here ({', '.join(b.name for b in bes)})"
        )
    return bes


def calibrate_backends(
    profiles: list[Profile], backends: list[str], probes: int, say: Callable[[str], None]
) -> list[Calibration]:
    """`tunnelbench calibrate`: each profile on every backend in turn (machine drift hits them alike) over one
    fresh 2-host lab, configured against measured."""
    results = []
    with (
        tempfile.TemporaryDirectory(prefix="tunnelbench-cal-") as tmp,
        impair_lab(Path(tmp), 2, "auto") as (lab, _),
    ):
        h1, h2 = lab.hosts
        bes = calibration_backends(lab, backends)
        base = measure_base(h1, h2, lab.run_dir)
        say(
            f"backend {', '.join(b.name for b in bes)}; base one-way {base.one_way_ms:.3f} ms, "
            f"RTT {base.rtt_ms:.3f} ms"
        )
        try:
            for p in profiles:
                for be in bes:
                    be.apply(p)
                    try:
                        results.append(calibrate(be, p, h1, h2, lab.run_dir, base, count=probes))
                    finally:
                        be.clear()
        finally:
            for be in bes:
                be.clear()
    return results
