"""UDP ceiling: the highest offered iperf3 UDP rate whose loss stays at or under a target (default
1%), every repeat passing. `udp -b 0` floods the sender and an encrypted tunnel drops 85-95% of it at the
receiver, which says nothing about the rate a UDP application can use; the ceiling does.

The search (a pure function, `search_ceiling`, so it is tested without a lab):
  1. a rate passes when every one of `repeats` probes (iperf3 -u -b RATE -t step_s) has loss <= the target
     and the sender really offered the rate (>= 90% of it: a CPU-bound iperf3 sender is not a tunnel that
     keeps up); the first failing repeat ends that rate;
  2. bracket: from start_mbit, double while the rate passes (up to hi_mbit), halve while it fails (down to
     lo_mbit);
  3. bisect in log space between the highest passing and the lowest failing rate until the two are within
     resolution_pct of each other;
  4. stop early, before a probe that would not end in time, at max_probes iperf3 runs or the time budget
     (budget_s, and the case's deadline): the ceiling is then the highest rate that passed so far and
     `udp_ceiling_complete` is 0.
If even lo_mbit fails, the ceiling is 0 (a result, not an error: "no rate meets the target", e.g. under a
profile with more random loss than the target); `udp_ceiling_fail_mbps` and `udp_ceiling_fail_loss_pct` say
where it failed. A search cut short before any rate passed or lo_mbit failed has no answer: WorkloadError.
Every probe is stored as series keyed by its start time (rate, loss, goodput), and the whole search as
`<label>-search.json` in the case's artifacts. A probe that iperf3 aborts with EMSGSIZE (the tunnel's path
MTU dropped under it) runs again, at most MAX_MTU_RETRIES times a case (`udp_ceiling_mtu_retries`)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import Field, model_validator

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome, Series
from tunnelbench.instruments.common import start_iperf3
from tunnelbench.instruments.iperf3 import PORT, parse_udp, run_client
from tunnelbench.workloads.base import TOOL_START_S, CaseContext, Params, Workload, WorkloadError

# seconds one iperf3 run takes beyond -t (server spawn, listen wait, control connection, results exchange);
# measured 0.3-0.6 s on a shared 2-core machine, 1.5 s keeps expected_seconds() an upper bound
PROBE_OVERHEAD_S = 1.5
MAX_MTU_RETRIES = 3  # iperf3 runs repeated after EMSGSIZE, per case
SENDER_FLOOR = 0.9  # a probe whose sender reached less than 90% of the offered rate fails ("sender")


@dataclass(frozen=True)
class ProbeResult:
    """What one probe measured."""

    loss_pct: float
    goodput_mbps: float | None = None  # received
    sent_mbps: float | None = None  # what the sender managed to offer
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Probe:
    rate_mbit: float
    repeat: int  # 0-based repeat at this rate
    t_s: float  # seconds since the search started, when the probe started
    duration_s: float
    result: ProbeResult
    passed: bool
    why: str = ""  # failing probes: "loss" or "sender"


@dataclass
class Ceiling:
    rate_mbit: float  # highest rate every repeat of which passed; 0 when none did
    fail_mbit: float | None  # lowest rate that failed (the upper bracket)
    stop: str  # resolution | hi_mbit | lo_mbit | max_probes | deadline
    probes: list[Probe]

    @property
    def complete(self) -> bool:
        """The search ended by its own rule, not cut short by the probe count or the clock."""
        return self.stop in ("resolution", "hi_mbit", "lo_mbit")

    @property
    def bracket_pct(self) -> float | None:
        if not self.rate_mbit or self.fail_mbit is None:
            return None
        return (self.fail_mbit / self.rate_mbit - 1) * 100

    def at(self, rate: float) -> list[Probe]:
        return [p for p in self.probes if p.rate_mbit == rate]


def _round(rate: float) -> float:
    return float(f"{rate:.4g}")


def search_ceiling(
    probe: Callable[[float], ProbeResult],
    *,
    loss_target_pct: float = 1.0,
    repeats: int = 3,
    start_mbit: float = 100.0,
    lo_mbit: float = 1.0,
    hi_mbit: float = 10_000.0,
    resolution_pct: float = 5.0,
    max_probes: int = 30,
    step: float = 2.0,
    deadline: float = math.inf,
    probe_s: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
) -> Ceiling:
    """Find the highest rate (Mbit/s) at which `repeats` consecutive probes all have loss <= the target.

    probe(rate) runs one probe and returns what it measured. No probe starts unless it can end by
    `deadline` (a `clock()` time), judged by probe_s or the longest probe so far, whichever is longer.
    `step` is the first bracketing factor: 2 (double or halve) from a cold start; a warm start (start_mbit
    = a previous ceiling) steps by less, squaring the factor on every further step the same way (galloping
    back up to 2), so a ceiling near the previous one is bracketed in two rates."""
    if not step > 1:
        raise ValueError("need step > 1")
    if not 0 < lo_mbit <= hi_mbit:
        raise ValueError("need 0 < lo_mbit <= hi_mbit")
    lo_mbit, hi_mbit = _round(lo_mbit), _round(hi_mbit)  # the rates tried are rounded: so are the bounds
    probes: list[Probe] = []
    t0 = clock()
    longest = probe_s
    stop = ""

    def test(rate: float) -> bool | None:
        """True: every repeat passed; False: one failed; None: stopped before deciding."""
        nonlocal longest, stop
        for i in range(repeats):
            if len(probes) >= max_probes:
                stop = "max_probes"
                return None
            now = clock()
            if now + longest > deadline:
                stop = "deadline"
                return None
            r = probe(rate)
            took = clock() - now
            longest = max(longest, took)
            why = ""
            if not r.loss_pct <= loss_target_pct:  # NaN fails too
                why = "loss"
            elif r.sent_mbps is not None and r.sent_mbps < SENDER_FLOOR * rate:
                why = "sender"
            probes.append(Probe(rate, i, now - t0, took, r, not why, why))
            if why:
                return False
        return True

    passed: float | None = None  # highest passing rate
    failed: float | None = None  # lowest failing rate
    rate = _round(min(hi_mbit, max(lo_mbit, start_mbit)))
    while True:
        ok = test(rate)
        if ok is None:
            break
        if ok:
            passed = rate
        else:
            failed = rate
        if failed is None:  # bracketing upwards
            if rate >= hi_mbit:
                stop = "hi_mbit"
                break
            rate = _round(min(hi_mbit, rate * step))
            step = min(2.0, step * step)
        elif passed is None:  # bracketing downwards
            if rate <= lo_mbit:
                stop = "lo_mbit"
                break
            rate = _round(max(lo_mbit, rate / step))
            step = min(2.0, step * step)
        else:
            if failed <= passed * (1 + resolution_pct / 100):
                stop = "resolution"
                break
            mid = _round(math.sqrt(passed * failed))
            if not passed < mid < failed:  # rounding left no rate in between
                stop = "resolution"
                break
            rate = mid
    return Ceiling(passed or 0.0, failed, stop, probes)


def probe_result(o: Outcome, rate: float) -> ProbeResult:
    """A probe's result from its parsed iperf3 samples."""
    m = {s.name: s.value for s in o.samples}
    if "udp_loss_pct" not in m:
        raise WorkloadError(f"iperf3 at {rate:g} Mbit/s reported no loss figure")
    extra: dict[str, float] = {k: m[k] for k in ("iperf_cpu_client_pct", "iperf_cpu_server_pct") if k in m}
    return ProbeResult(m["udp_loss_pct"], m.get("goodput_mbps"), m.get("goodput_sender_mbps"), extra)


