"""The read verbs (`report`, `export`, `compare`, `history`) on what they should not trust (issue 42): a store
they cannot use ends the verb with one line naming the file and exit 2, never a traceback, and the file, its
mtime and its folder are as they were (no -wal/-shm appears); a damaged value is left out with a warning line;
a link planted where the report goes is refused, and what it points to is unchanged; a destination is checked
before the work; a results root or run folder another user can write is refused, naming it and the fix."""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_store_reader import (
    DAMAGED_VALUES,
    UNUSABLE,
    damaged_run,
    good_run,
    snapshot,
    unusable_run,
)

from tunnelbench.cli import app
from tunnelbench.store import DB_NAME


def tb(*argv: str | Path) -> Result:
    return CliRunner().invoke(app.main, [str(a) for a in argv])


def lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.strip()]


def assert_no_traceback(res: Result) -> None:
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)


def verbs(d: Path, good: Path, out: Path) -> dict[str, list[str | Path]]:
    """Each read verb on the run folder `d` (compare: against the good run `good`)."""
    return {
        "report": ["report", d],
        "export": ["export", d, "--out", out / "m.csv"],
        "compare": ["compare", good, d, "--json", out / "c.json"],
        "history": ["history", "--results", d.parent, "--out", out / "h.html"],
    }


@pytest.mark.parametrize("verb", ["report", "export", "compare", "history"])
@pytest.mark.parametrize("kind", list(UNUSABLE))
def test_a_store_a_read_verb_cannot_use_is_one_line_exit_2_and_left_as_it_was(tmp_path, kind, verb):
    d = unusable_run(tmp_path / "results", kind)
    good = good_run(tmp_path / "other", "20260102-000000-bbbbbb", seed=2)
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(d)
    res = tb(*verbs(d, good, out)[verb])
    assert_no_traceback(res)
    said = lines(res.stderr)
    if verb == "history":  # the only run is skipped with its reason: nothing to show (click's usage error)
        assert res.exit_code == 2, res.output
        assert said[0] == f"skipped {d}: {d / DB_NAME}: " + said[0].split(f"{d / DB_NAME}: ", 1)[1]
        assert UNUSABLE[kind][1] in said[0] and f"no readable runs under {d.parent}/" in said[-1]
    else:
        assert res.exit_code == 2, res.output
        assert len(said) == 1 and said[0].startswith(f"{d / DB_NAME}: "), res.stderr
        assert UNUSABLE[kind][1] in said[0], said
    assert snapshot(d) == before  # no byte, mtime or side file changed: nothing written (no report either)
    assert list(out.iterdir()) == []


def test_history_skips_a_damaged_run_with_a_line_and_goes_on(tmp_path):
    root = tmp_path / "results"
    good = good_run(root, "20260102-000000-bbbbbb", seed=2)
    bad = damaged_run(root, "text", "20260103-000000-cccccc")
    broken = good_run(root, "20260104-000000-dddddd", seed=3)
    (broken / DB_NAME).write_bytes(b"SQLite format 3\x00" + bytes(100))
    before = [snapshot(d) for d in (good, bad, broken)]
    res = tb("history", "--results", root)
    assert_no_traceback(res)
    assert res.exit_code == 0, res.output
    said = lines(res.stderr)
    assert said[0].startswith(f"skipped {broken}: {broken / DB_NAME}: "), said
    assert said.count(f"warning: {bad / DB_NAME}: {DAMAGED_VALUES['text'][1]}") == 1, said
    assert said[-1] == f"history: {root / 'history.html'}"
    html = (root / "history.html").read_text()
    assert "20260102-000000-bbbbbb" in html and "20260103-000000-cccccc" in html
    assert [snapshot(d) for d in (good, bad, broken)] == before


@pytest.mark.parametrize("verb", ["export", "compare", "history"])
@pytest.mark.parametrize("kind", list(DAMAGED_VALUES))
def test_a_damaged_value_is_a_warning_line_naming_the_file_not_a_traceback(tmp_path, kind, verb):
    d = damaged_run(tmp_path / "results", kind)
    good = good_run(tmp_path / "other", "20260102-000000-bbbbbb", seed=2)
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(d)
    res = tb(*verbs(d, good, out)[verb])
    assert_no_traceback(res)
    assert res.exit_code in (0, 1), res.output  # compare: 1 is its regression gate
    assert lines(res.stderr).count(f"warning: {d / DB_NAME}: {DAMAGED_VALUES[kind][1]}") == 1, res.stderr
    assert snapshot(d) == before


