"""The engine's tax on the system under test: the same short TCP test through a live mesh, once with the
native engine in the path at zero impairment and once without it, alternated (off, on, off, on) so that
the machine's drift does not land on one side. Calibration says whether delay and loss are right; this
says what the emulator costs the VPN being measured. Measured per VPN, in each engine mode the run's
profiles use (GSO super-packets whole, or every wire packet).

The tax is decided with its uncertainty: each round is a pair of legs (off, then on), the tax is
1 - the geometric mean of on/off over the rounds, with a Student's t interval on the log ratios. Two or three
short rounds resolve about +-20% on this kind of machine, so a 10% line read from them is a coin flip: the
check starts with MIN_ROUNDS and adds rounds (up to MAX_ROUNDS) while the interval still holds the line;
only an interval wholly above it flags the VPN."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tunnelbench.impair.backend import NativeBackend
from tunnelbench.impair.profiles import Profile
from tunnelbench.impair.tcpcheck import goodput_mbps, iperf3_tcp
from tunnelbench.lab.host import Host

TAX_FLAG_PCT = (
    10.0  # a tax clearly above this is flagged: throughput under the engine is partly the emulator's
)
MIN_ROUNDS, MAX_ROUNDS = 3, 8
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

    def _logs(self) -> list[float]:
        return [
            math.log(on / off)
            for off, on in zip(self.off_mbps, self.on_mbps, strict=False)
            if off > 0 and on > 0
        ]

    @property
    def interval(self) -> tuple[float, float, float]:
        """(tax %, lo, hi): 1 - geometric mean of on/off, 95% t interval over the rounds (lo = hi = tax with
        one round: nothing known of its spread)."""
        logs = self._logs()
        if not logs:
            return (0.0, 0.0, 0.0)
        n = len(logs)
        mean = sum(logs) / n
        h = 0.0
        if n > 1:
            from scipy import stats as sst

            sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
            h = float(sst.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
        # a larger on/off ratio is a smaller tax: the interval's ends swap
        return (100 * (1 - math.exp(mean)), 100 * (1 - math.exp(mean + h)), 100 * (1 - math.exp(mean - h)))

    @property
    def tax_pct(self) -> float:
        return self.interval[0]

    @property
    def flagged(self) -> bool:
        return self.interval[1] > TAX_FLAG_PCT

    @property
    def undecided(self) -> bool:
        """The interval still holds the flag's line: more rounds could decide it."""
        _, lo, hi = self.interval
        return lo <= TAX_FLAG_PCT < hi

    def to_json(self) -> dict[str, Any]:
        t, lo, hi = self.interval
        return {**asdict(self), "tax_pct": t, "tax_lo": lo, "tax_hi": hi, "flagged": self.flagged}

    def summary(self) -> str:
        cpu = (
            f", engine {statistics.median(self.engine_cpu_pct):.0f}% of a core" if self.engine_cpu_pct else ""
        )
        t, lo, hi = self.interval
        return (
            f"{self.mode}: {statistics.median(self.off_mbps):,.0f} -> {statistics.median(self.on_mbps):,.0f} "
            f"Mbit/s, tax {t:+.1f}% [{lo:+.1f}, {hi:+.1f}] over {len(self._logs())} rounds{cpu}"
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
    rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
) -> list[TaxCheck]:
    """Alternate off / on(mode) legs `rounds` times, and more (up to `max_rounds`) while a mode's interval
    still holds the flag's line; the backend is left cleared (no profile)."""
    checks = {m: TaxCheck(vpn, m, seconds=seconds) for m in modes}
    saved = backend.gso_mode
    try:
        done = 0
        while done < rounds or (done < max_rounds and any(c.undecided for c in checks.values())):
            done += 1
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
