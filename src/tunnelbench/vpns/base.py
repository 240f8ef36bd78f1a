"""The VPN driver interface. One file per VPN under vpns/ holds everything about that VPN.

A driver never knows what will be measured: the orchestrator builds a `Mesh` from a driver and hosts and
hands the mesh (hosts + tunnel addresses) to workloads."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import time
from abc import ABC, abstractmethod
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tunnelbench.lab.host import CommandError, Host, Process


@dataclass
class Availability:
    ok: bool
    reason: str = ""
    version: str | None = None


@dataclass
class MeshSpec:
    """What a driver gets to build a mesh: the hosts, a run-unique tag for global names, options."""

    hosts: list[Host]
    tag: str
    workdir: Path
    mtu: int | None = None  # common tunnel MTU when the scenario levels the field; None = the VPN's default
    options: dict = field(default_factory=dict)


# set while availability() asks a remote host for a driver's version: _first_line runs there
_VERSION_HOST: ContextVar[Host | None] = ContextVar("_VERSION_HOST", default=None)


class VpnDriver(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]
    binaries: ClassVar[tuple[str, ...]] = ()
    default_mtu: ClassVar[int | None] = None
    # seconds the tunnel needs after every pair answers before it runs at full speed (e.g. tinc's PMTU
    # discovery sends large packets over its TCP meta connection for ~5 s); the runner waits this out
    settle_s: ClassVar[float] = 0.0
    # tunnel addresses: host i (1-based) gets TUNNEL_NET.i
    tunnel_prefix: ClassVar[str] = "10.77.0"
    tunnel_prefixlen: ClassVar[int] = 24

    def __init__(self, spec: MeshSpec):
        self.spec = spec
        self.procs: dict[str, list[Process]] = {h.name: [] for h in spec.hosts}

    # -- identity ----------------------------------------------------------------------------------
    @classmethod
    def availability(cls, hosts: list[Host] | None = None) -> Availability:
        """Binaries and version here, or on the hosts when they are remote (SSH lab: version from the first)."""
        remote = [h for h in hosts or [] if h.remote]
        if remote:
            missing = sorted(
                {f"{b} on {h.name}" for h in remote for b, p in h.which(cls.binaries).items() if p is None}
            )  # type: ignore[attr-defined]
        else:
            missing = [b for b in cls.binaries if shutil.which(b) is None]
        if missing:
            return Availability(
                False, f"missing binaries: {', '.join(missing)} (try `tunnelbench install {cls.name}`)"
            )
        token = _VERSION_HOST.set(remote[0] if remote else None)
        try:
            return Availability(True, version=cls.version())
        except Exception as e:  # a binary that cannot report its version is broken
            return Availability(False, f"version check failed: {e}")
        finally:
            _VERSION_HOST.reset(token)

    @classmethod
    @abstractmethod
    def version(cls) -> str: ...

    @staticmethod
    def _first_line(argv: list[str], contains: str = "") -> str:
        host = _VERSION_HOST.get()
        p = (
            host.run(argv, check=False, timeout=10)
            if host
            else subprocess.run(argv, capture_output=True, text=True, timeout=10)
        )
        for line in (p.stdout + p.stderr).splitlines():
            if contains.lower() in line.lower() and line.strip():
                return line.strip()
        raise RuntimeError(f"`{' '.join(argv)}` printed no version")

    # -- addressing --------------------------------------------------------------------------------
    def index(self, host: Host) -> int:
        return self.spec.hosts.index(host) + 1

    def tunnel_ip(self, host: Host) -> str:
        return f"{self.tunnel_prefix}.{self.index(host)}"

    @property
    def mtu(self) -> int | None:
        return self.spec.mtu or self.default_mtu

    def host_dir(self, host: Host) -> Path:
        d = host.workdir / self.name
        made = self.__dict__.setdefault("_made_dirs", set())
        if (host.name, d) not in made:  # one round trip per host on an SSH host, not one per call
            host.mkdir(d)
            made.add((host.name, d))
        return d

    def ifname(self, host: Host) -> str:
        """Tunnel interface name, unique on the whole machine (some VPNs keep sockets per name in /var/run)."""
        return f"{self.spec.tag}v{self.index(host)}"

    # -- lifecycle ---------------------------------------------------------------------------------
    @abstractmethod
    def configure(self) -> None:
        """Generate keys, certificates and configs for the full mesh (private keys 0600, never printed)."""

    @abstractmethod
    def start(self, host: Host) -> None:
        """Start the VPN on one host (do not wait for peers). Register processes in self.procs."""

    def stop(self, host: Host) -> None:
        for p in reversed(self.procs[host.name]):
            p.stop()
        self.procs[host.name] = []
        self.after_stop(host)

    def after_stop(self, host: Host) -> None:  # noqa: B027 (optional hook)
        """Remove what the daemon leaves behind on exit (sockets, interfaces)."""

    def leftovers(self, host: Host) -> list[str]:
        """What of this VPN is still on the host after stop: processes, interfaces, routes, files."""
        found = [f"process {p.label} pid {p.pid}" for p in self.procs[host.name] if p.alive()]
        links = host.run(["ip", "-o", "link", "show"]).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name not in ("lo", "eth0") and name not in host.preexisting_links:
                found.append(f"interface {name}")
        routes = host.run(["ip", "-o", "route", "show", "table", "all"]).stdout
        for line in routes.splitlines():
            if self.tunnel_prefix in line and "eth0" not in line:
                found.append(f"route {line.strip()}")
        return found

    def daemons(self, host: Host) -> list[Process]:
        return [p for p in self.procs[host.name]]

    def log_tails(self, chars: int = 1500) -> dict[str, str]:
        return {f"{h}/{p.label}": p.log_tail(chars) for h, ps in self.procs.items() for p in ps}

    # -- shared helpers for drivers ----------------------------------------------------------------
    def wait_for(self, what: str, check, timeout: float = 10.0, interval: float = 0.02) -> None:
        end = time.monotonic() + timeout
        while True:
            if check():
                return
            if time.monotonic() > end:
                raise TimeoutError(f"{self.name}: {what} not ready after {timeout:.0f} s")
            time.sleep(interval)

    def link_exists(self, host: Host, ifname: str) -> bool:
        return host.run(["ip", "link", "show", ifname], check=False).returncode == 0


class MeshNotReady(RuntimeError):
    pass


class Mesh:
    """A running VPN over a set of hosts, as workloads see it."""

    def __init__(self, driver: VpnDriver):
        self.driver = driver
        self.hosts = driver.spec.hosts
        self.vpn = driver.name
        self.probe_ms = 300  # readiness probe timeout; raised under delay profiles

    def tunnel_ip(self, host: Host) -> str:
        return self.driver.tunnel_ip(host)

    def daemons(self) -> dict[str, list[Process]]:
        return {h.name: self.driver.daemons(h) for h in self.hosts}

    def start(self) -> None:
        for h in self.hosts:
            self.driver.start(h)

    def stop(self) -> None:
        for h in self.hosts:
            self.driver.stop(h)

    def pairs_down(self, per_probe_ms: int | None = None) -> list[tuple[str, str]]:
        """Pairs (a, b) where a cannot ping b's tunnel address now (fping, one round)."""
        per_probe_ms = per_probe_ms or self.probe_ms
        down: list[tuple[str, str]] = []
        for a in self.hosts:
            targets = {self.tunnel_ip(b): b for b in self.hosts if b is not a}
            limit = 10 + 2 * per_probe_ms / 1000
            p = a.run(
                ["fping", "-q", "-r", "0", "-t", str(per_probe_ms), *targets], check=False, timeout=limit
            )
            if p.returncode == 0:
                continue
            alive = set(
                a.run(
                    ["fping", "-a", "-r", "0", "-t", str(per_probe_ms), *targets], check=False
                ).stdout.split()
            )
            down += [(a.name, b.name) for ip, b in targets.items() if ip not in alive]
        return down

    def wait_ready(self, timeout: float) -> float:
        """Wait until every ordered pair answers over the tunnel; returns seconds waited."""
        t0 = time.monotonic()
        down = list(itertools.permutations([h.name for h in self.hosts], 2))
        while down:
            for h in self.hosts:
                for p in self.driver.daemons(h):
                    if not p.alive():
                        raise MeshNotReady(
                            f"{self.vpn} daemon {p.label} on {h.name} exited: {p.log_tail(800)}"
                        )
            down = self.pairs_down()
            if not down:
                break
            if time.monotonic() - t0 > timeout:
                raise MeshNotReady(f"{self.vpn}: pairs not answering after {timeout:.0f} s: {down}")
            time.sleep(0.05)
        return time.monotonic() - t0

    def leftovers(self) -> list[str]:
        out: list[str] = []
        for h in self.hosts:
            try:
                out += [f"{h.name}: {x}" for x in self.driver.leftovers(h)]
            except CommandError as e:
                out.append(f"{h.name}: cannot inspect ({e})")
        return out
