"""Reading runs: `report`, `compare`, `history`, `export`. Each reads its stores read-only (store.py), refuses
a results root or run folder another user can write (core/files.py: FileRefused, exit 2 from the group),
checks where it will write before the work, and writes each file whole (write_atomic); a write that fails
after the work (a full disk) is one line and exit 1."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.text import Text

from tunnelbench.cli.common import Number, OutFile, console, err, find_run, main
from tunnelbench.core.files import FileRefused, check_destination, check_private_folder, write_atomic

if TYPE_CHECKING:
    from tunnelbench.store import Store


def run_folder(ref: str | None, results: Path) -> Path:
    """The run folder `ref` names (find_run), refused if another user can write it or the folder it is in
    (the results root it was found under, or the parent of a folder named by its path: another user could
    swap the run folder for a link between our check and our write)."""
    d = find_run(ref, results)
    if ref and Path(ref).is_dir():
        check_private_folder(d.resolve().parent, sticky_ok=True)
    else:
        check_private_folder(results)
    check_private_folder(d)
    return d


def say_skipped(stores: Iterable[Store]) -> None:
    """What the readers left out of damaged stores, one line each (once, however many reads found it)."""
    for line in dict.fromkeys(line for st in stores for line in st.skipped):
        err.print(Text(f"warning: {line}", style="yellow"), soft_wrap=True)


def write_out(path: Path, text: str) -> None:
    """An output file, whole or not at all; one that cannot be written now, after the work, ends the command
    with one line and exit 1 (a refused path was checked before the work: exit 2)."""
    try:
        write_atomic(path, text)
    except FileRefused:
        raise
    except OSError as e:
        err.print(Text(f"{path}: not written: {e.strerror or e}", style="red"), soft_wrap=True)
        sys.exit(1)


def write_stdout(text: str) -> None:
    """The text on stdout; a stdout that takes none (a full disk, a closed pipe) is one line and exit 1."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        # what is left in the buffer would fail again at exit, with a traceback-like line: drop it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        err.print(Text(f"stdout: not written: {e.strerror or e}", style="red"), soft_wrap=True)
        sys.exit(1)


@main.command()
@click.argument("run_refs", nargs=-1)
@click.option(
    "--results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"), show_default=True
)
@click.option(
    "--out",
    type=OutFile(),
    help="HTML file (default RUN/report.html; for several runs LAST_RUN/report-combined.html)",
)
@click.option(
    "--markdown",
    "md_out",
    type=OutFile(),
    help="Markdown summary (default: the HTML path with .md)",
)
@click.option(
    "--full",
    is_flag=True,
    help="also print every headline metric per VPN and workload, and the whole Security table",
)
def report(
    run_refs: tuple[str, ...], results: Path, out: Path | None, md_out: Path | None, full: bool = False
) -> None:
    """Print the headline of stored run(s) and write the self-contained HTML report and a Markdown summary
    (newest run when none is given). Several runs are combined into one report, e.g. two releases of a VPN."""
    from tunnelbench.report.full import render_markdown, render_report
    from tunnelbench.report.reading import read
    from tunnelbench.report.terminal import print_summary

    run_dirs = [run_folder(r, results) for r in run_refs] if run_refs else [run_folder(None, results)]
    path = out or run_dirs[-1] / ("report.html" if len(run_dirs) == 1 else "report-combined.html")
    md = md_out or path.with_suffix(".md")
    for dest in (path, md):  # before the work: a run folder we may not write is said now
        check_destination(dest)
    rd = read([(d, None) for d in run_dirs])  # the command's one reading: every view below renders it
    try:
        print_summary(rd, console, full=full)
        html, text = render_report(rd), render_markdown(rd)
    finally:
        rd.close()
    say_skipped(r.store for r in rd.runs)
    write_out(path, html)
    write_out(md, text)
    err.print(f"report: {path}\nmarkdown: {md}")


