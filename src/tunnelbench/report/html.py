"""The HTML page of a stored run: `write_html` writes the full report (report/full.py: statistics, tiers, plots)
and a Markdown summary next to it, both from the run's one analysis."""

from __future__ import annotations

from pathlib import Path

from tunnelbench.core.files import write_atomic
from tunnelbench.store import Store


def write_html(store: Store, run_id: str, path: Path) -> Path:
    """The full report of this run at `path`, and its Markdown summary at the same name with .md, each
    written whole (core/files.py: a kill mid-write keeps the previous file; a link there is refused)."""
    from tunnelbench.analysis.analyze import analyze, load_run
    from tunnelbench.report.full import render_markdown, render_report

    a = analyze([load_run(store.path.parent, run_id)])
    write_atomic(path, render_report(a))
    write_atomic(path.with_suffix(".md"), render_markdown(a))
    return path
