"""The exit code `run` ends with (runner/execute.py): the run's own ending (an exception: 1, interrupted: 130)
combined with what its store says was measured (0 every planned case, 1 some not, 3 none). The Runner is
replaced by one that writes a hand-made store, so the code is checked against case statuses written here,
in the fast lane (the lab test in tests/analysis/test_exit_codes.py runs the CLI on a real run)."""

from __future__ import annotations

import io
import json
import sqlite3
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from tunnelbench.core.results import Outcome, Sample
from tunnelbench.runner import execute as ex
from tunnelbench.runner.case import Interrupted
from tunnelbench.scenario import parse_scenario
from tunnelbench.store import DB_NAME, Store

TEXT = 'vpns = ["internal", "vxlan"]\n[[workloads]]\nname = "connect"\n'
RUN = "20261128-130000-tbexec"

# (vpn, repetition, status) of every attempt, and the VPN records (name -> (status, reason))
ALL_OK = [("internal", 1, "ok"), ("internal", 2, "ok"), ("vxlan", 1, "ok"), ("vxlan", 2, "ok")]
RETRIED = [*ALL_OK[:3], ("vxlan", 2, "failed"), ("vxlan", 2, "ok")]  # a failed attempt, then its retry ok
ONE_FAILED = [*ALL_OK[:3], ("vxlan", 2, "failed"), ("vxlan", 2, "failed")]  # every attempt of a case failed
NONE_OK = [("internal", 1, "failed"), ("vxlan", 1, "failed")]
OK_VPNS = {"internal": ("ok", None), "vxlan": ("ok", None)}


class FakeRunner:
    """Stands in for runner/loop.py's Runner: run() stores the given cases (and VPN records) and ends as told."""

    cases: list[tuple[str, int, str]] = []
    vpns: dict[str, tuple[str, str | None]] = OK_VPNS
    ending: BaseException | str = "ok"  # the status run() returns, or what it raises

    def __init__(self, sc, text, err, results, overrides=None, resume=None) -> None:
        self.run_id = RUN
        self.run_dir = Path(results) / RUN
        self.run_dir.mkdir(parents=True)
        self.secrets = SimpleNamespace(values=[])

    def run(self) -> SimpleNamespace:
        st = Store(self.run_dir / DB_NAME)
        st.begin_run(self.run_id, "tbexec", TEXT, "0")
        for name, (status, reason) in self.vpns.items():
            st.set_vpn(self.run_id, name, "1", status, reason)
        attempts: dict[tuple[str, int], int] = {}
        for vpn, rep, status in self.cases:
            attempt = attempts[(vpn, rep)] = attempts.get((vpn, rep), -1) + 1
            adir = self.run_dir / "cases" / vpn / f"r{rep}a{attempt}"
            adir.mkdir(parents=True)
            cid = st.start_case(
                self.run_id, vpn, "baseline", "connect", "connect", {}, rep, attempt, "h1", "h2", adir
            )
            if status == "ok":
                st.finish_case(cid, "ok", Outcome(samples=[Sample("connect_s", 0.1, "s")]))
            else:
                st.finish_case(cid, status, error="WorkloadError: planted")
        ended = self.ending if isinstance(self.ending, str) else "failed"
        st.end_run(self.run_id, ended)
        st.close()
        if isinstance(self.ending, BaseException):
            raise self.ending
        return SimpleNamespace(status=self.ending)