def combine_udp(results: list[dict[str, Any]], out: Outcome) -> None:
    """Several iperf3 UDP tests run side by side as one: rates summed, loss = lost / sent datagrams over all of
    them, CPU the busiest process's (the one that would limit first)."""
    lost = packets = 0
    recv = sent = 0.0
    cpu_c: list[float] = []
    cpu_s: list[float] = []
    for data in results:
        end = data["end"]
        s = end["sum"]
        r, x = end.get("sum_received", s), end.get("sum_sent", s)
        lost += int(r.get("lost_packets", s.get("lost_packets", 0)))
        packets += int(r.get("packets", s.get("packets", 0)))
        recv += r["bits_per_second"] / 1e6
        sent += x["bits_per_second"] / 1e6
        cpu = end.get("cpu_utilization_percent", {})
        if "host_total" in cpu:
            cpu_c.append(cpu["host_total"])
        if "remote_total" in cpu:
            cpu_s.append(cpu["remote_total"])
    out.add("goodput_mbps", recv)
    out.add("goodput_sender_mbps", sent)
    out.add("udp_loss_pct", 100.0 * lost / packets if packets else None)
    out.add("iperf_cpu_client_pct", max(cpu_c) if cpu_c else None)
    out.add("iperf_cpu_server_pct", max(cpu_s) if cpu_s else None)