@pytest.mark.slow  # a full report with plots, 3-10 s
@pytest.mark.parametrize("kind", ["text", "null"])
def test_report_of_a_damaged_value_warns_and_writes_the_report(tmp_path, kind):
    d = damaged_run(tmp_path, kind)
    _, sha, mtime = snapshot(d)
    res = tb("report", d)
    assert_no_traceback(res)
    assert res.exit_code == 0, res.output
    assert lines(res.stderr).count(f"warning: {d / DB_NAME}: {DAMAGED_VALUES[kind][1]}") == 1, res.stderr
    assert sorted(os.listdir(d)) == ["cases", "report.html", "report.md", DB_NAME]  # no -wal, no -shm
    assert snapshot(d)[1:] == (sha, mtime)


def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's work must not start: reading the store is the first of it."""
    from tunnelbench import store

    def refuse(*a: object) -> None:
        raise AssertionError("the work started before the destination was checked")

    monkeypatch.setattr(store.Store, "open_run_dir", refuse)


def test_a_link_planted_as_report_md_is_refused_before_the_work_and_its_target_unchanged(
    tmp_path, monkeypatch
):
    """Refused, not replaced: a link in our own run folder was put there by someone (the folder check keeps
    other users out), and replacing it would hide that; the user removes it and runs again."""
    d = good_run(tmp_path / "results")
    outside = tmp_path / "outside.txt"
    outside.write_text("someone else's file\n")
    (d / "report.md").symlink_to(outside)
    no_work(monkeypatch)
    res = tb("report", d)
    assert_no_traceback(res)
    assert res.exit_code == 2, res.output
    assert lines(res.stderr) == [
        f"{d / 'report.md'} is a symbolic link (to {outside}): refused, tunnelbench never writes through a "
        f"link; remove it (rm {d / 'report.md'}) or name another file"
    ]
    assert outside.read_text() == "someone else's file\n"
    assert (d / "report.md").is_symlink() and not (d / "report.html").exists()


@pytest.mark.parametrize(
    "argv, said",
    [
        (["report", "{run}", "--out", "{tmp}/missing/r.html"], "Invalid value for '--out': the folder '{tmp}/missing' does not exist"),
        (["report", "{run}", "--markdown", "{tmp}/missing/r.md"], "Invalid value for '--markdown': the folder '{tmp}/missing' does not exist"),
        # not a regular file (the issue's /dev/full): a socket in a folder any user can write, as /dev is not
        # (opening it fails at once where a FIFO would block a write that got past the check)
        (["report", "{run}", "--out", "{tmp}/sock"], "Invalid value for '--out': {tmp}/sock is not a regular file (srwx"),
        (["export", "{run}", "--out", "{tmp}/sock"], "Invalid value for '--out': {tmp}/sock is not a regular file (srwx"),
        (["compare", "{run}", "{run}", "--json", "{tmp}/sock"], "Invalid value for '--json': {tmp}/sock is not a regular file"),
        (["history", "--results", "{tmp}/results", "--out", "{tmp}/sock"], "Invalid value for '--out': {tmp}/sock is not a regular file"),
        (["history", "--results", "{tmp}/results", "--out", "{tmp}/missing/h.html"], "Invalid value for '--out': the folder '{tmp}/missing' does not exist"),
        (["report", "{run}"], "{run}/report.html is not a regular file (drwx"),  # a folder where the report goes
    ],
)  # fmt: skip
def test_a_destination_the_verb_cannot_write_is_refused_before_the_work(tmp_path, monkeypatch, argv, said):
    d = good_run(tmp_path / "results")
    (d / "report.html").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    sock.close()
    no_work(monkeypatch)
    res = tb(*[a.format(run=d, tmp=tmp_path) for a in argv])
    assert_no_traceback(res)
    assert res.exit_code == 2, res.output
    assert said.format(run=d, tmp=tmp_path) in " ".join(res.output.split()), res.output
    assert not (tmp_path / "missing").exists()


def test_a_failed_write_after_the_work_is_one_line_and_exit_1(tmp_path, monkeypatch):
    from tunnelbench.cli import results

    def full(path: Path, data: str) -> Path:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(results, "write_atomic", full)
    d = good_run(tmp_path / "results")
    res = tb("export", d, "--out", tmp_path / "m.csv")
    assert_no_traceback(res)
    assert res.exit_code == 1, res.output
    assert lines(res.stderr) == [f"{tmp_path / 'm.csv'}: not written: No space left on device"]


def test_stdout_that_takes_nothing_is_one_line_and_exit_1(monkeypatch, capsys):
    from tunnelbench.cli.results import write_stdout

    with open("/dev/full", "w") as full:
        monkeypatch.setattr(sys, "stdout", full)
        with pytest.raises(SystemExit) as e:
            write_stdout("x" * 100_000)
    assert e.value.code == 1
    assert lines(capsys.readouterr().err) == ["stdout: not written: No space left on device"]


