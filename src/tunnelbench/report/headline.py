"""The headline of a run: per profile one compact table (a row per VPN with its version, a column per
workload's first headline metric: median, significance tier, ratio to the no-VPN baseline), then one line per
finding: who leads each column and whether the design can tell it from the next VPN, failed cases, skipped
VPNs, underpowered metrics, calibration out of tolerance. The terminal, the HTML report and the Markdown
summary all show this same content; every per-metric row is in `tunnelbench report --full`."""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from tunnelbench.analysis.analyze import Analysis, Family, RunData, is_baseline
from tunnelbench.analysis.records import json_value
from tunnelbench.analysis.stats import ALPHA, Better, Tiering
from tunnelbench.analysis.verdict import SHORT, limited_lines
from tunnelbench.report.fmt import num

MAX_COLUMNS = 5  # metric columns per table: 5 of ~17 characters plus the VPN column fit 120 columns
UNIT_SUFFIXES = ("_mbps", "_ms", "_s", "_pct")
CAPTION = (
    "median over repetitions (T = significance tier among the VPNs, 1 = best; one tier = no significant "
    f"difference, compared within rounds, Holm, α = {ALPHA}: the method per column below the table); × = median "
    "/ no-VPN baseline (CI in the report); instr. / emul. / dist. / off-path = the measuring tool / the "
    "impairment engine / something outside the lab / another path set the result: shown, not ranked (why: "
    "below the table)"
)


@dataclass
class Column:
    label: str
    workload: str
    metric: str
    unit: str
    better: Better
    family: Family
    tiering: Tiering | None = None  # among the VPNs only: the baseline is the reference, not a contender

    @property
    def short(self) -> str:
        """The metric without its unit suffix (goodput_mbps -> goodput)."""
        short = self.metric
        for s in UNIT_SUFFIXES:
            short = short.removesuffix(s)
        return short

    @property
    def where(self) -> str:
        """The column in a sentence: "tcp goodput", "connect" (not "connect connect")."""
        return self.label if self.short == self.label else f"{self.label} {self.short}"

    @property
    def title(self) -> str:
        arrow = {"higher": " ↑", "lower": " ↓"}.get(self.better, "")
        return f"{self.label}\n{self.short} {self.unit}{arrow}".rstrip()


@dataclass
class Cell:
    median: float
    unit: str
    n: int
    tier: int | None  # None: one VPN only, or no better direction
    ratio: float | None
    limited: str = (
        ""  # "", or the verdict that keeps it out of the ranking (instrument-bound, emulator-bound)
    )

    @property
    def text(self) -> str:
        extra = [f"T{self.tier}"] if self.tier is not None else []
        if self.limited:
            extra.insert(0, SHORT.get(self.limited, self.limited))
        if self.ratio is not None and not math.isnan(self.ratio):
            extra.append(f"{self.ratio:.0f}×" if self.ratio >= 100 else f"{self.ratio:.2g}×")  # not 1.7e+02×
        return num(self.median, self.unit) + (f" ({', '.join(extra)})" if extra else "")


@dataclass
class Row:
    variant: str
    version: str
    baseline: bool
    cells: dict[str, Cell]  # column label -> cell


@dataclass
class Table:
    profile: str
    columns: list[Column]
    rows: list[Row]


@dataclass
class Headline:
    tables: list[Table] = field(default_factory=list)
    findings: list[tuple[str, str]] = field(default_factory=list)  # (text, tone: ok | warn | bad | "")


def short_version(v: str | None) -> str:
    """A version without its provenance note ("1.11.1 (go proxy)" -> "1.11.1")."""
    return (v or "").split(" (", 1)[0]


def _columns(a: Analysis, profile: str) -> list[Column]:
    out = []
    for label in a.labels:
        fams = [f for f in a.families if f.profile == profile and f.label == label]
        if not fams:
            continue
        # the first headline metric this label has values for, as the run defined them
        for metric in a.headline(fams[0].workload):
            f = next((x for x in fams if x.metric == metric), None)
            if f is not None:
                out.append(Column(label, f.workload, metric, f.unit, f.better, f))
                break
    return out


def _cell(c: Column, variant: str) -> Cell | None:
    g = c.family.groups.get(variant)
    if g is None or g.desc is None:
        return None
    tier = c.tiering.tier.get(variant) if c.tiering else None
    limited = "" if g.verdict.ranked else g.verdict.kind
    return Cell(g.desc.median, c.unit, g.desc.n, tier, g.ratio[0] if g.ratio else None, limited)


