"""Seed 001's many-clients curve in the report (issue 15 item 7): per VPN and N, response p25/p50/p75 and the
failure rate, medians over repetitions; a case that failed outright (no call made: the mesh did not come up)
counts as 100% failed calls, and a retried attempt counts only by its final attempt. Known answers from a
hand-made store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tb
from synthetic_runs import hand_store

from tunnelbench.analysis.analyze import analyze, load_run
from tunnelbench.core.results import Outcome, Sample
from tunnelbench.report import full
from tunnelbench.report.reading import Reading
from tunnelbench.store import DB_NAME

# N -> per repetition: (p25, p50, p75, failure %) or None for a failed case
CASES = {
    5: [(10, 12, 15, 0.0), (11, 13, 17, 0.0), (9, 14, 16, 0.0)],
    100: [(20, 40, 80, 2.0), (30, 50, 90, 4.0), None],
    500: [None, None, None],
}


def make_store(root: Path) -> Path:
    run = "r1"
    with hand_store(root) as (st, run_dir):
        for n, reps in CASES.items():
            for k, got in enumerate(reps, start=1):
                adir = run_dir / "cases" / f"n{n}" / f"r{k}"
                adir.mkdir(parents=True)
                params = {"clients": n}
                if got is None:
                    cid = st.start_case(
                        run,
                        "vpnA",
                        "baseline",
                        "many_clients",
                        f"many-clients-n{n}",
                        params,
                        k,
                        0,
                        "h1",
                        "h2",
                        adir,
                    )
                    st.finish_case(cid, "failed", error="MeshNotReady: pairs not answering")
                    continue
                if n == 100 and k == 1:  # a first attempt that failed and was retried: only the retry counts
                    cid = st.start_case(
                        run,
                        "vpnA",
                        "baseline",
                        "many_clients",
                        f"many-clients-n{n}",
                        params,
                        k,
                        0,
                        "h1",
                        "h2",
                        adir,
                    )
                    st.finish_case(cid, "failed", error="WorkloadError: load generator failed")
                p25, p50, p75, fail = got
                out = Outcome(
                    samples=[
                        Sample("response_p25_ms", p25, "ms"),
                        Sample("response_p50_ms", p50, "ms"),
                        Sample("response_p75_ms", p75, "ms"),
                        Sample("failure_rate_pct", fail, "%"),
                    ]
                )
                cid = st.start_case(
                    run,
                    "vpnA",
                    "baseline",
                    "many_clients",
                    f"many-clients-n{n}",
                    params,
                    k,
                    1 if n == 100 and k == 1 else 0,
                    "h1",
                    "h2",
                    adir,
                )
                st.finish_case(cid, "ok", out)
    return run_dir


@pytest.mark.slow  # 3-4 s: out of the fast lane
def test_clients_points_and_the_curve(tmp_path):
    a = analyze([load_run(make_store(tmp_path))])
    pts = full.clients_points(a, "baseline")["vpnA"]
    assert sorted(pts) == [5, 100, 500]
    assert pts[5]["p50"] == [12, 13, 14] and pts[5]["fail"] == [0, 0, 0] and "failed_cases" not in pts[5]
    # N = 100: two measured repetitions (the retried one by its final attempt) and one failed case at 100%
    assert sorted(pts[100]["p50"]) == [40, 50] and sorted(pts[100]["fail"]) == [2, 4, 100]
    assert pts[100]["failed_cases"] == [1]
    assert pts[500]["fail"] == [100, 100, 100] and "p50" not in pts[500]  # the mesh never came up: measured
    ctx = full.build_context(Reading.of(a))
    (svg,) = ctx["clients"]
    assert "many clients · baseline" in svg and "clients N (log scale)" in svg and "failed calls [%]" in svg
    assert '<section id="clients">' in full.render_report(Reading.of(a))


SCENARIO = """name = "degradation"
[impair.profiles.loss-50]
loss_pct = 50
[impair.profiles.loss-100]
loss_pct = 100
[impair.profiles.delay-1000]
delay_ms = 1000
[impair.profiles.mixed]
delay_ms = 10
loss_pct = 1
"""
# profile -> (failure %, p50) of the one repetition at N = 100, None = the mesh did not come up (a failed case)
DEGRADED = {
    "baseline": (0.0, 5.0),
    "loss-50": (30.0, 900.0),
    "loss-100": None,
    "delay-1000": (1.0, 2010.0),
    "mixed": (2.0, 30.0),
}


@pytest.mark.slow  # 4-8 s (the CLI or a report in a subprocess): out of the fast lane
def test_degradation_points_put_loss_and_delay_profiles_on_their_axes(tmp_path):
    with hand_store(tmp_path, scenario=SCENARIO) as (st, run_dir):
        for profile, got in DEGRADED.items():
            params = {"clients": 100}
            if (
                got is None
            ):  # [run] unreachable = "fail": the runner records the case as failed, params and all
                st.record_failure(
                    "r1",
                    "vpnA",
                    profile,
                    "many_clients",
                    "many-clients-n100",
                    params,
                    1,
                    "MeshNotReady: mesh not answering under profile loss-100",
                )
                continue
            adir = run_dir / profile
            adir.mkdir()
            cid = st.start_case(
                "r1", "vpnA", profile, "many_clients", "many-clients-n100", params, 1, 0, "h1", "h2", adir
            )
            st.finish_case(
                cid,
                "ok",
                Outcome(
                    samples=[Sample("failure_rate_pct", got[0], "%"), Sample("response_p50_ms", got[1], "ms")]
                ),
            )
    a = analyze([load_run(run_dir)])
    pts = full.degradation_points(a)
    assert set(pts) == {"loss_pct", "delay_ms"}  # "mixed" (loss and delay) is on neither axis
    loss = pts["loss_pct"]["vpnA"]
    assert sorted(loss) == [0.0, 50.0, 100.0]
    assert loss[50.0] == {"fail": [30.0], "p50": [900.0]} and loss[100.0] == {"fail": [100.0], "p50": []}
    assert pts["delay_ms"]["vpnA"] == {
        0.0: {"fail": [0.0], "p50": [5.0]},
        1000.0: {"fail": [1.0], "p50": [2010.0]},
    }
    svgs = full.build_context(Reading.of(a))["clients"]
    assert any("packet loss [%]" in s and "one-way delay [ms]" in s for s in svgs)


UNREACHABLE = """
name = "unreachable"
vpns = ["internal"]
profiles = ["baseline", "xloss-100"]
[run]
repetitions = 2
retries = 0
tunnel_timeout_s = 2
drift_check_s = 0
unreachable = "{mode}"
[impair]
calibrate = false  # what is measured here is the runner's answer to a dead mesh, not the profile (23 s)
tax_check_s = 0
[lab]
hosts = 2
[[workloads]]
name = "ping"
count = 3
interval_s = 0.05
"""


@pytest.mark.lab
@pytest.mark.parametrize("mode", ["fail", pytest.param("skip", marks=pytest.mark.long)])  # skip: 30 s, --long
def test_a_profile_that_breaks_the_mesh_is_measured_as_failures_or_skipped(tmp_path, mode):
    """Under 100% loss no pair answers: with unreachable = "fail" each repetition is a failed case carrying
    its workload's parameters (what the degradation figure counts as 100% failed); with "skip" one skip."""
    import sqlite3

    from conftest import lab_missing

    if lab_missing():
        pytest.skip(lab_missing())
    (tmp_path / "s.toml").write_text(UNREACHABLE.format(mode=mode))
    res = tb("run", str(tmp_path / "s.toml"), "--results", str(tmp_path / "r"), "--no-html", timeout=600)
    (run_dir,) = (tmp_path / "r").iterdir()
    db = sqlite3.connect(run_dir / DB_NAME)
    rows = db.execute('SELECT profile, status, repetition, params, error FROM "case" ORDER BY id').fetchall()
    base = [r for r in rows if r[0] == "baseline"]
    lossy = [r for r in rows if r[0] == "xloss-100"]
    assert [r[1] for r in base] == ["ok", "ok"], res.stderr[-2000:]
    if mode == "fail":
        assert sorted((r[1], r[2]) for r in lossy) == [("failed", 1), ("failed", 2)], rows
        assert all(r[4].startswith("MeshNotReady: mesh not answering under profile xloss-100") for r in lossy)
        assert all(json.loads(r[3])["count"] == 3 for r in lossy)  # the workload's own parameters
    else:
        assert [r[1] for r in lossy] == ["skipped"] * len(lossy) and lossy, rows


