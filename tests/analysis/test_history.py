"""`tunnelbench history`: the trend of every VPN across stored runs. Hand-made stores with known values (three
runs, a version change, a regression and an improvement compare flags, a VPN missing from the middle run, broken
stores that are skipped), and three real runs whose history page is opened in headless Chromium."""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import tb
from rich.console import Console
from test_report import ARTIFACTS, CHROMIUM, assert_self_contained, chromium_missing, open_in_chromium

from tunnelbench.analysis.analyze import load_run
from tunnelbench.analysis.compare import compare_runs
from tunnelbench.core.results import Outcome, Sample
from tunnelbench.report.history import (
    build_history,
    close_runs,
    collect_runs,
    history_tables,
    print_history,
    render_history,
)
from tunnelbench.store import DB_NAME, Store

DAY = 86400.0
T0 = 1_780_000_000.0  # 2026-05-28
# known per-repetition values: (vpn, label) -> list; six repetitions each
TCP_FAST = [1000.0, 1010.0, 990.0, 1005.0, 995.0, 1002.0]  # median 1001.0
TCP_FAST_SLOWER = [500.0, 510.0, 490.0, 505.0, 495.0, 502.0]  # median 501.0: -50%, a regression
TCP_INTERNAL = [3000.0, 3010.0, 2990.0, 3005.0, 2995.0, 3002.0]  # median 3001.0
RTT_FAST = [2.0, 2.1, 1.9, 2.05, 1.95, 2.02]  # median 2.01
RTT_FAST_BETTER = [1.0, 1.1, 0.9, 1.05, 0.95, 1.02]  # median 1.01: -50%, an improvement
RTT_INTERNAL = [0.1, 0.11, 0.09, 0.105, 0.095, 0.102]  # median 0.101
TCP_SLOWVPN = [300.0, 310.0, 290.0, 305.0, 295.0, 302.0]  # median 301.0
TCP_SLOWVPN_WORSE = [100.0, 110.0, 90.0, 105.0, 95.0, 102.0]  # median 101.0


def make_store(
    root: Path,
    folder: str,
    run_id: str,
    started: float,
    vpns: dict[str, str],
    values: dict[tuple[str, str], list[float]],
    failed: tuple[tuple[str, str], ...] = (),
) -> Path:
    """A run folder whose store holds exactly `values`: per (vpn, label) one case per value (label tcp ->
    goodput_mbps plus a non-headline goodput_sender_mbps, label ping -> rtt_p50_ms). `failed` groups get
    cases whose every attempt failed."""
    d = root / folder
    d.mkdir(parents=True)
    st = Store(d / DB_NAME)
    st.begin_run(run_id, run_id[-6:], 'name = "hand-made"\n', "0.1.0")
    st.db.execute("UPDATE run SET started=? WHERE id=?", (started, run_id))
    st.db.commit()
    for vpn, version in vpns.items():
        st.set_vpn(run_id, vpn, version, "ok")
    for (vpn, label), vals in values.items():
        for rep, v in enumerate(vals, 1):
            wl = "tcp" if label == "tcp" else "ping"
            cid = st.start_case(run_id, vpn, "baseline", wl, label, {}, rep, 0, "h1", "h2", d / "cases")
            samples = (
                [Sample("goodput_mbps", v, "Mbit/s"), Sample("goodput_sender_mbps", v * 1.01, "Mbit/s")]
                if wl == "tcp"
                else [Sample("rtt_p50_ms", v, "ms")]
            )
            st.finish_case(cid, "ok", Outcome(samples=samples))
    for vpn, label in failed:
        for rep in (1, 2):
            cid = st.start_case(run_id, vpn, "baseline", label, label, {}, rep, 0, "h1", "h2", d / "cases")
            st.finish_case(cid, "failed", error="WorkloadError: no reply")
    st.end_run(run_id, "ok")
    st.close()
    return d