def parallel_probe(
    ctx: CaseContext, args: list[str], step_s: int, streams: int, tag: str
) -> tuple[Outcome, float]:
    """`streams` iperf3 client/server pairs at once (ports PORT..PORT+streams-1), as one probe."""
    runs = []
    t0 = time.monotonic()
    try:
        for i in range(streams):
            runs.append(
                start_iperf3(
                    ctx, ctx.client, ctx.server, ctx.server_ip, PORT + i, args, step_s, f"{tag}-s{i}"
                )
            )
        results = [r.wait(timeout=min(ctx.remaining(), step_s + 30)) for r in runs]
    finally:
        for r in runs:
            r.stop()
    o = Outcome()
    combine_udp(results, o)
    return o, time.monotonic() - t0


class UdpCeilingParams(Params):
    loss_target_pct: float = Field(1.0, ge=0, lt=100, description="a rate passes at loss <= this (%)")
    step_s: int = Field(2, ge=1, le=60, description="seconds per probe (iperf3 -t takes whole seconds)")
    repeats: int = Field(3, ge=1, le=10, description="probes per rate; every one must pass")
    start_mbit: float = Field(
        100.0, gt=0, le=100_000, description="first rate tried (Mbit/s); doubled or halved to bracket"
    )
    lo_mbit: float = Field(
        1.0, gt=0, le=100_000, description="lowest rate tried: if it fails, the ceiling is 0"
    )
    hi_mbit: float = Field(10_000.0, gt=0, le=100_000, description="highest rate tried")
    resolution_pct: float = Field(
        5.0, gt=0, le=100, description="stop when the lowest failing rate is within this of the ceiling"
    )
    max_probes: int = Field(30, ge=1, le=500, description="probes at most (EMSGSIZE re-runs aside)")
    budget_s: float = Field(
        90.0, ge=5, le=7200, description="seconds for the whole search: no probe starts that would end later"
    )
    length: int | None = Field(None, ge=16, le=65507, description="datagram payload bytes (iperf3 -l)")
    streams: int = Field(
        1,
        ge=1,
        le=8,
        description="iperf3 processes per probe (ports 5201..), each offered rate / streams: one iperf3 (single-"
        "threaded) sender or receiver may be the limit before a fast tunnel is; loss and rates are their sums",
    )
    warm_start: bool = Field(
        True,
        description="start each repetition at the same VPN's (and profile's) previous ceiling, bracketing by "
        "2 x resolution_pct first: about half the probes of a cold search; the first repetition starts at "
        "start_mbit",
    )

    @model_validator(mode="after")
    def _bounds(self) -> UdpCeilingParams:
        if not self.lo_mbit <= self.start_mbit <= self.hi_mbit:
            raise ValueError("need lo_mbit <= start_mbit <= hi_mbit")
        if self.max_probes < self.repeats:
            raise ValueError("max_probes must be at least repeats (a rate needs every repeat to pass)")
        return self


