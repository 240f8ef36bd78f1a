"""The SQLite store of a run folder: run -> cases -> metrics and time series, plus environment and phases.

Every finished case is committed at once (WAL journal), so a crash or SIGKILL later keeps it."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    def __init__(self, path: Path):
        self.path = path
        self.db = sqlite3.connect(path, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self.db.commit()

    @classmethod
    def open_run_dir(cls, run_dir: Path) -> Store:
        p = run_dir / DB_NAME
        if not p.exists():
            raise FileNotFoundError(f"no {DB_NAME} in {run_dir}")
        return cls(p)

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
    def runs(self) -> list[sqlite3.Row]:
        self.db.row_factory = sqlite3.Row
        return list(self.db.execute("SELECT * FROM run ORDER BY started"))

    def run_row(self, run_id: str | None = None) -> sqlite3.Row:
        self.db.row_factory = sqlite3.Row
        q = "SELECT * FROM run " + ("WHERE id=?" if run_id else "ORDER BY started DESC LIMIT 1")
        row: sqlite3.Row | None = self.db.execute(q, (run_id,) if run_id else ()).fetchone()
        if row is None:
            raise KeyError(run_id or "no run in store")
        return row

    def cases(self, run_id: str) -> Iterator[CaseRow]:
        self.db.row_factory = sqlite3.Row
        for r in self.db.execute('SELECT * FROM "case" WHERE run_id=? ORDER BY id', (run_id,)):
            d = dict(r)
            d["params"] = json.loads(d["params"] or "{}")
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

    def metric_totals(self, run_id: str, names: tuple[str, ...]) -> dict[str, tuple[float, int]]:
        """(sum, count) of each named metric over the run's cases (any host)."""
        marks = ",".join("?" * len(names))
        return {
            n: (s, k)
            for n, s, k in self.db.execute(
                f'SELECT m.name, SUM(m.value), COUNT(*) FROM metric m JOIN "case" c ON c.id = m.case_id '
                f"WHERE c.run_id = ? AND m.name IN ({marks}) GROUP BY m.name",
                (run_id, *names),
            )
        }

    def metrics(self, run_id: str) -> list[sqlite3.Row]:
        """Metrics of the run's successful cases, joined with their case keys."""
        self.db.row_factory = sqlite3.Row
        return list(
            self.db.execute(
                "SELECT c.id AS case_id, c.vpn, c.profile, c.workload, c.label, c.repetition, c.attempt, "
                'm.name, m.value, m.unit, m.host FROM metric m JOIN "case" c ON c.id = m.case_id '
                "WHERE c.run_id=? AND c.status='ok' ORDER BY c.id",
                (run_id,),
            )
        )

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
        rows = self.db.execute(
            "SELECT workload, name, unit, better, description, headline FROM metric_spec WHERE run_id=?",
            (run_id,),
        ).fetchall()
        return {(w, n): (MetricSpec(n, u, b, d), int(h)) for w, n, u, b, d, h in rows}

    def env(self, run_id: str) -> dict[str, str]:
        return dict(
            self.db.execute("SELECT key, value FROM environment WHERE run_id=?", (run_id,)).fetchall()
        )

    def vpns(self, run_id: str) -> list[sqlite3.Row]:
        self.db.row_factory = sqlite3.Row
        return list(self.db.execute("SELECT * FROM vpn WHERE run_id=? ORDER BY rowid", (run_id,)))

    def phases(self, run_id: str) -> dict[str, float]:
        rows = self.db.execute(
            "SELECT phase, SUM(seconds) FROM phase WHERE run_id=? GROUP BY phase", (run_id,)
        )
        return dict(rows.fetchall())

    def series(self, case_ids: Iterable[int]) -> list[sqlite3.Row]:
        self.db.row_factory = sqlite3.Row
        ids = list(case_ids)
        if not ids:
            return []
        q = f"SELECT * FROM series WHERE case_id IN ({','.join('?' * len(ids))}) ORDER BY case_id, name, host, t"
        return list(self.db.execute(q, ids))
