"""The SQLite store of a run folder: run -> cases -> metrics and time series, plus environment and phases.

Every finished case is committed at once (WAL journal), so a crash or SIGKILL later keeps it. The runner
writes through `Store(path)`; every reader (report, export, compare, history) opens through
`Store.open_run_dir`, read-only: nothing it reads is changed (no WAL switch, no schema, no -wal/-shm file
left behind), a file that is not a readable tunnelbench store raises StoreError (one line: the file and what
is wrong), and a damaged value is left out with a line in `skipped`, never a traceback."""

from __future__ import annotations

import functools
import json
import math
import sqlite3
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tunnelbench.core.files import FileRefused
from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome

SCHEMA = """
CREATE TABLE IF NOT EXISTS run (
  id TEXT PRIMARY KEY, tag TEXT, started REAL, ended REAL, status TEXT, scenario TEXT, tunnelbench_version TEXT
);
CREATE TABLE IF NOT EXISTS environment (
  run_id TEXT, key TEXT, value TEXT, PRIMARY KEY (run_id, key)
);
CREATE TABLE IF NOT EXISTS vpn (
  run_id TEXT, name TEXT, version TEXT, status TEXT, reason TEXT, settings TEXT, PRIMARY KEY (run_id, name)
);
CREATE TABLE IF NOT EXISTS "case" (
  id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, vpn TEXT, profile TEXT, workload TEXT, label TEXT,
  params TEXT, repetition INTEGER, attempt INTEGER, status TEXT, error TEXT, started REAL, ended REAL,
  client TEXT, server TEXT, artifact_dir TEXT
);
CREATE TABLE IF NOT EXISTS metric (
  case_id INTEGER, name TEXT, value REAL, unit TEXT, host TEXT
);
CREATE TABLE IF NOT EXISTS series (
  case_id INTEGER, name TEXT, unit TEXT, host TEXT, t REAL, value REAL
);
CREATE TABLE IF NOT EXISTS phase (
  run_id TEXT, vpn TEXT, phase TEXT, seconds REAL
);
CREATE TABLE IF NOT EXISTS metric_spec (
  run_id TEXT, workload TEXT, name TEXT, unit TEXT, better TEXT, description TEXT, headline INTEGER,  -- place, 0 = not
  PRIMARY KEY (run_id, workload, name)
);
CREATE INDEX IF NOT EXISTS metric_case ON metric(case_id);
CREATE INDEX IF NOT EXISTS series_case ON series(case_id);
"""

DB_NAME = "results.sqlite"
# PRAGMA user_version of the SCHEMA above; 0 is a store from before it was set (the same tables). A reader
# refuses a store written by a later schema rather than misread it.
SCHEMA_VERSION = 1
# tables a store from before them lacks; the reader treats them as empty
OPTIONAL_TABLES = ("metric_spec",)


class StoreError(FileRefused):
    """A store a reader cannot use (not SQLite, truncated, another schema, no run): the message names the file
    and what is wrong, in one line; every read verb ends with it and exit 2."""


@functools.cache
def schema_columns() -> dict[str, set[str]]:
    """Every table of SCHEMA with its columns, as SQLite itself reads SCHEMA (no second list to keep)."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(SCHEMA)
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {
            t: {r[1] for r in db.execute(f'PRAGMA table_info("{t}")')}
            for t in tables
            if t != "sqlite_sequence"
        }
    finally:
        db.close()


def _connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection that creates nothing. mode=ro alone on a WAL store creates -wal and -shm
    beside it and leaves them; with no -wal there (no writer has it open: the runner's Store makes it at
    once and removes it when it closes) every committed case is in the main file, so immutable=1 reads it
    without any side file. With a -wal (a run writing now, or killed) mode=ro reads its committed cases too,
    through the side files already there; likewise a rollback journal left by a crashed writer."""
    side = any(path.with_name(path.name + s).exists() for s in ("-wal", "-journal"))
    uri = f"{path.resolve().as_uri()}?mode=ro" + ("" if side else "&immutable=1")
    return sqlite3.connect(uri, uri=True, timeout=30)


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _show(v: object, width: int = 24) -> str:
    t = repr(v)
    return t if len(t) <= width else t[: width - 1] + "…"


