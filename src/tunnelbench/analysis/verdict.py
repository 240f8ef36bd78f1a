"""A cell's verdict: did it measure the VPN, or did the measuring tool (instrument-bound) or the impairment
engine (emulator-bound) set the pace? Only measured cells take tiers and leader lines; the others are shown
with their reasons (DESIGN.md, "A cell is only as good as its verdict").

A (VPN, profile, workload label, metric) cell is
  instrument-bound when, in any of its repetitions, the measuring tool's own UDP socket dropped datagrams
    (kern_udp_tool_drops > 0 on a host: lab/counters.py attributes the drops per socket), iperf3 used
    TOOL_CPU_PCT or more of a core on either side (it reports its own CPU), or the UDP ceiling's search ended
    on a rate iperf3's sender could not offer (udp_ceiling_sender_limited); or, for a rate a VPN should be
    ranked by (Mbit/s, higher is better), when the no-VPN baseline of the same run is not clearly above it
    (the ratio's CI reaches CEILING_RATIO: the lab's own ceiling, not the VPN's);
  emulator-bound when the engine was the bottleneck in a repetition (engine_bound, judged by its work:
    impair/load.py), when the engine-tax check of the VPN in this profile's engine mode exceeded the
    flag (impair/tax.py), or when the run's calibration of the profile came out of tolerance (the emulator
    did not deliver the configured delay, loss, ... when it was measured: impair/calibrate.py).
The reasons name how many repetitions and by how much, so a reader can judge them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MEASURED, INSTRUMENT, EMULATOR = "measured", "instrument-bound", "emulator-bound"
TOOL_CPU_PCT = 90.0  # iperf3 is single-threaded (3.12): at ~90% of a core it paces the test itself
CEILING_RATIO = 0.9  # a VPN within 10% of the no-VPN baseline (CI) reads the lab's ceiling
TOOL_CPU_METRICS = ("iperf_cpu_client_pct", "iperf_cpu_server_pct")
SHORT = {INSTRUMENT: "instr.", EMULATOR: "emul."}


@dataclass(frozen=True)
class Verdict:
    instrument: tuple[str, ...] = ()
    emulator: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return INSTRUMENT if self.instrument else EMULATOR if self.emulator else MEASURED

    @property
    def ranked(self) -> bool:
        return self.kind == MEASURED

    @property
    def reasons(self) -> tuple[str, ...]:
        return self.instrument + self.emulator

    @property
    def text(self) -> str:
        return self.kind if self.ranked else f"{self.kind}: {'; '.join(self.reasons)}"


@dataclass
class CaseFacts:
    """What one case says about its instruments and its emulator (read from its stored metrics)."""

    tool_drops: float = 0.0  # kern_udp_tool_drops summed over hosts
    tool_cpu_pct: float | None = None  # the higher of iperf3's client and server CPU
    sender_limited: bool = False  # the UDP ceiling's failing rate failed because iperf3 could not offer it
    engine_bound: bool = False

    def add(self, name: str, value: float) -> None:
        if name == "kern_udp_tool_drops":
            self.tool_drops += value
        elif name in TOOL_CPU_METRICS:
            self.tool_cpu_pct = max(self.tool_cpu_pct or 0.0, value)
        elif name == "engine_bound" and value >= 1:
            self.engine_bound = True
        elif name == "udp_ceiling_sender_limited" and value >= 1:
            self.sender_limited = True


def judge(
    cases: Sequence[CaseFacts],
    *,
    ceiling: tuple[float, float, float] | None = None,
    baseline_median: float | None = None,
    tax_pct: float | None = None,
    tax_flag_pct: float = 10.0,
    calibration: Sequence[str] = (),
) -> Verdict:
    """The verdict of a cell from its repetitions' facts; `ceiling`: the cell's (ratio, lo, hi) to the no-VPN
    baseline when it is a rate the VPN is ranked by; `tax_pct`: the VPN's engine tax in this profile's mode."""
    n = len(cases)
    inst: list[str] = []
    emu: list[str] = []
    dropped = [c.tool_drops for c in cases if c.tool_drops > 0]
    if dropped:
        inst.append(
            f"the measuring tool's own socket dropped {sum(dropped):,.0f} datagrams "
            f"({len(dropped)} of {n} repetitions)"
        )
    busy = [c.tool_cpu_pct for c in cases if c.tool_cpu_pct is not None and c.tool_cpu_pct >= TOOL_CPU_PCT]
    if busy:
        inst.append(f"iperf3 used {max(busy):.0f}% of a core ({len(busy)} of {n} repetitions)")
    short = sum(c.sender_limited for c in cases)
    if short:
        inst.append(
            f"iperf3's sender could not offer the rate above the ceiling ({short} of {n} repetitions)"
        )
    if ceiling is not None and ceiling[2] >= CEILING_RATIO:
        base = f" ({baseline_median:,.0f})" if baseline_median is not None else ""
        inst.append(
            f"the no-VPN baseline{base} is not clearly above it ({ceiling[0]:.2f}× [{ceiling[1]:.2f}–"
            f"{ceiling[2]:.2f}]): the lab's ceiling"
        )
    bound = sum(c.engine_bound for c in cases)
    if bound:
        emu.append(f"the impairment engine was the bottleneck ({bound} of {n} repetitions)")
    if tax_pct is not None and tax_pct > tax_flag_pct:
        emu.append(
            f"engine tax {tax_pct:+.0f}% on this VPN's TCP in this engine mode (> {tax_flag_pct:.0f}%)"
        )
    if calibration:
        emu.append(f"the profile's calibration was out of tolerance ({'; '.join(calibration)})")
    return Verdict(tuple(inst), tuple(emu))


def is_ceiling_metric(unit: str, better: str) -> bool:
    """A rate the VPNs are ranked by: the lab must be clearly faster than the VPN for it to mean anything."""
    return unit == "Mbit/s" and better == "higher"


def limited_lines(
    profile: str, where: str, verdicts: Mapping[str, Verdict], multi_profile: bool
) -> list[tuple[str, str]]:
    """The headline's one line per column with limited cells: which VPNs, which kind, why."""
    bad = {v: x for v, x in verdicts.items() if not x.ranked}
    if not bad:
        return []
    at = where + (f" @ {profile}" if multi_profile else "")
    parts = [f"{v} {x.text}" for v, x in bad.items()]
    return [(f"{at}: not ranked, {'; '.join(parts)}", "warn")]
