"""Host.run's timeout: a command that outlives it is killed and reported, and the call returns even when the
command left a process behind that still holds its output pipe (reading to EOF would wait for that process:
CI once sat an hour in a test until its own limit)."""

import os
import time
from pathlib import Path

import psutil
import pytest

from tunnelbench.lab.host import CommandError, Host


class LocalHost(Host):
    def __init__(self) -> None:
        self.name, self.underlay_ip, self.journal, self.workdir = "local", "127.0.0.1", None, Path("/tmp")

    def argv(self, argv):
        return list(argv)


def test_a_command_past_its_timeout_raises_with_no_exit_code():
    """The command is killed and reaped when the call returns: no child of this process runs it any more."""
    argv = ["sleep", "30.25"]  # a command line no other test runs
    with pytest.raises(CommandError) as err:
        LocalHost().run(argv, timeout=0.5)
    assert err.value.returncode is None
    left = [p for p in psutil.Process().children(recursive=True) if _cmdline(p) == argv]
    assert left == [], f"{argv} still runs after its timeout: {left}"


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # gone between the listing and the read: not running
        return []


@pytest.mark.slow  # 4-8 s (the CLI or a report in a subprocess): out of the fast lane
def test_a_grandchild_holding_the_pipe_does_not_hold_the_caller(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    # the shell backgrounds a sleeper (it inherits stdout) and records its PID; the shell itself outlives the
    # timeout and is killed, the sleeper is not
    script = f"sleep 40 & echo $! > {pidfile}; echo started; sleep 40"
    t0 = time.monotonic()
    try:
        with pytest.raises(CommandError):
            LocalHost().run(["sh", "-c", script], timeout=1)
        took = time.monotonic() - t0
        assert took < 15, f"run() returned after {took:.1f} s: it waited for the grandchild's pipe"
    finally:
        if pidfile.exists():
            pid = int(pidfile.read_text())
            os.kill(pid, 9)  # the test's own grandchild, by its PID
