"""One reading per command: the end of `run` (runner/execute.py, the report step) and `report` open each run's
store once, read its metric table once, analyse once, build the headline once and the emulator facts once per
run; every view (terminal, HTML, Markdown, Security, emulator facts) renders that one reading.

Counted from outside the code under test: every Store's SQLite connection traces its statements (a metric-table
read is a statement that reads `FROM metric`), and analyze, the headline's build and emulator_facts are wrapped
wherever a tunnelbench module holds them, so a second call from any module is counted."""

from __future__ import annotations

import importlib
import io
import pkgutil
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console
from synthetic_runs import make_run

import tunnelbench
import tunnelbench.analysis.analyze as analyze_mod
import tunnelbench.analysis.emulator as emulator_mod
import tunnelbench.cli.app as app
import tunnelbench.report.headline as headline_mod
import tunnelbench.runner.execute as execute_mod
from tunnelbench.runner.loop import RunResult
from tunnelbench.store import Store

METRIC_READ = re.compile(r"\bFROM\s+metric\b", re.I)


@pytest.fixture
def counts(monkeypatch) -> Counter:
    """Counter of store opens, metric-table reads, analyses, headline builds and emulator facts."""
    n: Counter = Counter()
    init = Store.__init__

    def counting_init(self: Store, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        n["store opens"] += 1
        self.db.set_trace_callback(lambda sql: n.update(["metric reads"] if METRIC_READ.search(sql) else []))

    monkeypatch.setattr(Store, "__init__", counting_init)
    for name, fn in (
        ("analyses", analyze_mod.analyze),
        ("headline builds", headline_mod.build),
        ("emulator facts", emulator_mod.emulator_facts),
    ):
        wrap_everywhere(monkeypatch, fn, counted(fn, name, n))
    return n


def counted(fn: Callable[..., Any], name: str, n: Counter) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        n[name] += 1
        return fn(*args, **kwargs)

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def wrap_everywhere(monkeypatch, fn: Callable[..., Any], wrapper: Callable[..., Any]) -> None:
    """Every tunnelbench module's name bound to `fn` now calls `wrapper`. Every module is imported first, so
    no module binds the original later; an import inside a function reads the module's attribute when it
    runs, so it gets the wrapper too."""
    for info in pkgutil.walk_packages(tunnelbench.__path__, "tunnelbench."):
        if not info.name.endswith("__main__"):  # the console entry point runs the CLI when imported
            importlib.import_module(info.name)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("tunnelbench"):
            for attr, val in list(vars(mod).items()):
                if val is fn or getattr(val, "__wrapped__", None) is fn:
                    monkeypatch.setattr(mod, attr, wrapper)


def one_run(tmp_path: Path, name: str = "20260101-000000-tbread") -> Path:
    return make_run(tmp_path, name, {"internal": (2000, 40), "fastvpn": (900, 20), "slowvpn": (300, 10)}, n=3)


def test_the_end_of_a_run_reads_once_and_every_view_renders_that(tmp_path, counts):
    """execute's report step after the Runner (a Runner stand-in whose run is already stored): the summary,
    report.html, report.md and the exit code from one store open, one metric read, one analysis, one headline."""
    run_dir = one_run(tmp_path)
    counts.clear()  # what making the run counted
    runner = SimpleNamespace(
        run_id=run_dir.name,
        run_dir=run_dir,
        run=lambda: RunResult(run_dir.name, run_dir, "ok", 1.0),
        secrets=SimpleNamespace(values={}),
    )
    out, err = io.StringIO(), io.StringIO()
    x = execute_mod._execute(
        runner, None, True, Console(file=out, width=200), Console(file=err, width=200), None
    )  # type: ignore[arg-type]
    assert x.code == 0, err.getvalue()
    assert (run_dir / "report.html").is_file() and (run_dir / "report.md").is_file()
    assert "headline" in out.getvalue() and "fastvpn" in (run_dir / "report.md").read_text()
    want = {"store opens": 1, "metric reads": 1, "analyses": 1, "headline builds": 1, "emulator facts": 1}
    assert dict(counts) == want


@pytest.mark.parametrize("runs", [1, 2])
def test_report_reads_each_run_once_and_analyses_them_once(tmp_path, counts, runs):
    """`tunnelbench report` of one run, and of two combined: each store opened once and its metric table read
    once; one analysis and one headline for the whole command (the terminal's, the HTML's and the Markdown's)."""
    dirs = [one_run(tmp_path, f"20260101-00000{i}-tbrd{i}") for i in range(runs)]
    counts.clear()  # what making the runs counted
    res = CliRunner().invoke(app.main, ["report", *map(str, dirs), "--results", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert (dirs[-1] / ("report.html" if runs == 1 else "report-combined.html")).is_file()
    assert dict(counts) == {
        "store opens": runs,
        "metric reads": runs,
        "analyses": 1,
        "headline builds": 1,
        "emulator facts": runs,
    }


def test_the_renderers_import_nothing_that_reads_or_analyses():
    """The views (report/full.py, report/terminal.py) render a Reading: they import no loader, no analysis and no
    headline builder (report/reading.py is the one place that calls them)."""
    src = Path(analyze_mod.__file__).parents[1] / "report"
    for view in ("full.py", "terminal.py"):
        text = (src / view).read_text()
        for name in (
            "load_run",
            "analyze(",
            "emulator_facts",
            "build_headline",
            "headline import build",
            "Store",
        ):
            assert name not in text, f"report/{view} uses {name}"
