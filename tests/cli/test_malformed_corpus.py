"""The corpus of malformed inputs (tests/data/malformed/, its README.md is the manifest): every file, given to
the verb that reads it, exits 2 with one line naming the field (or what the file is), never a traceback, and
writes nothing. The inputs a repository cannot hold (a FIFO, a file over 1 MiB) are made here."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from tree import DATA

CORPUS = DATA / "malformed"


def manifest() -> list[tuple[str, str, str]]:
    """(file, what it breaks, what the error names) per row of the README's table."""
    rows = []
    for line in (CORPUS / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and cells[0] not in ("file", "---"):
            rows.append((cells[0], cells[1], cells[2]))
    return rows


# a FIFO would wait for a writer forever and a 2 MiB file is no test data: made at test time
MADE_HERE = [
    ("scenarios/fifo.toml", "a named pipe", "is a named pipe (FIFO)"),
    ("scenarios/huge.toml", "2 MiB of comments", "is larger than 1 MiB"),
    ("inventories/fifo.yml", "a named pipe", "is a named pipe (FIFO)"),
    ("stores/store-fifo/results.sqlite", "a named pipe as the store", "results.sqlite"),
]
VERBS = {
    "scenarios": [["plan", "{f}", "--results", "{out}"], ["run", "{f}", "--results", "{out}"]],
    "suites": [["plan", "{f}", "--results", "{out}"], ["run", "{f}", "--results", "{out}"]],
    "inventories": [["doctor", "--inventory", "{f}"]],
    "stores": [["report", "{run}"], ["export", "{run}"]],
}
# the run folders whose store cannot be opened without writing to it or without a traceback today


def cases() -> list:
    out = []
    for rel, _breaks, names in [*manifest(), *MADE_HERE]:
        kind = rel.split("/")[0]
        for argv in VERBS[kind]:
            out.append(pytest.param(rel, argv, names, id=f"{argv[0]}:{rel}"))
    return out


def test_the_corpus_has_a_hundred_files_each_in_the_manifest():
    on_disk = {
        str(p.relative_to(CORPUS))
        for p in CORPUS.rglob("*")
        if p.name not in ("README.md", ".gitkeep") and (p.is_symlink() or p.is_file())
    }
    on_disk |= {str(p.relative_to(CORPUS)) for p in CORPUS.glob("stores/*/results.sqlite") if p.is_dir()}
    listed = {rel for rel, _, _ in manifest()}
    assert on_disk == listed, (on_disk - listed, listed - on_disk)
    assert len(listed) >= 100, len(listed)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the corpus (symlinks kept) with the inputs made at test time: a verb that wrote anything would
    write here, never into tests/data."""
    root = tmp_path_factory.mktemp("malformed") / "malformed"
    shutil.copytree(CORPUS, root, symlinks=True)
    os.mkfifo(root / "scenarios" / "fifo.toml")
    (root / "scenarios" / "huge.toml").write_text(("# " + "x" * 1022 + "\n") * 2048)
    os.mkfifo(root / "inventories" / "fifo.yml")
    (root / "stores" / "store-fifo").mkdir()
    os.mkfifo(root / "stores" / "store-fifo" / "results.sqlite")
    return root


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry below `folder` with its bytes (a symlink's target, a FIFO's or folder's kind)."""
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        if p.is_symlink():
            out[key] = f"-> {os.readlink(p)}"
        elif p.is_fifo():
            out[key] = "fifo"
        elif p.is_dir():
            out[key] = "folder"
        else:
            out[key] = p.read_bytes()
    return out


@pytest.mark.parametrize("rel, argv, names", cases())
def test_a_malformed_input_is_one_line_naming_the_field_and_nothing_is_written(
    corpus, tmp_path, monkeypatch, rel, argv, names
):
    from tunnelbench import doctor
    from tunnelbench.cli import app, common
    from tunnelbench.runner import execute

    def reached(what: str):
        def fail(*a: object, **k: object) -> None:
            raise AssertionError(f"{rel} was accepted: {what} was reached")

        return fail

    for module in (app.run, app.lab):
        monkeypatch.setattr(module, "hold_lab", reached("the lab lock"))
    monkeypatch.setattr(app.run, "_before_run", reached("the run"))
    monkeypatch.setattr(execute, "execute", reached("the run"))
    monkeypatch.setattr(execute, "execute_suite", reached("the suite"))
    monkeypatch.setattr(doctor, "doctor_inventory", reached("the inventory's hosts"))
    for con in (common.console, common.err):  # a message is one line however long: no folding at 160
        monkeypatch.setattr(con, "width", 2000)
    f = corpus / rel
    run_dir = tmp_path / f.parent.name
    if rel.startswith("stores/"):
        shutil.copytree(f.parent, run_dir, symlinks=True) if not f.is_fifo() else run_dir.mkdir()
        if f.is_fifo():
            os.mkfifo(run_dir / "results.sqlite")
    out = tmp_path / "results"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    before = snapshot(corpus), snapshot(run_dir) if run_dir.exists() else {}

    res = CliRunner().invoke(app.main, [a.format(f=f, out=out, run=run_dir) for a in argv])

    text = res.output
    lines = [x for x in text.splitlines() if x.strip()]
    assert res.exception is None or isinstance(res.exception, SystemExit), (res.exception, text)
    assert res.exit_code == 2, text
    assert "Traceback" not in text, text
    assert len(lines) == 1 and names in lines[0], text
    assert not out.exists() and not any(cwd.iterdir()), "a run folder or a file was written"
    assert (snapshot(corpus), snapshot(run_dir) if run_dir.exists() else {}) == before, "an input changed"