def _sort_key(col: Column | None, variant: str) -> tuple[int, float]:
    if col is None:
        return (0, 0.0)
    g = col.family.groups.get(variant)
    if g is None or g.desc is None:
        return (1, 0.0)
    return (0, -g.desc.median if col.better == "higher" else g.desc.median)


def build(a: Analysis) -> Headline:
    h = Headline()
    for profile in a.profiles:
        cols = _columns(a, profile)
        if not cols:
            continue
        variants = [v for v in a.variants if any(v in c.family.groups for c in cols)]
        # the baselines: internal, and internal@mtuNNNN at another underlay MTU (rows, never contenders)
        base = sorted((v for v in variants if is_baseline(v)), key=lambda v: "@" in v.split(" ")[0])
        others = sorted((v for v in variants if v not in base), key=lambda v: _sort_key(cols[0], v))
        for c in (
            cols
        ):  # the analysis' one tiering (VPNs among themselves, limited cells out): every view reads it
            if c.better != "none":
                c.tiering = c.family.tiering
        rows = []
        for v in base + others:
            run = a.run_of(v)
            vpn = next((vpn for (rid, vpn), var in a.variant_of.items() if var == v and rid == run.run_id), v)
            cells = {c.label: cell for c in cols if (cell := _cell(c, v)) is not None}
            rows.append(Row(v, short_version(run.version(vpn)), v in base, cells))
        for i in range(0, len(cols), MAX_COLUMNS):
            h.tables.append(Table(profile, cols[i : i + MAX_COLUMNS], rows))
        multi = len(a.profiles) > 1
        for c in cols:
            line = _leader(c, multi)
            if line:
                h.findings.append(line)
            verdicts = {v: g.verdict for v, g in c.family.groups.items() if g.values}
            h.findings += limited_lines(profile, c.where, verdicts, multi)
            h.findings += _left_out(a, c, multi)
        h.findings += _methods(cols, profile, multi)
        under = [c.where for c in cols if c.family.underpowered]
        if under:
            n = min(g.desc.n for c in cols for g in c.family.groups.values() if g.desc)
            h.findings.append(
                (
                    f"{profile}: underpowered (n = {n} per VPN: no pair can reach p < {ALPHA} after "
                    f"Holm): {', '.join(under)}; use more repetitions",
                    "warn",
                )
            )
    h.findings += _problems(a)
    return h


def _left_out(a: Analysis, c: Column, multi_profile: bool) -> list[tuple[str, str]]:
    """Cells ranked on fewer repetitions than they have (disturbed or off-path ones left out), and VPNs with
    too few values to compare at all (why: their failed or missing repetitions)."""
    at = c.where + (f" @ {c.family.profile}" if multi_profile else "")
    out: list[tuple[str, str]] = []
    notes = [
        f"{v}: {'; '.join(g.verdict.notes)}"
        for v, g in c.family.groups.items()
        if g.verdict.ranked and g.verdict.notes
    ]
    if notes:
        out.append((f"{at}: " + " | ".join(notes), "warn"))
    test = c.family.test
    if test is not None and test.excluded:
        parts = []
        for v, why in test.excluded.items():
            g = c.family.groups[v]
            failed = a.run_of(v).failures().get((g.vpn, c.family.profile, c.label), 0)
            parts.append(f"{v} has {why}" + (f" ({failed} failed attempt(s))" if failed else ""))
        out.append((f"{at}: not compared, too few good repetitions: {'; '.join(parts)}", "warn"))
    return out


def _methods(cols: list[Column], profile: str, multi_profile: bool) -> list[tuple[str, str]]:
    """How each column's VPNs were compared, and the smallest difference the run could have detected there
    (80% power, Holm's first step): what "not separable" means in this run."""
    by: dict[str, list[str]] = {}
    for c in cols:
        t = c.family.test
        if t is None:
            continue
        mde = t.mde_text(c.unit)
        by.setdefault(t.text, []).append(c.where + (f" {mde}" if mde else ""))
    if not by:
        return []
    at = f"{profile}: " if multi_profile else ""
    parts = [f"{m}: {', '.join(w)}" for m, w in by.items()]
    return [
        (f"{at}compared by " + "; ".join(parts) + " (± = the smallest difference this run could detect)", "")
    ]


