"""The journal's two copies when a disk fails (no lab): the registry's copy (what `clean` reads while the run
lives) must be written, or the journal raises; the results folder's copy failing is noted and the run goes
on. References: the files' own lines, read back."""

from __future__ import annotations

import json

import pytest

from tunnelbench.lab import journal as journal_mod
from tunnelbench.lab.journal import Journal


@pytest.fixture
def journal(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_mod, "REGISTRY", tmp_path / "registry")
    return Journal(tmp_path / "run", "20261127-000000-tbunit")


def test_a_failed_results_folder_copy_is_noted_and_the_registry_copy_kept(journal, tmp_path):
    journal.path = tmp_path / "gone" / "journal.jsonl"  # its folder does not exist: every write fails
    journal.netns("tbunitns")
    journal.netns("tbunitns2")
    lines = [json.loads(x) for x in journal.copy_path.read_text().splitlines()]
    assert [e["name"] for e in lines] == ["tbunitns", "tbunitns2"]
    assert journal.run_dir_error is not None and str(journal.path) in journal.run_dir_error
    assert "No such file" in journal.run_dir_error  # the first failure, in the OS's words


def test_a_failed_registry_copy_raises(journal, tmp_path):
    journal.copy_path = tmp_path / "gone" / "copy.jsonl"
    with pytest.raises(OSError):
        journal.netns("tbunitns")
    assert journal.run_dir_error is None
