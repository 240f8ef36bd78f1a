"""The headline (report/headline.py): one row per VPN, one column per workload's first headline metric, tiers
among the VPNs only, the leader line and the findings, on a hand-made store whose answers are known; the
rendered terminal text fits 120 columns and prints bracketed text as it is."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from tunnelbench.analysis.analyze import analyze, load_run
from tunnelbench.core.results import Outcome, Sample
from tunnelbench.report.headline import build
from tunnelbench.report.reading import read
from tunnelbench.report.terminal import print_summary
from tunnelbench.store import DB_NAME, Store

RUN = "20260101-000000-tbhead"
VERSIONS = {
    "internal": "linux 6.1.0-test",
    "fastvpn": "2.0 [dev] (go proxy v0.0.0-20260522210424-ecfc5a8d5446)",
    "midvpn": "1.4.2 (debian 1.4.2-1)",
    "slowvpn": "0.9",
}
# label -> (workload, metric, unit, per-VPN base value, step per repetition); medians are base + 3.5 * step.
# midvpn's values run the other way through the rounds (base + (N - rep) * step): a VPN whose samples overlap
# another's but are not shifted by the same amount in every round, so the within-round comparison (the
# analysis compares VPNs within rounds) has no consistent difference to find either
COLUMNS = {
    "tcp": (
        "tcp",
        "goodput_mbps",
        "Mbit/s",
        {"internal": 1000, "fastvpn": 500, "midvpn": 300, "slowvpn": 301},
        2,
    ),
    "tcp-p4": (
        "tcp",
        "goodput_mbps",
        "Mbit/s",
        {"internal": 2000, "fastvpn": 900, "midvpn": 400, "slowvpn": 200},
        2,
    ),
    "udp-100M": (
        "udp",
        "goodput_mbps",
        "Mbit/s",
        {"internal": 100, "fastvpn": 99, "midvpn": 98, "slowvpn": 97},
        0.01,
    ),
    "ping": (
        "ping",
        "rtt_p50_ms",
        "ms",
        {"internal": 0.05, "fastvpn": 0.3, "midvpn": 0.31, "slowvpn": 0.9},
        0.01,
    ),
    "connect": (
        "connect",
        "connect_s",
        "s",
        {"internal": 0.005, "fastvpn": 0.1, "midvpn": 0.3, "slowvpn": 0.2},
        0.001,
    ),
}
N = 8


def make_store(
    root: Path, extra_label: bool = False, fail: bool = False, bad_calibration: bool = False
) -> Path:
    run_dir = root / RUN
    run_dir.mkdir(parents=True)
    st = Store(run_dir / DB_NAME)
    st.begin_run(RUN, "tbhead", 'name = "hand-made"\n', "0.1.0")
    if bad_calibration:
        st.set_env(
            RUN,
            {
                "calibration.lossy": {
                    "profile": "lossy",
                    "backend": "netem",
                    "ok": False,
                    "checks": [
                        {"quantity": "loss", "unit": "%", "configured": 1.0, "measured": 9.5, "ok": False}
                    ],
                }
            },
        )
    cols = dict(COLUMNS)
    if extra_label:  # a sixth column: the headline splits into two tables
        cols["tcp-p8"] = ("tcp", "goodput_mbps", "Mbit/s", {v: b["tcp"] for v, b in _bases().items()}, 2)
    for vpn, version in VERSIONS.items():
        st.set_vpn(RUN, vpn, version, "ok")
        for label, (wl, metric, unit, base, step) in cols.items():
            for rep in range(1, N + 1):
                adir = run_dir / "cases" / vpn / label / f"r{rep}"
                adir.mkdir(parents=True)
                cid = st.start_case(RUN, vpn, "baseline", wl, label, {}, rep, 0, "h1", "h2", adir)
                k = N - rep if vpn == "midvpn" else rep - 1
                st.finish_case(cid, "ok", Outcome(samples=[Sample(metric, base[vpn] + k * step, unit)]))
    if fail:
        adir = run_dir / "cases" / "slowvpn" / "tcp" / "r8a1"
        adir.mkdir(parents=True)
        cid = st.start_case(RUN, "slowvpn", "baseline", "tcp", "tcp", {}, N, 1, "h1", "h2", adir)
        st.finish_case(cid, "failed", error="WorkloadError: iperf3 timed out")
    st.end_run(RUN, "ok")
    st.close()
    return run_dir


def _bases() -> dict[str, dict[str, float]]:
    return {v: {lb: c[3][v] for lb, c in COLUMNS.items()} for v in VERSIONS}


def test_rows_columns_tiers_and_ratios_match_the_hand_made_values(tmp_path):
    h = build(analyze([load_run(make_store(tmp_path))]))
    (t,) = h.tables
    assert [c.label for c in t.columns] == list(COLUMNS)
    assert [(c.metric, c.unit) for c in t.columns] == [(c[1], c[2]) for c in COLUMNS.values()]
    # the baseline first, then by the first column's median, best first: fastvpn 507, slowvpn 308, midvpn 307
    assert [r.variant for r in t.rows] == ["internal", "fastvpn", "slowvpn", "midvpn"]
    assert t.rows[0].baseline and not any(r.baseline for r in t.rows[1:])
    assert [r.version for r in t.rows] == ["linux 6.1.0-test", "2.0 [dev]", "0.9", "1.4.2"]
    cells = {r.variant: r.cells for r in t.rows}
    assert cells["fastvpn"]["tcp"].median == 507.0 and cells["internal"]["tcp"].median == 1007.0
    assert abs(cells["fastvpn"]["tcp"].ratio - 507 / 1007) < 1e-9
    # tiers among the VPNs only: fastvpn alone on top (8 vs 8 disjoint samples), slowvpn and midvpn overlap
    assert cells["internal"]["tcp"].tier is None
    assert (cells["fastvpn"]["tcp"].tier, cells["slowvpn"]["tcp"].tier, cells["midvpn"]["tcp"].tier) == (
        1,
        2,
        2,
    )
    assert cells["fastvpn"]["tcp"].text == "507 (T1, 0.5×)"
    # lower is better for connect: fastvpn 0.1035 < slowvpn 0.2035 < midvpn 0.3035, all disjoint
    assert [cells[v]["connect"].tier for v in ("fastvpn", "slowvpn", "midvpn")] == [1, 2, 3]


def test_findings_name_the_leader_the_ties_and_the_problems(tmp_path):
    h = build(analyze([load_run(make_store(tmp_path, fail=True, bad_calibration=True))]))
    text = [t for t, _ in h.findings]
    lead = next(t for t in text if t.startswith("tcp goodput:"))
    # 507 / 308 = 1.65 (medians, independent of the tool): "1.6× slowvpn's 308"
    assert "fastvpn leads at 507 Mbit/s, 1.6× slowvpn's 308" in lead, lead
    tie = next(t for t in text if t.startswith("ping rtt_p50:"))  # 0.335 vs 0.345 with overlapping samples
    assert "fastvpn 0.335 ms, not separable from midvpn" in tie, tie
    assert any("slowvpn tcp @ baseline: 1 failed attempt(s)" in t for t in text), text
    assert any("profile lossy OUT OF TOLERANCE: loss 9.50 vs 1.00 %" in t for t in text), text


def test_terminal_headline_fits_120_columns_and_keeps_brackets(tmp_path):
    for extra in (False, True):
        run_dir = make_store(tmp_path / str(extra), extra_label=extra)
        buf = io.StringIO()
        console = Console(file=buf, width=120, record=True, color_system=None)
        rd = read([(run_dir, RUN)])
        print_summary(rd, console)
        rd.close()
        out = buf.getvalue()
        lines = out.splitlines()
        assert max(len(x) for x in lines) <= 120, max(lines, key=len)
        assert "2.0 [dev]" in out  # a version with brackets is printed as it is, not read as markup
        assert sum(x.startswith("headline") for x in lines) == (2 if extra else 1), out
        assert "tunnelbench report --full " + RUN in out
        # the per-metric table is only in --full
        assert "median over repetitions" in out and "min–max" not in out
        vpn_rows = [x for x in lines if re.match(r"│ (internal|fastvpn|midvpn|slowvpn)\b", x)]
        assert len(vpn_rows) == (8 if extra else 4), out


def test_full_adds_the_per_metric_table(tmp_path):
    run_dir = make_store(tmp_path)
    buf = io.StringIO()
    rd = read([(run_dir, RUN)])
    print_summary(rd, Console(file=buf, width=200), full=True)
    rd.close()
    assert "min–max" in buf.getvalue()


@pytest.mark.slow  # 4-8 s (the CLI or a report in a subprocess): out of the fast lane
def test_html_and_markdown_reports_open_with_the_same_headline(tmp_path):
    from tunnelbench.report.full import write_report

    run_dir = make_store(tmp_path)
    rd = read([(run_dir, None)])
    write_report(rd, tmp_path / "r.html", tmp_path / "r.md")
    rd.close()
    page = (tmp_path / "r.html").read_text()
    assert page.index('id="headline"') < page.index('id="overview"')
    assert '<td class="ok">507 (T1, 0.5×)</td>' in page
    assert "2.0 [dev]" in page
    md = (tmp_path / "r.md").read_text()
    assert "| fastvpn 2.0 [dev] | 507 (T1, 0.5×) |" in md, md[:2000]
    assert rd.runs


def test_a_resumed_run_says_so(tmp_path):
    run_dir = make_store(tmp_path)
    st = Store(run_dir / DB_NAME)
    st.set_env(
        RUN,
        {
            "run.resumed": [
                {
                    "at": 1767225600.0,
                    "previous_status": "running",
                    "cases_ok": 17,
                    "discarded": ["fastvpn · baseline · tcp · rep 3 attempt 1 (running)"],
                }
            ]
        },
    )
    st.close()
    text = [t for t, _ in build(analyze([load_run(run_dir)])).findings]
    assert (
        f"run {RUN} was resumed at 2026-01-01 00:00:00 UTC after it ended running: 17 finished case(s) kept, "
        "1 unfinished one(s) measured again" in text
    ), text


def test_a_ratio_above_100_prints_as_a_number():
    from tunnelbench.report.headline import Cell

    assert Cell(0.924, "s", 8, 3, 170.4).text == "0.924 (T3, 170×)"  # seen: "1.7e+02×" in the default run
    assert Cell(0.139, "s", 8, 2, 24.6).text == "0.139 (T2, 25×)"


def test_cases_whose_path_switched_are_named(tmp_path):
    run_dir = make_store(tmp_path)
    st = Store(run_dir / DB_NAME)
    ids = [
        cid
        for (cid,) in st.db.execute(
            "SELECT id FROM \"case\" WHERE vpn = 'midvpn' AND label = 'tcp' ORDER BY repetition"
        )
    ]
    for i, cid in enumerate(ids):  # 3 of the 8 switched (1, 2 and 1 changes), 5 stayed where they were
        st.db.execute(
            "INSERT INTO metric (case_id, name, value, unit, host) VALUES (?, 'path_changes', ?, "
            "'count', NULL)",
            (cid, [1, 0, 2, 0, 0, 1, 0, 0][i]),
        )
    st.db.commit()
    st.close()
    text = [t for t, _ in build(analyze([load_run(run_dir)])).findings]
    assert [t for t in text if "path switched" in t] == [
        "midvpn tcp @ baseline: the path switched between direct and relayed within 3 of 8 case(s) "
        "(series path_direct_pct per case)"
    ]


def _with_env(tmp_path: Path, env: dict) -> list[str]:
    run_dir = make_store(tmp_path)
    st = Store(run_dir / DB_NAME)
    st.set_env(RUN, env)
    st.close()
    return [t for t, _ in build(analyze([load_run(run_dir)])).findings]


def test_the_machine_line_says_quiet_or_busy_and_what_the_run_did(tmp_path):
    """runner/guard.py's tally (env `interference`) in one line, worked out by hand: the mean of what was taken
    is taken_pct_sum / disturbed, the three biggest processes by CPU-seconds, what the run did about it."""
    quiet = {"mode": "remeasure", "threshold_pct": 10.0, "cases": 40, "disturbed": 0}
    assert (
        "machine quiet: nothing outside the lab took 10% or more of its CPUs in any of 40 case(s)"
        in _with_env(tmp_path / "q", {"interference": quiet})
    )
    busy_before = {**quiet, "before_run": {"other_pct": 8.0, "steal_pct": 4.0}}
    assert (
        "machine quiet: nothing outside the lab took 10% or more of its CPUs in any of 40 case(s); busy before the "
        "run (12%)" in _with_env(tmp_path / "b", {"interference": busy_before})
    )
    busy = {
        "mode": "remeasure",
        "threshold_pct": 10.0,
        "cases": 40,
        "disturbed": 4,
        "remeasured": 3,
        "kept": 1,
        "waited_s": 62.4,
        "steady": 1,
        "max_taken_pct": 71.0,
        "taken_pct_sum": 150.0,
        "top_s": {"go": 120.0, "cc1": 30.5, "rustc": 12.0, "make": 1.0},
    }
    assert (
        "machine busy: 4 of 40 case measurement(s) disturbed (outside the lab took 38% of its CPUs on average, up "
        "to 71%; by go 120 CPU-s, cc1 30 CPU-s, rustc 12 CPU-s); 3 measured again when quiet; 1 kept as disturbed "
        "(left out of the ranking); 62 s spent waiting for quiet; the load stayed through 1 wait(s): its cases are "
        "labelled" in _with_env(tmp_path / "c", {"interference": busy})
    )
    label = {**busy, "mode": "label", "kept": 0, "waited_s": 0.0, "steady": 0, "top_s": {}}
    assert (
        "machine busy: 4 of 40 case measurement(s) disturbed (outside the lab took 38% of its CPUs on average, up "
        "to 71%); none kept disturbed" in _with_env(tmp_path / "d", {"interference": label})
    )


def test_the_drift_line_names_the_slow_rounds_only_when_the_reference_moved(tmp_path):
    pts = [{"when": f"round {r}", "goodput_mbps": g} for r, g in enumerate([1000, 980, 600, 1010], 1)]
    # median 990, range 410 = 41% of it (>= 25%): a line; below 75% of the median (742.5): round 3
    assert (
        "the machine drifted: the raw path's reference ranged 600–1,010 Mbit/s (median 990), slow at round 3; VPNs "
        "are compared within rounds, which cancels what hit every VPN of a round alike, not load within a round"
        in _with_env(tmp_path / "a", {"drift.reference": pts})
    )
    steady = [{"when": f"round {r}", "goodput_mbps": g} for r, g in enumerate([1000, 900, 1100], 1)]
    assert not any(
        "drifted" in t for t in _with_env(tmp_path / "b", {"drift.reference": steady})
    )  # 20% < 25%
    assert not any("drifted" in t for t in _with_env(tmp_path / "c", {"drift.reference": pts[:2]}))  # too few


def test_a_vpn_with_too_few_good_repetitions_is_named_with_its_failed_attempts(tmp_path):
    # issue 41 point 3: a VPN whose cases failed is not compared, and the headline says why and how many failed
    import sqlite3

    from synthetic_runs import make_run

    d = make_run(
        tmp_path, "20261128-000000-tbfew0", {"internal": (1000, 10), "a": (500, 10), "b": (300, 10)}, n=4
    )
    db = sqlite3.connect(d / DB_NAME)
    with db:
        db.execute(
            "UPDATE \"case\" SET status = 'failed' WHERE vpn = 'b' AND label = 'tcp' AND repetition > 1"
        )
    db.close()
    text = [t for t, _ in build(analyze([load_run(d)])).findings]
    line = next((t for t in text if "not compared, too few good repetitions" in t), None)
    assert line is not None, text
    assert (
        line.startswith("tcp goodput: not compared, too few good repetitions: b has ") and "3 failed" in line
    ), line
