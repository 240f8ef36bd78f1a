"""What the emulator cost the system under test, and how the machine drifted: read back from a run's stored
facts for the summary and the report. The CPU placement, the engine-tax check per VPN and engine mode,
the engine's CPU per case (router metric `engine_cpu_pct`), the cases marked emulator-bound
(`engine_bound`), and the drift reference measured at every round boundary."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from tunnelbench.analysis.records import Records, json_value

TAX_FLAG_PCT = 10.0  # impair/tax.py's flag (analysis reads stored runs and does not import the emulator)


@dataclass
class ProfileCost:
    profile: str
    mode: str | None  # gso | segment | None (no engine)
    engine_cpu_median: float | None = None
    engine_cpu_max: float | None = None
    tax_pct: dict[str, float] = field(default_factory=dict)  # VPN -> tax in this profile's engine mode
    tax_ci: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # VPN -> (tax, lo, hi)
    bound: dict[tuple[str, str], tuple[int, int]] = field(
        default_factory=dict
    )  # (VPN, label) -> (bound, cases)

    @property
    def flagged(self) -> list[str]:
        """VPNs whose tax is clearly above the flag (the interval's low end; a run from before intervals: the
        point)."""
        return [v for v, (_t, lo, _hi) in self.tax_ci.items() if lo > TAX_FLAG_PCT]


@dataclass
class Drift:
    points: list[dict[str, Any]]

    @property
    def values(self) -> list[float]:
        return [p["goodput_mbps"] for p in self.points if "goodput_mbps" in p]

    def summary(self) -> str | None:
        v = self.values
        if len(v) < 2:
            return None
        med = statistics.median(v)
        cv = 100 * statistics.stdev(v) / statistics.mean(v)
        return (
            f"drift reference (raw underlay TCP, {len(v)} rounds): median {med:,.0f} Mbit/s, "
            f"range {min(v):,.0f}–{max(v):,.0f} ({100 * (max(v) - min(v)) / med:.0f}% of the median), "
            f"CV {cv:.1f}%"
        )


@dataclass
class EmulatorFacts:
    placement: dict[str, Any] | None
    taxes: dict[str, dict[str, Any]]  # VPN -> {mode: TaxCheck json} or {"error": ...}
    profiles: list[ProfileCost]
    drift: Drift

    @property
    def any_engine(self) -> bool:
        return any(p.mode for p in self.profiles)


def _json(env: dict[str, str], key: str) -> Any:
    """A JSON value of the environment table; None when absent or not JSON."""
    return json_value(env.get(key), keep_text=False)


def emulator_facts(env: dict[str, str], metrics: list[dict[str, Any]]) -> EmulatorFacts:
    """env: the run's environment table; metrics: every stored metric with its case keys (any host)."""
    rec = Records.of(env)
    taxes = {vpn: t for vpn, t in rec.engine_tax.items() if isinstance(t, dict) and t}
    modes: dict[str, str | None] = _json(env, "impair.modes") or {}
    per_profile: dict[str, ProfileCost] = {}
    cpu: dict[str, list[float]] = {}
    bound: dict[str, dict[tuple[str, str], list[int]]] = {}
    for m in metrics:
        if m.get("host") != "router":
            continue
        prof = m["profile"]
        if m["name"] == "engine_cpu_pct":
            cpu.setdefault(prof, []).append(m["value"])
        elif m["name"] == "engine_bound":
            b = bound.setdefault(prof, {}).setdefault((m["vpn"], m["label"]), [0, 0])
            b[0] += int(m["value"] >= 0.5)
            b[1] += 1
    for prof, mode in modes.items():
        pc = ProfileCost(prof, mode)
        if prof in cpu:
            pc.engine_cpu_median, pc.engine_cpu_max = statistics.median(cpu[prof]), max(cpu[prof])
        pc.bound = {k: (v[0], v[1]) for k, v in bound.get(prof, {}).items()}
        if mode:
            for vpn, t in taxes.items():
                tc = t.get(mode)
                if isinstance(tc, dict) and isinstance(tc.get("tax_pct"), int | float):
                    pct = float(tc["tax_pct"])
                    pc.tax_pct[vpn] = pct
                    lo, hi = tc.get("tax_lo", pct), tc.get("tax_hi", pct)
                    ok = isinstance(lo, int | float) and isinstance(hi, int | float)
                    pc.tax_ci[vpn] = (pct, float(lo), float(hi)) if ok else (pct, pct, pct)
        per_profile[prof] = pc
    return EmulatorFacts(
        _json(env, "cpu.placement"),
        taxes,
        list(per_profile.values()),
        Drift(rec.drift),
    )


def facts_lines(f: EmulatorFacts) -> list[str]:
    """Plain-text lines (no markup) for the terminal and the Markdown summary."""
    out: list[str] = []
    pl = f.placement
    if pl:
        if pl.get("mode") == "off":
            out.append(f"CPU placement: off ({pl.get('reason')})")
        else:
            eng = f"engine on CPU {pl['engine']}, " if pl.get("engine") else ""
            hosts = pl.get("hosts") or {}
            per_host = (
                f" ({', '.join(f'{h}: CPU {c}' for h, c in hosts.items())})"
                if pl.get("mode") == "pinned"
                else ""
            )
            out.append(
                f"CPU placement: {pl.get('mode')} ({pl.get('reason')}): {eng}VPN daemons and measuring "
                f"tools on CPU {pl.get('sut')}{per_host}, for every profile incl. baseline"
            )
    for p in f.profiles:
        if not p.mode:
            continue
        cpu = (
            f"engine CPU median {p.engine_cpu_median:.0f}% (max {p.engine_cpu_max:.0f}%) of a core"
            if p.engine_cpu_median is not None
            else "engine CPU not measured"
        )
        tax = ", ".join(
            f"{v} {t:+.0f}%"
            + (f" [{lo:+.0f}, {hi:+.0f}]" if hi > lo else "")
            + (" (clearly >10%)" if lo > TAX_FLAG_PCT else "")
            for v, (t, lo, hi) in p.tax_ci.items()
        )
        line = f"profile {p.profile} (engine, {'GSO packets whole' if p.mode == 'gso' else 'per wire packet'}): {cpu}"
        if tax:
            line += f"; engine tax on TCP: {tax}"
        out.append(line)
        hot = [f"{v} {lbl} ({b} of {n})" for (v, lbl), (b, n) in sorted(p.bound.items()) if b]
        if hot:
            out.append(
                f"  emulator-bound cases (the engine dropped, worked >= 85% of a core, or released >= 1 ms late): {', '.join(hot)}"
            )
    for vpn, t in f.taxes.items():
        if "error" in t:
            out.append(f"engine-tax check for {vpn} failed: {t['error']}")
    d = f.drift.summary()
    if d:
        out.append(d)
    return out
