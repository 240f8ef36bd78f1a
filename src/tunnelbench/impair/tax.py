"""The engine's tax on the system under test: the same short TCP test through a live mesh, once with the
native engine in the path at zero impairment and once without it, alternated (off, on, off, on) so that
the machine's drift does not land on one side. Calibration says whether delay and loss are right; this
says what the emulator costs the VPN being measured. Measured per VPN, in each engine mode the run's
profiles use (GSO super-packets whole, or every wire packet)."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tunnelbench.impair.backend import NativeBackend
from tunnelbench.impair.profiles import Profile
from tunnelbench.impair.tcpcheck import goodput_mbps, iperf3_tcp
from tunnelbench.lab.host import Host

TAX_FLAG_PCT = 10.0  # a tax above this is flagged: throughput under the engine is partly the emulator's
TAX_PORT = 5297
MODES = {"gso": "auto", "segment": "segment"}  # tax mode -> NativeBackend.gso_mode that produces it


@dataclass
class TaxCheck:
    vpn: str
    mode: str  # gso | segment
    off_mbps: list[float] = field(default_factory=list)
    on_mbps: list[float] = field(default_factory=list)
    engine_cpu_pct: list[float] = field(default_factory=list)  # engine CPU, % of one core, per "on" leg
    seconds: float = 0.0

    @property
    def tax_pct(self) -> float:
        off, on = statistics.median(self.off_mbps), statistics.median(self.on_mbps)
        return 100.0 * (1 - on / off) if off > 0 else 0.0

    @property
    def flagged(self) -> bool:
        return self.tax_pct > TAX_FLAG_PCT

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tax_pct": self.tax_pct, "flagged": self.flagged}

    def summary(self) -> str:
        cpu = (
            f", engine {statistics.median(self.engine_cpu_pct):.0f}% of a core" if self.engine_cpu_pct else ""
        )
        return (
            f"{self.mode}: {statistics.median(self.off_mbps):,.0f} -> {statistics.median(self.on_mbps):,.0f} "
            f"Mbit/s, tax {self.tax_pct:+.1f}%{cpu}"
        )


def modes_for(profiles: list[Profile], gso_mode: str) -> list[str]:
    """The engine modes the run's impaired profiles will use."""
    out = set()
    for p in profiles:
        if p.is_baseline or not p.needs_engine:
            continue
        out.add("gso" if gso_mode == "auto" else "segment")
    return sorted(out)


def mode_of(p: Profile, gso_mode: str) -> str | None:
    if not p.needs_engine:
        return None
    return "gso" if gso_mode == "auto" else "segment"


def measure_tax(
    backend: NativeBackend,
    vpn: str,
    src: Host,
    dst: Host,
    dst_ip: str,
    seconds: float,
    modes: list[str],
    rounds: int = 2,
) -> list[TaxCheck]:
    """Alternate off / on(mode) legs `rounds` times; the backend is left cleared (no profile)."""
    checks = {m: TaxCheck(vpn, m, seconds=seconds) for m in modes}
    saved = backend.gso_mode
    try:
        for _ in range(rounds):
            backend.clear()
            off = goodput_mbps(iperf3_tcp(src, dst, dst_ip, seconds, TAX_PORT))
            for m in modes:
                checks[m].off_mbps.append(off)
                backend.gso_mode = MODES[m]
                backend.apply(Profile(name=f"tax-{m}"), force_engine=True)
                s0, t0 = backend.stats(), time.monotonic()
                checks[m].on_mbps.append(goodput_mbps(iperf3_tcp(src, dst, dst_ip, seconds, TAX_PORT)))
                s1, t1 = backend.stats(), time.monotonic()
                why = backend.health()
                if why:
                    raise RuntimeError(f"engine-tax check: {why}")
                if s0 and s1 and s0.get("pid") == s1.get("pid"):
                    checks[m].engine_cpu_pct.append(100 * (s1["cpu_s"] - s0["cpu_s"]) / (t1 - t0))
                backend.clear()
    finally:
        backend.gso_mode = saved
        backend.clear()
    return [checks[m] for m in modes]
