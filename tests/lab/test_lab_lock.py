"""One lab per machine (lab/lock.py): a second holder is refused with the first one named; the kernel drops
the lock when its holder dies, SIGKILL included; a refused `run` exits 2 and writes nothing. References: the
lock file's contents, PIDs of processes this test started, the results folder on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import tb

from tunnelbench.lab import journal
from tunnelbench.lab.lock import LabBusy, LabLock


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "REGISTRY", tmp_path / "registry")
    return tmp_path / "registry"


def test_a_second_holder_is_refused_naming_the_first(registry, tmp_path):
    first = LabLock("run").acquire()
    first.describe("20261127-000000-tb1234", tmp_path / "r" / "20261127-000000-tb1234")
    with pytest.raises(LabBusy) as e:
        LabLock("calibrate").acquire()
    msg = str(e.value)
    assert (
        f"`tunnelbench run` (run 20261127-000000-tb1234 in {tmp_path}/r/20261127-000000-tb1234), pid {os.getpid()}"
        in msg
    )
    assert "kill " in msg and "wait for it to end" in msg
    first.release()
    second = LabLock("calibrate").acquire()  # free again once released
    second.release()
    lock = registry.with_name("registry.lock")
    assert lock.stat().st_mode & 0o777 == 0o600 and lock.read_text() == ""  # idle: names nobody
    assert not registry.exists() or "registry.lock" not in [p.name for p in registry.iterdir()]


def test_the_lock_dies_with_its_holder(registry):
    """A holder SIGKILLed: no stale lock (the kernel releases a dead process's flock), whatever the file says."""
    code = (
        "import sys, time; from tunnelbench.lab import journal; from pathlib import Path; "
        f"journal.REGISTRY = Path({str(registry)!r}); "
        "from tunnelbench.lab.lock import LabLock; LabLock('up').acquire(); print('held', flush=True); time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        with pytest.raises(LabBusy, match=rf"`tunnelbench up`, pid {p.pid}, .*`tunnelbench down`"):
            LabLock("run").acquire()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    LabLock("run").acquire().release()


@pytest.mark.lab
@pytest.mark.slow
def test_a_run_while_the_lab_is_held_exits_2_and_writes_nothing(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    reg = tmp_path / "registry"
    code = (
        "import time; from tunnelbench.lab import journal; from pathlib import Path; "
        f"journal.REGISTRY = Path({str(reg)!r}); from tunnelbench.lab.lock import LabLock; "
        "l = LabLock('run').acquire(); l.describe('20261127-010203-tbholder', Path('/r/x')); "
        "print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        res = tb("run", "--results", str(tmp_path / "r"), "--no-html", env={"TUNNELBENCH_REGISTRY": str(reg)})
        assert res.returncode == 2, res.stderr[-2000:]
        assert f"run 20261127-010203-tbholder in /r/x), pid {holder.pid}" in res.stderr, res.stderr
        assert not (tmp_path / "r").exists()  # refused before the run folder existed
        assert time.monotonic() - t0 < 60  # refused at once, not after waiting
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
