"""The readers' store opener (Store.open_run_dir): read-only (the file's bytes, mtime and folder are as they
were: no WAL switch, no schema, no -wal/-shm left), one StoreError naming the file for a store it cannot use,
and damaged values left out with a line. The damaged stores are made here by hand from a synthetic run
(tests/synthetic_runs.py): cut short, random bytes, another schema, 'abc' and NULL where a number belongs,
broken JSON; the builders are shared with the CLI tests (tests/report/test_read_verbs.py)."""

from __future__ import annotations

import hashlib
import os
import random
import sqlite3
from pathlib import Path

import pytest
from synthetic_runs import make_run

from tunnelbench.analysis.analyze import load_run
from tunnelbench.core.results import Outcome
from tunnelbench.store import DB_NAME, Store, StoreError

RUN = "20260101-000000-aaaaaa"


def good_run(root: Path, run_id: str = RUN, seed: int = 1) -> Path:
    """A small real store, closed by its writer (WAL mode, no -wal left)."""
    return make_run(root, run_id, {"internal": (1000, 20), "fastvpn": (500, 10)}, n=3, seed=seed)


def sql(db: Path, *queries: str) -> None:
    con = sqlite3.connect(db)
    for q in queries:
        con.execute(q)
    con.commit()
    con.close()


# a store the reader cannot use: how it is made, and what the one line says
def _truncated(db: Path) -> None:
    db.write_bytes(db.read_bytes()[: 5 * 4096])  # 5 of its pages: the header says more


def _random(db: Path) -> None:
    db.write_bytes(random.Random(42).randbytes(50_000))


def _empty(db: Path) -> None:
    db.write_bytes(b"")


def _foreign(db: Path) -> None:
    db.unlink()
    sql(db, "CREATE TABLE photo (id INTEGER, name TEXT)", "INSERT INTO photo VALUES (1, 'cat.jpg')")


def _older(db: Path) -> None:
    sql(db, 'ALTER TABLE "case" DROP COLUMN label')


def _newer(db: Path) -> None:
    sql(db, "PRAGMA user_version = 9")


def _no_run(db: Path) -> None:
    sql(db, "DELETE FROM run")


UNUSABLE = {
    "truncated": (_truncated, "database disk image is malformed"),
    "random": (_random, "file is not a database"),
    "empty": (_empty, "empty file (0 bytes): no 'run' table, not a tunnelbench store"),
    "foreign": (_foreign, "no 'run' table (not a tunnelbench store, or an older one)"),
    "older": (_older, "table 'case' lacks label (an older store)"),
    "newer": (_newer, "schema version 9, newer than this tunnelbench reads (1)"),
    "no run": (_no_run, "no run recorded in the store"),
}

# damaged values in a readable store: (query, the line the reader says)
DAMAGED_VALUES = {
    "text": (
        "UPDATE metric SET value='abc' WHERE rowid=1",
        "1 value(s) of metric goodput_mbps are not finite numbers ('abc' in case 1): left out",
    ),
    "null": (
        "UPDATE metric SET value=NULL WHERE rowid=1",
        "1 value(s) of metric goodput_mbps are not finite numbers (None in case 1): left out",
    ),
    "nan": (
        "UPDATE metric SET value='NaN' WHERE rowid=1",
        "1 value(s) of metric goodput_mbps are not finite numbers ('NaN' in case 1): left out",
    ),
    "env": (
        "UPDATE environment SET value='{\"profile\": \"edge\", ' WHERE key='calibration.edge'",
        "environment calibration.edge: not valid JSON (Expecting property name enclosed in double quotes at 20): "
        "left out",
    ),
}


def unusable_run(root: Path, kind: str) -> Path:
    d = good_run(root)
    UNUSABLE[kind][0](d / DB_NAME)
    return d


def damaged_run(root: Path, kind: str, run_id: str = RUN) -> Path:
    d = good_run(root, run_id)
    sql(d / DB_NAME, DAMAGED_VALUES[kind][0])
    return d


def snapshot(run_dir: Path) -> tuple[list[str], str, int]:
    """What a reader must leave as it was: the folder's names, the store's bytes and mtime."""
    db = run_dir / DB_NAME
    st = db.stat()
    return sorted(os.listdir(run_dir)), hashlib.sha256(db.read_bytes()).hexdigest(), st.st_mtime_ns


