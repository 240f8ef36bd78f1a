"""A busy machine during a run: planted busy processes outside the lab (pinned to the lab's CPUs) run during
exactly one case; that case is seen as disturbed, measured again once the machine is quiet, and the
headline names the process. With the guard off ([interference] mode = "off") the same run keeps the disturbed
value as if nothing happened, which this test would not accept."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_run_e2e import wait_for_running

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SCENARIO = """
name = "busy"
vpns = ["internal"]
[run]
repetitions = 3
drift_check_s = 0
[lab]
hosts = 2
[[workloads]]
name = "tcp"
duration_s = 3
omit_s = 0
[interference]
mode = "{mode}"
quiet_wait_s = 20
# above what a quiet test machine's own background takes, well below what the planted load takes (each busy
# process shares its CPU with the lab's iperf3 and kernel work: about a quarter of the lab's CPUs each)
max_taken_pct = 15
"""


def _case_ended(db: Path, rep: int) -> bool:
    c = sqlite3.connect(db, timeout=5)
    try:
        rows = c.execute('SELECT status FROM "case" WHERE repetition=? ORDER BY id', (rep,)).fetchall()
    finally:
        c.close()
    return bool(rows) and rows[0][0] != "running"


def run_with_a_busy_case(tmp_path: Path, mode: str = "remeasure") -> tuple[str, Path]:
    """The run's output and folder; busy processes named tbbusy run during repetition 2's first attempt."""
    scen = tmp_path / "s.toml"
    scen.write_text(SCENARIO.format(mode=mode))
    results = tmp_path / "results"
    busy = tmp_path / "tbbusy"
    busy.symlink_to(shutil.which("yes") or "/usr/bin/yes")  # its name in /proc is the one it was run by
    p = subprocess.Popen(
        [sys.executable, "-m", "tunnelbench.cli", "run", str(scen), "--results", str(results), "--no-html"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    pids: list[int] = []
    try:
        run_dir = wait_for_running(results, "internal", "tcp", 2, timeout=180)
        # one on each of the lab's CPUs; not a child of the run (the shell that started it has exited), nor in
        # a namespace of the lab
        for cpu in (0, 1):
            pids.append(
                int(
                    subprocess.run(
                        ["sh", "-c", f"taskset -c {cpu} {busy} >/dev/null 2>&1 & echo $!"],
                        capture_output=True,
                        text=True,
                        check=True,
                    ).stdout
                )
            )
        end = time.monotonic() + 60
        while not _case_ended(run_dir / "results.sqlite", 2) and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out[-3000:]
    return out, run_dir


def test_the_disturbed_case_is_measured_again_and_the_headline_names_the_process(tmp_path):
    out, run_dir = run_with_a_busy_case(tmp_path)
    db = sqlite3.connect(run_dir / "results.sqlite")
    rows = db.execute(
        'SELECT attempt, status, error FROM "case" WHERE repetition=2 ORDER BY attempt'
    ).fetchall()
    assert rows[0][1] == "disturbed" and "tbbusy" in rows[0][2], rows
    assert rows[-1][1] == "ok", rows  # measured again once the machine was quiet
    (taken,) = db.execute(
        'SELECT m.value FROM metric m JOIN "case" c ON c.id = m.case_id WHERE c.repetition=2 AND c.attempt=? '
        "AND m.name='interference_pct'",
        (rows[0][0],),
    ).fetchone()
    assert taken >= 15, taken
    tally = json.loads(dict(db.execute("SELECT key, value FROM environment").fetchall())["interference"])
    assert tally["disturbed"] >= 1 and tally["remeasured"] >= 1 and "tbbusy" in tally["top_s"]
    line = next(x for x in out.splitlines() if "machine busy:" in x)
    assert "tbbusy" in line and "measured again when quiet" in line, out[-3000:]