@pytest.mark.parametrize(
    "where, mode, said",
    [
        ("root", 0o777, "the folder {root} is writable by its group and other users (drwxrwxrwx)"),
        ("root", 0o1777, "the folder {root} is writable by its group and other users (drwxrwxrwt)"),
        ("run", 0o775, "the folder {run} is writable by its group (drwxrwxr-x)"),
    ],
)
@pytest.mark.parametrize("verb", ["report", "export", "compare", "history"])
def test_a_folder_other_users_can_write_is_refused_naming_it_and_chmod(
    tmp_path, monkeypatch, where, mode, said, verb
):
    root = tmp_path / "results"
    d = good_run(root)
    os.chmod(root if where == "root" else d, mode)
    no_work(monkeypatch)
    argv = {
        "report": ["report", "--results", root],
        "export": ["export", "--results", root],
        "compare": ["compare", d.name, d.name, "--results", root],
        "history": ["history", "--results", root],
    }[verb]
    res = tb(*argv)
    assert_no_traceback(res)
    folder = root if where == "root" else d
    if verb == "history" and where == "run":  # the run is skipped, with the reason; no other run to show
        assert res.exit_code == 2 and lines(res.stderr)[0].startswith(f"skipped {d}: "), res.output
    else:
        assert res.exit_code == 2, res.output
        assert len(lines(res.stderr)) == 1, res.stderr
    line = next(x for x in lines(res.stderr) if said.format(root=root, run=d) in x)
    assert line.endswith(f"make it yours alone: chmod go-w {folder}"), line
    assert sorted(os.listdir(d)) == ["cases", DB_NAME]


@pytest.mark.parametrize("verb", ["report", "export"])
def test_a_run_named_by_path_in_a_folder_others_can_write_is_refused(tmp_path, monkeypatch, verb):
    # another user could swap the run folder for a link between the check and the write; a root-owned sticky
    # parent (/tmp) lets nobody else rename it, so it is accepted
    root = tmp_path / "shared"
    d = good_run(root)
    os.chmod(root, 0o777)
    no_work(monkeypatch)
    res = tb(verb, str(d))
    assert_no_traceback(res)
    assert res.exit_code == 2, res.output
    assert lines(res.stderr) == [
        f"the folder {root} is writable by its group and other users (drwxrwxrwx): another user could replace "
        f"what tunnelbench reads or writes there; make it yours alone: chmod go-w {root}"
    ], res.stderr
    assert sorted(os.listdir(d)) == ["cases", DB_NAME]
    os.chmod(root, 0o1777)  # sticky, owned by this user
    monkeypatch.undo()
    if os.geteuid() == 0:
        res = tb(verb, str(d))
        assert res.exit_code == 0, res.output


@pytest.mark.root  # chattr +i needs root
def test_an_immutable_run_folder_is_read_and_its_report_refused_before_the_work(tmp_path):
    d = good_run(tmp_path / "results")
    before = snapshot(d)
    subprocess.run(["chattr", "+i", str(d)], check=True)
    try:
        res = tb("export", d)
        assert_no_traceback(res)
        assert res.exit_code == 0 and res.stdout.startswith("run_id,vpn,"), res.output
        res = tb("report", d)
        assert_no_traceback(res)
        assert res.exit_code == 2, res.output
        assert lines(res.stderr) == [
            f"the folder {str(d)!r} is not writable: name a file in a folder you can write"
        ]
    finally:
        subprocess.run(["chattr", "-i", str(d)], check=True)
    assert snapshot(d) == before


KILLED_WRITING_THE_REPORT = """
import resource, signal, sys
from tunnelbench.cli.app import main
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; the kernel's default is to kill
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))
main(sys.argv[2:])
"""


@pytest.mark.slow  # a full report in a subprocess, 3-10 s
def test_a_report_killed_mid_write_keeps_the_previous_report_whole(tmp_path):
    """The kernel kills the report at 64 KiB of its new HTML (RLIMIT_FSIZE, SIGXFSZ): the report.html of
    before is there whole, not cut at the kill."""
    d = good_run(tmp_path / "results")
    previous = "<html>the report of before</html>\n"
    (d / "report.html").write_text(previous)
    res = subprocess.run(
        [sys.executable, "-c", KILLED_WRITING_THE_REPORT, str(64 * 1024), "report", str(d)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert res.returncode == -signal.SIGXFSZ, res.stderr
    assert (d / "report.html").read_text() == previous


def test_the_writers_of_run_folders_and_results_roots_never_write_in_place():
    """No writer of a run folder's or results root's files writes in place: each calls core/files.py."""
    src = Path(__file__).resolve().parents[2] / "src" / "tunnelbench"
    writers = ["cli/results.py", "report/full.py", "report/history.py", "sweeps/natmatrix.py",
               "sweeps/meshscale.py", "suite.py", "cli/lab.py", "runner/loop.py", "runner/case.py",
               "runner/execute.py", "runner/guard.py"]  # fmt: skip
    for rel in writers:
        text = (src / rel).read_text()
        assert not re.search(r"\.write_text\(|\.write_bytes\(|open\([^)]*['\"][wa]", text), rel
