"""A running VPN over a set of hosts, as workloads see it: the hosts, their tunnel addresses, the daemons, and
the readiness wait. The orchestrator builds it from a driver; a workload gets it and never the driver's code."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from tunnelbench.core.results import Outcome
from tunnelbench.lab.host import CommandError, Host, Process
from tunnelbench.vpns.base import VpnDriver
from tunnelbench.vpns.podclients import PodClients

# fping (5.1, Debian 12) forgets a probe 10 s after sending it (seqmap.c, SEQMAP_TIMEOUT_IN_S): a later reply
# is dropped as unknown, so a round trip of 10 s or more (Goethals et al.'s 5000 ms one way) never counts.
# Probes allowed that long go out as iputils ping instead.
FPING_FORGETS_MS = 10_000


class Layer(Protocol):
    """Something running on top of a mesh that must go before it (kube/layer.py)."""

    def stop(self) -> list[str]:
        """Undo everything; what could not be undone."""


class MeshNotReady(RuntimeError):
    """The mesh is not ready. `down` lists the pairs that never answered when every daemon still runs (the
    tunnels may carry some traffic, as under heavy loss); empty when a daemon exited."""

    outcome: Outcome  # what a failing case measured, when it set one (the runner stores its metrics)

    def __init__(self, msg: str, down: list[tuple[str, str]] | None = None):
        super().__init__(msg)
        self.down = down or []


class Mesh:
    """A running VPN over a set of hosts, as workloads see it."""

    def __init__(self, driver: VpnDriver):
        self.driver = driver
        self.hosts = driver.spec.hosts
        self.vpn = driver.key  # "nebula@1.9.0" for a variant: the run's rows and case folders are per key
        self.probe_ms = 300  # readiness probe timeout; raised under delay profiles
        self.unsettled_at_ready: list[str] = []  # what VpnDriver.unsettled still said when wait_ready gave up
        # layers a workload put on top of the mesh (kube/: a cluster whose nodes talk over it): each goes, last
        # first, before the mesh stops; what one could not undo is named among the mesh's leftovers
        self.layers: list[Layer] = []
        self.layer_leftovers: list[str] = []

    def tunnel_ip(self, host: Host) -> str:
        return self.driver.tunnel_ip(host)

    def pod_clients(self, server: Host, n: int, names: list[str]) -> PodClients:
        """Clients of this mesh that run in Kubernetes pods (vpns/podclients.py); NotImplementedError when the
        driver has no recipe for them."""
        return self.driver.pod_clients(server, n, names)

    def expect_delay(self, delay_ms: float, jitter_ms: float) -> float:
        """The path now delays each way by `delay_ms` with `jitter_ms`: a readiness probe waits for its reply
        300 ms plus twice the worst round trip (jitter at 3 sigma); returns the seconds a readiness wait adds
        (4 x (delay + jitter)) for the replies of a path that slow."""
        self.probe_ms = int(300 + 2 * 2 * (delay_ms + 3 * jitter_ms))
        return 4 * (delay_ms + jitter_ms) / 1000

    def daemons(self) -> dict[str, list[Process]]:
        return {h.name: self.driver.daemons(h) for h in self.hosts}

    # a star's spokes start and stop this many at a time: one at a time, a SoftEther star of 100 spokes took
    # minutes each way (each spoke waits on its own daemon and vpncmd), and of 1000 never finished
    SPOKES_AT_ONCE = 8

    def _star_hub(self) -> Host | None:
        return self.driver.spec.hub if self.driver.spec.topology == "star" else None

    def start(self) -> None:
        hub = self._star_hub()
        if hub is None:
            for h in self.hosts:
                self.driver.start(h)
            return
        self.driver.start(hub)  # the spokes connect to it
        self._each_spoke(self.driver.start, hub)

    def stop(self) -> None:
        layers, self.layers = self.layers, []
        for layer in reversed(layers):
            try:
                self.layer_leftovers += layer.stop()
            except Exception as e:  # noqa: BLE001 - the mesh still stops; the leftover check names it
                self.layer_leftovers.append(f"{type(layer).__name__} teardown failed: {e}"[:400])
        try:
            hub = self._star_hub()
            if hub is None:
                for h in self.hosts:
                    self.driver.stop(h)
                return
            try:
                self._each_spoke(self.driver.stop, hub)
            finally:
                self.driver.stop(hub)
        finally:
            self.layer_leftovers += self.driver.after_mesh()

    def _each_spoke(self, step: Callable[[Host], None], hub: Host) -> None:
        """step(spoke) for every spoke, SPOKES_AT_ONCE at a time; every spoke is attempted, the first error raised.
        On Ctrl-C the spokes not begun are dropped and those under way finish before it propagates."""
        spokes = [h for h in self.hosts if h is not hub]
        pool = ThreadPoolExecutor(max_workers=self.SPOKES_AT_ONCE, thread_name_prefix="spoke")
        try:
            futures = [pool.submit(step, h) for h in spokes]
            errors = [e for f in futures if (e := f.exception()) is not None]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if errors:
            raise errors[0]

    def probed_pairs(self) -> list[tuple[Host, Host]]:
        """The pairs readiness probes: every ordered pair of peers, or in a star only hub -> spoke (a reply
        proves the spoke's tunnel both ways)."""
        if self.driver.spec.topology == "star":
            hub = self.driver.spec.hub
            assert hub is not None  # VpnDriver.__init__ refuses a star without a hub
            heads = [hub]
        else:
            heads = self.hosts
        return [(a, b) for a in heads for b in self.driver.peers(a)]

    def pairs_down(
        self, per_probe_ms: int | None = None, skip: set[tuple[str, str]] | None = None
    ) -> list[tuple[str, str]]:
        """Pairs (a, b) where a cannot ping b's tunnel address now (fping, one round; pairs in skip are not
        probed). In a star only the hub probes (one fping to every spoke, 1 ms apart)."""
        per_probe_ms = per_probe_ms or self.probe_ms
        skip = skip or set()
        down: list[tuple[str, str]] = []
        star = self.driver.spec.topology == "star"
        by_src: dict[str, tuple[Host, dict[str, Host]]] = {}
        for a, b in self.probed_pairs():
            if (a.name, b.name) not in skip:
                by_src.setdefault(a.name, (a, {}))[1][self.tunnel_ip(b)] = b
        for a, targets in by_src.values():
            limit = 10 + 2 * per_probe_ms / 1000 + (len(targets) / 1000 if star else 0)
            if per_probe_ms >= FPING_FORGETS_MS:
                alive = self._ping_alive(a, list(targets), per_probe_ms, limit)
                down += [(a.name, b.name) for ip, b in targets.items() if ip not in alive]
                continue
            iv = ["-i", "1"] if star else []
            p = a.run(
                ["fping", "-q", "-r", "0", *iv, "-t", str(per_probe_ms), *targets], check=False, timeout=limit
            )
            if p.returncode == 0:
                continue
            alive = set(
                a.run(
                    ["fping", "-a", "-r", "0", *iv, "-t", str(per_probe_ms), *targets],
                    check=False,
                    timeout=limit,
                ).stdout.split()
            )
            down += [(a.name, b.name) for ip, b in targets.items() if ip not in alive]
        return down

    @staticmethod
    def _ping_alive(a: Host, targets: list[str], per_probe_ms: int, limit: float) -> set[str]:
        """The targets that answer one iputils ping each (all at once, from a), for round trips too long
        for fping."""
        wait_s = str(math.ceil(per_probe_ms / 1000))
        script = (
            'for ip in "$@"; do (ping -n -q -c 1 -W "$0" "$ip" >/dev/null 2>&1 && echo "$ip") & done; wait'
        )
        return set(a.run(["sh", "-c", script, wait_s, *targets], check=False, timeout=limit).stdout.split())

    def wait_ready(self, timeout: float) -> float:
        """Wait until every ordered pair has answered over the tunnel since the wait began, and then (within
        the same timeout) until the driver reports its paths settled (VpnDriver.unsettled); returns seconds
        waited. A pair counts once it answered: under a lossy profile (Goethals et al.'s degradation sweeps
        lose 10..90%) the chance that all of 100 spokes answer in the same round is 0.81^100 at 10% loss, so
        a round-by-round "all at once" would call a working mesh down. Pairs that never answer raise
        MeshNotReady; paths that never settle are kept in unsettled_at_ready and left to the case's path
        check (lab/pathcheck.py), which counts the bytes rather than trusting the VPN's view."""
        t0 = time.monotonic()
        self.unsettled_at_ready = []
        answered: set[tuple[str, str]] = set()
        while True:
            for h in self.hosts:
                for p in self.driver.daemons(h):
                    if not p.alive():
                        raise MeshNotReady(
                            f"{self.vpn} daemon {p.label} on {h.name} exited: {p.log_tail(800)}"
                        )
            probed = {(a.name, b.name) for a, b in self.probed_pairs()} - answered
            down, unsettled = self.pairs_down(skip=answered), []
            answered |= probed - set(down)
            if not down:
                unsettled = self.driver.unsettled()
                if not unsettled:
                    break
            late = time.monotonic() - t0 > timeout
            if late and down:
                raise MeshNotReady(
                    f"{self.vpn}: pairs not answering after {timeout:.0f} s (not once since the wait began;"
                    f" {len(answered)} others did): {down}",
                    down,
                )
            if late:  # every pair answers: the case runs, and its byte-counted path verdict judges the path
                self.unsettled_at_ready = unsettled
                break
            time.sleep(0.05 if down else 0.2)
        return time.monotonic() - t0

    def leftovers(self) -> list[str]:
        out, self.layer_leftovers = list(self.layer_leftovers), []
        for h in self.hosts:
            try:
                out += [f"{h.name}: {x}" for x in self.driver.leftovers(h)]
            except CommandError as e:
                out.append(f"{h.name}: cannot inspect ({e})")
        return out