@pytest.mark.parametrize(
    ("cases", "vpns", "ending", "code", "line"),
    [
        (ALL_OK, OK_VPNS, "ok", 0, "exit 0: all 4 planned case(s) measured"),
        (RETRIED, OK_VPNS, "ok", 0, "exit 0: all 4 planned case(s) measured"),
        (ONE_FAILED, OK_VPNS, "ok", 1, "exit 1: 1 of 4 planned case(s) not measured: vxlan: 1 case(s)"),
        (
            ALL_OK[:2],
            {**OK_VPNS, "vxlan": ("skipped", "mesh did not come up")},
            "ok",
            1,
            "exit 1: 0 of 2 planned case(s) not measured: vxlan: no case (skipped: mesh did not come up)",
        ),
        (NONE_OK, OK_VPNS, "ok", 3, "exit 3: nothing measured (2 planned case(s))"),
        # the run itself failed after storing every case: 1, whatever the store says
        (ALL_OK, OK_VPNS, RuntimeError("planted"), 1, "exit 1: the run failed; exit 0: all 4 planned"),
        (ALL_OK, OK_VPNS, "failed", 1, "exit 1: the run failed; exit 0: all 4 planned"),
        (NONE_OK, OK_VPNS, RuntimeError("planted"), 3, "exit 3: nothing measured (2 planned case(s))"),
        (ONE_FAILED, OK_VPNS, Interrupted(), 130, None),  # interrupted: not judged, `--resume` goes on
    ],
    ids=[
        "all-ok",
        "retried",
        "one-failed",
        "vpn-skipped",
        "none-ok",
        "raised",
        "status-failed",
        "raised-none-ok",
        "interrupted",
    ],  # fmt: skip
)
def test_the_exit_code_is_the_runs_ending_and_the_stores_judgement(
    tmp_path, monkeypatch, cases, vpns, ending, code, line
):
    monkeypatch.setattr(FakeRunner, "cases", cases)
    monkeypatch.setattr(FakeRunner, "vpns", vpns)
    monkeypatch.setattr(FakeRunner, "ending", ending)
    monkeypatch.setattr(ex, "Runner", FakeRunner)
    out, err = io.StringIO(), io.StringIO()
    sc = parse_scenario(tomllib.loads(TEXT), "t")
    x = ex.execute(
        sc, TEXT, {}, None, tmp_path, False, Console(file=out, width=300), Console(file=err, width=300)
    )
    said = err.getvalue()
    assert (x.run_id, x.run_dir) == (RUN, tmp_path / RUN)
    assert x.code == code, f"run returned exit {x.code}, the store and the run's ending say {code}: {said}"
    if line is None:
        assert "exit " not in said, said
    else:
        assert line in said, said


class PartRunner(FakeRunner):
    """A suite's part: its own run id, its cases and ending from PLAN in turn."""

    PLAN: list[tuple[list[tuple[str, int, str]], BaseException | str]] = []
    made: list[str] = []

    def __init__(self, sc, text, err, results, overrides=None, resume=None) -> None:
        self.cases, self.ending = self.PLAN[len(self.made)]
        self.run_id = f"20261128-13000{len(self.made)}-tbpart{len(self.made)}"
        self.made.append(self.run_id)
        self.run_dir = Path(results) / self.run_id
        self.run_dir.mkdir(parents=True)
        self.secrets = SimpleNamespace(values=[])


@pytest.mark.parametrize(
    ("plan", "code", "parts_run", "note"),
    [
        ([(ALL_OK, "ok"), (ALL_OK, "ok")], 0, 2, None),
        ([(ALL_OK, "ok"), (ONE_FAILED, "ok")], 1, 2, None),
        ([(NONE_OK, "ok"), (NONE_OK, "ok")], 3, 2, None),
        ([(NONE_OK, "ok"), (ALL_OK, "ok")], 1, 2, None),  # one part measured something: not "nothing"
        ([(ALL_OK, Interrupted()), (ALL_OK, "ok")], 130, 1, "interrupted during p1: later parts not run"),
    ],
    ids=["all-ok", "a-part-short", "nothing", "one-part-nothing", "interrupted"],
)
def test_a_suite_runs_each_part_and_merges_their_codes(tmp_path, monkeypatch, plan, code, parts_run, note):
    from tunnelbench.suite import Suite

    monkeypatch.setattr(PartRunner, "PLAN", plan)
    monkeypatch.setattr(PartRunner, "made", [])
    monkeypatch.setattr(ex, "Runner", PartRunner)
    sc = parse_scenario(tomllib.loads(TEXT), "t")
    asked: list[object] = []
    notes: list[str] = []
    suite = Suite("tbs", "", ["p1", "p2"], "t", None)
    out, err = io.StringIO(), io.StringIO()
    got = ex.execute_suite(
        suite,
        [("p1", sc, TEXT, {}), ("p2", sc, TEXT, {})],
        notes,
        tmp_path,
        False,
        Console(file=out, width=300),
        Console(file=err, width=300),
        before_each=lambda s: asked.append(s),
    )
    assert got == code, err.getvalue()
    assert len(PartRunner.made) == parts_run and asked == [sc] * parts_run
    assert notes == ([note] if note else [])
    matrix = tmp_path / f"tbs-suite-{PartRunner.made[0]}" / "matrix.json"
    runs = json.loads(matrix.read_text())["runs"]
    assert [r["id"] for r in runs] == PartRunner.made
    assert f"matrix: {matrix.with_name('matrix.md')}" in " ".join(err.getvalue().split())


