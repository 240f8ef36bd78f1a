"""Reading runs: `report`, `compare`, `history`, `export`."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.text import Text

from tunnelbench.cli.common import Number, OutFile, console, err, find_run, main


@main.command()
@click.argument("run_refs", nargs=-1)
@click.option(
    "--results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"), show_default=True
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="HTML file (default RUN/report.html; for several runs LAST_RUN/report-combined.html)",
)
@click.option(
    "--markdown",
    "md_out",
    type=click.Path(dir_okay=False, path_type=Path),
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
    from tunnelbench.report.full import write_report
    from tunnelbench.report.terminal import print_summary
    from tunnelbench.store import Store

    run_dirs = [find_run(r, results) for r in run_refs] if run_refs else [find_run(None, results)]
    for run_dir in run_dirs:
        store = Store.open_run_dir(run_dir)
        run_id = store.run_row()["id"]
        print_summary(store, run_id, console, full=full)
        store.close()
    default = run_dirs[-1] / ("report.html" if len(run_dirs) == 1 else "report-combined.html")
    path = out or default
    write_report(run_dirs, path, md_out or path.with_suffix(".md"))
    err.print(f"report: {path}\nmarkdown: {md_out or path.with_suffix('.md')}")


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

    a = load_run(find_run(run_a, results))
    b = load_run(find_run(run_b, results))
    cmp = compare_runs(a, b, threshold, list(metrics) or None)
    if json_out:
        json_out.write_text(json.dumps(cmp.to_json(), indent=1) + "\n")
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
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="HTML file (default RESULTS/history.html)"
)
def history(
    results: Path, vpns: tuple[str, ...], metrics: tuple[str, ...], threshold: float, out: Path | None
) -> None:
    """The trend of every VPN across all stored runs: an offline HTML page (each headline metric over time
    with its CI, the changes compare flags between consecutive runs) and the latest vs previous run per VPN."""
    from tunnelbench.report import history as hist

    runs, skipped = hist.collect_runs(results)
    for d, why in skipped:
        err.print(Text(f"skipped {d}: {why}", style="yellow"))
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
        path = hist.write_history(h, out or results / "history.html")
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

    run = load_run(find_run(run_ref, results))
    if fmt == "json":
        text = to_json(run, series)
    else:
        text = to_csv(series_rows(run), SERIES_COLUMNS) if series else to_csv(metric_rows(run))
    if out:
        out.write_text(text)
        err.print(f"{fmt}: {out}")
    else:
        sys.stdout.write(text)
