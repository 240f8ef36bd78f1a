"""The report: statistics and sections of a synthetic run (fast), exports, and the report of a real small run
opened in headless Chromium (no console errors, no requests, a screenshot in test-artifacts/)."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shutil
import sqlite3
import statistics
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from conftest import tb
from synthetic_runs import hand_store, make_run
from tree import ARTIFACTS

from tunnelbench.analysis.analyze import analyze, load_run
from tunnelbench.core.results import Outcome, Sample, Series
from tunnelbench.report.export import COLUMNS, metric_rows, to_csv, to_json
from tunnelbench.report.full import render_markdown, render_report
from tunnelbench.report.reading import Reading
from tunnelbench.store import DB_NAME, Store

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


# -- references the product did not compute: results.sqlite read with sqlite3 and the statistics module -------
_CASE_KEY = (
    "c.run_id, c.vpn, v.version, c.profile, c.workload, c.label, c.repetition, c.attempt"  # the export's key
)
OK_METRICS = (
    f"SELECT {_CASE_KEY}, m.host, m.name, m.value, m.unit FROM metric m "
    'JOIN "case" c ON c.id = m.case_id LEFT JOIN vpn v ON v.run_id = c.run_id AND v.name = c.vpn '
    "WHERE c.status = 'ok'"
)
OK_SERIES = (
    f"SELECT {_CASE_KEY}, s.host, s.name, s.t, s.value, s.unit FROM series s "
    'JOIN "case" c ON c.id = s.case_id LEFT JOIN vpn v ON v.run_id = c.run_id AND v.name = c.vpn '
    "WHERE c.status = 'ok'"
)


def sql(db: Path, query: str, *args: object) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(query, args).fetchall()
    finally:
        con.close()


def stored_samples(db: Path) -> dict[tuple[str, str, str, str], tuple[str, list[float]]]:
    """(vpn, profile, label, metric) -> (unit, values): each successful case's own (host-less) metrics."""
    out: dict[tuple[str, str, str, str], tuple[str, list[float]]] = {}
    for _, vpn, _, profile, _, label, _, _, host, name, value, unit in sql(db, OK_METRICS):
        if host is None:
            out.setdefault((vpn, profile, label, name), (unit, []))[1].append(value)
    return out


def export_key(r: dict) -> tuple:
    """An exported metric row (CSV strings or JSON values) as the tuple OK_METRICS gives for it."""
    return (r["run_id"], r["vpn"], r["vpn_version"] or None, r["profile"], r["workload"], r["label"],
            int(r["repetition"]), int(r["attempt"]), r["host"] or None, r["metric"], float(r["value"]), r["unit"])  # fmt: skip


def series_key(r: dict) -> tuple:
    return (r["run_id"], r["vpn"], r["vpn_version"] or None, r["profile"], r["workload"], r["label"],
            int(r["repetition"]), int(r["attempt"]), r["host"] or None, r["metric"], float(r["t"]),
            float(r["value"]), r["unit"])  # fmt: skip


def same_rows(got: Counter, want: Counter, what: str) -> None:
    assert got == want, (
        f"{what}: missing {list((want - got).elements())[:5]}, extra {list((got - want).elements())[:5]}"
    )


# -- numbers read back out of the report, within what its rounding allows ------------------------------------
NUMBER = r"-?\d[\d,]*(?:\.\d+)?(?:e[+-]\d+)?"