def read_all(run_dir: Path) -> Store:
    """Everything a report reads: the run through load_run, and every series."""
    run = load_run(run_dir)
    run.store.series(c.id for c in run.cases)
    run.store.close()
    return run.store


@pytest.mark.parametrize("kind", list(UNUSABLE))
def test_a_store_the_reader_cannot_use_is_one_error_naming_the_file_and_left_as_it_was(tmp_path, kind):
    d = unusable_run(tmp_path, kind)
    before = snapshot(d)
    with pytest.raises(StoreError) as e:
        read_all(d)
    msg = str(e.value)
    assert msg.startswith(f"{d / DB_NAME}: ") and UNUSABLE[kind][1] in msg and "\n" not in msg, msg
    assert snapshot(d) == before


def test_reading_a_good_store_changes_nothing(tmp_path):
    """A WAL store closed by its writer: a read-write open would leave -wal and -shm beside it (and so would a
    plain mode=ro open); the reader leaves the folder and the file as they were."""
    d = good_run(tmp_path)
    before = snapshot(d)
    assert before[0] == ["cases", DB_NAME]
    run = load_run(d)
    run.store.series(c.id for c in run.cases)
    assert snapshot(d) == before  # while it reads (a writer's connection removes its files when it closes)
    run.store.close()
    assert snapshot(d) == before
    assert run.store.skipped == []


def test_a_running_writers_committed_cases_are_read(tmp_path):
    """While the runner has the store open its cases sit in the -wal: the reader must see them (an
    immutable read of the main file alone would not) and must not remove the writer's files."""
    d = good_run(tmp_path)
    w = Store(d / DB_NAME)
    cid = w.start_case(RUN, "fastvpn", "baseline", "tcp", "tcp", {}, 9, 0, "h1", "h2", d)
    out = Outcome()
    out.add("goodput_mbps", 123.0)
    w.finish_case(cid, "ok", out)
    assert (d / f"{DB_NAME}-wal").exists()
    try:
        run = load_run(d)
        assert [m["value"] for m in run.metrics if m["case_id"] == cid] == [123.0]
        run.store.close()
        assert (d / f"{DB_NAME}-wal").exists()
    finally:
        w.close()


@pytest.mark.parametrize("kind", list(DAMAGED_VALUES))
def test_a_damaged_value_is_left_out_with_a_line_naming_the_file(tmp_path, kind):
    d = damaged_run(tmp_path, kind)
    before = snapshot(d)
    with sqlite3.connect(d / DB_NAME) as con:  # the reference: what the store holds, read by SQLite itself
        n_metrics = con.execute("SELECT COUNT(*) FROM metric").fetchone()[0]
        n_env = con.execute("SELECT COUNT(*) FROM environment").fetchone()[0]
    con.close()
    run = load_run(d)
    assert run.store.skipped == [f"{d / DB_NAME}: {DAMAGED_VALUES[kind][1]}"]
    values = [m["value"] for m in run.metrics]
    assert all(isinstance(v, float) for v in values)
    assert len(values) == n_metrics - (kind != "env")
    assert len(run.env) == n_env - (kind == "env")
    run.store.close()
    assert snapshot(d) == before


def test_infinite_values_and_series_points_and_broken_params_are_left_out_with_a_line(tmp_path):
    d = good_run(tmp_path)
    db = d / DB_NAME
    sql(
        db,
        "UPDATE metric SET value=9e999 WHERE rowid=2",
        "UPDATE series SET value='x' WHERE rowid IN (1, 2)",
        "UPDATE \"case\" SET params='{oops' WHERE id=3",
    )
    run = load_run(d)
    points = run.store.series([1])
    with sqlite3.connect(db) as con:
        n_points = con.execute("SELECT COUNT(*) FROM series WHERE case_id=1").fetchone()[0]
    con.close()
    assert len(points) == n_points - 2
    assert next(c for c in run.cases if c.id == 3).params == {}
    assert run.store.skipped == [
        f"{db}: case 3: its parameters are not JSON ('{{oops'): read as none",
        f"{db}: 1 value(s) of metric retransmit_rate are not finite numbers (inf in case 1): left out",
        f"{db}: 2 point(s) of series goodput_mbps are not finite numbers (t 1.0, value 'x' in case 1): left out",
    ]
    run.store.close()


def test_the_writer_stamps_its_schema_version(tmp_path):
    Store(tmp_path / DB_NAME).close()
    with sqlite3.connect(tmp_path / DB_NAME) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == 1
    con.close()
