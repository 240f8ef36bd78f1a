"""The `tunnelbench` command line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from tunnelbench import __version__

# tables are wide: keep them readable when piped or in CI logs (rich assumes 80 columns off a terminal)
console = Console() if sys.stdout.isatty() else Console(width=160)
err = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=160)


def _need_root() -> None:
    if os.geteuid() != 0:
        err.print(
            "[red]tunnelbench needs root: it creates network namespaces, veth pairs and nftables rules[/]"
        )
        sys.exit(2)


def _find_run(ref: str | None, results: Path) -> Path:
    """A run folder from a path, a run id (or its unique prefix/suffix) or, with no argument, the newest run."""
    if ref and Path(ref).is_dir():
        return Path(ref)
    runs = sorted(p for p in results.glob("*") if (p / "results.sqlite").exists()) if results.is_dir() else []
    if not runs:
        raise click.UsageError(f"no runs under {results}/ (use --results DIR or pass a run folder)")
    if ref is None:
        return runs[-1]
    match = [p for p in runs if ref in p.name]
    if len(match) != 1:
        raise click.UsageError(f"run {ref!r} matches {len(match)} runs under {results}/; give more of its id")
    return match[0]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tunnelbench")
def main() -> None:
    """Benchmark VPNs and overlay tunnels in a namespace lab, fairly and reproducibly."""


@main.command()
@click.argument("scenario", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--vpn", "vpns", multiple=True, help="only these VPNs (repeat, or 'all'); overrides the scenario"
)
@click.option("--repetitions", "-n", type=int, help="override run.repetitions")
@click.option(
    "--results", type=click.Path(file_okay=False, path_type=Path), help="results folder (default ./results)"
)
@click.option("--no-html", is_flag=True, help="do not write report.html")
def run(scenario: Path | None, vpns: tuple[str, ...], repetitions: int | None, results: Path | None,
        no_html: bool) -> None:  # fmt: skip
    """Run a scenario (the built-in default when none is given) and print the summary."""
    from tunnelbench.scenario import ScenarioError, load_scenario, parse_scenario

    try:
        sc, text = load_scenario(scenario)
        if vpns or repetitions:
            import tomllib

            data = tomllib.loads(text)
            if vpns:
                data["vpns"] = [v for arg in vpns for v in arg.split(",")]
            if repetitions:
                data.setdefault("run", {})["repetitions"] = repetitions
            sc = parse_scenario(data, f"{scenario or 'default scenario'} with command-line overrides")
            text = _dump_toml_note(text, vpns, repetitions)
    except ScenarioError as e:
        err.print(f"[red]{e}[/]")
        sys.exit(2)
    _need_root()
    from tunnelbench.analysis.summary import summarize
    from tunnelbench.report.html import write_html
    from tunnelbench.report.terminal import print_summary
    from tunnelbench.runner import Interrupted, Runner
    from tunnelbench.store import DB_NAME, Store

    runner = Runner(sc, text, err, results)
    err.print(f"run {runner.run_id} -> {runner.run_dir}")
    code = 0
    res = None
    try:
        res = runner.run()
    except (Interrupted, KeyboardInterrupt):
        code = 130
    except Exception as e:  # the run is torn down and stored; say what broke, keep the traceback
        import traceback

        (runner.run_dir / "error.txt").write_text(traceback.format_exc())
        err.print(f"[red]run failed: {type(e).__name__}: {e} (traceback in {runner.run_dir / 'error.txt'})[/]")
        code = 1
    store = Store(runner.run_dir / DB_NAME)
    summary = summarize(store, runner.run_id)
    print_summary(store, runner.run_id, summary, console)
    if not no_html:
        path = write_html(store, runner.run_id, summary, runner.run_dir / "report.html")
        err.print(f"report: {path}")
    if code == 0 and res is not None and res.status != "ok":
        code = 1
    sys.exit(code)


def _dump_toml_note(text: str, vpns: tuple[str, ...], repetitions: int | None) -> str:
    note = "# command-line overrides:"
    if vpns:
        note += f" --vpn {','.join(vpns)}"
    if repetitions:
        note += f" --repetitions {repetitions}"
    return note + "\n" + text


@main.command()
def doctor() -> None:
    """Probe this machine: tools, kernel features (netem, WireGuard, NFQUEUE, ...), VPNs, and what is missing."""
    from tunnelbench.doctor import run_doctor

    checks = run_doctor()
    t = Table(title="tunnelbench doctor", title_justify="left")
    for c in ("group", "check", "status", "detail", "if missing"):
        t.add_column(c)
    for c in checks:
        t.add_row(
            c.group, c.name, "[green]yes[/]" if c.ok else "[red]no[/]", c.detail, "" if c.ok else c.meaning
        )
    console.print(t)
    required = {"root", "ip", "nft", "iperf3", "ping", "fping", "ss", "network namespaces", "veth"}
    bad = [c.name for c in checks if not c.ok and c.name in required]
    if bad:
        err.print(f"[red]cannot run the lab: {', '.join(bad)} missing[/]")
        sys.exit(1)


@main.command()
@click.option("--force", is_flag=True, help="also clean runs whose process is still alive")
def clean(force: bool) -> None:
    """Remove namespaces, processes and files that crashed or killed runs left (from their journals only)."""
    _need_root()
    from tunnelbench.lab.clean import clean_all

    rep = clean_all(force)
    for x in rep.removed:
        console.print(f"removed {x}")
    for x in rep.skipped:
        console.print(f"[yellow]{x}[/]")
    for x in rep.problems:
        err.print(f"[red]could not remove {x}[/]")
    for x in rep.unknown:
        console.print(f"[yellow]namespace {x} looks like tunnelbench's but is in no journal: left alone[/]")
    if not (rep.removed or rep.skipped or rep.problems):
        console.print("nothing to clean")
    sys.exit(1 if rep.problems else 0)


@main.command("list")
def list_() -> None:
    """VPNs, workloads and impairment profiles, and whether each is available here."""
    from tunnelbench.impair.profiles import PROFILES
    from tunnelbench.scenario import builtin_scenarios
    from tunnelbench.vpns import DRIVERS
    from tunnelbench.workloads import WORKLOADS

    t = Table(title="VPNs", title_justify="left")
    for c in ("name", "available", "version / reason", "what is tested"):
        t.add_column(c)
    for name, cls in DRIVERS.items():
        a = cls.availability()
        t.add_row(
            name, "[green]yes[/]" if a.ok else "[red]no[/]", a.version if a.ok else a.reason, cls.summary
        )
    console.print(t)
    t = Table(title="Workloads", title_justify="left")
    for c in ("name", "available", "parameters", "metrics"):
        t.add_column(c)
    import shutil

    for name, wl in WORKLOADS.items():
        missing = [x for x in wl.tools if shutil.which(x) is None]
        params = ", ".join(f"{k}={f.default}" for k, f in wl.Params.model_fields.items())
        t.add_row(name, "[green]yes[/]" if not missing else f"[red]no: missing {', '.join(missing)}[/]", params,
                  ", ".join(m.name for m in wl.metrics))  # fmt: skip
    console.print(t)
    t = Table(title="Impairment profiles", title_justify="left")
    for c in ("name", "description"):
        t.add_column(c)
    for name, p in PROFILES.items():
        t.add_row(name, p.description)
    console.print(t)
    console.print(f"built-in scenarios: {', '.join(builtin_scenarios())}")


@main.command()
@click.argument("run_ref", required=False)
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True)  # fmt: skip
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="HTML file (default RUN/report.html)"
)
def report(run_ref: str | None, results: Path, out: Path | None) -> None:
    """Print the summary of a stored run and write its HTML page (newest run when none is given)."""
    from tunnelbench.analysis.summary import summarize
    from tunnelbench.report.html import write_html
    from tunnelbench.report.terminal import print_summary
    from tunnelbench.store import Store

    run_dir = _find_run(run_ref, results)
    store = Store.open_run_dir(run_dir)
    run_id = store.run_row()["id"]
    summary = summarize(store, run_id)
    print_summary(store, run_id, summary, console)
    path = write_html(store, run_id, summary, out or run_dir / "report.html")
    err.print(f"report: {path}")


if __name__ == "__main__":
    main()