@dataclass
class CaseRow:
    id: int
    run_id: str
    vpn: str
    profile: str
    workload: str
    label: str
    params: dict[str, Any]
    repetition: int
    attempt: int
    status: str
    error: str | None
    started: float
    ended: float | None
    client: str
    server: str
    artifact_dir: str


class Store:
    def __init__(self, path: Path, readonly_db: sqlite3.Connection | None = None):
        """The writer's store at `path` (made if new: WAL journal, the schema); `readonly_db` is for
        open_run_dir only."""
        self.path = path
        self.readonly = readonly_db is not None
        self.skipped: list[str] = []  # what a reader left out of what it read, and why (one line each)
        if readonly_db is not None:
            self.db = readonly_db
            return
        self.db = sqlite3.connect(path, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        if not self.db.execute("PRAGMA user_version").fetchone()[0]:
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        self.db.commit()

    @classmethod
    def open_run_dir(cls, run_dir: Path) -> Store:
        """The one opener for readers: the run folder's store, read-only, its schema checked (the tables and
        columns the reader reads, the schema version, at least one run). Raises StoreError naming the file."""
        p = run_dir / DB_NAME
        if not p.is_file():
            raise StoreError(f"{p}: no such file: {run_dir} is not a run folder")
        if p.stat().st_size == 0:
            raise StoreError(f"{p}: empty file (0 bytes): no 'run' table, not a tunnelbench store")
        try:
            db = _connect_readonly(p)
        except sqlite3.Error as e:
            raise StoreError(f"{p}: cannot open: {e}") from None
        try:
            _check_schema(db, p)
        except BaseException:
            db.close()
            raise
        return cls(p, readonly_db=db)

    def close(self) -> None:
        self.db.close()

    # -- writing -----------------------------------------------------------------------------------
    def begin_run(self, run_id: str, tag: str, scenario_toml: str, version: str) -> None:
        self.db.execute(
            "INSERT INTO run VALUES (?,?,?,?,?,?,?)",
            (run_id, tag, time.time(), None, "running", scenario_toml, version),
        )
        self.db.commit()

    def reopen_run(self, run_id: str) -> None:
        """A resumed run is running again (its start time is kept; `ended` is set anew at its end)."""
        self.db.execute("UPDATE run SET ended=NULL, status='running' WHERE id=?", (run_id,))
        self.db.commit()

    def discard_unfinished(self, run_id: str) -> list[str]:
        """Delete the cases a killed or interrupted process left `running` or `interrupted` (they are measured
        again on resume, so each case is counted once); returns what was discarded, for the record."""
        rows = self.db.execute(
            'SELECT id, vpn, profile, label, repetition, attempt, status FROM "case" WHERE run_id=? '
            "AND status IN ('running', 'interrupted') ORDER BY id",
            (run_id,),
        ).fetchall()
        ids = [(r[0],) for r in rows]
        with self.db:
            for table, col in (("metric", "case_id"), ("series", "case_id"), ('"case"', "id")):
                self.db.executemany(f"DELETE FROM {table} WHERE {col}=?", ids)
        return [
            f"{vpn} · {profile} · {label} · rep {rep} attempt {att + 1} ({st})"
            for _id, vpn, profile, label, rep, att, st in rows
        ]

    def done_cases(self, run_id: str) -> set[tuple[str, str, str, int]]:
        """(vpn, condition label, workload label, repetition) of every case that finished ok."""
        rows = self.db.execute(
            "SELECT vpn, profile, label, repetition FROM \"case\" WHERE run_id=? AND status='ok'", (run_id,)
        )
        return {tuple(r) for r in rows}  # plain tuples whatever row_factory an earlier read left set

    def end_run(self, run_id: str, status: str) -> None:
        self.db.execute("UPDATE run SET ended=?, status=? WHERE id=?", (time.time(), status, run_id))
        self.db.commit()

    def set_env(self, run_id: str, items: dict[str, object]) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO environment VALUES (?,?,?)",
            [(run_id, k, v if isinstance(v, str) else json.dumps(v)) for k, v in items.items()],
        )
        self.db.commit()

    def set_vpn(
        self,
        run_id: str,
        name: str,
        version: str | None,
        status: str,
        reason: str = "",
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO vpn VALUES (?,?,?,?,?,?)",
            (run_id, name, version, status, reason, json.dumps(settings or {})),
        )
        self.db.commit()

    def add_phase(self, run_id: str, vpn: str | None, phase: str, seconds: float) -> None:
        self.db.execute("INSERT INTO phase VALUES (?,?,?,?)", (run_id, vpn, phase, seconds))
        self.db.commit()

    def start_case(
        self,
        run_id: str,
        vpn: str,
        profile: str,
        workload: str,
        label: str,
        params: dict[str, Any],
        repetition: int,
        attempt: int,
        client: str,
        server: str,
        artifact_dir: Path,
    ) -> int:
        cur = self.db.execute(
            'INSERT INTO "case" (run_id, vpn, profile, workload, label, params, repetition, attempt, status, '
            "started, client, server, artifact_dir) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                run_id,
                vpn,
                profile,
                workload,
                label,
                json.dumps(params),
                repetition,
                attempt,
                "running",
                time.time(),
                client,
                server,
                str(artifact_dir),
            ),  # fmt: skip
        )
        self.db.commit()
        assert cur.lastrowid is not None  # set by the INSERT
        return int(cur.lastrowid)

    def finish_case(
        self, case_id: int, status: str, outcome: Outcome | None = None, error: str | None = None
    ) -> None:
        with self.db:
            if outcome is not None:
                self.db.executemany(
                    "INSERT INTO metric VALUES (?,?,?,?,?)",
                    [(case_id, s.name, s.value, s.unit, s.host) for s in outcome.samples],
                )
                self.db.executemany(
                    "INSERT INTO series VALUES (?,?,?,?,?,?)",
                    [
                        (case_id, se.name, se.unit, se.host, t, v)
                        for se in outcome.series
                        for t, v in se.points
                    ],
                )
            self.db.execute(
                'UPDATE "case" SET status=?, error=?, ended=? WHERE id=?',
                (status, error, time.time(), case_id),
            )

    def record_skip(
        self, run_id: str, vpn: str, profile: str, workload: str, label: str, reason: str
    ) -> None:
        cid = self.start_case(run_id, vpn, profile, workload, label, {}, 0, 0, "", "", Path(""))
        self.finish_case(cid, "skipped", error=reason)

    def record_failure(
        self,
        run_id: str,
        vpn: str,
        profile: str,
        workload: str,
        label: str,
        params: dict[str, Any],
        repetition: int,
        error: str,
    ) -> None:
        """A case that could not start because its condition broke the mesh, kept as a failed measurement."""
        cid = self.start_case(run_id, vpn, profile, workload, label, params, repetition, 0, "", "", Path(""))
        self.finish_case(cid, "failed", error=error)

    # -- reading -----------------------------------------------------------------------------------
    def _read(self, sql: str, args: Iterable[Any] = (), rows: bool = False) -> list[Any]:
        """Every row of a query (sqlite3.Row with `rows`, else tuples). In a reader, an SQLite error (a
        truncated or damaged file) is a StoreError naming the file; the writer's errors stay SQLite's own."""
        cur = self.db.cursor()
        if rows:
            cur.row_factory = sqlite3.Row
        try:
            return cur.execute(sql, tuple(args)).fetchall()
        except sqlite3.Error as e:
            if self.readonly:
                raise StoreError(f"{self.path}: unreadable: {e}") from None
            raise
        finally:
            cur.close()

    def _skip(self, line: str) -> None:
        if line not in self.skipped:
            self.skipped.append(line)

    def runs(self) -> list[sqlite3.Row]:
        return self._read("SELECT * FROM run ORDER BY started", rows=True)

    def run_row(self, run_id: str | None = None) -> sqlite3.Row:
        q = "SELECT * FROM run " + ("WHERE id=?" if run_id else "ORDER BY started DESC LIMIT 1")
        found = self._read(q, (run_id,) if run_id else (), rows=True)
        if not found:
            raise KeyError(run_id or "no run in store")
        row: sqlite3.Row = found[0]
        return row

    def cases(self, run_id: str) -> Iterator[CaseRow]:
        names = [f.name for f in fields(CaseRow)]
        for r in self._read('SELECT * FROM "case" WHERE run_id=? ORDER BY id', (run_id,), rows=True):
            d = {k: r[k] for k in names}
            try:
                d["params"] = json.loads(d["params"] or "{}")
            except (TypeError, json.JSONDecodeError):
                self._skip(
                    f"{self.path}: case {d['id']}: its parameters are not JSON ({_show(d['params'])}): read as none"
                )
                d["params"] = {}
            yield CaseRow(**d)

    def case_values(
        self, run_id: str, vpn: str, profile: str, label: str, name: str, below_rep: int | None = None
    ) -> list[float]:
        """One case-level metric of every successful case of a (VPN, profile, workload label) group; with
        `below_rep`, only repetitions before it (what a run knew when it planned that repetition: a resumed
        run plans the same adaptive repetitions as the killed one)."""
        return [
            v
            for (v,) in self.db.execute(
                'SELECT m.value FROM metric m JOIN "case" c ON c.id = m.case_id WHERE c.run_id = ? AND c.vpn = ? '
                "AND c.profile = ? AND c.label = ? AND c.status = 'ok' AND m.name = ? AND m.host IS NULL "
                "AND c.repetition < ?",
                (run_id, vpn, profile, label, name, 2**31 if below_rep is None else below_rep),
            )
        ]

    def metrics(self, run_id: str, every_status: bool = False) -> list[sqlite3.Row]:
        """Metrics of the run's successful cases (`every_status`: of every case that stored any, with its
        `status`), joined with their case keys. A value that is not a finite number (text, NULL, infinite: a
        damaged store; an unmeasured metric is never stored) is left out, with a line in `skipped` for a
        successful case's."""
        rows = self._read(
            "SELECT c.id AS case_id, c.vpn, c.profile, c.workload, c.label, c.repetition, c.attempt, "
            'm.name, m.value, m.unit, m.host, c.status FROM metric m JOIN "case" c ON c.id = m.case_id '
            "WHERE c.run_id=?" + ("" if every_status else " AND c.status='ok'") + " ORDER BY c.id",
            (run_id,),
            rows=True,
        )
        bad: dict[str, list[Any]] = defaultdict(list)
        for r in rows:
            if not _finite(r["value"]) and r["status"] == "ok":
                bad[r["name"]].append(r)
        for name, rs in bad.items():
            self._skip(
                f"{self.path}: {len(rs)} value(s) of metric {name} are not finite numbers "
                f"({_show(rs[0]['value'])} in case {rs[0]['case_id']}): left out"
            )
        return [r for r in rows if _finite(r["value"])]

    def set_metric_specs(self, run_id: str, specs: Iterable[tuple[str, MetricSpec, int]]) -> None:
        """The definitions the run measured with, (workload, spec, place among the workload's headline
        metrics: 1-based, 0 = not one) each ("" for the runner's own metrics), so a report of this run judges it by them, not by a later release's. A resumed
        run keeps the ones it started with."""
        with self.db:
            self.db.executemany(
                "INSERT OR IGNORE INTO metric_spec VALUES (?,?,?,?,?,?,?)",
                [(run_id, w, m.name, m.unit, m.better, m.description, h) for w, m, h in specs],
            )

    def metric_specs(self, run_id: str) -> dict[tuple[str, str], tuple[MetricSpec, int]]:
        """(workload, metric) -> (spec, headline place) as the run stored them; {} for a run from before."""
        if self.readonly and not self._read(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='metric_spec'"
        ):
            return {}
        rows = self._read(
            "SELECT workload, name, unit, better, description, headline FROM metric_spec WHERE run_id=?",
            (run_id,),
        )
        return {(w, n): (MetricSpec(n, u, b, d), int(h)) for w, n, u, b, d, h in rows}

    def env(self, run_id: str) -> dict[str, str]:
        """The run's environment: key -> value as stored (JSON, or text the runner stored as text). A value
        that starts as JSON does ({ or [) but does not parse is damaged: left out, with a line in `skipped`."""
        out = {}
        for k, v in self._read("SELECT key, value FROM environment WHERE run_id=?", (run_id,)):
            if isinstance(v, str) and v.lstrip()[:1] in ("{", "["):
                try:
                    json.loads(v)
                except json.JSONDecodeError as e:
                    self._skip(f"{self.path}: environment {k}: not valid JSON ({e.msg} at {e.pos}): left out")
                    continue
            out[k] = v
        return out

    def vpns(self, run_id: str) -> list[sqlite3.Row]:
        return self._read("SELECT * FROM vpn WHERE run_id=? ORDER BY rowid", (run_id,), rows=True)

    def phases(self, run_id: str) -> dict[str, float]:
        rows = self._read("SELECT phase, SUM(seconds) FROM phase WHERE run_id=? GROUP BY phase", (run_id,))
        return {p: s for p, s in rows if _finite(s)}

    def series(self, case_ids: Iterable[int]) -> list[sqlite3.Row]:
        """The time series points of these cases; a point whose time or value is not a finite number is left
        out, with a line in `skipped`."""
        ids = list(case_ids)
        if not ids:
            return []
        q = f"SELECT * FROM series WHERE case_id IN ({','.join('?' * len(ids))}) ORDER BY case_id, name, host, t"
        rows = self._read(q, ids, rows=True)
        bad: dict[str, list[Any]] = defaultdict(list)
        for r in rows:
            if not (_finite(r["t"]) and _finite(r["value"])):
                bad[r["name"]].append(r)
        for name, rs in bad.items():
            self._skip(
                f"{self.path}: {len(rs)} point(s) of series {name} are not finite numbers "
                f"(t {_show(rs[0]['t'])}, value {_show(rs[0]['value'])} in case {rs[0]['case_id']}): left out"
            )
        return [r for r in rows if _finite(r["t"]) and _finite(r["value"])]


def _check_schema(db: sqlite3.Connection, path: Path) -> None:
    """The tables and columns a reader reads (every table of SCHEMA, those of OPTIONAL_TABLES only when
    present), the schema version and at least one run; else StoreError naming what is wrong."""
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{path}: schema version {version}, newer than this tunnelbench reads ({SCHEMA_VERSION}): "
                "read it with the release that wrote it"
            )
        if "run" not in tables:
            raise StoreError(f"{path}: no 'run' table (not a tunnelbench store, or an older one)")
        missing = []
        for table, cols in schema_columns().items():
            if table not in tables:
                if table not in OPTIONAL_TABLES:
                    missing.append(f"no {table!r} table")
                continue
            have = {r[1] for r in db.execute(f'PRAGMA table_info("{table}")')}
            if cols - have:
                missing.append(f"table {table!r} lacks {', '.join(sorted(cols - have))}")
        if missing:
            raise StoreError(f"{path}: {'; '.join(missing)} (an older store)")
        if not db.execute("SELECT count(*) FROM run").fetchone()[0]:
            raise StoreError(f"{path}: no run recorded in the store")
    except sqlite3.Error as e:
        raise StoreError(f"{path}: not a readable tunnelbench store: {e}") from None
