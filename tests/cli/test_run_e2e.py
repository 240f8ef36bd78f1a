"""The CLI end to end: a small real run, then runs killed mid-case (SIGKILL + clean, SIGTERM)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import tb

from tunnelbench.lab.journaling import process_alive
from tunnelbench.lab.netns import netns_exists

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SCENARIO = """
name = "e2e"
vpns = ["internal", "wireguard-go"]
[run]
repetitions = {reps}
# block order: the kill tests wait for the second VPN's first case, by which time every case of the first
# VPN must be stored (tests/runner/test_fidelity.py covers the interleaved default)
order = "block"
drift_check_s = 0
[lab]
hosts = 2
[[workloads]]
name = "tcp"
duration_s = {dur}
omit_s = 0
[[workloads]]
name = "ping"
count = 20
interval_s = 0.01
"""


def start(tmp_path: Path, reps: int, dur: float) -> tuple[subprocess.Popen, Path]:
    scen = tmp_path / "s.toml"
    # no drift reference (2 s per round before the case the test waits for): tests/runner/test_fidelity.py checks it
    scen.write_text(SCENARIO.format(reps=reps, dur=dur))
    results = tmp_path / "results"
    # SIGINT at its default in the run: a test command started in the background (`cmd &`, nohup) passes SIGINT
    # ignored to everything it starts, and a Python started so keeps ignoring it (no KeyboardInterrupt): the
    # SIGINT test then saw a run that finished with exit 0, as a user's Ctrl-C would not
    p = subprocess.Popen([sys.executable, "-m", "tunnelbench.cli", "run", str(scen), "--results", str(results)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    return p, results


def wait_for_running(results: Path, vpn: str, workload: str, rep: int, timeout: float = 120) -> Path:
    """The run folder, once the given case has started (its row says running): a signal sent now lands inside
    it. A case the poll never saw running (the run went past it) fails the test with that reason."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for db in results.glob("*/results.sqlite"):
            try:
                c = sqlite3.connect(db, timeout=5)
                got = c.execute(
                    'SELECT status FROM "case" WHERE vpn=? AND workload=? AND repetition=?',
                    (vpn, workload, rep),
                ).fetchall()
                c.close()
            except sqlite3.Error:
                continue
            if ("running",) in got:
                return db.parent
            if got:
                raise AssertionError(
                    f"{vpn} {workload} rep {rep} ended ({got}) before the poll saw it running"
                )
        time.sleep(0.05)
    raise AssertionError(f"{vpn} {workload} rep {rep} did not start within {timeout} s")


def journal_state(run_dir: Path) -> tuple[list[str], list[dict]]:
    entries = [json.loads(x) for x in (run_dir / "journal.jsonl").read_text().splitlines() if x.strip()]
    return [e["name"] for e in entries if e["kind"] == "netns"], [
        e for e in entries if e["kind"] == "process"
    ]


def test_small_run_prints_summary_and_stores_everything(real_run):
    # conftest.REAL_RUN_SCENARIO: 2 VPNs x 3 labels x 3 rounds, the default's drift check
    res, run_dir = real_run
    # the headline: a row per VPN, a column per workload (tcp goodput, ping rtt_p50), within 120 columns
    lines = res.stdout.splitlines()
    assert lines[0].startswith("headline"), res.stdout
    assert "goodput Mbit/s" in res.stdout and "rtt_p50 ms" in res.stdout, res.stdout
    assert any(x.startswith("│ wireguard-go ") for x in lines), res.stdout
    assert max(len(x) for x in lines) <= 120, res.stdout
    assert "goodput_mbps" not in res.stdout  # the per-metric table is in `report --full`
    db = sqlite3.connect(run_dir / "results.sqlite")
    assert db.execute("SELECT status FROM run").fetchone()[0] == "ok"
    # an attempt set aside because something outside the lab disturbed it is stored as `disturbed`
    statuses = db.execute("SELECT vpn, workload, status FROM \"case\" WHERE status != 'disturbed'").fetchall()
    assert len(statuses) == 2 * 3 * 3 and all(s == "ok" for *_, s in statuses)
    env = dict(db.execute("SELECT key, value FROM environment").fetchall())
    assert env["sysctl.net.ipv4.tcp_congestion_control"] and env["kernel"] and "iperf 3" in env["tool.iperf3"]
    assert db.execute("SELECT version FROM vpn WHERE name='wireguard-go'").fetchone()[0]
    cpu = db.execute("SELECT COUNT(*) FROM metric WHERE name='daemon_cpu_pct'").fetchone()[0]
    assert cpu >= 2 * 3 * 3  # both hosts' daemon, every wireguard-go case
    assert list(run_dir.glob("cases/wireguard-go/baseline/tcp/r1a0/tcp-client.json"))
    html = (run_dir / "report.html").read_text()
    assert "wireguard-go" in html and "goodput_mbps" in html
    netns, procs = journal_state(run_dir)
    assert netns and not any(netns_exists(n) for n in netns)
    assert all(not process_alive(p["pid"], p["start"]) for p in procs)
    rep = tb("report", "--full", str(run_dir), columns=200)
    assert rep.returncode == 0 and "goodput_mbps" in rep.stdout and "retransmit_rate" in rep.stdout


# block order, 2 repetitions of (tcp, ping): every internal case, then wireguard-go's tcp and ping of
# repetition 1. The kill tests wait for exactly these and signal 0.5 s into wireguard-go's tcp of repetition 2
# (a 3 s case): exactly these are ok afterwards, the case cut short is not
REPS = 2
CUT_CASE_S = 3  # the tcp case the signal cuts (the signal is sent 0.5 s after the case started)
SURVIVORS = sorted(
    [("internal", w, r) for r in range(1, REPS + 1) for w in ("tcp", "ping")]
    + [("wireguard-go", "tcp", 1), ("wireguard-go", "ping", 1)]
)