RUN1, RUN2, RUN3 = "20260528-000000-tbaaa1", "20260529-000000-tbaaa2", "20260530-000000-tbaaa3"


@pytest.fixture
def three_runs(tmp_path: Path) -> Path:
    """Three runs a day apart (folder names sort in the reverse order: order must come from the start time).
    fastvpn 1.0 -> 1.0 -> 1.1: its RTT halves in run 2 (improvement), its goodput halves in run 3 with the new
    version (regression). slowvpn is not in run 2: its run 3 is compared with run 1 (goodput regression, and
    its ping never succeeds in run 3). internal is steady."""
    root = tmp_path / "results"
    make_store(
        root,
        "c-run1",
        RUN1,
        T0,
        {"internal": "kernel", "fastvpn": "1.0", "slowvpn": "0.9"},
        {
            ("internal", "tcp"): TCP_INTERNAL,
            ("fastvpn", "tcp"): TCP_FAST,
            ("slowvpn", "tcp"): TCP_SLOWVPN,
            ("internal", "ping"): RTT_INTERNAL,
            ("fastvpn", "ping"): RTT_FAST,
            ("slowvpn", "ping"): RTT_FAST,
        },
    )
    make_store(
        root,
        "b-run2",
        RUN2,
        T0 + DAY,
        {"internal": "kernel", "fastvpn": "1.0"},
        {
            ("internal", "tcp"): TCP_INTERNAL,
            ("fastvpn", "tcp"): TCP_FAST,
            ("internal", "ping"): RTT_INTERNAL,
            ("fastvpn", "ping"): RTT_FAST_BETTER,
        },
    )
    make_store(
        root,
        "a-run3",
        RUN3,
        T0 + 2 * DAY,
        {"internal": "kernel", "fastvpn": "1.1", "slowvpn": "0.9"},
        {
            ("internal", "tcp"): TCP_INTERNAL,
            ("fastvpn", "tcp"): TCP_FAST_SLOWER,
            ("slowvpn", "tcp"): TCP_SLOWVPN_WORSE,
            ("internal", "ping"): RTT_INTERNAL,
            ("fastvpn", "ping"): RTT_FAST_BETTER,
        },
        failed=(("slowvpn", "ping"),),
    )
    return root


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def history_of(root: Path, **kw):
    runs, skipped = collect_runs(root)
    try:
        return build_history(runs, skipped=skipped, **kw)
    finally:
        close_runs(runs)


