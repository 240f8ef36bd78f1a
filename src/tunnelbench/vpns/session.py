"""One way a VPN's mesh comes up and goes, as lab/make.py is for a lab. `make_mesh` is the one place that builds
a driver's MeshSpec, from the lab the mesh runs on (its hosts, tag, folder and relay host) and the one merge of
a scenario's `vpn_options`, and the `Mesh` a workload gets; `start_mesh` configures it, starts every daemon,
waits until every pair answers and warms it up; `end_mesh` stops it and verifies the teardown (what it left on
any host); `mesh_session` all three around a block, for a mesh that lives for one point of a sweep (nat-matrix
cells, mesh-scale sizes) or one engine-tax check. A run (runner/loop.py) holds a mesh across a session's cases
and `up`/`down` (interactive.py) across processes: they call the three themselves. A test names any other
place that makes a mesh (tests/house/test_layering.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tunnelbench.lab.base import Lab
from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import MeshSpec, VpnDriver
from tunnelbench.vpns.mesh import Mesh


def vpn_options(options: Mapping[str, Mapping[str, Any]], vpn: str) -> dict[str, Any]:
    """A VPN key's options: those given for its base name, then those for the exact `name@version`."""
    base = vpn.split("@", 1)[0]
    return {**options.get(base, {}), **(options.get(vpn, {}) if vpn != base else {})}


def make_mesh(
    cls: type[VpnDriver],
    lab: Lab,
    *,
    hosts: list[Host] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    mtu: int | None = None,
    path: str = "direct",
    topology: str = "mesh",
    hub: Host | None = None,
    session: str = "",
) -> Mesh:
    """The driver for `cls` over `hosts` (default: every peer of the lab), configured nowhere yet. `options`:
    a scenario's whole `vpn_options`, merged for the driver's key here."""
    spec = MeshSpec(
        hosts=list(lab.hosts if hosts is None else hosts),
        tag=lab.tag,
        workdir=lab.run_dir,
        mtu=mtu,
        options=vpn_options(options or {}, cls.key),
        path=path,
        relay=lab.relay,
        topology=topology,
        hub=hub,
        session=session,
    )
    return Mesh(cls(spec))


@dataclass
class Started:
    started_at: float  # time.monotonic() when the first daemon started
    start_s: float  # until every daemon was started
    waited_s: float | None  # until every pair answered (Mesh.wait_ready); None when not waited for


def start_mesh(
    mesh: Mesh,
    ready_timeout: float | None,
    warm_up: bool = True,
    configured: Callable[[float], object] | None = None,
) -> Started:
    """Configure (then `configured(seconds)`), start every host's daemons, wait up to `ready_timeout` until
    every pair answers (None: not at all, the caller measures readiness itself) and warm the tunnel up."""
    t0 = time.monotonic()
    mesh.driver.configure()
    if configured is not None:
        configured(time.monotonic() - t0)
    started_at = time.monotonic()
    mesh.start()
    start_s = time.monotonic() - started_at
    waited = None
    if ready_timeout is not None:
        waited = mesh.wait_ready(ready_timeout)
        if warm_up:
            mesh.driver.warm_up()
    return Started(started_at, start_s, waited)


def end_mesh(mesh: Mesh, stop: Callable[[], object] | None = None) -> list[str]:
    """Stop the mesh (`stop`, e.g. one that also ends the session's keys; default Mesh.stop) and verify the
    teardown: what the driver left on each host (processes, interfaces, routes, state), empty when nothing.
    A stop that raises raises here."""
    (stop or mesh.stop)()
    return mesh.leftovers()


@contextmanager
def mesh_session(
    cls: type[VpnDriver],
    lab: Lab,
    ready_timeout: float | None,
    out: dict[str, Any],
    warm_up: bool = True,
    **spec: Any,
) -> Iterator[tuple[Mesh, Started]]:
    """A mesh made, started and (with `ready_timeout`) answering on entry; stopped and verified on exit, even
    when the block or the start raised. What went wrong on the way out is put in `out`: `stop_error`, or
    `leftovers` (what the teardown left). `spec`: make_mesh's keywords."""
    mesh = make_mesh(cls, lab, **spec)
    try:
        yield mesh, start_mesh(mesh, ready_timeout, warm_up)
    finally:
        try:
            left = end_mesh(mesh)
        except Exception as e:  # noqa: BLE001 - the caller's lab teardown still runs
            out["stop_error"] = str(e)[:200]
        else:
            if left:
                out["leftovers"] = left