def check_survivors(run_dir: Path) -> None:
    db = sqlite3.connect(run_dir / "results.sqlite")
    try:
        ok = db.execute("SELECT vpn, workload, repetition FROM \"case\" WHERE status='ok'").fetchall()
        cut = db.execute(
            "SELECT status FROM \"case\" WHERE vpn='wireguard-go' AND workload='tcp' AND repetition=2"
        ).fetchall()
    finally:
        db.close()
    assert sorted(ok) == SURVIVORS, ok
    assert len(cut) == 1 and cut[0][0] != "ok", cut


def test_sigkill_mid_case_then_clean_leaves_nothing_and_keeps_results(tmp_path):
    p, results = start(tmp_path, reps=REPS, dur=CUT_CASE_S)
    try:
        run_dir = wait_for_running(results, "wireguard-go", "tcp", 2)
        time.sleep(0.5)  # inside wireguard-go's tcp of repetition 2, its tool running
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    netns, procs = journal_state(run_dir)
    assert any(netns_exists(n) for n in netns), "the killed run should have left its lab behind"
    alive_before = [e for e in procs if process_alive(e["pid"], e["start"])]
    assert alive_before, "wireguard-go daemons should still run after SIGKILL"
    res = tb("clean")
    assert res.returncode == 0, res.stdout + res.stderr
    assert not any(netns_exists(n) for n in netns)
    assert not [e for e in procs if process_alive(e["pid"], e["start"])]
    assert not list(Path("/var/run/wireguard").glob(f"{run_dir.name.split('-')[-1]}*"))
    check_survivors(run_dir)
    # the run is unregistered: a second clean has nothing of it left to do
    from tunnelbench.lab.journal import REGISTRY

    assert not (REGISTRY / run_dir.name).exists()
    assert run_dir.name not in tb("clean").stdout


# SIGTERM takes the same path as SIGINT (the handler raises Interrupted; 30 s each): --long runs it
@pytest.mark.parametrize(
    "sig",
    [pytest.param(signal.SIGTERM, marks=pytest.mark.long), signal.SIGINT],
    ids=["SIGTERM", "SIGINT"],
)
def test_signal_tears_down_and_keeps_finished_cases(tmp_path, sig):
    p, results = start(tmp_path, reps=REPS, dur=CUT_CASE_S)
    run_dir = wait_for_running(results, "wireguard-go", "tcp", 2)
    time.sleep(0.5)  # inside wireguard-go's tcp of repetition 2, its tool running
    p.send_signal(sig)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 130, out
    netns, procs = journal_state(run_dir)
    assert not any(netns_exists(n) for n in netns)
    assert not [e for e in procs if process_alive(e["pid"], e["start"])]
    db = sqlite3.connect(run_dir / "results.sqlite")
    assert db.execute("SELECT status FROM run").fetchone()[0] == "interrupted"
    check_survivors(run_dir)
    assert "goodput Mbit/s" in out  # the headline of what was measured is still printed


ADAPTIVE = """
name = "adaptive"
vpns = ["internal"]
[run]
repetitions = 2
max_repetitions = 6
target_ci_pct = {target}
drift_check_s = 0
[lab]
hosts = 2
# TCP goodput, not ping: ping's 3-decimal RTTs can repeat exactly, and two equal values have a zero-width
# CI, which meets any goal and stopped the "impossible goal" case early
[[workloads]]
name = "tcp"
duration_s = 1
omit_s = 0
"""


@pytest.mark.parametrize("target,expected", [(100.0, 2), (1e-6, 6)])
def test_adaptive_repetitions_stop_at_the_precision_goal_or_the_cap(tmp_path, target, expected):
    """A loose goal is met by the fixed repetitions; an impossible one runs to max_repetitions."""
    from conftest import lab_missing

    if lab_missing():
        pytest.skip(lab_missing())
    scen = tmp_path / "s.toml"
    scen.write_text(ADAPTIVE.format(target=target))
    r = tb("run", str(scen), "--results", str(tmp_path / "results"), "--no-html")
    assert r.returncode == 0, r.stdout + r.stderr
    (db,) = (tmp_path / "results").glob("*/results.sqlite")
    reps = (
        sqlite3.connect(db)
        .execute("SELECT repetition FROM \"case\" WHERE status='ok' ORDER BY id")
        .fetchall()
    )
    assert [x for (x,) in reps] == list(range(1, expected + 1))


RELATIVE = """
name = "relative-results"
vpns = ["fastd", "strongswan"]
[run]
repetitions = 1
[lab]
hosts = 2
[[workloads]]
name = "ping"
count = 10
interval_s = 0.01
"""


def test_relative_results_folder_works_for_daemons_that_resolve_paths_themselves(tmp_path):
    """`--results results` (the default, relative to the cwd): fastd resolves its includes against its config
    folder and swanctl runs in its own mount namespace; both failed with a relative run folder."""
    from conftest import lab_missing

    from tunnelbench.catalog import DRIVERS

    if lab_missing():
        pytest.skip(lab_missing())
    missing = [v for v in ("fastd", "strongswan") if not DRIVERS[v].availability().ok]
    assert not missing, f"scripts/setup.sh installs these: {missing}"
    (tmp_path / "s.toml").write_text(RELATIVE)
    r = tb("run", "s.toml", "--results", "results", "--no-html", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (db,) = (tmp_path / "results").glob("*/results.sqlite")
    rows = sqlite3.connect(db).execute('SELECT vpn, status FROM "case"').fetchall()
    assert sorted(rows) == [("fastd", "ok"), ("strongswan", "ok")], rows