def test_series_and_flags_equal_the_hand_made_inputs(three_runs):
    h = history_of(three_runs)
    assert [r.run_id for r in h.runs] == [RUN1, RUN2, RUN3]  # by start time, not folder name
    assert h.skipped == []
    # one trend per headline metric present (goodput_sender_mbps is not headline)
    assert [(t.label, t.metric) for t in h.trends] == [("tcp", "goodput_mbps"), ("ping", "rtt_p50_ms")]
    tcp = h.trend("baseline", "tcp", "goodput_mbps")
    ping = h.trend("baseline", "ping", "rtt_p50_ms")
    assert tcp is not None and ping is not None and tcp.unit == "Mbit/s" and tcp.better == "higher"

    def pts(t, vpn):
        return [(p.run_id, p.version, p.median, p.n) for p in t.series[vpn]]

    assert pts(tcp, "fastvpn") == [
        (RUN1, "1.0", 1001.0, 6),
        (RUN2, "1.0", 1001.0, 6),
        (RUN3, "1.1", 501.0, 6),
    ]
    assert pts(tcp, "internal") == [(r, "kernel", 3001.0, 6) for r in (RUN1, RUN2, RUN3)]
    assert pts(tcp, "slowvpn") == [(RUN1, "0.9", 301.0, 6), (RUN3, "0.9", 101.0, 6)]
    assert pts(ping, "fastvpn") == [
        (RUN1, "1.0", pytest.approx(2.01), 6),
        (RUN2, "1.0", pytest.approx(1.01), 6),
        (RUN3, "1.1", pytest.approx(1.01), 6),
    ]
    assert pts(ping, "slowvpn") == [(RUN1, "0.9", pytest.approx(2.01), 6)]  # its run 3 never succeeded
    for t in h.trends:
        for s in t.series.values():
            for p in s:
                assert p.ci_lo <= p.median <= p.ci_hi and p.median == pytest.approx(median(p.values))
    assert tcp.series["fastvpn"][2].values == TCP_FAST_SLOWER
    # the changes compare flags, each against the previous run of the same VPN/profile/workload
    got = {(f.vpn, f.label, f.metric, f.run_a, f.run_b, f.version_a, f.version_b, f.verdict) for f in h.flags}
    assert got == {
        ("fastvpn", "ping", "rtt_p50_ms", RUN1, RUN2, "1.0", "1.0", "improvement"),
        ("fastvpn", "tcp", "goodput_mbps", RUN2, RUN3, "1.0", "1.1", "REGRESSION"),
        ("slowvpn", "tcp", "goodput_mbps", RUN1, RUN3, "0.9", "0.9", "REGRESSION"),
        ("slowvpn", "ping", "", RUN1, RUN3, "0.9", "0.9", "FAILED: every attempt failed"),
    }
    reg = next(f for f in h.flags if f.vpn == "fastvpn" and f.verdict == "REGRESSION")
    assert reg.change is not None and reg.change.median_a == 1001.0 and reg.change.median_b == 501.0
    assert reg.change.change_pct == pytest.approx((501 / 1001 - 1) * 100)
    # the points carry the flag; the first point of a series has nothing to compare with
    assert [p.flag for p in tcp.series["fastvpn"]] == ["", "", "regression"]
    assert [p.flag for p in ping.series["fastvpn"]] == ["", "improvement", ""]
    assert [p.flag for p in tcp.series["internal"]] == ["", "", ""]
    assert [p.prev_run for p in tcp.series["slowvpn"]] == [None, RUN1]


def test_flags_are_what_compare_says(three_runs):
    """Same verdicts as `compare` on the same pair of runs (the logic is reused, not re-implemented)."""
    h = history_of(three_runs)
    runs = {r.run_id: load_run(r.run_dir) for r in h.runs}
    try:
        cmp = compare_runs(runs[RUN2], runs[RUN3])
        direct = {(c.vpn, c.label, c.metric): c.verdict for c in cmp.changes}
        tcp = h.trend("baseline", "tcp", "goodput_mbps")
        assert tcp is not None
        for vpn in ("internal", "fastvpn"):
            assert tcp.series[vpn][2].verdict == direct[(vpn, "tcp", "goodput_mbps")]
        assert direct[("fastvpn", "tcp", "goodput_mbps")] == "REGRESSION"
    finally:
        close_runs(list(runs.values()))


def test_previous_run_is_the_last_one_where_the_group_succeeded(three_runs):
    """slowvpn's ping failed in run 3: run 4 compares it with run 1 (its last success), not with run 3; and
    run 4's internal tcp with run 3 (the directly previous run)."""
    run4 = "20260531-000000-tbaaa4"
    make_store(
        three_runs,
        "0-run4",
        run4,
        T0 + 3 * DAY,
        {"internal": "kernel", "slowvpn": "1.0"},
        {("internal", "tcp"): TCP_INTERNAL, ("slowvpn", "ping"): RTT_FAST_BETTER},
    )
    h = history_of(three_runs)
    ping = h.trend("baseline", "ping", "rtt_p50_ms")
    assert ping is not None
    assert [(p.run_id, p.prev_run, p.flag) for p in ping.series["slowvpn"]] == [
        (RUN1, None, ""),
        (run4, RUN1, "improvement"),
    ]
    assert ("slowvpn", "rtt_p50_ms", RUN1, run4, "improvement") in {
        (f.vpn, f.metric, f.run_a, f.run_b, f.verdict) for f in h.flags
    }
    tcp = h.trend("baseline", "tcp", "goodput_mbps")
    assert tcp is not None and [p.prev_run for p in tcp.series["internal"]] == [None, RUN1, RUN2, RUN3]
    assert [p.run_id for p in tcp.series["slowvpn"]] == [RUN1, RUN3]  # no tcp in run 4


