"""`run` refuses a results root another user can write (issue 42), as the read verbs do and as the SSH lab
refuses such a work folder: another user could plant a link there for root to write through. Refused before
anything runs: no build, no lab lock, no run folder."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner


@pytest.mark.parametrize(
    "mode, said", [(0o777, "its group and other users (drwxrwxrwx)"), (0o775, "its group (drwxrwxr-x)")]
)
def test_run_into_a_results_root_others_can_write_is_refused_before_anything_runs(
    tmp_path, monkeypatch, mode, said
):
    from tunnelbench.cli import app

    def nothing_runs(*a: object) -> None:
        raise AssertionError("the run went on past the results root check")

    monkeypatch.setattr(app.run, "need_root", nothing_runs)
    monkeypatch.setattr(app.run, "hold_lab", nothing_runs)
    root = tmp_path / "results"
    root.mkdir()
    os.chmod(root, mode)
    res = CliRunner().invoke(app.main, ["run", "--results", str(root), "--no-build"])
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert [x for x in res.stderr.splitlines() if x.strip()] == [
        f"the folder {root} is writable by {said}: another user could replace what tunnelbench reads or "
        f"writes there; make it yours alone: chmod go-w {root}"
    ]
    assert list(root.iterdir()) == []