class UdpCeiling(Workload):
    name = "udp_ceiling"
    summary = "highest iperf3 UDP rate at <= a loss target (default 1%), every repeat passing (bisection)"
    tools = ("iperf3", "ss")
    headline = ("udp_ceiling_mbps", "udp_ceiling_loss_pct")
    Params = UdpCeilingParams
    params: UdpCeilingParams
    metrics = (
        MetricSpec(
            "udp_ceiling_mbps",
            "Mbit/s",
            "higher",
            "highest offered UDP rate at which every repeat had loss <= the target (0: none did)",
        ),
        MetricSpec("udp_ceiling_goodput_mbps", "Mbit/s", "higher", "received bit rate at the ceiling (mean)"),
        MetricSpec("udp_ceiling_loss_pct", "%", "none", "loss at the ceiling, mean over its repeats"),
        MetricSpec("udp_ceiling_loss_max_pct", "%", "none", "loss at the ceiling, worst repeat"),
        MetricSpec(
            "udp_ceiling_fail_mbps",
            "Mbit/s",
            "none",
            "lowest offered rate that failed a repeat: the ceiling lies below it",
        ),
        MetricSpec("udp_ceiling_fail_loss_pct", "%", "none", "loss of the failing repeat at that rate"),
        MetricSpec("udp_ceiling_bracket_pct", "%", "none", "fail rate / ceiling - 1: the search's precision"),
        MetricSpec("udp_ceiling_probes", "count", "none", "iperf3 runs of the search"),
        MetricSpec(
            "udp_ceiling_mtu_retries",
            "count",
            "none",
            "probes run again after iperf3's EMSGSIZE (the tunnel's path MTU dropped mid-probe)",
        ),
        MetricSpec(
            "udp_ceiling_complete",
            "bool",
            "none",
            "1: the search ended by its rules; 0: cut by max_probes or the time budget",
        ),
        MetricSpec(
            "udp_ceiling_sender_limited",
            "bool",
            "none",
            "1: the failing rate failed because iperf3's sender could not offer it (the tool, not the tunnel)",
        ),
        MetricSpec(
            "iperf_cpu_client_pct", "%", "none", "iperf3 client CPU at the ceiling (saturation check)"
        ),
        MetricSpec(
            "iperf_cpu_server_pct", "%", "none", "iperf3 server CPU at the ceiling (saturation check)"
        ),
    )

    def __init__(self, params: UdpCeilingParams) -> None:
        super().__init__(params)
        self._last: dict[str, float] = {}  # warm start: case folder's parent -> the last ceiling found there

    def label(self) -> str:
        p = self.params
        lb = "udp-ceiling"
        if p.loss_target_pct != 1.0:
            lb += f"-{p.loss_target_pct:g}pct"
        if p.length:
            lb += f"-l{p.length}"
        if p.streams > 1:
            lb += f"-p{p.streams}"
        return lb

    def expected_seconds(self) -> float:
        """An upper bound: no probe starts that would end after budget_s, except that a probe run again
        after EMSGSIZE may overrun by one probe; and max_probes (+ those re-runs) x one probe each."""
        p = self.params
        one = p.step_s + PROBE_OVERHEAD_S
        return min(p.budget_s + one, (p.max_probes + MAX_MTU_RETRIES) * one) + PROBE_OVERHEAD_S

    def typical_seconds(self, cases: int = 1) -> float:
        """The probe-count model of search_ceiling. A cold search brackets the ceiling in two rates
        (start_mbit, then one doubling or halving past it) and bisects that factor of 2 down to
        resolution_pct; a warm one (every case after the first, with warm_start) tries the previous ceiling
        and two galloping steps up (x s, x s^2, s = 1 + 2 x resolution_pct), then bisects s^2. About half the
        rates pass (repeats probes each), the others fail at their first probe. Capped as run() caps it."""
        p = self.params
        res = 1 + p.resolution_pct / 100

        def bisections(ratio: float) -> int:  # each halves the bracket's log; until it is within res
            return math.ceil(math.log2(math.log(ratio) / math.log(res))) if ratio > res else 0

        def seconds(rates: int) -> float:
            probes = min(p.max_probes, (rates + 1) // 2 * p.repeats + rates // 2)
            return min(p.budget_s + p.step_s, probes * (p.step_s + TOOL_START_S))

        s = 1 + 2 * p.resolution_pct / 100
        cold = seconds(2 + bisections(2.0))
        if not p.warm_start or cases < 2:
            return cold
        warm = seconds(3 + bisections(min(2.0, s * s)))
        return (cold + (cases - 1) * warm) / cases

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        label = self.label()
        measured = 0.0
        runs = 0

        mtu_retries = 0

        def probe(rate: float) -> ProbeResult:
            nonlocal measured, runs, mtu_retries
            runs += 1
            args = ["-u", "-b", f"{round(rate * 1e6 / p.streams)}"] + (
                ["-l", str(p.length)] if p.length else []
            )
            tag = f"{label}-p{runs:02d}-{rate:g}M"
            if p.streams > 1:
                o, ran = parallel_probe(ctx, args, p.step_s, p.streams, tag)
                measured += min(ran, p.step_s)
                return probe_result(o, rate)
            try:
                data, ran = run_client(ctx, args, p.step_s, 0, tag)
            except WorkloadError as e:
                # EMSGSIZE: the tunnel's path MTU dropped under the probe (tinc learns its PMTU after start
                # and answers with ICMP frag-needed); the next iperf3 run sizes its datagrams to the new MSS
                if "Message too long" not in str(e) or p.length or mtu_retries >= MAX_MTU_RETRIES:
                    raise
                mtu_retries += 1
                data, ran = run_client(ctx, args, p.step_s, 0, f"{tag}-retry")
            measured += min(ran, p.step_s)  # tool start-up is case overhead
            o = Outcome()
            parse_udp(data, o)
            return probe_result(o, rate)

        # warm start: the previous ceiling of this VPN x profile x label (its case folders' parent)
        key = str(ctx.artifact_dir.parent)
        prev = self._last.get(key) if p.warm_start else None
        start, step = (prev, 1 + 2 * p.resolution_pct / 100) if prev else (p.start_mbit, 2.0)
        t0 = time.monotonic()
        res = search_ceiling(
            probe,
            loss_target_pct=p.loss_target_pct,
            repeats=p.repeats,
            start_mbit=min(p.hi_mbit, max(p.lo_mbit, start)),
            step=step,
            lo_mbit=p.lo_mbit,
            hi_mbit=p.hi_mbit,
            resolution_pct=p.resolution_pct,
            max_probes=p.max_probes,
            deadline=min(t0 + p.budget_s, ctx.deadline - 1),
            probe_s=p.step_s + 0.3,
        )
        (ctx.artifact_dir / f"{label}-search.json").write_text(
            json.dumps(
                {
                    "params": p.model_dump(),
                    "start_mbit": start,
                    "warm": bool(prev),
                    "ceiling_mbit": res.rate_mbit,
                    "fail_mbit": res.fail_mbit,
                    "stop": res.stop,
                    "mtu_retries": mtu_retries,
                    "probes": [asdict(x) for x in res.probes],
                },
                indent=1,
            )
        )
        if not res.rate_mbit and res.stop in ("max_probes", "deadline"):
            raise WorkloadError(
                f"UDP ceiling search stopped ({res.stop}) after {len(res.probes)} probes before any rate passed "
                f"or lo_mbit {p.lo_mbit:g} failed; raise budget_s / max_probes or lower start_mbit"
            )
        if res.rate_mbit:
            self._last[key] = res.rate_mbit
        out = Outcome(measure_s=measured)
        out.add("udp_ceiling_mbps", res.rate_mbit)
        at = res.at(res.rate_mbit) if res.rate_mbit else []
        if at:

            def mean(xs: list[float]) -> float:
                return sum(xs) / len(xs)

            good = [x.result.goodput_mbps for x in at if x.result.goodput_mbps is not None]
            out.add("udp_ceiling_goodput_mbps", mean(good) if good else None)
            out.add("udp_ceiling_loss_pct", mean([x.result.loss_pct for x in at]))
            out.add("udp_ceiling_loss_max_pct", max(x.result.loss_pct for x in at))
            for k in ("iperf_cpu_client_pct", "iperf_cpu_server_pct"):
                v = [x.result.extra[k] for x in at if k in x.result.extra]
                out.add(k, mean(v) if v else None)
        if res.fail_mbit is not None:
            (bad,) = [x for x in res.at(res.fail_mbit) if not x.passed]
            out.add("udp_ceiling_fail_mbps", res.fail_mbit)
            out.add("udp_ceiling_fail_loss_pct", bad.result.loss_pct)
            out.add("udp_ceiling_sender_limited", float(bad.why == "sender"))
        out.add("udp_ceiling_bracket_pct", res.bracket_pct)
        out.add("udp_ceiling_probes", len(res.probes))
        out.add("udp_ceiling_mtu_retries", mtu_retries)
        out.add("udp_ceiling_complete", float(res.complete))
        get: Callable[[Probe], float | None]
        for name, unit, get in (
            ("udp_ceiling_probe_rate_mbps", "Mbit/s", lambda x: x.rate_mbit),
            ("udp_ceiling_probe_loss_pct", "%", lambda x: x.result.loss_pct),
            ("udp_ceiling_probe_goodput_mbps", "Mbit/s", lambda x: x.result.goodput_mbps),
        ):
            pts = [(x.t_s, float(get(x))) for x in res.probes if get(x) is not None]
            out.series.append(Series(name, unit, pts))
        return out
