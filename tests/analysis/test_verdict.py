"""A cell's verdict (analysis/verdict.py): the measuring tool's own drops, its CPU, the lab's ceiling and the
impairment engine each keep a cell out of the ranking, shown with the reason. Hand-made stores with known
answers, and one lab test that plants a tiny iperf3 receive buffer and finds the drops on the tool's socket."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from tunnelbench.analysis.analyze import analyze, load_run
from tunnelbench.analysis.verdict import CaseFacts, judge, min_kept
from tunnelbench.core.results import Outcome, Sample
from tunnelbench.report.headline import build
from tunnelbench.store import DB_NAME, Store

RUN = "20260101-000000-tbverd"


def make_run(
    root: Path,
    cells: dict[str, tuple[list[float], dict[str, float]]],
    profile: str = "baseline",
    env: dict[str, object] | None = None,
) -> Path:
    """One run of udp_ceiling under `baseline`: per VPN its ceilings (one per repetition) and extra per-case
    metrics {"name@host" or "name": value} added to every repetition."""
    run_dir = root / RUN
    run_dir.mkdir(parents=True)
    st = Store(run_dir / DB_NAME)
    st.begin_run(RUN, "tbverd", 'name = "hand-made"\n', "0.1.0")
    if env:
        st.set_env(RUN, env)
    for vpn, (values, extra) in cells.items():
        st.set_vpn(RUN, vpn, "1.0", "ok")
        for rep, v in enumerate(values, 1):
            adir = run_dir / "cases" / vpn / f"r{rep}"
            adir.mkdir(parents=True)
            cid = st.start_case(RUN, vpn, profile, "udp_ceiling", "udp-ceiling", {}, rep, 0, "h1", "h2", adir)
            samples = [Sample("udp_ceiling_mbps", v, "Mbit/s")]
            for key, x in extra.items():
                name, _, host = key.partition("@")
                samples.append(Sample(name, x, "count" if name.startswith("kern_") else "%", host or None))
            st.finish_case(cid, "ok", Outcome(samples=samples))
    st.end_run(RUN, "ok")
    st.close()
    return run_dir


BASE = [2000.0 + i for i in range(8)]
FAST = [800.0 + i for i in range(8)]  # separable from SLOW and clearly below the baseline
SLOW = [300.0 + i for i in range(8)]


def _headline(run_dir: Path):
    a = analyze([load_run(run_dir)])
    return a, build(a)


def test_a_tool_that_dropped_on_its_own_socket_is_shown_with_the_reason_and_takes_no_tier(tmp_path):
    run_dir = make_run(
        tmp_path,
        {
            "internal": (BASE, {}),
            "fast": (FAST, {"kern_udp_tool_drops@h2": 1234, "kern_udp_tool_drops@h1": 0}),
            "slow": (SLOW, {"kern_udp_tool_drops@h2": 0}),
            "mid": ([500.0 + i for i in range(8)], {"kern_udp_daemon_drops@h2": 999}),  # the VPN's own: fine
        },
    )
    a, h = _headline(run_dir)
    groups = {g.variant: g for g in a.groups.values() if g.metric == "udp_ceiling_mbps"}
    assert groups["fast"].verdict.kind == "instrument-bound"
    assert "dropped 9,872 datagrams (8 of 8 repetitions)" in groups["fast"].verdict.text  # 8 x 1234
    assert groups["slow"].verdict.ranked and groups["mid"].verdict.ranked
    (table,) = h.tables
    rows = {r.variant: r for r in table.rows}
    assert rows["fast"].cells["udp-ceiling"].text.startswith("804 (instr.")
    assert rows["fast"].cells["udp-ceiling"].tier is None  # no tier for a limited cell
    assert rows["mid"].cells["udp-ceiling"].tier == 1 and rows["slow"].cells["udp-ceiling"].tier == 2
    texts = [t for t, _ in h.findings]
    assert any(": mid leads" in t for t in texts), texts  # fast, the fastest, leads nothing
    (why,) = [t for t in texts if "not ranked" in t]
    assert "fast instrument-bound: the measuring tool's own socket dropped" in why and "slow" not in why


def test_a_vpn_at_the_no_vpn_baseline_reads_the_labs_ceiling(tmp_path):
    run_dir = make_run(tmp_path, {"internal": (BASE, {}), "fast": (BASE, {}), "slow": (SLOW, {})})
    a, h = _headline(run_dir)
    g = next(g for g in a.groups.values() if g.variant == "fast" and g.metric == "udp_ceiling_mbps")
    assert g.verdict.kind == "instrument-bound" and "the lab's ceiling" in g.verdict.text
    assert "(2,004)" in g.verdict.text  # the baseline's median, named
    slow = next(g for g in a.groups.values() if g.variant == "slow" and g.metric == "udp_ceiling_mbps")
    assert slow.verdict.ranked  # 0.15x the baseline: clearly below


def _calibration(profile: str, checks: list[tuple[str, float, float, bool | None]]) -> str:
    """A calibration record as impair/calibrate.py stores it: (quantity, configured, measured, ok)."""
    return json.dumps(
        {
            "profile": profile,
            "backend": "native",
            "summary": "delay 5 ms",
            "ok": all(ok is not False for *_, ok in checks),
            "checks": [
                {"quantity": q, "unit": "ms", "configured": c, "measured": m, "detail": "", "ok": ok}
                for q, c, m, ok in checks
            ],
        }
    )


def test_a_profile_whose_calibration_missed_is_emulator_bound_in_every_cell(tmp_path):
    """The emulator did not deliver the profile when it was calibrated (a loaded machine's late timers): no
    cell under that profile is ranked, and the reason names the check with both figures."""
    missed = _calibration(
        "d5", [("one-way delay mean", 5.0, 6.897, False), ("one-way delay sd", 0.0, 0.4, None)]
    )
    held = _calibration(
        "d5", [("one-way delay mean", 5.0, 5.05, True), ("ping RTT median", 10.0, 10.1, True)]
    )
    cells = {"internal": (BASE, {}), "fast": (FAST, {}), "slow": (SLOW, {})}
    run_dir = make_run(tmp_path / "a", cells, "d5", {"calibration.d5": missed, "calibration.base": "{}"})
    a, h = _headline(run_dir)
    groups = {g.variant: g for g in a.groups.values() if g.metric == "udp_ceiling_mbps"}
    assert {g.verdict.kind for g in groups.values()} == {"emulator-bound"}
    assert "calibration was out of tolerance (one-way delay mean 6.9 vs 5 ms)" in groups["slow"].verdict.text
    assert all(c.tier is None for r in h.tables[0].rows for c in r.cells.values())
    run_dir = make_run(tmp_path / "b", cells, "d5", {"calibration.d5": held})
    a, _ = _headline(run_dir)
    assert all(g.verdict.ranked for g in a.groups.values() if g.variant != "internal")


def test_a_saturated_iperf3_and_an_engine_bottleneck_are_named():
    # iperf3 at its core's limit over the repetitions: the t interval of the mean (scipy's) clears 90%
    from scipy import stats as sst

    cpu = [97.0, 95.0, 99.0, 96.0]
    lo, hi = sst.t.interval(0.95, 3, loc=np.mean(cpu), scale=sst.sem(cpu))
    v = judge([CaseFacts(tool_cpu_pct=x) for x in cpu])
    assert (
        v.kind == "instrument-bound" and f"iperf3 used 97% [{lo:.0f}–{min(hi, 100):.0f}] of a core" in v.text
    )
    # one repetition that touched the line is a note, not a verdict (the interval holds the line)
    v = judge([CaseFacts(tool_cpu_pct=97.0), CaseFacts(tool_cpu_pct=40.0)])
    assert v.ranked and "iperf3 reached 97% of a core in 1 of 2 repetitions" in "; ".join(v.notes)
    assert judge([CaseFacts(tool_cpu_pct=89.9)]).ranked
    assert judge([CaseFacts(tool_cpu_pct=90.5)]).kind == "instrument-bound"  # one value: its own interval
    v = judge([CaseFacts(engine_bound=True), CaseFacts()])
    assert v.kind == "emulator-bound" and "(1 of 2 repetitions)" in v.text
    assert judge([CaseFacts()], tax_pct=25.0).kind == "emulator-bound"
    assert judge([CaseFacts()], tax_pct=8.0).ranked
    # a tax with its interval: flagged only when the interval is wholly above the line
    assert judge([CaseFacts()], tax_pct=(25.0, 12.0, 38.0)).kind == "emulator-bound"
    v = judge([CaseFacts()], tax_pct=(25.0, -4.0, 45.0))
    assert v.ranked and "not clearly above 10%" in "; ".join(v.notes)
    v = judge([CaseFacts(sender_limited=True), CaseFacts(), CaseFacts()])
    assert v.kind == "instrument-bound" and "sender could not offer" in v.text and "(1 of 3" in v.text
    f = CaseFacts()
    f.add("udp_ceiling_sender_limited", 1.0)
    assert f.sender_limited
    # both: the instrument is named first
    assert judge([CaseFacts(tool_drops=5, engine_bound=True)]).kind == "instrument-bound"


def test_disturbed_and_off_path_repetitions_are_left_out_until_too_few_remain():
    quiet, busy = CaseFacts(), CaseFacts(disturbed=True, taken_pct=48.0)
    # 1 of 6 disturbed: the cell is ranked on the other 5, the note says what was left out
    v = judge([busy] + [quiet] * 5)
    assert v.ranked and "took 48% of the lab's CPUs in 1 of 6 repetitions: left out" in v.notes[0]
    # 4 of 6 disturbed: 2 left < min_kept(6) = 3: the cell is disturbed, not ranked
    v = judge([busy] * 4 + [quiet] * 2)
    assert v.kind == "disturbed" and "in 4 of 6 repetitions" in v.text
    off = CaseFacts(off_path=True, direct_pct=12.0)
    v = judge([off] * 3 + [quiet])
    assert v.kind == "off-path" and "(12-12% went straight)" in v.text
    f = CaseFacts()
    for name, value in (
        ("disturbed", 1.0),
        ("interference_pct", 40.0),
        ("steal_pct", 5.0),
        ("off_path", 1.0),
    ):
        f.add(name, value)
    assert f.disturbed and f.taken_pct == 45.0 and f.off_path and f.left_out == "disturbed"


@pytest.mark.lab
def test_a_planted_tiny_iperf3_buffer_shows_as_the_tools_drops(lab_factory, tmp_path, monkeypatch):
    """A real iperf3 UDP test between two namespaces with the receiver's buffer planted tiny (-w 4 KiB): the
    datagrams iperf3 counted lost were dropped on its own socket, and the per-socket attribution says so
    (kern_udp_tool_drops on the server, against iperf3's own lost count); the verdict is instrument-bound."""
    from tunnelbench.instruments import iperf3
    from tunnelbench.lab import counters

    lab = lab_factory(2)
    h1, h2 = lab.hosts
    monkeypatch.setattr(iperf3, "UDP_SOCKET_BUFFER", 4096)
    before = counters.sample([h1, h2])
    srv = iperf3.start_server(h2, h2.underlay_ip, 5201, "iperf3-server", tmp_path / "srv.log")
    try:
        args = iperf3.sized(["-u", "-b", "300M"], h1, h2)
        assert args[-2:] == ["-w", "4096"]
        res = h1.run(iperf3.client_argv(h2.underlay_ip, 5201, 2, extra=args), timeout=30)
    finally:
        srv.stop(grace=2)
    time.sleep(0.2)
    after = counters.sample([h1, h2])

    lost = json.loads(res.stdout)["end"]["sum"]["lost_packets"]
    d = {(n, h): v for n, v, _, h in counters.deltas(before, after)}
    tool = d[("kern_udp_tool_drops", "h2")]
    assert lost > 100, lost  # a 4 KiB buffer at 300 Mbit/s overflows
    # nearly every lost datagram died on iperf3's socket (the last few, after the highest sequence number
    # iperf3 saw, it does not count as lost)
    assert 0.8 * lost <= tool <= 1.05 * lost + 50, (tool, lost)
    assert d[("kern_udp_daemon_drops", "h2")] == 0
    assert judge([CaseFacts(tool_drops=tool)]).kind == "instrument-bound"


def test_each_limit_at_its_boundary_and_its_exact_words():
    """The lines a reader gets, word for word, and each limit just at and just past its line (worked out by
    hand: min_kept(n) = max(2, ceil(n / 2)))."""
    assert [min_kept(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [2, 2, 2, 2, 3, 3, 4]
    quiet, busy = CaseFacts(), CaseFacts(disturbed=True, taken_pct=30.0)
    # exactly min_kept(4) = 2 quiet of 4: still ranked on them; one fewer: disturbed
    v = judge([busy, busy, quiet, quiet])
    assert v.ranked and v.notes == (
        "something outside the lab took 30% of the lab's CPUs in 2 of 4 repetitions: left out",
    )
    v = judge([busy, busy, busy, quiet])
    assert v.disturbed == ("something outside the lab took 30% of the lab's CPUs in 3 of 4 repetitions",)
    off = CaseFacts(off_path=True)  # no share recorded: nothing said about it
    assert judge([off, off, quiet]).off_path == (
        "the traffic took another path than the scenario's in 2 of 3 repetitions",
    )
    v = judge(
        [CaseFacts(off_path=True, direct_pct=10.0), CaseFacts(off_path=True, direct_pct=35.0), quiet, quiet]
    )
    assert v.notes == (
        "the traffic took another path than the scenario's in 2 of 4 repetitions (10-35% went straight): left out",
    )
    # the verdict reads only the kept repetitions: drops in a disturbed one do not make the cell instrument-bound
    assert judge([CaseFacts(disturbed=True, tool_drops=9), quiet, quiet]).ranked
    # one datagram dropped on the tool's socket is enough
    v = judge([CaseFacts(tool_drops=1), quiet])
    assert v.instrument == ("the measuring tool's own socket dropped 1 datagrams (1 of 2 repetitions)",)
    # the ceiling: a ratio whose interval reaches 0.9 exactly is the lab's
    v = judge([quiet], ceiling=(0.8, 0.7, 0.9), baseline_median=1234.0)
    assert v.instrument == (
        "the no-VPN baseline (1,234) is not clearly above it (0.80× [0.70–0.90]): the lab's ceiling",
    )
    assert judge([quiet], ceiling=(0.8, 0.7, 0.8999)).ranked
    v = judge([quiet], ceiling=(0.95, 0.91, 0.99))
    assert v.instrument == (
        "the no-VPN baseline is not clearly above it (0.95× [0.91–0.99]): the lab's ceiling",
    )
    # iperf3's CPU: the interval's low end exactly at 90% flags
    v = judge([CaseFacts(tool_cpu_pct=90.0)])
    assert v.instrument == ("iperf3 used 90% [90–90] of a core",)
    v = judge([quiet], tax_pct=(25.0, 12.0, 38.0))
    assert v.emulator == ("engine tax +25% [+12–+38] on this VPN's TCP in this engine mode (> 10%)",)
    v = judge([quiet], tax_pct=12.0)
    assert v.emulator == ("engine tax +12% on this VPN's TCP in this engine mode (> 10%)",)
    assert judge([quiet], tax_pct=10.0).ranked and judge([quiet], tax_pct=10.0).notes == ()
    v = judge([quiet], calibration=("loss 9.5 vs 1 %", "delay 3 vs 2 ms"))
    assert v.emulator == (
        "the profile's calibration was out of tolerance (loss 9.5 vs 1 %; delay 3 vs 2 ms)",
    )
    assert (
        v.text
        == "emulator-bound: the profile's calibration was out of tolerance (loss 9.5 vs 1 %; delay 3 vs 2 ms)"
    )


def test_case_facts_read_each_stored_metric():
    f = CaseFacts()
    for name, value in (
        ("kern_udp_tool_drops", 3.0),
        ("kern_udp_tool_drops", 4.0),
        ("iperf_cpu_client_pct", 40.0),
        ("iperf_cpu_server_pct", 70.0),
        ("iperf_cpu_client_pct", 55.0),
        ("engine_bound", 0.0),
        ("path_direct_pct", 64.0),
        ("off_path", 0.0),
    ):
        f.add(name, value)
    assert (f.tool_drops, f.tool_cpu_pct, f.engine_bound, f.direct_pct, f.off_path) == (
        7.0,
        70.0,
        False,
        64.0,
        False,
    )
    f.add("engine_bound", 1.0)
    assert f.engine_bound and f.left_out is None
    g = CaseFacts()
    g.add("iperf_cpu_server_pct", 12.0)  # the first reading is the maximum so far, not 0
    assert g.tool_cpu_pct == 12.0
