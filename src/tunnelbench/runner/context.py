"""What every part of a run shares: the run's identity and store (RunContext), and the bench it measures on
(Bench: the lab, the client and server, the impairment backend, the path watch, the CPU placement), which a
dirty teardown replaces as a whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, TaskID
from rich.text import Text

from tunnelbench.impair.backend import Backend
from tunnelbench.lab import cpus, hostfw, pathcheck
from tunnelbench.lab.base import Lab
from tunnelbench.lab.host import Host
from tunnelbench.lab.journal import Journal
from tunnelbench.lab.make import make_lab
from tunnelbench.scenario import Scenario
from tunnelbench.store import Store

# A case fails on any error (a parser bug in one workload must not end the run); Interrupted and
# KeyboardInterrupt are not Exceptions of this kind and always end it.
CASE_ERRORS = (Exception,)


def safe(name: str) -> str:
    """A VPN key as a folder name."""
    return name.replace("/", "_")


@dataclass
class RunContext:
    """The run's identity, scenario, store and console, as every part of the run reads them."""

    sc: Scenario
    run_id: str
    run_dir: Path
    tag: str
    console: Console
    store: Store = field(init=False)
    progress: Progress | None = None
    task: TaskID | None = None  # set with progress

    def phase(self, vpn: str | None, phase: str, seconds: float) -> None:
        self.store.add_phase(self.run_id, vpn, phase, seconds)

    def say(self, msg: str, style: str = "") -> None:
        """Print a line; `msg` is plain text (VPN errors and user names may hold brackets, never markup)."""
        (self.progress.console if self.progress else self.console).print(
            Text(msg, style=style), highlight=False
        )

    def status(self, description: str) -> None:
        """The progress line's description (what the run does now)."""
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, description=description)


@dataclass
class Bench:
    """The lab a run measures on, with what the run set up in it. `client` and `server` are the scenario's
    fixed pair (the same host is always client, the same host always server)."""

    lab: Lab
    client: Host
    server: Host
    backend: Backend | None = None
    path_watch: pathcheck.PathWatch | None = None
    placement: cpus.Placement | None = None

    @classmethod
    def of(cls, sc: Scenario, lab: Lab) -> Bench:
        """The bench on a lab already built."""
        return cls(lab, *cls._pair(sc, lab))

    @staticmethod
    def _pair(sc: Scenario, lab: Lab) -> tuple[Host, Host]:
        client = next(h for h in lab.hosts if h.name == sc.lab.client)
        server = next(h for h in lab.hosts if h.name == sc.lab.server)
        return client, server

    def watch_path(self, sc: Scenario) -> bool:
        """On the namespace lab the router forwards every underlay byte: watch the pair's path there (and
        plant the path check's negative control when the scenario asks). True when the fault was planted."""
        if sc.lab.backend != "netns":
            return False
        self.path_watch = pathcheck.PathWatch(self.lab, self.client, self.server)
        if sc.lab.plant_fault == "udp-blocked":
            self.lab.block_udp_pair(self.client, self.server)
            return True
        return False

    def rebuild(self, sc: Scenario, tag: str, run_dir: Path, journal: Journal) -> None:
        """A lab from scratch after a teardown left something: never let the next VPN start on a dirty host
        set. The new lab gets what the old one had from the run: the host firewall, the CPU pinning, the
        router's path counters and planted fault (sysctls: each session sets its tuning)."""
        self.lab.destroy()
        self.lab = make_lab(sc.lab, tag, run_dir, journal)  # held before it is built: the teardown ends it
        self.lab.build()
        self.lab.wait_links()
        self.client, self.server = self._pair(sc, self.lab)
        if sc.hosts.firewall == "stateful":
            hostfw.install(self.lab.hosts, f"{tag}hostfw")
        if self.placement is not None:
            self.placement.pin(self.lab.hosts)
        if self.path_watch is not None:
            self.watch_path(sc)

    def hosts(self) -> list[Host]:
        """Every host of the lab, router included."""
        return list(self.lab.all_hosts())