class Lock:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def describe(self, run_id, run_dir) -> None:
        self.calls.append(("describe", run_id, run_dir))

    def release(self) -> None:
        self.calls.append(("release",))


def run_once(
    tmp_path, monkeypatch, ending, html: bool = False, lock: Lock | None = None
) -> tuple[ex.Executed, str, str]:
    monkeypatch.setattr(FakeRunner, "cases", ALL_OK)
    monkeypatch.setattr(FakeRunner, "ending", ending)
    monkeypatch.setattr(ex, "Runner", FakeRunner)
    out, err = io.StringIO(), io.StringIO()
    sc = parse_scenario(tomllib.loads(TEXT), "t")
    x = ex.execute(
        sc, TEXT, {}, None, tmp_path, html, Console(file=out, width=300), Console(file=err, width=300), lock
    )  # type: ignore[arg-type]
    return x, out.getvalue(), " ".join(err.getvalue().split())


def test_what_the_run_says_about_its_folder_a_crash_and_a_full_disk(tmp_path, monkeypatch):
    import errno

    x, out, said = run_once(tmp_path / "a", monkeypatch, RuntimeError("planted"))
    run_dir = tmp_path / "a" / RUN
    assert said.startswith(f"run {RUN} -> {run_dir} ")
    assert f"run failed: RuntimeError: planted (traceback in {run_dir / 'error.txt'})" in said
    assert (run_dir / "error.txt").read_text().rstrip().endswith("RuntimeError: planted")
    assert "median over repetitions" in out  # the summary is printed whatever happened
    x, _, said = run_once(tmp_path / "b", monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    assert x.code == 1 and not (tmp_path / "b" / RUN / "error.txt").exists()
    assert (
        f"run stopped: the results disk is full ({tmp_path / 'b' / RUN}): the lab is torn down and every case "
        f"stored before is kept; free space, then `tunnelbench run --resume {RUN}` measures the rest" in said
    )
    assert ex.disk_full(OSError(errno.EDQUOT, "quota")) and ex.disk_full(
        sqlite3.OperationalError("database or disk is full")
    )
    assert not ex.disk_full(OSError(errno.EACCES, "denied")) and not ex.disk_full(
        sqlite3.OperationalError("locked")
    )


def test_the_report_is_written_where_the_run_is_and_the_lab_lock_is_let_go(tmp_path, monkeypatch):
    wrote: list[tuple] = []

    def write_report(rd, path, markdown):
        wrote.append((rd.runs[0].run_dir, rd.runs[0].run_id, path, markdown))

    monkeypatch.setattr(ex, "write_report", write_report)
    lock = Lock()
    x, _, said = run_once(tmp_path, monkeypatch, "ok", html=True, lock=lock)
    run_dir = tmp_path / RUN
    assert (
        wrote == [(run_dir, RUN, run_dir / "report.html", run_dir / "report.md")]
        and f"report: {run_dir / 'report.html'}" in said
    )
    assert lock.calls == [("describe", RUN, run_dir), ("release",)] and x.code == 0

    def cannot(rd, path, markdown):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ex, "write_report", cannot)
    x, _, said = run_once(tmp_path / "b", monkeypatch, "ok", html=True)
    assert "report not written: [Errno 28] No space left on device" in said and x.code == 0


def test_a_run_with_secrets_ends_with_the_key_scan_line(tmp_path, monkeypatch):
    from tunnelbench.security.keys import scan_line

    monkeypatch.setattr(FakeRunner, "secrets", SimpleNamespace(values=["s3cret"]), raising=False)
    found = {
        "secrets": 2,
        "outputs": ["report.html", "results.sqlite"],
        "hits": [{"output": "report.html", "offset": 7}],
    }
    monkeypatch.setattr(FakeRunner, "scan_outputs", lambda self: found, raising=False)

    def init(self, sc, text, err, results, overrides=None, resume=None) -> None:
        self.run_id, self.run_dir = RUN, Path(results) / RUN
        self.run_dir.mkdir(parents=True)

    monkeypatch.setattr(FakeRunner, "__init__", init)
    _, out, _ = run_once(tmp_path, monkeypatch, "ok")
    assert out.rstrip().endswith("key scan: KEY MATERIAL FOUND in the outputs: report.html @7")
    assert scan_line(found)[0] == "key scan: KEY MATERIAL FOUND in the outputs: report.html @7"
