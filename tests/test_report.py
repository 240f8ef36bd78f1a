"""The report: statistics and sections of a synthetic run (fast), exports, and the report of a real small run
opened in headless Chromium (no console errors, no requests, a screenshot in test-artifacts/)."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import tb
from synthetic_runs import make_run

from tunnelbench.analysis.analyze import analyze, load_run
from tunnelbench.analysis.summary import summarize
from tunnelbench.report.export import COLUMNS, metric_rows, to_csv, to_json
from tunnelbench.report.full import render_markdown, render_report
from tunnelbench.store import DB_NAME, Store

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
SECTIONS = (
    "overview",
    "heatmaps",
    "scatter",
    "rtt",
    "timeseries",
    "cpu",
    "derived",
    "stats",
    "features",
    "failures",
    "environment",
)


def assert_self_contained(html: str) -> None:
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "external reference"
    assert "<link" not in html.lower() and "@import" not in html and "url(http" not in html


@pytest.mark.slow  # 4-8 s (the CLI or a report in a subprocess): out of the fast lane
def test_analysis_and_report_of_a_synthetic_run(tmp_path):
    d = make_run(
        tmp_path,
        "20260101-000000-tbsynt",
        {"internal": (2000, 40), "fastvpn": (900, 20), "slowvpn": (300, 10)},
        n=8,
        fail="slowvpn",
    )
    a = analyze([load_run(d)])
    assert a.variants == ["internal", "fastvpn", "slowvpn"]
    f = a.family("baseline", "tcp", "goodput_mbps")
    assert f is not None and f.tiering is not None
    assert f.tiering.groups() == [["internal"], ["fastvpn"], ["slowvpn"]]  # 8 vs 8, clearly apart
    g = a.groups[("fastvpn", "baseline", "tcp", "goodput_mbps")]
    assert g.ratio is not None and g.ratio[1] < 0.45 < g.ratio[2] and g.desc.n == 8
    # a difference to another reading (loaded minus idle) gets no "x times the baseline"; the RTT does
    assert a.groups[("fastvpn", "baseline", "ping", "added_latency_p50_ms")].ratio is None
    assert a.groups[("fastvpn", "baseline", "ping", "rtt_p50_ms")].ratio is not None
    rows = {(r.vpn, r.label, r.metric): r for r in summarize(Store(d / DB_NAME), d.name).rows}
    assert rows[("fastvpn", "ping", "added_latency_p50_ms")].ratio is None
    assert rows[("fastvpn", "ping", "rtt_p50_ms")].ratio is not None
    # parallel scaling: tcp-p4 was made 1.6x tcp; efficiency = goodput per daemon CPU-core
    sc = {(s.variant, s.label): s for s in a.scaling}
    assert sc[("fastvpn", "tcp-p4")].value == pytest.approx(1.6, rel=0.1)
    eff = {(e.variant, e.label): e for e in a.efficiency}
    assert eff[("fastvpn", "tcp")].value == pytest.approx(900 / 0.85, rel=0.15)
    assert ("internal", "baseline", "tcp") not in {(e.variant, e.profile, e.label) for e in a.efficiency}
    html = render_report(a)
    assert_self_contained(html)
    for s in SECTIONS:
        assert f'id="{s}"' in html
    assert html.count("<svg") >= 8
    assert "goodput_mbps [Mbit/s]" in html and "rtt_ms [ms]" in html  # axis labels with units
    assert "WorkloadError: iperf3 timed out" in html and "handshake did not complete" in html
    # the calibration stored with the run (synthetic_runs: profile edge on netem, TCP goodput configured 100,
    # measured 94, ok) is rendered cell by cell, the raw path's one-way delay above it
    cal = html[html.index("Calibration of the impairment profiles") :]
    cal = cal[: cal.index("</table>")]
    assert re.search(r"<code>one_way_ms</code>\s*=\s*0\.02\b", cal), cal
    cal_rows = [
        [re.sub(r"<[^>]+>", " ", c).split() for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", cal)
        if "<td" in row
    ]
    assert len(cal_rows) == 1, cal
    (profile, backend, quantity, configured, measured, detail, ok) = cal_rows[0]
    assert profile == ["edge", "rate", "100", "Mbit/s"] and backend == ["netem"], cal_rows
    assert quantity == ["TCP", "goodput", "[Mbit/s]"] and detail == ["90-100%"] and ok == ["yes"], cal_rows
    assert float(configured[0]) == 100 and float(measured[0]) == 94, cal_rows
    md = render_markdown(a)
    assert "| fastvpn | tcp | goodput_mbps [Mbit/s] |" in md and "failed" in md


@pytest.mark.slow  # 4-8 s (the CLI or a report in a subprocess): out of the fast lane
def test_combined_report_of_two_versions(tmp_path):
    a = make_run(
        tmp_path,
        "20260101-000000-tbv100",
        {"internal": (2000, 40), "fastvpn": (900, 20)},
        n=6,
        version="1.0.0",
        extra_label=False,
    )
    b = make_run(
        tmp_path,
        "20260101-000001-tbv110",
        {"internal": (2000, 40), "fastvpn": (700, 20)},
        n=6,
        version="1.1.0",
        seed=4,
        extra_label=False,
    )
    res = tb("report", str(a), str(b), "--out", str(tmp_path / "both.html"))
    assert res.returncode == 0, res.stdout + res.stderr
    html = (tmp_path / "both.html").read_text()
    assert "fastvpn 1.0.0" in html and "fastvpn 1.1.0" in html and "internal @tbv100" in html
    assert (tmp_path / "both.md").exists()


@pytest.mark.slow  # 4-8 s (the CLI or a report in a subprocess): out of the fast lane
def test_exports(tmp_path):
    d = make_run(tmp_path, "20260101-000000-tbexpo", {"internal": (2000, 40), "fastvpn": (900, 20)}, n=3)
    run = load_run(d)
    rows = list(csv.DictReader(io.StringIO(to_csv(metric_rows(run)))))
    assert tuple(rows[0]) == COLUMNS
    n_metrics = len(run.metrics)
    assert len(rows) == n_metrics
    r = next(
        r for r in rows if r["vpn"] == "fastvpn" and r["metric"] == "goodput_mbps" and r["label"] == "tcp"
    )
    assert r["vpn_version"] == "1.0" and r["unit"] == "Mbit/s" and r["repetition"] == "1" and r["host"] == ""
    assert r["better"] == "higher" and float(r["value"]) > 0
    assert any(r["host"] == "h1" and r["metric"] == "daemon_cpu_pct" for r in rows)
    doc = json.loads(to_json(run, series=True))
    assert len(doc["metrics"]) == n_metrics and doc["series"] and doc["run"]["id"] == run.run_id
    res = tb("export", str(d), "--format", "json")
    assert res.returncode == 0 and json.loads(res.stdout)["metrics"]
    res = tb("export", str(d), "--out", str(tmp_path / "m.csv"))
    assert res.returncode == 0 and (tmp_path / "m.csv").read_text().startswith(",".join(COLUMNS))


# -- a real small run in headless Chromium -----------------------------------------------------------------
SCENARIO = """
name = "report-e2e"
vpns = ["internal", "wireguard-go"]
[run]
repetitions = 3
[lab]
hosts = 2
[[workloads]]
name = "tcp"
duration_s = 1
omit_s = 0
[[workloads]]
name = "tcp"
streams = 2
duration_s = 1
omit_s = 0
[[workloads]]
name = "ping"
count = 20
interval_s = 0.01
"""


def chromium_missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} missing (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright Python package is missing (pip install playwright; no browser download needed)"
    return None


def open_in_chromium(html_path: Path, screenshot: Path) -> dict:
    """Load the page from disk in headless Chromium with no network; return console messages, requests and
    what the DOM holds."""
    from playwright.sync_api import sync_playwright

    msgs: list[tuple[str, str]] = []
    requests: list[str] = []
    with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="tb-chromium-") as profile:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, offline=True, viewport={"width": 1400, "height": 1000},
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"],
        )  # fmt: skip
        try:
            page = ctx.new_page()
            page.on("console", lambda m: msgs.append((m.type, m.text)))
            page.on("pageerror", lambda e: msgs.append(("pageerror", str(e))))
            page.on("requestfailed", lambda r: msgs.append(("requestfailed", r.url)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(html_path.resolve().as_uri(), wait_until="load")
            info = page.evaluate(
                """() => ({
                  sections: [...document.querySelectorAll('section[id]')].map(s => s.id),
                  plots: document.querySelectorAll('svg.plot').length,
                  plotsIn: Object.fromEntries([...document.querySelectorAll('section[id]')].map(
                      s => [s.id, s.querySelectorAll('svg.plot').length])),
                  tiers: document.querySelectorAll('.tier').length,
                  text: document.body.innerText,
                })"""
            )
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            ctx.close()
    info["console"] = msgs
    info["requests"] = requests
    return info


@pytest.mark.lab
@pytest.mark.slow
def test_report_of_a_real_run_in_headless_chromium(tmp_path):
    from conftest import lab_missing

    why = lab_missing() or chromium_missing()
    if why:
        print(f"skipped: {why}")
        pytest.skip(why)
    scen = tmp_path / "s.toml"
    scen.write_text(SCENARIO)
    res = tb("run", str(scen), "--results", str(tmp_path / "results"), "--no-html")
    assert res.returncode == 0, res.stdout + res.stderr
    (run_dir,) = (tmp_path / "results").iterdir()
    res = tb("report", str(run_dir))
    assert res.returncode == 0, res.stdout + res.stderr
    html_path = run_dir / "report.html"
    html = html_path.read_text()
    assert_self_contained(html)
    assert (run_dir / "report.md").read_text().count("wireguard-go") >= 3
    info = open_in_chromium(html_path, ARTIFACTS / "report-real-run.png")
    shutil.copy(html_path, ARTIFACTS / "report-real-run.html")
    assert info["console"] == [], info["console"]
    assert all(u.startswith("file:") for u in info["requests"]), info["requests"]
    assert set(SECTIONS) <= set(info["sections"])
    assert info["plots"] >= 10, info["plots"]
    for s in ("overview", "heatmaps", "scatter", "rtt", "timeseries", "cpu"):
        assert info["plotsIn"][s] >= 1, (s, info["plotsIn"])
    assert info["tiers"] >= 2
    text = info["text"]
    for s in ("Overview: ranking per metric", "wireguard-go", "goodput_mbps", "rtt_p50_ms", "Parallel scaling factor",
              "CPU efficiency", "Environment, versions and calibration", "iperf 3"):  # fmt: skip
        assert s in text, s
    assert (ARTIFACTS / "report-real-run.png").stat().st_size > 50_000
    # exports of the real run
    res = tb("export", str(run_dir))
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert {r["vpn"] for r in rows} == {"internal", "wireguard-go"} and {r["label"] for r in rows} >= {
        "tcp",
        "ping",
    }


def test_rtt_histogram_shares_on_shared_log_bins():
    from tunnelbench.report.plots import histogram_shares

    edges, shares = histogram_shares({"a": [1, 1, 1, 100], "b": [20, 0, -1], "c": []}, bins=2)
    assert edges == pytest.approx(
        [1, 10, 100.01], rel=1e-3
    )  # geometric: 1, 10, 100 (the top edge just above the max)
    assert shares["a"].tolist() == [0.75, 0.25] and shares["b"].tolist() == [
        0.0,
        1.0,
    ]  # 20 is in bin 2; 0 and -1 are left out
    assert "c" not in shares  # no positive sample, no curve
    assert histogram_shares({"x": []})[1] == {}


def test_features_come_from_the_run_that_stored_them_not_from_todays_drivers(tmp_path):
    """A report shows the feature record each run stored with its VPN (its driver's record at the time); a run
    that stored none (an old run) shows none, never today's record, and no environment key adds facts."""
    from tunnelbench.report.full import _features

    d = make_run(
        tmp_path, "20260101-000000-tbfeat", {"internal": (2000, 40), "nebula": (900, 20), "tinc": (300, 10)}
    )
    st = Store(d / DB_NAME)
    stored = {"protocol": {"value": "as stored in 2026", "source": "driver: test", "probed": False}}
    st.set_vpn(
        "20260101-000000-tbfeat", "nebula", "1.0", "ok", settings={"features": stored, "cipher": "aes"}
    )
    st.set_env("20260101-000000-tbfeat", {"features.tinc.protocol": "from the environment"})
    st.close()
    got = {f["variant"]: f for f in _features(analyze([load_run(d)]))}
    assert got["nebula"]["features"] == {"protocol": json.dumps(stored["protocol"])}
    assert got["nebula"]["settings"] == {"cipher": "aes"}
    assert got["tinc"]["features"] == {} and got["internal"]["features"] == {}
