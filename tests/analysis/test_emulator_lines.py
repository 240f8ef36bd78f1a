"""The emulator's lines in the summary and the Markdown report (analysis/emulator.py facts_lines), word for
word, from hand-made stored facts: the CPU placement in each mode, each profile's engine CPU and engine tax,
the emulator-bound cases, a failed tax check and the drift reference (its median, range and CV by hand)."""

from __future__ import annotations

import json

from tunnelbench.analysis.emulator import emulator_facts, facts_lines

ENV = {
    "impair.modes": json.dumps({"baseline": None, "d1": "gso", "l1": "segment"}),
    "engine_tax.nebula": json.dumps(
        {"gso": {"tax_pct": 4.0}, "segment": {"tax_pct": 22.5, "tax_lo": 13.0, "tax_hi": 31.0}}
    ),
    "engine_tax.tinc": json.dumps({"error": "iperf3: boom"}),
    "drift.reference": json.dumps([{"goodput_mbps": 100}, {"goodput_mbps": 110}, {"goodput_mbps": 90}]),
}
ROW = {"vpn": "nebula", "label": "tcp", "host": "router"}
METRICS = [
    {**ROW, "profile": "d1", "name": "engine_cpu_pct", "value": 40.0},
    {**ROW, "profile": "d1", "name": "engine_cpu_pct", "value": 61.0},
    {**ROW, "profile": "d1", "name": "engine_cpu_pct", "value": 50.0},
    {**ROW, "profile": "l1", "name": "engine_bound", "value": 1.0},
    {**ROW, "profile": "l1", "name": "engine_bound", "value": 0.4},  # below half: not bound
    {**ROW, "profile": "l1", "label": "udp", "name": "engine_bound", "value": 0.0},
]
PROFILE_LINES = [
    "profile d1 (engine, GSO packets whole): engine CPU median 50% (max 61%) of a core; engine tax on TCP: nebula +4%",
    "profile l1 (engine, per wire packet): engine CPU not measured; engine tax on TCP: nebula +22% [+13, +31] "
    "(clearly >10%)",
    "  emulator-bound cases (the engine dropped, worked >= 85% of a core, or released >= 1 ms late): nebula tcp "
    "(1 of 2)",
    "engine-tax check for tinc failed: iperf3: boom",
    # 100, 110, 90: median 100, range 20 = 20% of it, sd 10 / mean 100 = 10.0%
    "drift reference (raw underlay TCP, 3 rounds): median 100 Mbit/s, range 90–110 (20% of the median), CV 10.0%",
]


def lines(placement: dict | None) -> list[str]:
    env = dict(ENV)
    if placement is not None:
        env["cpu.placement"] = json.dumps(placement)
    return facts_lines(emulator_facts(env, METRICS))


def test_each_placement_mode_in_words():
    assert lines({"mode": "engine-apart", "reason": "2 CPUs", "engine": "1", "sut": "0"}) == [
        "CPU placement: engine-apart (2 CPUs): engine on CPU 1, VPN daemons and measuring tools on CPU 0, for "
        "every profile incl. baseline",
        *PROFILE_LINES,
    ]
    pinned = {
        "mode": "pinned",
        "reason": "asked",
        "engine": "3",
        "sut": "0-2",
        "hosts": {"h1": "0", "h2": "1-2"},
    }
    assert lines(pinned)[0] == (
        "CPU placement: pinned (asked): engine on CPU 3, VPN daemons and measuring tools on CPU 0-2 (h1: CPU 0, "
        "h2: CPU 1-2), for every profile incl. baseline"
    )
    no_engine = {"mode": "shared", "reason": "no engine", "sut": "0-1"}
    assert lines(no_engine)[0] == (
        "CPU placement: shared (no engine): VPN daemons and measuring tools on CPU 0-1, for every profile incl. "
        "baseline"
    )
    assert lines({"mode": "off", "reason": "one CPU"}) == ["CPU placement: off (one CPU)", *PROFILE_LINES]
    assert lines(None) == PROFILE_LINES


def test_nothing_to_say_without_an_engine_or_drift():
    assert facts_lines(emulator_facts({"impair.modes": json.dumps({"baseline": None})}, [])) == []
    one = {"impair.modes": "{}", "drift.reference": json.dumps([{"goodput_mbps": 100}])}
    assert facts_lines(emulator_facts(one, [])) == []  # one point: no drift to speak of
