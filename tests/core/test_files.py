"""core/files.py: the one way the product writes a file into a run folder or results root (whole or not at all,
never through a link), and the folders and files it refuses. References: the files' own bytes, a kill by the
kernel mid-write (RLIMIT_FSIZE: SIGXFSZ), stat modes set by the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tunnelbench.core import files
from tunnelbench.core.files import (
    FileRefused,
    check_destination,
    check_private_folder,
    check_target,
    write_atomic,
)


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "report.md"
    target.write_text("old")
    write_atomic(target, "new ü")
    assert target.read_bytes() == "new ü".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_a_link_at_the_target_is_refused_and_what_it_points_to_is_unchanged(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.md").symlink_to(outside)
    with pytest.raises(FileRefused, match=r"report\.md is a symbolic link \(to .*outside\.txt\): refused"):
        write_atomic(run / "report.md", "planted")
    assert outside.read_text() == "not yours"
    assert (run / "report.md").is_symlink()  # left for its owner to see
    assert sorted(p.name for p in run.iterdir()) == ["report.md"]


def test_a_target_that_is_not_a_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    with pytest.raises(FileRefused, match=r"out\.csv is not a regular file \(prw"):
        check_destination(fifo)
    with pytest.raises(FileRefused, match=r"/dev/full is not a regular file \(crw"):
        write_atomic(Path("/dev/full"), "x")
    (tmp_path / "d").mkdir()
    with pytest.raises(FileRefused, match="is not a regular file"):
        check_target(tmp_path / "d")


def test_a_destination_in_a_missing_folder_or_under_a_file_is_refused(tmp_path):
    with pytest.raises(FileRefused, match="the folder '.*gone' does not exist"):
        check_destination(tmp_path / "gone" / "r.html")
    (tmp_path / "f").write_text("")
    with pytest.raises(FileRefused, match="is not a folder"):
        check_destination(tmp_path / "f" / "r.html")
    check_destination(tmp_path / "r.html")  # a new file in a writable folder


KILLED_MID_WRITE = """
import resource, signal, sys
from pathlib import Path
from tunnelbench.core.files import write_atomic
target = Path(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; the kernel's default is to kill
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
write_atomic(target, "x" * 100_000)  # the kernel kills this process (SIGXFSZ) at byte 4096
"""


def test_a_kill_mid_write_leaves_the_previous_file_whole(tmp_path):
    target = tmp_path / "nat-matrix.json"
    target.write_text('{"cells": 3}\n')
    res = subprocess.run(
        [sys.executable, "-c", KILLED_MID_WRITE, str(target)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == -signal.SIGXFSZ, res.stderr
    assert target.read_text() == '{"cells": 3}\n'


def test_a_failed_write_leaves_the_target_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "report.html"
    target.write_text("previous")

    def fail(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", fail)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, "new")
    assert target.read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


@pytest.mark.parametrize(
    "mode, said",
    [
        (0o777, "writable by its group and other users (drwxrwxrwx)"),
        (0o1777, "writable by its group and other users (drwxrwxrwt)"),
        (0o775, "writable by its group (drwxrwxr-x)"),
        (0o757, "writable by other users (drwxr-xrwx)"),
    ],
)
def test_a_folder_others_can_write_is_refused_naming_it_and_the_fix(tmp_path, mode, said):
    d = tmp_path / "results"
    d.mkdir()
    os.chmod(d, mode)
    with pytest.raises(FileRefused) as e:
        check_private_folder(d)
    assert str(e.value) == (
        f"the folder {d} is {said}: another user could replace what tunnelbench reads or writes there; "
        f"make it yours alone: chmod go-w {d}"
    )
    os.chmod(d, 0o755)
    check_private_folder(d)


def test_as_root_a_folder_another_user_owns_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "results"
    d.mkdir(mode=0o755)
    if os.geteuid() == 0:  # make it another user's: as root a chown does it
        os.chown(d, 12345, -1)
    owner = os.stat(d).st_uid
    assert owner != 0
    monkeypatch.setattr(files.os, "geteuid", lambda: 0)  # this process as root
    with pytest.raises(
        FileRefused, match=rf"owned by uid {owner}, not root.*chown root {d}, or run this as uid {owner}"
    ):
        check_private_folder(d)