def _leader(c: Column, multi_profile: bool) -> tuple[str, str] | None:
    """Who leads a column among the VPNs (the baseline is the reference, not a contender), by how much, and
    whether the design separates it from the runner-up."""
    f, t = c.family, c.tiering
    if t is None:
        return None
    best, second = t.order[0], t.order[1]
    gb, gs = f.groups[best], f.groups[second]
    assert gb.desc is not None and gs.desc is not None
    where = c.where + (f" @ {f.profile}" if multi_profile else "")
    pair = next((p for p in t.pairs if {p.a, p.b} == {best, second}), None)
    p_txt = f"p = {pair.p_holm:.2g}, Holm" if pair and not math.isnan(pair.p_holm) else "no test"
    mb, ms = gb.desc.median, gs.desc.median
    base = ""
    if gb.ratio and not math.isnan(gb.ratio[0]):
        base = f"; {gb.ratio[0]:.2g}× no-VPN [{gb.ratio[1]:.2g}–{gb.ratio[2]:.2g}]"
    if pair is not None and pair.significant:
        if ms and mb and max(mb / ms, ms / mb) >= 1.5:
            by = f"{max(mb / ms, ms / mb):.2g}× {second}'s {num(ms, c.unit)}"
        else:
            by = (
                f"{100 * (mb - ms) / abs(ms):+.1f}% vs {second}'s {num(ms, c.unit)}" if ms else f"vs {second}"
            )
        return f"{where}: {best} leads at {num(mb, c.unit)} {c.unit}, {by} ({p_txt}){base}", "ok"
    ties = [v for v in t.order if t.tier[v] == t.tier[best]][1:]
    return (
        f"{where}: {best} {num(mb, c.unit)} {c.unit}, not separable from {', '.join(ties)} ({p_txt} vs {second})",
        "",
    )