def num_format(x: float, unit: str = "") -> tuple[str, float]:
    """How report/fmt.py's num() must show x by its rule (restated here, not called): the text's pattern and
    half a unit of its last digit, the most a correct rounding is off. Ratios: 4 decimals, below 0.001 in
    d.dde±NN; else 1,000 and up: an integer with thousands separators, 100 and up: an integer, 10 and up: 1
    decimal, 1 and up: 2, below 1: 3."""
    a = abs(x)
    if unit == "ratio":
        if 0 < a < 0.001:
            return r"-?\d\.\d\de-\d\d", 0.005 * 10 ** math.floor(math.log10(a))
        return r"-?\d+\.\d{4}", 0.00005
    if a >= 1000:
        return r"-?\d{1,3}(?:,\d{3})+", 0.5
    if a >= 100:
        return r"-?\d+", 0.5
    if a >= 10:
        return r"-?\d+\.\d", 0.05
    if a >= 1:
        return r"-?\d+\.\d\d", 0.005
    return r"-?\d+\.\d{3}", 0.0005


def assert_shown(text: str, want: float, what: str, unit: str = "", decimals: int | None = None) -> None:
    """text is want as num() shows it (or, with decimals, as f"{want:.<decimals>f}" does)."""
    pattern, tol = (
        num_format(want, unit) if decimals is None else (rf"-?\d+\.\d{{{decimals}}}", 0.5 / 10**decimals)
    )
    assert re.fullmatch(pattern, text), (
        f"{what}: shown as {text!r}, not as {pattern} (the store gives {want!r})"
    )
    got = float(text.replace(",", ""))
    assert abs(got - want) <= tol * (1 + 1e-9), (
        f"{what}: the report shows {text}, the store gives {want!r} (±{tol:g})"
    )


def assert_sig(text: str, want: float, sig: int, what: str) -> None:
    """A ratio shown with `sig` significant digits (format .{sig}g: trailing zeros dropped, so the tolerance is
    half a unit of the sig-th digit of the reference, not of the last digit shown)."""
    tol = 0.5 * 10 ** (math.floor(math.log10(abs(want))) - sig + 1) if want else 0.0
    got = float(text)
    assert abs(got - want) <= tol * (1 + 1e-9), (
        f"{what}: the report shows {text}, the store gives {want!r} (±{tol:g})"
    )


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
    # tiers among the VPNs (8 vs 8, clearly apart); the no-VPN baseline is the reference, shown first, untiered
    assert f.tiering.groups() == [["fastvpn"], ["slowvpn"]]
    assert f.order() == ["internal", "fastvpn", "slowvpn"] and f.tier_of("internal") is None
    g = a.groups[("fastvpn", "baseline", "tcp", "goodput_mbps")]
    assert g.ratio is not None and g.ratio[1] < 0.45 < g.ratio[2] and g.desc.n == 8
    # a difference to another reading (loaded minus idle) gets no "x times the baseline"; the RTT does
    assert a.groups[("fastvpn", "baseline", "ping", "added_latency_p50_ms")].ratio is None
    assert a.groups[("fastvpn", "baseline", "ping", "rtt_p50_ms")].ratio is not None
    # parallel scaling: tcp-p4 was made 1.6x tcp; efficiency = goodput per daemon CPU-core
    sc = {(s.variant, s.label): s for s in a.scaling}
    assert sc[("fastvpn", "tcp-p4")].value == pytest.approx(1.6, rel=0.1)
    eff = {(e.variant, e.label): e for e in a.efficiency}
    assert eff[("fastvpn", "tcp")].value == pytest.approx(900 / 0.85, rel=0.15)
    assert ("internal", "baseline", "tcp") not in {(e.variant, e.profile, e.label) for e in a.efficiency}
    html = render_report(Reading.of(a))
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
    md = render_markdown(Reading.of(a))
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


def export_run(tmp_path: Path) -> tuple[Path, Counter, Counter]:
    """A run whose failing case kept what it measured (WorkloadError.outcome: stored, never exported), and
    the reference: results.sqlite read with sqlite3, not the product's loader."""
    d = make_run(
        tmp_path,
        "20260101-000000-tbexpo",
        {"internal": (2000, 40), "fastvpn": (900, 20)},
        n=3,
        fail="fastvpn",
    )
    db = d / DB_NAME
    con = sqlite3.connect(db)
    with con:
        (failed,) = con.execute("SELECT id FROM \"case\" WHERE status = 'failed'").fetchone()
        con.execute("INSERT INTO metric VALUES (?, 'goodput_mbps', 12345.0, 'Mbit/s', NULL)", (failed,))
        con.execute("INSERT INTO series VALUES (?, 'goodput_mbps', 'Mbit/s', NULL, 1.0, 12345.0)", (failed,))
    con.close()
    return d, Counter(sql(db, OK_METRICS)), Counter(sql(db, OK_SERIES))


