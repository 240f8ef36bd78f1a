"""What a command that shows runs reads once and every view renders (Flent's model: one results object, every
formatter reads it). `read` opens each run's store once (its metric table read once: analysis/analyze.py
`load_run`), analyses the runs once, builds the headline once and each run's Security rows once; the terminal
summary, the HTML report, the Markdown summary and the Security table render that `Reading` and compute nothing
of their own. `run` (runner/execute.py) and `report` (cli/results.py) each build one; `compare` and `history`
read each run's own analysis (`RunData.alone`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunnelbench.analysis.analyze import Analysis, RunData, analyze, load_run
from tunnelbench.report.headline import Headline, build
from tunnelbench.report.security import key_scan, security_rows


@dataclass
class Security:
    """One run's Security rows (report/security.py) and its output key scan (None: the run had none)."""

    rows: list[dict[str, Any]]
    scan: tuple[str, bool] | None


@dataclass
class Reading:
    analysis: Analysis
    headline: Headline
    security: dict[str, Security]  # run id -> its Security rows and key scan

    @classmethod
    def of(cls, a: Analysis) -> Reading:
        """Everything the views show of an analysis, built once."""
        return cls(a, build(a), {r.run_id: Security(security_rows(r), key_scan(r)) for r in a.runs})

    @property
    def runs(self) -> list[RunData]:
        return self.analysis.runs

    def close(self) -> None:
        for r in self.runs:
            r.store.close()


def read(runs: list[tuple[Path, str | None]]) -> Reading:
    """The runs (run folder, run id or None for its newest) read and analysed together, once."""
    loaded: list[RunData] = []
    try:
        for run_dir, run_id in runs:
            loaded.append(load_run(run_dir, run_id))
        return Reading.of(analyze(loaded))
    except BaseException:
        for r in loaded:
            r.store.close()
        raise
