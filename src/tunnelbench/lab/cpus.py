"""CPU placement: which CPUs the impairment engine and the system under test (VPN daemons, measuring tools)
may use, the same for every profile of a run, baseline included.

On a machine with few cores the native engine, at real-time priority, takes a whole core from the VPN and
iperf3 under any impaired profile, but not under the baseline: a profile-to-profile difference then mixes
the profile's effect with the emulator's CPU cost. Confining the system under test to the same CPUs for
every profile makes the comparison about the profile. Pinning is `taskset -c` on every command a lab host
runs (children inherit it), and on the engine."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunnelbench.lab.host import Host


def cpu_list(spec: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5]."""
    out: list[int] = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out += range(int(a), int(b) + 1)
        elif part:
            out.append(int(part))
    return sorted(set(out))


def cpu_spec(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


@dataclass
class Placement:
    mode: str  # off | engine-apart | pinned
    reason: str
    ncpu: int
    engine: str | None = None  # CPU list of the engine
    sut: str | None = None  # CPU list of the system under test
    hosts: dict[str, str] = field(default_factory=dict)  # host -> CPU list it is confined to
    engine_busy_poll_us: int | None = None  # set by the runner when the native engine runs
    engine_realtime: bool | None = None
    steer_rx: bool = False  # RPS of every host's underlay interface to its CPUs

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def pin(self, hosts: Iterable[Host]) -> None:
        """Set every host's CPU list (lab.host.Host.cpus; None = unpinned)."""
        for h in hosts:
            h.cpus = self.hosts.get(h.name)

    def summary(self) -> str:
        if self.mode == "off":
            share = f"all {self.ncpu} CPUs" if self.ncpu else "the hosts' CPUs"  # 0: not known (SSH hosts)
            return f"CPU placement off ({self.reason}): VPNs, tools and engine share {share}"
        per_host = ", ".join(f"{h}: {c}" for h, c in self.hosts.items())
        engine = f"engine on CPU {self.engine}, " if self.engine else ""
        return f"CPU placement {self.mode} ({self.reason}): {engine}system under test on CPU {self.sut}" + (
            f" ({per_host})" if self.mode == "pinned" else ""
        )


PIN_MAX_HOSTS = 16  # larger labs (many-clients stars) are left to the scheduler


def available_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def plan(
    mode: str,
    engine_used: bool,
    hosts: list[str],
    engine_cpus: str | None = None,
    sut_cpus: str | None = None,
    cpus: list[int] | None = None,
) -> Placement:
    """Decide the placement. mode: auto | off | engine-apart | pinned (scenario [cpu] placement)."""
    cpus = cpus if cpus is not None else available_cpus()
    n = len(cpus)
    if mode == "auto":
        if engine_used and n <= 4:
            mode, reason = "engine-apart", f"auto: native engine on a {n}-CPU machine"
        elif engine_used:
            return Placement("off", f"auto: {n} CPUs are enough to share with the engine", n)
        elif len(hosts) > PIN_MAX_HOSTS:
            return Placement(
                "off", f"auto: {len(hosts)} hosts, more than {PIN_MAX_HOSTS} to pin one by one", n
            )
        else:
            # measured on a 2-CPU VM (README, "CPU placement"): run-to-run changes of TCP goodput fell from
            # up to 6.3% (unpinned) to at most 1.6% with each host on its own CPU
            mode, reason = "pinned", "auto: no native engine; each host on its own CPU"
    else:
        reason = "set by the scenario (cpu.placement)"
    if mode == "off":
        return Placement("off", reason, n)
    if n < 2 and not (engine_cpus and sut_cpus):
        return Placement("off", f"{mode} needs 2 CPUs, this machine has {n}", n)
    if not engine_used and mode == "pinned" and not engine_cpus:
        eng: list[int] = []  # no engine in the run: every CPU is the system under test's
    else:
        eng = cpu_list(engine_cpus) if engine_cpus else cpus[-1:]
    sut = cpu_list(sut_cpus) if sut_cpus else [c for c in cpus if c not in eng]
    unknown = [c for c in (*eng, *sut) if c not in cpus]
    if unknown:
        raise ValueError(
            f"cpu: CPU {unknown[0]} is not available here (CPUs {cpu_spec(cpus)}); fix "
            "[cpu] engine_cpus / sut_cpus"
        )
    if not sut:
        raise ValueError(
            f"cpu: no CPU left for the system under test (engine_cpus = {cpu_spec(eng)} of "
            f"{cpu_spec(cpus)}); set [cpu] sut_cpus"
        )
    if mode == "pinned":
        per_host = {h: str(sut[i % len(sut)]) for i, h in enumerate(hosts)}
    else:
        per_host = {h: cpu_spec(sut) for h in hosts}
    return Placement(mode, reason, n, cpu_spec(eng) or None, cpu_spec(sut), per_host)
