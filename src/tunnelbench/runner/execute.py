"""One scenario run to the end as the `run` verb does it, and a suite of such runs: the Runner, then the
summary, the HTML report, the key scan and the exit code a CI job gates on (analysis/outcome.py). A suite runs
each part as its own run and merges their security matrix. The CLI parses the input and holds the lab lock;
everything after that is here."""

from __future__ import annotations

import errno
import sqlite3
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from tunnelbench.analysis.analyze import load_run
from tunnelbench.analysis.outcome import NOTHING_MEASURED, judge_run, suite_code
from tunnelbench.core.files import write_atomic
from tunnelbench.lab.lock import LabBusy, LabLock, RunLock
from tunnelbench.report.full import write_report
from tunnelbench.report.reading import read
from tunnelbench.report.terminal import print_summary, security_table
from tunnelbench.runner.case import Interrupted
from tunnelbench.runner.loop import Runner
from tunnelbench.runner.resume import ResumeError, ResumePlan
from tunnelbench.scenario import Scenario
from tunnelbench.security.keys import scan_line
from tunnelbench.suite import Suite, merged_rows, write_matrix


@dataclass
class Executed:
    code: int  # the exit code: 0 all measured, 1 some not, 3 nothing, 130 interrupted
    run_dir: Path
    run_id: str


def disk_full(e: BaseException) -> bool:
    """The run's results disk filled up (SQLite says so in its own words, a file write with ENOSPC)."""
    if isinstance(e, sqlite3.OperationalError) and "disk is full" in str(e):
        return True
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def execute(
    sc: Scenario,
    text: str,
    overrides: dict[str, Any],
    plan: ResumePlan | None,
    results: Path | None,
    html: bool,
    console: Console,
    err: Console,
    lock: LabLock | None = None,
) -> Executed:
    """Run one scenario to the end, print its summary, write its report. ResumeError (the run folder cannot be
    continued) is raised before anything runs; `lock`, the lab lock the caller holds, is released once the lab
    is gone. The run folder's own lock is held from before anything is written there to the end: a second
    process on it (a `--resume` while the run goes on, two resumes) is refused with exit 2, naming the first."""
    runner = Runner(sc, text, err, results, overrides=overrides, resume=plan)
    try:
        folder = RunLock(runner.run_dir, "run --resume" if plan else "run").acquire()
    except LabBusy as e:
        if lock is not None:
            lock.release()
        err.print(Text(str(e), style="red"))
        return Executed(2, runner.run_dir, runner.run_id)
    try:
        return _execute(runner, plan, html, console, err, lock)
    finally:
        folder.release()


def _execute(
    runner: Runner, plan: ResumePlan | None, html: bool, console: Console, err: Console, lock: LabLock | None
) -> Executed:
    if lock is not None:
        lock.describe(runner.run_id, runner.run_dir)
    err.print(Text(f"{'resuming run' if plan else 'run'} {runner.run_id} -> {runner.run_dir}"))
    code = 0
    res = None
    try:
        res = runner.run()
    except ResumeError:  # raised before the run is reopened: nothing to summarize
        raise
    except (Interrupted, KeyboardInterrupt):
        code = 130
    except Exception as e:  # the run is torn down and stored; say what broke, keep the traceback
        if disk_full(e):
            err.print(Text(
                f"run stopped: the results disk is full ({runner.run_dir}): the lab is torn down and every case "
                f"stored before is kept; free space, then `tunnelbench run --resume {runner.run_id}` measures "
                "the rest", style="red"))  # fmt: skip
        else:
            where = runner.run_dir / "error.txt"
            try:
                write_atomic(where, traceback.format_exc())
            except OSError as w:
                where = f"not written: {w.strerror or w}"  # type: ignore[assignment]
            err.print(Text(f"run failed: {type(e).__name__}: {e} (traceback in {where})", style="red"))
        code = 1
    rd = read([(runner.run_dir, runner.run_id)])  # the run's one reading: every view below renders it
    try:
        print_summary(rd, console)
        if html:
            path = runner.run_dir / "report.html"
            try:
                write_report(rd, path, path.with_suffix(".md"))
                err.print(f"report: {path}")
            except OSError as e:
                err.print(Text(f"report not written: {e}", style="red"))
    finally:
        rd.close()
    if runner.secrets.values:  # after the report: every output the run wrote is searched for its keys
        line, style = scan_line(runner.scan_outputs())
        console.print(Text(line, style=style))
    if lock is not None:  # the lab is gone: a suite's next part (or another run) may build one
        lock.release()
    if code != 130:  # an ended run: its exit code says whether every planned case was measured
        out = judge_run(rd.runs[0])
        if code == 0 and res is not None and res.status != "ok":
            code = 1
        code = NOTHING_MEASURED if out.code == NOTHING_MEASURED else max(code, out.code)
        err.print(Text(out.line() if code == out.code else f"exit {code}: the run failed; {out.line()}",
                       style="green" if code == 0 else "yellow" if code == 1 else "red"))  # fmt: skip
    return Executed(code, runner.run_dir, runner.run_id)


Part = tuple[str, Scenario, str, dict[str, Any]]  # (part name, scenario, its text, its overrides)


def execute_suite(
    suite: Suite,
    parts: list[Part],
    notes: list[str],
    results: Path | None,
    html: bool,
    console: Console,
    err: Console,
    before_each: Callable[[Scenario], LabLock | None] | None = None,
) -> int:
    """Every part of a suite as its own run, then the merged Security matrix; the suite's exit code.
    `before_each(scenario)` returns the lab lock a part holds (or None) after its first-use builds."""
    done: list[tuple[Path, str]] = []
    codes = []
    for i, (part, sc, text, over) in enumerate(parts, 1):
        err.print(
            Text(f"suite {suite.name}: part {i}/{len(parts)}: {part} ({len(sc.vpns)} VPN(s))", style="bold")
        )
        lock = before_each(sc) if before_each is not None else None
        x = execute(sc, text, over, None, results, html, console, err, lock)
        done.append((x.run_dir, x.run_id))
        codes.append(x.code)
        if x.code == 130:  # interrupted: the finished parts stay, and the matrix shows what they measured
            notes.append(f"interrupted during {part}: later parts not run")
            break
    runs = [load_run(d, rid) for d, rid in done]
    try:
        rows = merged_rows(runs)
        folder = (results or Path("results")) / f"{suite.name}-suite-{done[0][1]}"
        path = write_matrix(suite, runs, rows, notes, folder)
    finally:
        for r in runs:
            r.store.close()
    console.print(security_table(rows, f"{suite.name}: merged from {len(runs)} run(s)"))
    for n in notes:
        console.print(Text(n, style="dim"))
    err.print(f"matrix: {path}")
    return suite_code(codes)