def test_exports(tmp_path):
    """Every exported value (CSV, JSON, their series) is the stored one, row for row, with its case key and
    every digit (a value rounded on its way out differs from the store's)."""
    d, want, want_series = export_run(tmp_path)
    # the reference itself, from make_run's input: per repetition internal stores tcp 2 + tcp-p4 2 + ping 4
    # values, fastvpn also 4 daemon values (2 hosts x CPU, RSS) per tcp case; 3 repetitions; 5 goodput
    # intervals per tcp case, 50 RTTs per ping case
    assert sum(want.values()) == 3 * (8 + 16) and sum(want_series.values()) == 3 * 2 * (5 + 5 + 50)
    assert {k[0] for k in want} == {"20260101-000000-tbexpo"} and {k[2] for k in want} == {"kernel", "1.0"}
    # most of make_run's values are draws with every digit a double holds: shown to 12 digits, they differ
    assert sum(float(f"{k[10]:.12g}") != k[10] for k in want) >= len(want) // 2
    run = load_run(d)
    text = to_csv(metric_rows(run))
    assert text.startswith(",".join(COLUMNS) + "\n")
    rows = list(csv.DictReader(io.StringIO(text)))
    same_rows(Counter(map(export_key, rows)), want, "CSV")
    assert all(r["better"] == ("higher" if r["metric"] == "goodput_mbps" else "lower") for r in rows), {
        (r["metric"], r["better"]) for r in rows
    }
    doc = json.loads(to_json(run, series=True))
    db = d / DB_NAME
    (run_row,) = sql(db, "SELECT id, tag, started, ended, status, tunnelbench_version FROM run")
    assert (
        tuple(doc["run"][k] for k in ("id", "tag", "started", "ended", "status", "tunnelbench_version"))
        == run_row
    )
    assert doc["environment"]["kernel"] == "6.1-test" and doc["environment"]["cpu_count"] == "2"
    assert [tuple(v.values()) for v in doc["vpns"]] == sql(
        db, "SELECT name, version, status, reason FROM vpn"
    )
    cols = "id, vpn, profile, workload, label, params, repetition, attempt, status, error, client, server"
    cases = [
        dict(zip(cols.split(", "), r, strict=True)) for r in sql(db, f'SELECT {cols} FROM "case" ORDER BY id')
    ]
    for c in cases:
        c["params"] = json.loads(c["params"])
    assert sorted(doc["cases"], key=lambda c: c["id"]) == cases
    assert {c["status"] for c in doc["cases"]} == {"ok", "failed"}  # every case, the failed one too
    same_rows(Counter(map(export_key, doc["metrics"])), want, "JSON metrics")
    same_rows(Counter(map(series_key, doc["series"])), want_series, "JSON series")
    assert "series" not in json.loads(to_json(run))  # only when asked for


@pytest.mark.slow  # 4-8 s (the CLI or a report in a subprocess): out of the fast lane
def test_exports_from_the_cli(tmp_path):
    """`tunnelbench export` (JSON to stdout, CSV to a file) writes what the store holds."""
    d, want, _ = export_run(tmp_path)
    res = tb("export", str(d), "--format", "json")
    assert res.returncode == 0, res.stderr
    same_rows(Counter(map(export_key, json.loads(res.stdout)["metrics"])), want, "CLI JSON metrics")
    res = tb("export", str(d), "--out", str(tmp_path / "m.csv"))
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(io.StringIO((tmp_path / "m.csv").read_text())))
    assert tuple(rows[0]) == COLUMNS
    same_rows(Counter(map(export_key, rows)), want, "CLI CSV")