@main.command()
@click.argument("run_a")
@click.argument("run_b")
@click.option(
    "--results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"), show_default=True
)
@click.option(
    "--threshold",
    type=Number(0, 1000),
    default=10.0,
    show_default=True,
    help="flag regressions whose whole 95% CI is beyond this many percent",
)
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    help="compare and gate only these metrics (repeat); default: headline throughput/latency/time",
)
@click.option(
    "--json",
    "json_out",
    type=OutFile(),
    help="also write the comparison as JSON",
)
@click.option("--all", "show_all", is_flag=True, help="also list metrics that are not gated")
def compare(
    run_a: str,
    run_b: str,
    results: Path,
    threshold: float,
    metrics: tuple[str, ...],
    json_out: Path | None,
    show_all: bool,
) -> None:
    """Compare run B against run A (matched by VPN, profile, workload, metric); exit 1 on a significant
    regression beyond --threshold in a gated metric or when B ran a case of A's that never succeeded,
    0 otherwise (2 when nothing matches)."""
    import json

    from tunnelbench.analysis.analyze import load_run
    from tunnelbench.analysis.compare import compare_runs
    from tunnelbench.report.terminal import print_comparison

    a = load_run(run_folder(run_a, results))
    b = load_run(run_folder(run_b, results))
    cmp = compare_runs(a, b, threshold, list(metrics) or None)
    say_skipped([a.store, b.store])
    if json_out:
        write_out(json_out, json.dumps(cmp.to_json(), indent=1) + "\n")
    if not cmp.changes and not cmp.failed_b and not cmp.security_b:
        err.print(
            Text(
                f"no matching (VPN, profile, workload, metric) between {a.run_id} and {b.run_id}", style="red"
            )
        )
        sys.exit(2)
    print_comparison(cmp, console, show_all)
    sys.exit(1 if cmp.gate_failed else 0)


@main.command()
@click.option(
    "--results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"), show_default=True
)
@click.option("--vpn", "vpns", multiple=True, help="only these VPNs (repeat, or a comma list)")
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    help="only these metrics (repeat; compared and gated as compare --metric); default: headline",
)
@click.option(
    "--threshold",
    type=Number(0, 1000),
    default=10.0,
    show_default=True,
    help="flag changes whose whole 95% CI is beyond this many percent (as compare)",
)
@click.option("--out", type=OutFile(), help="HTML file (default RESULTS/history.html)")
def history(
    results: Path, vpns: tuple[str, ...], metrics: tuple[str, ...], threshold: float, out: Path | None
) -> None:
    """The trend of every VPN across all stored runs: an offline HTML page (each headline metric over time
    with its CI, the changes compare flags between consecutive runs) and the latest vs previous run per VPN."""
    from tunnelbench.report import history as hist

    if results.is_dir():
        check_private_folder(results)
    path = out or results / "history.html"
    if results.is_dir():
        check_destination(path)  # before the work
    runs, skipped = hist.collect_runs(results)
    for d, why in skipped:
        err.print(Text(f"skipped {d}: {why}", style="yellow"), soft_wrap=True)
    if not runs:
        raise click.UsageError(f"no readable runs under {results}/ (use --results DIR)")
    names = [x.strip() for v in vpns for x in v.split(",") if x.strip()]
    try:
        h = hist.build_history(runs, names or None, list(metrics) or None, threshold, skipped)
        for name in names:
            if name not in h.vpns:
                what = ", ".join(metrics) or "headline"
                err.print(Text(f"no {what} metric of VPN {name!r} in any run", style="yellow"))
        hist.print_history(h, console)
        say_skipped(r.store for r in runs)
        write_out(path, hist.render_history(h))
    finally:
        hist.close_runs(runs)
    err.print(Text(f"history: {path}"))


@main.command()
@click.argument("run_ref", required=False)
@click.option(
    "--results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"), show_default=True
)
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True)
@click.option("--series", is_flag=True, help="CSV: the time series instead of the metrics; JSON: add them")
@click.option("--out", type=OutFile(), help="file (default: stdout)")
def export(run_ref: str | None, results: Path, fmt: str, series: bool, out: Path | None) -> None:
    """Tidy export of a run's metrics with their case keys (one row per value), as CSV or JSON."""
    from tunnelbench.analysis.analyze import load_run
    from tunnelbench.report.export import SERIES_COLUMNS, metric_rows, series_rows, to_csv, to_json

    run = load_run(run_folder(run_ref, results))
    if fmt == "json":
        text = to_json(run, series)
    else:
        text = to_csv(series_rows(run), SERIES_COLUMNS) if series else to_csv(metric_rows(run))
    say_skipped([run.store])
    if out:
        write_out(out, text)
        err.print(f"{fmt}: {out}")
    else:
        write_stdout(text)
