"""A cell's verdict: did it measure the VPN, or did the measuring tool (instrument-bound), the impairment
engine (emulator-bound), something outside the lab (disturbed) or another path than the scenario's
(off-path) set the result? Only measured cells take tiers and leader lines; the others are shown with their
reasons (README.md, "A cell's verdict"; docs/results.md). Each limit is decided with its uncertainty.

A (VPN, profile, workload label, metric) cell is
  instrument-bound when, in any of its repetitions, the measuring tool's own UDP socket dropped datagrams
    (kern_udp_tool_drops > 0 on a host: lab/counters.py attributes the drops per socket), when iperf3's own
    CPU (it reports it) was at TOOL_CPU_PCT or more of a core over the repetitions (the interval of its mean
    at or above the line), or the UDP ceiling's search ended on a rate iperf3's sender could not offer
    (udp_ceiling_sender_limited); or, for a rate a VPN should be ranked by (Mbit/s, higher is better), when
    the no-VPN baseline of the same run is not clearly above it (the ratio's CI reaches CEILING_RATIO: the
    lab's own ceiling, not the VPN's);
  emulator-bound when the engine was the bottleneck in a repetition (engine_bound, judged by its work:
    impair/load.py), when the engine-tax check of the VPN in this profile's engine mode is clearly above the
    flag (its interval: impair/tax.py), or when the run's calibration of the profile came out of tolerance
    (the emulator did not deliver the configured delay, loss, ... when it was measured: impair/calibrate.py);
  disturbed / off-path when fewer than `min_kept` of its repetitions were measured on a quiet machine / on
    the scenario's path (lab/interference.py, lab/pathcheck.py); with enough of them, the others are left out
    of its ranking and named in its notes.
The reasons name how many repetitions and by how much, so a reader can judge them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MEASURED, INSTRUMENT, EMULATOR = "measured", "instrument-bound", "emulator-bound"
DISTURBED, OFF_PATH = "disturbed", "off-path"
TOOL_CPU_PCT = 90.0  # iperf3 is single-threaded (3.12): at ~90% of a core it paces the test itself
CEILING_RATIO = 0.9  # a VPN within 10% of the no-VPN baseline (CI) reads the lab's ceiling
TOOL_CPU_METRICS = ("iperf_cpu_client_pct", "iperf_cpu_server_pct")
SHORT = {INSTRUMENT: "instr.", EMULATOR: "emul.", DISTURBED: "dist.", OFF_PATH: "off-path"}


@dataclass(frozen=True)
class Verdict:
    instrument: tuple[str, ...] = ()
    emulator: tuple[str, ...] = ()
    disturbed: tuple[str, ...] = ()  # too few repetitions left that nothing outside the lab disturbed
    off_path: tuple[str, ...] = ()  # too few repetitions left on the scenario's path
    notes: tuple[str, ...] = ()  # what was left out of a ranked cell (disturbed or off-path repetitions)

    @property
    def kind(self) -> str:
        for kind, why in (
            (INSTRUMENT, self.instrument),
            (EMULATOR, self.emulator),
            (DISTURBED, self.disturbed),
            (OFF_PATH, self.off_path),
        ):
            if why:
                return kind
        return MEASURED

    @property
    def ranked(self) -> bool:
        return self.kind == MEASURED

    @property
    def reasons(self) -> tuple[str, ...]:
        return self.instrument + self.emulator + self.disturbed + self.off_path

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
    disturbed: bool = False  # kept although something outside the lab took the lab's CPUs
    taken_pct: float = 0.0  # what it took (others + steal), % of the lab's CPUs
    off_path: bool = False  # the traffic did not take the scenario's path
    direct_pct: float | None = None  # the share that went straight between client and server

    @property
    def left_out(self) -> str | None:
        """Why this repetition is not ranked although its cell may be (disturbed, off-path), or None."""
        return DISTURBED if self.disturbed else OFF_PATH if self.off_path else None

    def add(self, name: str, value: float) -> None:
        if name == "kern_udp_tool_drops":
            self.tool_drops += value
        elif name in TOOL_CPU_METRICS:
            self.tool_cpu_pct = max(self.tool_cpu_pct or 0.0, value)
        elif name == "engine_bound" and value >= 1:
            self.engine_bound = True
        elif name == "udp_ceiling_sender_limited" and value >= 1:
            self.sender_limited = True
        elif name == "disturbed" and value >= 1:
            self.disturbed = True
        elif name in ("interference_pct", "steal_pct"):
            self.taken_pct += value
        elif name == "off_path" and value >= 1:
            self.off_path = True
        elif name == "path_direct_pct":
            self.direct_pct = value


def min_kept(n: int) -> int:
    """Repetitions a cell must keep (not disturbed, on its path) to be ranked: two, and at least half."""
    return max(2, math.ceil(n / 2))


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi): Student's t interval of the mean; one value is its own interval (nothing known)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, mean, mean
    from scipy import stats as sst

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    h = float(sst.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean, mean - h, mean + h


Tax = tuple[float, float, float]  # (tax %, CI lo, CI hi)


def judge(
    cases: Sequence[CaseFacts],
    *,
    ceiling: tuple[float, float, float] | None = None,
    baseline_median: float | None = None,
    tax_pct: float | Tax | None = None,
    tax_flag_pct: float = 10.0,
    calibration: Sequence[str] = (),
) -> Verdict:
    """The verdict of a cell from its repetitions' facts; `ceiling`: the cell's (ratio, lo, hi) to the no-VPN
    baseline when it is a rate the VPN is ranked by; `tax_pct`: the VPN's engine tax in this profile's mode,
    with its interval when the run measured one.

    Each limit is decided with its uncertainty: iperf3's CPU flags the cell when the interval of its mean over
    the repetitions lies at or above TOOL_CPU_PCT (a single repetition that touched it is a note, not a
    verdict); the engine tax when its interval lies above the flag; the ceiling when the baseline is not
    clearly (its ratio's interval) above the cell. Repetitions that something outside the lab disturbed, or
    whose traffic took another path than the scenario's, are left out of the ranking: the cell is ranked on
    the rest when it keeps `min_kept` of them, else it takes that verdict."""
    n = len(cases)
    inst: list[str] = []
    emu: list[str] = []
    notes: list[str] = []
    dist = [c for c in cases if c.left_out == DISTURBED]
    off = [c for c in cases if c.left_out == OFF_PATH]
    kept = [c for c in cases if c.left_out is None]
    disturbed: list[str] = []
    off_path: list[str] = []
    if dist:
        what = (
            f"something outside the lab took {max(c.taken_pct for c in dist):.0f}% of the lab's CPUs "
            f"in {len(dist)} of {n} repetitions"
        )
        (disturbed if len(kept) < min_kept(n) else notes).append(
            what + ("" if len(kept) < min_kept(n) else ": left out")
        )
    if off:
        shares = [c.direct_pct for c in off if c.direct_pct is not None]
        how = f" ({min(shares):.0f}-{max(shares):.0f}% went straight)" if shares else ""
        what = f"the traffic took another path than the scenario's in {len(off)} of {n} repetitions{how}"
        (off_path if len(kept) < min_kept(n) else notes).append(
            what + ("" if len(kept) < min_kept(n) else ": left out")
        )
    judged = kept if len(kept) >= min_kept(n) else list(cases)
    dropped = [c.tool_drops for c in judged if c.tool_drops > 0]
    if dropped:
        inst.append(
            f"the measuring tool's own socket dropped {sum(dropped):,.0f} datagrams "
            f"({len(dropped)} of {len(judged)} repetitions)"
        )
    cpu = [c.tool_cpu_pct for c in judged if c.tool_cpu_pct is not None]
    if cpu:
        mean, lo, hi = mean_ci(cpu)
        at = sum(v >= TOOL_CPU_PCT for v in cpu)
        if lo >= TOOL_CPU_PCT:
            inst.append(f"iperf3 used {mean:.0f}% [{lo:.0f}–{min(hi, 100):.0f}] of a core")
        elif at:
            notes.append(
                f"iperf3 reached {max(cpu):.0f}% of a core in {at} of {len(cpu)} repetitions (mean "
                f"{mean:.0f}% [{lo:.0f}–{hi:.0f}]: not clearly at its limit)"
            )
    short = sum(c.sender_limited for c in judged)
    if short:
        inst.append(
            f"iperf3's sender could not offer the rate above the ceiling ({short} of {len(judged)} repetitions)"
        )
    if ceiling is not None and ceiling[2] >= CEILING_RATIO:
        base = f" ({baseline_median:,.0f})" if baseline_median is not None else ""
        inst.append(
            f"the no-VPN baseline{base} is not clearly above it ({ceiling[0]:.2f}× [{ceiling[1]:.2f}–"
            f"{ceiling[2]:.2f}]): the lab's ceiling"
        )
    bound = sum(c.engine_bound for c in judged)
    if bound:
        emu.append(f"the impairment engine was the bottleneck ({bound} of {len(judged)} repetitions)")
    if tax_pct is not None:
        t, lo, hi = (tax_pct, tax_pct, tax_pct) if isinstance(tax_pct, int | float) else tax_pct
        span = f" [{lo:+.0f}–{hi:+.0f}]" if hi > lo else ""
        if lo > tax_flag_pct:
            emu.append(
                f"engine tax {t:+.0f}%{span} on this VPN's TCP in this engine mode (> {tax_flag_pct:.0f}%)"
            )
        elif t > tax_flag_pct:
            notes.append(f"engine tax {t:+.0f}%{span}: not clearly above {tax_flag_pct:.0f}%")
    if calibration:
        emu.append(f"the profile's calibration was out of tolerance ({'; '.join(calibration)})")
    return Verdict(tuple(inst), tuple(emu), tuple(disturbed), tuple(off_path), tuple(notes))


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
