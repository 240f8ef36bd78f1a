"""scripts/setup.sh on a set-up machine: one line per step with its outcome and duration, nothing of what
apt, pip, go or cargo print (that goes to the log it names, which holds every step's section)."""

from __future__ import annotations

import re
import subprocess

import pytest
from tree import ROOT

pytestmark = pytest.mark.root


def test_setup_prints_one_line_per_step_and_logs_the_rest(tmp_path):
    res = subprocess.run(
        ["bash", "scripts/setup.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env={
            "PATH": "/usr/local/bin:/usr/bin:/bin:/root/.cargo/bin:/usr/local/go/bin",
            "HOME": "/root",
            "TB_SETUP_LOG_DIR": str(tmp_path),
        },
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    steps = lines[:-1]
    assert [x.split(":")[1].strip() for x in steps[:3]] == [
        "Debian packages",
        "Python environment (.venv)",
        "hey v0.1.5",
    ], lines
    assert all(re.fullmatch(r"setup: [^:]+: .+ \(\d+ s\)", x) for x in steps), lines
    (log,) = tmp_path.glob("setup-*.log")
    assert lines[-1].startswith("setup: done in ") and lines[-1].endswith(f"log: {log}"), lines
    sections = [x for x in log.read_text().splitlines() if x.startswith("== ")]
    assert len(sections) == len(steps), (sections, steps)
