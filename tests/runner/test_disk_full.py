"""A run whose results disk fills up mid-run: the lab is torn down, the cases stored before are kept, the exit
code says some are missing, and --resume (after space is freed) measures the rest. The disk is a small tmpfs
of the test's own; it is filled by the test when the first case has been logged."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest
from conftest import lab_missing, ping_scenario, tb
from leftovers import lab_state, left_behind

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture
def small_disk(tmp_path):
    why = lab_missing()
    if why:
        pytest.skip(why)
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tbdiskfull", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_results_disk_mid_run_keeps_what_was_measured_and_resume_finishes(small_disk, tmp_path):
    scen = tmp_path / "s.toml"
    scen.write_text(ping_scenario("diskfull", ["internal"], repetitions=4))
    before = lab_state()
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tunnelbench.cli",
            "run",
            str(scen),
            "--no-html",
            "--results",
            str(small_disk),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert p.stdout is not None
    out = []
    for line in p.stdout:
        out.append(line)
        if line.startswith("[1/4] internal"):  # the first case is stored: fill the disk
            subprocess.run(["dd", "if=/dev/zero", f"of={small_disk}/fill", "bs=64k"], capture_output=True)
            break
    out += p.stdout.readlines()
    text = "".join(out)
    assert p.wait(120) == 1, text
    assert "run stopped: the results disk is full" in text and "Traceback" not in text, text
    assert "exit 1: " in text.splitlines()[-1], text
    (run_dir,) = [d for d in small_disk.iterdir() if d.is_dir()]
    # nothing of the lab is left, and the run is no longer registered
    assert left_behind(before, lab_state()) == {}, text
    (small_disk / "fill").unlink()
    db = sqlite3.connect(run_dir / "results.sqlite")
    ok = db.execute("SELECT repetition FROM \"case\" WHERE status = 'ok'").fetchall()
    rtts = db.execute("SELECT COUNT(*) FROM metric WHERE name = 'rtt_p50_ms'").fetchone()[0]
    db.close()
    assert (1,) in ok and 1 <= len(ok) < 4 and rtts >= len(ok), (ok, text)
    # space again: resume measures the missing repetitions only, and the run is complete
    res = tb("run", "--resume", str(run_dir), "--no-html", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    db = sqlite3.connect(run_dir / "results.sqlite")
    reps = sorted(r for (r,) in db.execute("SELECT repetition FROM \"case\" WHERE status = 'ok'"))
    db.close()
    assert reps == [1, 2, 3, 4], reps