def test_filters(three_runs):
    h = history_of(three_runs, vpns=["fastvpn"], metrics=["goodput_mbps", "goodput_sender_mbps"])
    assert [(t.label, t.metric) for t in h.trends] == [
        ("tcp", "goodput_mbps"),
        ("tcp", "goodput_sender_mbps"),
    ]
    assert all(list(t.series) == ["fastvpn"] for t in h.trends)
    assert h.vpns == ["fastvpn"]
    assert {(f.vpn, f.metric, f.verdict) for f in h.flags} == {
        ("fastvpn", "goodput_mbps", "REGRESSION"),
        ("fastvpn", "goodput_sender_mbps", "REGRESSION"),  # gated because asked for, as compare --metric
    }
    sender = h.trend("baseline", "tcp", "goodput_sender_mbps")
    assert sender is not None
    assert [p.median for p in sender.series["fastvpn"]] == pytest.approx(
        [1001 * 1.01, 1001 * 1.01, 501 * 1.01]
    )


def test_broken_and_old_stores_are_skipped_with_a_reason(three_runs):
    root = three_runs
    (root / "garbage").mkdir()
    (root / "garbage" / DB_NAME).write_bytes(b"this is not sqlite\n" * 10)
    (root / "empty").mkdir()
    (root / "empty" / DB_NAME).touch()
    old = root / "old"
    old.mkdir()
    con = sqlite3.connect(old / DB_NAME)  # an older schema: the case table without workload/label
    con.executescript(
        "CREATE TABLE run (id TEXT, started REAL, status TEXT, scenario TEXT);"
        "CREATE TABLE vpn (run_id TEXT, name TEXT, version TEXT, status TEXT);"
        'CREATE TABLE "case" (id INTEGER, run_id TEXT, vpn TEXT, profile TEXT, status TEXT);'
        "CREATE TABLE metric (case_id INTEGER, name TEXT, value REAL, unit TEXT, host TEXT);"
        "INSERT INTO run VALUES ('r-old', 1.0, 'ok', '');"
    )
    con.commit()
    con.close()
    (root / "norun").mkdir()
    Store(root / "norun" / DB_NAME).close()  # the schema but no run row (a run killed before it began)
    (root / "not-a-run").mkdir()  # no store: not a run folder, ignored
    copy = root / "z-copy-of-run1"
    shutil.copytree(root / "c-run1", copy)  # the same run id twice
    before = {p: (p / DB_NAME).read_bytes() for p in (root / "garbage", root / "empty", old)}
    h = history_of(root)
    assert [r.run_id for r in h.runs] == [RUN1, RUN2, RUN3]
    why = {d.name: reason for d, reason in h.skipped}
    assert set(why) == {"garbage", "empty", "old", "norun", "z-copy-of-run1"}
    assert "not a database" in why["garbage"]
    assert "no 'run' table" in why["empty"]
    assert "lacks" in why["old"] and "label" in why["old"] and "older store" in why["old"]
    assert "no run recorded" in why["norun"]
    assert RUN1 in why["z-copy-of-run1"] and "c-run1" in why["z-copy-of-run1"]
    for p, data in before.items():  # read-only: a broken file is left as it was
        assert (p / DB_NAME).read_bytes() == data
    assert {f.verdict for f in h.flags} == {"REGRESSION", "improvement", "FAILED: every attempt failed"}