# -- a real small run in headless Chromium -----------------------------------------------------------------
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
                  tables: (() => {  // as a reader sees them: a collapsed table (All statistics) opened first
                    const closed = [...document.querySelectorAll('details:not([open])')];
                    closed.forEach(d => { d.open = true; });
                    const t = Object.fromEntries(['headline', 'stats', 'derived'].map(id => [id,
                      [...document.querySelectorAll(`#${id} table`)].map(t => [...t.rows].map(
                          r => [...r.cells].map(c => c.innerText.trim())))]));
                    closed.forEach(d => { d.open = false; });
                    return t;
                  })(),
                })"""
            )
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            ctx.close()
    info["console"] = msgs
    info["requests"] = requests
    return info


# REAL_RUN_SCENARIO's labels and the first headline metric of their workloads: the headline table's columns
HEADLINE_COLUMNS = {"tcp": "goodput_mbps", "tcp-p2": "goodput_mbps", "ping": "rtt_p50_ms"}


def assert_report_matches_store(tables: dict[str, list[list[list[str]]]], db: Path) -> None:
    """The numbers of the report as Chromium renders them (the headline, every row of All statistics, the
    parallel scaling and CPU efficiency tables) against results.sqlite: medians with statistics.median, means,
    SDs and percentiles with the statistics module, ratios of those medians, each within the rounding its
    shown digits allow."""
    samples = stored_samples(db)
    med = {k: statistics.median(v) for k, (_, v) in samples.items()}
    versions = dict(sql(db, "SELECT name, version FROM vpn WHERE status = 'ok'"))
    # the headline: a row per VPN, a column per workload, "median (tier, x internal)"
    ((head, *rows),) = tables["headline"]
    assert [h.split("\n")[0] for h in head[1:]] == list(HEADLINE_COLUMNS), head
    assert {r[0].split()[0] for r in rows} == set(versions) and len(rows) == len(versions), rows
    for row in rows:
        vpn = row[0].split()[0]
        assert versions[vpn].split(" (")[0] in row[0], (row[0], versions[vpn])
        for (label, metric), text in zip(HEADLINE_COLUMNS.items(), row[1:], strict=True):
            unit, _ = samples[(vpn, "baseline", label, metric)]
            want = med[(vpn, "baseline", label, metric)]
            m = re.match(rf"({NUMBER})(?: \((.*)\))?$", text)
            assert m, (vpn, label, text)
            assert_shown(m.group(1), want, f"headline {vpn} {label} {metric} median", unit)
            ratio = re.search(rf"({NUMBER})×", m.group(2) or "")
            if vpn == "internal":
                assert ratio is None, text
            else:
                base = med[("internal", "baseline", label, metric)]
                assert ratio, f"headline {vpn} {label}: no ratio to internal in {text!r}"
                assert_sig(ratio.group(1), want / base, 2, f"headline {vpn} {label} x internal")
    # All statistics: one row per stored (vpn, profile, label, metric), every statistic recomputed here
    ((head, *rows),) = tables["stats"]
    col = {h: i for i, h in enumerate(head)}
    seen = set()
    for row in rows:
        metric, unit = re.fullmatch(r"(\S+) \[(.*)\]", row[col["metric"]]).groups()  # type: ignore[union-attr]
        key = (row[col["VPN"]], row[col["profile"]], row[col["workload"]], metric)
        assert key in samples and key not in seen, key
        seen.add(key)
        unit_stored, v = samples[key]
        assert unit == unit_stored and int(row[col["n"]]) == len(v), (key, row)
        mean, sd = statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0
        q = statistics.quantiles(v, n=20, method="inclusive") if len(v) > 1 else [v[0]] * 19
        want = {
            "mean": mean,
            "median": med[key],
            "sd": sd,
            "p5": q[0],
            "p25": q[4],
            "p75": q[14],
            "p95": q[18],
        }
        for name, x in want.items():
            assert_shown(row[col[name]], x, f"statistics {key} {name}", unit)
        if mean:
            assert_shown(
                row[col["CV"]].removesuffix("%"), 100 * sd / abs(mean), f"statistics {key} CV", decimals=1
            )
        ratio = row[col["× internal"]]
        base = med.get(("internal", *key[1:]))
        if ratio:
            assert key[0] != "internal" and base, (key, ratio)
            assert_sig(ratio.split(" [")[0], med[key] / base, 3, f"statistics {key} x internal")
        elif key[0] != "internal" and metric in HEADLINE_COLUMNS.values():
            raise AssertionError(f"statistics {key}: no ratio to internal")
    assert seen == set(samples), set(samples) - seen
    # parallel scaling (median goodput of tcp-p2 / of tcp) and CPU efficiency (per case goodput per daemon
    # CPU-core of the client and server host, median over the cases)
    scaling, efficiency = ([r for r in t[1:]] for t in tables["derived"])
    want_scaling = {
        (vpn, "baseline", "tcp-p2"): (
            med[(vpn, "baseline", "tcp-p2", "goodput_mbps")] / med[(vpn, "baseline", "tcp", "goodput_mbps")],
            min(len(samples[(vpn, "baseline", lb, "goodput_mbps")][1]) for lb in ("tcp", "tcp-p2")),
        )
        for vpn in versions
    }
    per_case: dict[int, dict[str, float]] = defaultdict(dict)
    keys = {}
    for cid, vpn, profile, label, client, server, name, host, value in sql(
        db,
        "SELECT c.id, c.vpn, c.profile, c.label, c.client, c.server, m.name, m.host, m.value FROM metric m "
        "JOIN \"case\" c ON c.id = m.case_id WHERE c.status = 'ok' AND m.name IN ('goodput_mbps', 'daemon_cpu_pct')",
    ):
        keys[cid] = (vpn, profile, label)
        if name == "goodput_mbps" and host is None:
            per_case[cid]["goodput"] = value
        elif name == "daemon_cpu_pct" and host in (client, server):
            per_case[cid]["cpu"] = per_case[cid].get("cpu", 0.0) + value
    eff: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for cid, d in per_case.items():
        if "goodput" in d and d.get("cpu", 0) / 100 > 0.005:
            eff[keys[cid]].append(d["goodput"] / (d["cpu"] / 100))
    want_eff = {k: (statistics.median(v), len(v)) for k, v in eff.items()}
    assert set(want_eff) == {
        (vpn, "baseline", lb) for vpn in versions if vpn != "internal" for lb in ("tcp", "tcp-p2")
    }
    for what, table, wanted in (("scaling", scaling, want_scaling), ("efficiency", efficiency, want_eff)):
        got = {tuple(r[:3]): r for r in table}
        assert set(got) == set(wanted) and len(table) == len(wanted), (what, table)
        for key, (x, n) in wanted.items():
            assert_shown(got[key][3], x, f"{what} {key}")
            assert int(got[key][5]) == n, (what, key, got[key])


@pytest.mark.lab
@pytest.mark.slow
def test_report_of_a_real_run_in_headless_chromium(real_run):
    why = chromium_missing()
    if why:
        print(f"skipped: {why}")
        pytest.skip(why)
    _, run_dir = real_run  # conftest.REAL_RUN_SCENARIO; its run wrote a report too, `report` rewrites it
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
    # one VPN beside the no-VPN baseline: nothing to tier (VPNs are tiered among themselves; the baseline is the
    # reference); every ranking table says so
    assert info["tiers"] == 0, info["tiers"]
    assert html.count('<td class="l">internal</td><td><span class="muted">ref</span>') >= 5
    assert html.count('<td class="l">wireguard-go</td><td><span class="muted">–</span>') >= 5
    text = info["text"]
    for s in ("Overview: ranking per metric", "wireguard-go", "goodput_mbps", "rtt_p50_ms", "Parallel scaling factor",
              "CPU efficiency", "Environment, versions and calibration", "iperf 3"):  # fmt: skip
        assert s in text, s
    assert (ARTIFACTS / "report-real-run.png").stat().st_size > 50_000
    # the numbers shown against the store, and the real run's export row for row against it
    assert_report_matches_store(info["tables"], run_dir / DB_NAME)
    res = tb("export", str(run_dir))
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert {r["vpn"] for r in rows} == {"internal", "wireguard-go"} and {r["label"] for r in rows} >= {
        "tcp",
        "ping",
    }
    same_rows(
        Counter(map(export_key, rows)), Counter(sql(run_dir / DB_NAME, OK_METRICS)), "export of the real run"
    )


# -- per-peer plots read back out of the report's SVG ---------------------------------------------------------
SVG = "{http://www.w3.org/2000/svg}"


def _gid(el: ET.Element) -> str:
    return re.sub(r"^f\d+-", "", el.get("id", ""))  # plots.to_svg prefixes every id with the figure's


def _axis_map(axis: ET.Element, coord: str) -> tuple[float, float] | None:
    """(offset, scale) with value = offset + scale * pixel, from the tick marks' positions and their labels;
    None when the ticks carry no labels (a shared axis)."""
    ticks = []
    for tick in axis:
        label = "".join(t.text or "" for t in tick.iter(SVG + "text")).strip().replace("\u2212", "-")
        if re.fullmatch(r"[xy]tick_\d+", _gid(tick)) and label:
            ticks.append((float(next(tick.iter(SVG + "use")).get(coord, "nan")), float(label)))
    if len(ticks) < 2:
        return None
    (p0, v0), (p1, v1) = ticks[0], ticks[-1]
    scale = (v1 - v0) / (p1 - p0)
    for p, v in ticks:  # a linear axis without an offset label
        assert abs(v0 + (p - p0) * scale - v) <= 1e-6 * abs(v1 - v0), ticks
    return v0 - p0 * scale, scale


def svg_panels(svg: str) -> list[dict]:
    """Each panel of a matplotlib SVG: its title, and per legend label the points of its line in data units
    (the path's pixel coordinates mapped back through the ticks; a panel without y labels shares the y axis
    of the panel before it)."""
    panels = []
    ymap = None
    for ax in ET.fromstring(svg).iter(SVG + "g"):
        if not re.fullmatch(r"axes_\d+", _gid(ax)):
            continue
        axes = [g for g in ax if _gid(g).startswith("matplotlib.axis")]
        xmap, ymap = _axis_map(axes[0], "x"), _axis_map(axes[1], "y") or ymap
        assert xmap and ymap, "no tick labels to read the plot's scale from"
        lines = []
        for g in ax:
            if re.fullmatch(r"line2d_\d+", _gid(g)):
                d = next(g.iter(SVG + "path")).get("d", "")
                pts = [(float(x), float(y)) for x, y in re.findall(r"[ML] (-?[\d.]+) (-?[\d.]+)", d)]
                lines.append([(xmap[0] + xmap[1] * x, ymap[0] + ymap[1] * y) for x, y in pts])
        (legend,) = [g for g in ax if re.fullmatch(r"legend_\d+", _gid(g))]
        labels = [t.text for t in legend.iter(SVG + "text")]
        titles = [t.text for g in ax if re.fullmatch(r"text_\d+", _gid(g)) for t in g.iter(SVG + "text")]
        assert len(labels) == len(lines), (labels, len(lines))
        # a coordinate is written with 6 decimals: half a unit of that, on the pixel and on two ticks
        tol = 2e-6 * max(abs(xmap[1]), abs(ymap[1]))
        panels.append({"title": titles[-1], "lines": dict(zip(labels, lines, strict=True)), "tol": tol})
    return panels


def per_peer_input(vpn: str, rep: int, attempt: int) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """The hand-made per-peer goodput of one case: direction -> peer -> [(t, Mbit/s)], different for every
    peer, time, direction, VPN, repetition and attempt (vpnB stores no rx)."""
    off = 9 * rep + 31 * attempt + (45 if vpn == "vpnB" else 0)
    return {
        d: {
            peer: [
                (t, 100.0 * (k + 1) + 12.5 * t * (3 - k) + off - (40 if d == "rx" else 0))
                for t in (0.5, 1, 2, 3.5)
            ]
            for k, peer in enumerate(("h2", "h3", "h4"))
        }
        for d in (("tx", "rx") if vpn == "vpnA" else ("tx",))
    }


@pytest.mark.slow  # a full report with matplotlib, ~1 s
def test_per_peer_plot_values_are_the_stored_ones(tmp_path):
    """The report's per-peer goodput plots, read back from their SVG, draw each VPN's first successful
    repetition: every peer's points, per direction, are the hand-made series of that case, and the title names
    that case's repetition and stored fairness."""
    cases = [("vpnA", 1, 0, "ok", 0.875), ("vpnA", 2, 0, "ok", 0.5), ("vpnB", 1, 0, "failed", 0.25),
             ("vpnB", 1, 1, "ok", 0.625), ("vpnB", 2, 0, "ok", 0.375)]  # fmt: skip
    with hand_store(tmp_path, vpns=("vpnA", "vpnB")) as (st, run_dir):
        for vpn, rep, attempt, status, fair in cases:
            adir = run_dir / "cases" / vpn / f"r{rep}a{attempt}"
            adir.mkdir(parents=True)
            cid = st.start_case("r1", vpn, "baseline", "multihost", "mh", {}, rep, attempt, "h1", "h2", adir)
            out = Outcome(
                [Sample("stream_fairness", fair, "ratio"), Sample("aggregate_goodput_mbps", 600, "Mbit/s")]
            )
            for d, peers in per_peer_input(vpn, rep, attempt).items():
                out.series += [
                    Series(f"{d}_goodput_mbps", "Mbit/s", pts, peer) for peer, pts in peers.items()
                ]
            st.finish_case(cid, status, out)
    html = render_report(Reading.of(analyze([load_run(run_dir)])))
    svgs = [m for m in re.findall(r"<svg\b.*?</svg>", html, re.S) if "per-peer goodput" in m]
    titles = {"tx": "from the one host to each peer", "rx": "from each peer into the one host"}
    assert len(svgs) == 2
    for svg, (vpn, rep, attempt, fair) in zip(
        svgs, [("vpnA", 1, 0, 0.875), ("vpnB", 1, 1, 0.625)], strict=True
    ):
        assert f"{vpn} · mh · baseline · repetition {rep}: per-peer goodput (Jain fairness {fair:.3f})" in svg
        want = per_peer_input(vpn, rep, attempt)
        panels = svg_panels(svg)
        assert [p["title"] for p in panels] == [titles[d] for d in want], (vpn, [p["title"] for p in panels])
        for panel, (d, peers) in zip(panels, want.items(), strict=True):
            assert list(panel["lines"]) == list(peers), (vpn, d, list(panel["lines"]))
            for peer, pts in peers.items():
                got = panel["lines"][peer]
                assert len(got) == len(pts) and all(
                    abs(gt - t) <= panel["tol"] and abs(gv - v) <= panel["tol"]
                    for (gt, gv), (t, v) in zip(got, pts, strict=True)
                ), f"{vpn} {d} {peer}: plotted {[(round(t, 4), round(v, 4)) for t, v in got]}, stored {pts}"


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