def _problems(a: Analysis) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for r in a.runs:
        try:
            resumed = json.loads(r.env.get("run.resumed", "[]"))
        except ValueError:
            resumed = []
        for x in resumed:  # measured across processes: the reader should know it was interrupted
            at = dt.datetime.fromtimestamp(x.get("at", 0), dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            out.append(
                (
                    f"run {r.run_id} was resumed at {at} after it ended {x.get('previous_status')}: "
                    f"{x.get('cases_ok')} finished case(s) kept, {len(x.get('discarded') or [])} "
                    "unfinished one(s) measured again",
                    "warn",
                )
            )
        failed: dict[tuple[str, str, str], int] = {}
        for c in r.cases:
            if c.status in ("failed", "interrupted", "error"):
                k = (a.variant_of.get((r.run_id, c.vpn), c.vpn), c.profile, c.label)
                failed[k] = failed.get(k, 0) + 1
        for (v, p, lb), n in failed.items():
            out.append((f"{v} {lb} @ {p}: {n} failed attempt(s); errors in the report", "bad"))
        for rec in r.vpns:
            if rec["status"] != "ok":
                out.append((f"{rec['name']}: {rec['status']}: {rec['reason']}", "warn"))
        for cal in r.records.calibrations.values():
            if isinstance(cal, dict) and cal.get("ok") is False:
                bad = "; ".join(
                    f"{x.get('quantity')} {num(x.get('measured'))} vs {num(x.get('configured'))} "
                    f"{x.get('unit', '')}".rstrip()
                    for x in cal.get("checks", [])
                    if x.get("ok") is False
                )
                out.append((f"calibration of profile {cal.get('profile')} OUT OF TOLERANCE: {bad}", "bad"))
        out += _host_drops(a, r)
        out += _path_changes(a, r)
        out += _machine(r)
        out += _drift(r)
        if r.env.get("run.adaptive_stopped"):
            out.append((str(json_value(r.env["run.adaptive_stopped"])), "warn"))
    return out


def _num(d: dict[str, Any], key: str) -> float:
    v = d.get(key)
    return float(v) if isinstance(v, int | float) else 0.0


def _machine(r: RunData) -> list[tuple[str, str]]:
    """One line on what else ran on the machine (runner/guard.py's tally): quiet, or how many cases were
    disturbed, by how much and by which processes, and what the run did about it."""
    t = r.records.interference
    if not t:
        return []
    if t.get("unwatched"):
        return [(f"machine load not watched: {t['unwatched']} (nothing here says they were quiet)", "warn")]
    cases, dist = int(_num(t, "cases")), int(_num(t, "disturbed"))
    limit = _num(t, "threshold_pct")
    before = t.get("before_run") if isinstance(t.get("before_run"), dict) else None
    pre = ""
    if before and _num(before, "other_pct") + _num(before, "steal_pct") >= limit:
        pre = f"; busy before the run ({_num(before, 'other_pct') + _num(before, 'steal_pct'):.0f}%)"
    if dist == 0:
        return [
            (
                f"machine quiet: nothing outside the lab took {limit:.0f}% or more of its CPUs in any of {cases} "
                f"case(s){pre}",
                "ok" if not pre else "warn",
            )
        ]
    raw = t.get("top_s")
    top: dict[str, Any] = raw if isinstance(raw, dict) else {}
    who = ", ".join(f"{n} {s:,.0f} CPU-s" for n, s in list(top.items())[:3] if isinstance(s, int | float))
    mean = _num(t, "taken_pct_sum") / dist
    parts = [
        f"machine busy: {dist} of {cases} case measurement(s) disturbed (outside the lab took {mean:.0f}% of "
        f"its CPUs on average, up to {_num(t, 'max_taken_pct'):.0f}%" + (f"; by {who}" if who else "") + ")"
    ]
    if t.get("mode") == "remeasure":
        parts.append(f"{int(_num(t, 'remeasured'))} measured again when quiet")
    kept = int(_num(t, "kept"))
    parts.append(f"{kept} kept as disturbed (left out of the ranking)" if kept else "none kept disturbed")
    if _num(t, "waited_s") >= 1:
        parts.append(f"{_num(t, 'waited_s'):.0f} s spent waiting for quiet")
    if _num(t, "steady"):
        parts.append(f"the load stayed through {int(_num(t, 'steady'))} wait(s): its cases are labelled")
    return [("; ".join(parts) + pre, "warn")]


DRIFT_FLAG = 0.25  # a drift reference whose range exceeds this share of its median is worth a line


def _drift(r: RunData) -> list[tuple[str, str]]:
    """The raw path's reference per round (no VPN), used: when it moved a lot, say so, and which rounds ran
    slow, next to what the comparisons do about it (they are within rounds)."""
    pts = [
        p for p in r.records.drift if isinstance(p, dict) and isinstance(p.get("goodput_mbps"), int | float)
    ]
    if len(pts) < 3:
        return []
    vals = [float(p["goodput_mbps"]) for p in pts]
    med = statistics.median(vals)
    if med <= 0 or (max(vals) - min(vals)) / med < DRIFT_FLAG:
        return []
    slow = [str(p.get("when", "?")) for p in pts if float(p["goodput_mbps"]) < (1 - DRIFT_FLAG) * med]
    return [
        (
            f"the machine drifted: the raw path's reference ranged {min(vals):,.0f}–{max(vals):,.0f} Mbit/s "
            f"(median {med:,.0f})" + (f", slow at {', '.join(slow)}" if slow else "") + "; VPNs are compared "
            "within rounds, which cancels what hit every VPN of a round alike, not load within a round",
            "warn",
        )
    ]


def _path_changes(a: Analysis, r: RunData) -> list[tuple[str, str]]:
    """Cases whose underlay path switched between direct and relayed while they measured (the runner's
    `path_changes`, from the router's counters second by second: lab/pathcheck.py)."""
    ok = {c.id: c for c in r.cases if c.status == "ok"}
    groups: dict[tuple[str, str, str], list[int]] = {}  # -> [cases that changed, cases tracked]
    for m in r.metrics:
        c = ok.get(m["case_id"])
        if c is None or m["name"] != "path_changes":
            continue
        g = groups.setdefault((a.variant_of.get((r.run_id, c.vpn), c.vpn), c.profile, c.label), [0, 0])
        g[0] += m["value"] > 0
        g[1] += 1
    return [
        (
            f"{v} {lb} @ {p}: the path switched between direct and relayed within {n} of {total} case(s) "
            "(series path_direct_pct per case)",
            "warn",
        )
        for (v, p, lb), (n, total) in groups.items()
        if n
    ]


HOST_DROP_SHARE = 0.5  # flag a loss when drops on the end hosts explain at least this share of it
HOST_DROPS = {  # (kind, counter) -> metric: drops on an end host, not on the path (the router)
    ("socket", "RcvbufErrors"): "kern_udp_rcvbuf_errors",
    ("socket", "SndbufErrors"): "kern_udp_sndbuf_errors",
    ("iface", "rx_dropped"): "kern_if_rx_dropped",
    ("iface", "tx_dropped"): "kern_if_tx_dropped",
}
HOST_DROP_KINDS = {"socket": "a full UDP socket buffer", "iface": "full interface queues"}


def _host_drops(a: Analysis, r: RunData) -> list[tuple[str, str]]:
    """Loss the end hosts, not the path, caused: per (VPN, profile, label), the kernel counter deltas on the
    client and the server host (lab/counters.py) against the datagrams the workload lost (`udp_lost_packets`,
    or `udp_loss_pct` x `udp_packets`), summed over the successful cases that have both: a full UDP socket
    buffer (RcvbufErrors, SndbufErrors) and full interface queues (rx/tx `drop`, e.g. a tun device the VPN
    does not read fast enough). Every UDP socket in a host's namespace counts (iperf3's and a userspace
    VPN's own), so the line names the host, not the socket. A workload with no loss count (TCP, a ceiling
    search) is flagged whenever a socket buffer dropped datagrams."""
    ok = {c.id: c for c in r.cases if c.status == "ok"}
    per_case: dict[int, dict[tuple[str, str | None], float]] = {}
    for m in r.metrics:
        if m["case_id"] in ok:
            per_case.setdefault(m["case_id"], {})[(m["name"], m["host"])] = m["value"]
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for cid, ms in per_case.items():
        c = ok[cid]
        # a ceiling search offers more than the path carries on purpose: its drops above the ceiling are how
        # it finds it, and its probes' loss is judged probe by probe
        if c.workload == "udp_ceiling":
            continue
        drops = {
            (kind, h): ms[(name, h)]
            for h in dict.fromkeys((c.client, c.server))
            for kind, name in HOST_DROPS.items()
            if (name, h) in ms
        }
        if not drops:
            continue  # counters not sampled (an older run, or the sample failed)
        lost = ms.get(("udp_lost_packets", None))
        if lost is None and ("udp_loss_pct", None) in ms and ("udp_packets", None) in ms:
            lost = ms[("udp_loss_pct", None)] / 100 * ms[("udp_packets", None)]
        g = groups.setdefault(
            (a.variant_of.get((r.run_id, c.vpn), c.vpn), c.profile, c.label),
            {"lost": 0.0, "counted": False, "drops": {}},
        )
        if lost is not None:
            g["lost"] += lost
            g["counted"] = True
        for k, n in drops.items():
            g["drops"][k] = g["drops"].get(k, 0.0) + n
    out: list[tuple[str, str]] = []
    uncounted: list[str] = []  # socket-buffer drops in workloads without a loss count: one line for them all
    for (v, p, lb), g in groups.items():
        parts = []  # (datagrams, "by a full UDP socket buffer on h2 (RcvbufErrors 2,730 on h2)")
        for kind, what in HOST_DROP_KINDS.items():
            mine = {(counter, h): n for ((k, counter), h), n in g["drops"].items() if k == kind and n > 0}
            if mine:
                hosts = ", ".join(dict.fromkeys(h for _, h in mine))
                detail = ", ".join(f"{counter} {n:,.0f} on {h}" for (counter, h), n in mine.items())
                parts.append((sum(mine.values()), kind, f"{what} on {hosts} ({detail})"))
        parts.sort(key=lambda x: -x[0])
        lost, total = g["lost"], sum(n for n, _, _ in parts)
        if not g["counted"]:
            sock = [(n, text) for n, kind, text in parts if kind == "socket"]
            if sock:
                uncounted.append(
                    f"{v} {lb} @ {p} {sock[0][0]:,.0f} ({sock[0][1].split('(', 1)[-1].rstrip(')')})"
                )
        elif lost > 0 and total >= HOST_DROP_SHARE * lost:
            head = (
                f"{v} {lb} @ {p}: {min(1.0, total / lost):.0%} of the {lost:,.0f} lost datagrams were dropped"
            )
            if len(parts) == 1:
                out.append((f"{head} by {parts[0][2]}, not by the path", "warn"))
            else:
                # counts, not shares: the kinds overlap (a datagram dropped at a queue may be counted again)
                each = "; ".join(text for _, _, text in parts)
                out.append((f"{head} on the hosts, not by the path: {each}", "warn"))
    if uncounted:
        out.append(
            (
                "full UDP socket buffers dropped datagrams in workloads without a loss count (a VPN's own "
                "socket under TCP load: retransmissions, not loss): " + "; ".join(uncounted),
                "warn",
            )
        )
    return out