def test_html_page_has_a_trend_figure_per_metric_with_flagged_points(three_runs):
    h = history_of(three_runs)
    html = render_history(h)
    assert_self_contained(html)
    figs = re.findall(
        r'<figure class="trend" data-metric="([^"]+)" data-workload="([^"]+)"[^>]*>(.*?)</figure>', html, re.S
    )
    assert [(m, w) for m, w, _ in figs] == [("goodput_mbps", "tcp"), ("rtt_p50_ms", "ping")]
    body = dict(((m, w), b) for m, w, b in figs)
    tcp = body[("goodput_mbps", "tcp")]
    series = re.findall(r'<g class="series" data-vpn="([^"]+)" data-points="(\d+)">(.*?)</g></g>', tcp, re.S)
    assert {v: int(n) for v, n, _ in series} == {"internal": 3, "fastvpn": 3, "slowvpn": 2}
    points = re.findall(
        r'<g class="point" data-run="([^"]+)" data-version="([^"]*)" data-median="([^"]+)"'
        r'[^>]*data-flag="([^"]*)"',
        tcp,
    )
    assert len(points) == 8
    flagged = {(run, ver, float(med), flag) for run, ver, med, flag in points if flag}
    assert flagged == {(RUN3, "1.1", 501.0, "regression"), (RUN3, "0.9", 101.0, "regression")}
    assert 'data-flag="improvement"' in body[("rtt_p50_ms", "ping")]
    assert tcp.count("<svg") == 1 and tcp.count('class="ci"') == 8  # a CI whisker per point
    assert ">1.1</text>" in tcp  # the version change is labelled
    # the flagged table and the run report's stylesheet
    flagged_section = html[html.index('id="flagged"') : html.index('id="runs"')]
    assert flagged_section.count("REGRESSION") == 2 and "improvement" in flagged_section
    assert "FAILED: every attempt failed" in flagged_section
    assert "svg.plot{max-width:100%" in html and ".card{" in html


def test_terminal_table_latest_vs_previous_fits_120_columns(three_runs):
    h = history_of(three_runs)
    con = Console(width=200, record=True, color_system=None)
    print_history(h, con)
    out = con.export_text()
    assert max(len(line) for line in out.splitlines()) <= 120
    tables = {str(t.title).split(":")[0]: t for t in history_tables(h)}
    assert list(tables) == ["internal", "fastvpn", "slowvpn"]
    assert f"{RUN2} (1.0) → {RUN3} (1.1)" in str(tables["fastvpn"].title)
    lines = [ln for ln in out.splitlines() if "goodput_mbps" in ln]
    fast = lines[1]  # internal, fastvpn, slowvpn in that order
    assert re.search(r"1,001 .*501 .*-50\.0% .*REGRESSION", fast), fast
    slow = lines[2]
    assert re.search(r"301 .*101 .*-66\.4% .*REGRESSION", slow), slow
    assert re.search(r"3,001 .*3,001 .*\+0\.0%", lines[0]), lines[0]
    assert "rtt_p50_ms" in out and "2 regression(s), 1 improvement(s), 1 workload(s) that stopped" in out