MEASURE = """
name = "measure"
vpns = ["wireguard-go"]
profiles = ["baseline", "xloss-100"]
[run]
repetitions = 1
retries = 0
tunnel_timeout_s = 2
drift_check_s = 0
unreachable = "measure"
[lab]
hosts = 3
topology = "star"
[impair]
tax_check_s = 0
[[workloads]]
name = "many_clients"
clients = 2
duration_s = 2
interval_s = 0.25
timeout_s = 1
"""


@pytest.mark.lab
@pytest.mark.long  # 28 s; the same unreachable profile's "fail" mode above runs in CI
def test_measure_runs_the_clients_under_a_profile_no_probe_gets_through(tmp_path):
    """unreachable = "measure" (Goethals et al. applied netem to a running deployment): under 100% loss the
    probes never answer, yet the case runs on the tunnels already up and its calls are what fails: every call
    a timeout, case status ok. The shortfall is on record."""
    import sqlite3

    from conftest import lab_missing

    if lab_missing():
        pytest.skip(lab_missing())
    (tmp_path / "s.toml").write_text(MEASURE)
    res = tb("run", str(tmp_path / "s.toml"), "--results", str(tmp_path / "r"), "--no-html", timeout=600)
    (run_dir,) = (tmp_path / "r").iterdir()
    db = sqlite3.connect(run_dir / DB_NAME)
    rows = dict(db.execute('SELECT profile, status || ": " || coalesce(error, "") FROM "case"').fetchall())
    assert rows == {"baseline": "ok: ", "xloss-100": "ok: "}, (rows, res.stdout[-2000:], res.stderr[-2000:])
    m = {
        (p, n): v
        for p, n, v in db.execute(
            'SELECT c.profile, m.name, m.value FROM metric m JOIN "case" c ON c.id = m.case_id WHERE m.host IS NULL'
        )
    }
    assert m[("baseline", "failure_rate_pct")] == 0
    assert m[("xloss-100", "failure_rate_pct")] == 100
    # a client calls again only after its last call ended: each 1 s timeout holds it, 2 calls per client in 2 s
    assert 4 <= m[("xloss-100", "calls")] <= 6, m
    assert m[("xloss-100", "timeouts")] == m[("xloss-100", "calls")]
    env = dict(db.execute("SELECT key, value FROM environment WHERE key LIKE 'unreachable.%'").fetchall())
    assert json.loads(env["unreachable.wireguard-go.xloss-100"]) == {"never_answered": 2, "pairs": 2}
    assert "never answered a probe" in res.stdout + res.stderr