@pytest.mark.slow  # 4-8 s (the CLI or a report in a subprocess): out of the fast lane
def test_cli(three_runs, tmp_path):
    (three_runs / "garbage").mkdir()
    (three_runs / "garbage" / DB_NAME).write_text("nope")
    res = tb("history", "--results", str(three_runs), "--vpn", "fastvpn,internal", "--vpn", "nosuchvpn")
    assert res.returncode == 0, res.stdout + res.stderr
    assert (three_runs / "history.html").exists()
    assert f"history: {three_runs / 'history.html'}" in res.stderr
    assert "garbage" in res.stderr and "not a database" in res.stderr
    assert "nosuchvpn" in res.stderr
    assert "REGRESSION" in res.stdout and "slowvpn" not in res.stdout
    out = tmp_path / "h" / "page.html"
    out.parent.mkdir()  # --out names a file in a folder that exists (checked before the work, as report's)
    res = tb("history", "--results", str(three_runs), "--metric", "rtt_p50_ms", "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    html = out.read_text()
    assert re.findall(r'<figure class="trend" data-metric="([^"]+)"', html) == ["rtt_p50_ms"]
    res = tb("history", "--results", str(tmp_path / "nothing"))
    assert res.returncode == 2 and "no readable runs" in res.stderr


# -- three real runs, the page in headless Chromium --------------------------------------------------------
SCENARIO = """
name = "history-e2e"
vpns = ["internal", "wireguard-go"]
[run]
repetitions = 2
[lab]
hosts = 2
[[workloads]]
name = "tcp"
duration_s = 1
omit_s = 0
[[workloads]]
name = "ping"
count = 20
interval_s = 0.02
"""


@pytest.mark.lab
@pytest.mark.slow
@pytest.mark.long  # 45 s: the hand-made runs above check the series and flags; test_report the browser
def test_history_of_three_real_runs_in_headless_chromium(tmp_path):
    from conftest import lab_missing

    why = lab_missing() or chromium_missing()
    if why:
        pytest.skip(why)
    scen = tmp_path / "s.toml"
    scen.write_text(SCENARIO)
    results = tmp_path / "results"
    for _ in range(3):
        t = time.monotonic()
        res = subprocess.run([str(Path(sys.executable).parent / "tunnelbench"), "run", str(scen), "--results",
                              str(results), "--no-html"], capture_output=True, text=True, timeout=180)  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        print(f"run: {time.monotonic() - t:.1f} s")
    run_dirs = sorted(results.iterdir())
    assert len(run_dirs) == 3
    # the headline metrics these runs hold, from the stores
    expected = set()
    for d in run_dirs:
        r = load_run(d)
        for m in r.metrics:
            c = next(c for c in r.cases if c.id == m["case_id"])
            if m["host"] is None and r.is_headline(c.workload, m["name"]):
                expected.add((c.label, m["name"]))
        r.store.close()
    assert {("tcp", "goodput_mbps"), ("ping", "rtt_p50_ms"), ("ping", "rtt_p99_ms")} <= expected
    html_path = tmp_path / "history.html"
    res = tb("history", "--results", str(results), "--out", str(html_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "wireguard-go" in res.stdout and f"history: {html_path}" in res.stderr
    assert_self_contained(html_path.read_text())
    info = open_in_chromium(html_path, ARTIFACTS / "history-real-runs.png")
    shutil.copy(html_path, ARTIFACTS / "history-real-runs.html")
    assert info["console"] == [], info["console"]
    assert all(u.startswith("file:") for u in info["requests"]), info["requests"]
    assert {"trends", "flagged", "runs"} <= set(info["sections"])
    figs = _figures(html_path)
    assert {(f["workload"], f["metric"]) for f in figs} == expected
    assert len(figs) == len(expected)  # one per headline metric, no duplicates
    for f in figs:
        assert f["svg"] == 1, f
        assert f["series"] == {"internal": 3, "wireguard-go": 3}, f
        assert f["visible"], f
    assert "20" in info["text"] and "wireguard-go" in info["text"]


def _figures(html_path: Path) -> list[dict]:
    """Per trend figure in the rendered DOM: its metric and workload, its SVGs, the points of each series."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu"])  # fmt: skip
        try:
            page = browser.new_context(offline=True).new_page()
            page.goto(html_path.resolve().as_uri(), wait_until="load")
            return page.evaluate(
                """() => [...document.querySelectorAll('figure.trend')].map(f => ({
                    metric: f.dataset.metric, workload: f.dataset.workload,
                    svg: f.querySelectorAll('svg').length,
                    visible: f.querySelector('svg').getBoundingClientRect().width > 200,
                    series: Object.fromEntries([...f.querySelectorAll('g.series')].map(
                        g => [g.dataset.vpn, g.querySelectorAll('g.point').length])),
                }))"""
            )
        finally:
            browser.close()