CAPPED = """
name = "capped"
vpns = ["wireguard-go"]
profiles = ["baseline"]
[run]
repetitions = 1
retries = 0
drift_check_s = 0
[lab]
hosts = 4
topology = "star"
hosts_per_vpn = {"wireguard-go" = 3}
[[workloads]]
name = "many_clients"
clients = 2
duration_s = 2
[[workloads]]
name = "many_clients"
clients = 3
duration_s = 2
"""


@pytest.mark.lab
def test_hosts_per_vpn_runs_the_vpn_on_the_first_hosts_and_skips_larger_n(tmp_path):
    """lab.hosts_per_vpn = 3 on a 4-host lab: wireguard-go's daemons run on h1..h3 only (h4 gets no folder
    and no daemon in the journal), N = 2 is measured, N = 3 is n/a with the reason (and the run exits 0)."""
    import sqlite3

    from conftest import lab_missing

    if lab_missing():
        pytest.skip(lab_missing())
    (tmp_path / "s.toml").write_text(CAPPED)
    res = tb("run", str(tmp_path / "s.toml"), "--results", str(tmp_path / "r"), "--no-html", timeout=600)
    (run_dir,) = (tmp_path / "r").iterdir()
    db = sqlite3.connect(run_dir / DB_NAME)
    rows = dict(db.execute('SELECT label, status || ": " || coalesce(error, "") FROM "case"').fetchall())
    assert rows["many-clients-n2"] == "ok: ", (rows, res.stderr[-2000:])
    assert rows["many-clients-n3"].startswith("n/a: wireguard-go runs on 3 hosts in this scenario"), rows
    assert res.returncode == 0, res.stderr[-2000:]  # a case that does not apply is answered, not missing
    # the server answers two clients: no client-server pair path to confirm, so no path share is recorded
    path = db.execute("SELECT count(*) FROM metric WHERE name LIKE 'path_%'").fetchone()[0]
    assert path == 0
    (settings,) = db.execute("SELECT settings FROM vpn WHERE name = 'wireguard-go'").fetchone()
    assert json.loads(settings)["mesh_hosts"] == 3
    spawned = [
        line for line in (run_dir / "journal.jsonl").read_text().splitlines() if "wireguard-go" in line
    ]
    assert any('"h3"' in line for line in spawned) and not any('"h4"' in line for line in spawned), spawned
    dirs = sorted(p.parent.name for p in run_dir.rglob("wireguard-go") if p.is_dir())
    assert "h3" in dirs and "h4" not in dirs, dirs
