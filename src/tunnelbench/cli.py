"""The `tunnelbench` command line."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tunnelbench import __version__

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tunnelbench.builds import Build
    from tunnelbench.impair.backend import Backend
    from tunnelbench.impair.calibrate import Calibration
    from tunnelbench.impair.profiles import Profile
    from tunnelbench.lab.inventory import Inventory
    from tunnelbench.lab.lock import LabLock
    from tunnelbench.lab.netns import NetnsLab
    from tunnelbench.runner import ResumePlan
    from tunnelbench.scenario import Scenario
    from tunnelbench.suite import Suite

# tables are wide: keep them readable when piped or in CI logs (rich assumes 80 columns off a terminal)
# a pipe or a log file gets 160 columns (rich's 80 would fold every table), unless COLUMNS says otherwise
_wide = not os.environ.get("COLUMNS", "").isdigit()
console = Console() if sys.stdout.isatty() or not _wide else Console(width=160)
err = Console(stderr=True) if sys.stderr.isatty() or not _wide else Console(stderr=True, width=160)


class OutFile(click.Path):
    """A file the command writes when its work is done: its folder is checked before the work starts, so a
    typo costs nothing measured (click's own error: exit 2, naming the option)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = Path(os.fsdecode(super().convert(value, param, ctx)))
        folder = path.parent
        if not folder.is_dir():
            self.fail(
                f"the folder {str(folder)!r} does not exist: create it first or name another file", param, ctx
            )
        if not os.access(folder, os.W_OK):
            self.fail(
                f"the folder {str(folder)!r} is not writable: name a file in a folder you can write",
                param,
                ctx,
            )
        return path


def _need_root() -> None:
    if os.geteuid() != 0:
        err.print(
            "[red]tunnelbench needs root: it creates network namespaces, veth pairs and nftables rules[/]"
        )
        sys.exit(2)


def _find_run(ref: str | None, results: Path) -> Path:
    """A run folder from a path, a run id (or its unique prefix/suffix) or, with no argument, the newest run."""
    if ref and Path(ref).is_dir():
        d = Path(ref)
        if (d / "results.sqlite").exists():
            return d
        inner = sorted(p.name for p in d.glob("*") if (p / "results.sqlite").exists())
        if inner:
            raise click.UsageError(
                f"{d} is a results folder, not a run: give one of its {len(inner)} run(s), e.g. {d / inner[-1]} "
                f"(or its id with --results {d})"
            )
        raise click.UsageError(f"{d} is not a run folder: it holds no results.sqlite")
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
@click.option("--repetitions", "-n", type=click.IntRange(min=1), help="override run.repetitions")
@click.option("--profile", "-p", "profiles", multiple=True,
              help="impairment profile(s) to run under (repeat or comma-separate); overrides the scenario")  # fmt: skip
@click.option(
    "--results", type=click.Path(file_okay=False, path_type=Path), help="results folder (default ./results)"
)
@click.option("--no-html", is_flag=True, help="do not write report.html")
@click.option(
    "--inventory",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="run on the real hosts of this Ansible-style YAML inventory over SSH (lab.backend = ssh)",
)
@click.option(
    "--insecure-no-host-key-check",
    "insecure",
    is_flag=True,
    help="with --inventory: do not verify SSH host keys (only on a lab network you fully control)",
)
@click.option(
    "--resume",
    "resume_ref",
    metavar="RUN",
    help="continue a killed or interrupted run (its id or folder) in its folder: same scenario, seed and "
    "round order; cases already ok are kept, unfinished ones measured again",
)
@click.option(
    "--flamegraph",
    is_flag=True,
    help="profile the VPN daemons with perf during every case; the report shows the flame graphs",
)
@click.option(
    "--capture",
    type=click.Choice(["on-failure", "always", "off"]),
    help="keep each case's router pcap and kernel log lines: on-failure (default), always, off",
)
@click.option(
    "--no-build",
    is_flag=True,
    help="never build or install on first use (a VPN build, hey, quicperf, inferno): what is missing is "
    "skipped with the reason (a CI job that must not reach a registry)",
)
def run(
    scenario: Path | None,
    vpns: tuple[str, ...],
    repetitions: int | None,
    profiles: tuple[str, ...],
    results: Path | None,
    no_html: bool,
    inventory: Path | None = None,
    insecure: bool = False,
    resume_ref: str | None = None,
    flamegraph: bool = False,
    capture: str | None = None,
    no_build: bool = False,
) -> None:
    """Run a scenario (the built-in default when none is given) and print the summary.

    \b
    Exit codes: 0 every planned case measured (n/a cases count as answered);
    1 some cases not measured (a VPN unavailable or down, a case whose every attempt failed);
    2 bad input, nothing ran; 3 nothing measured; 130 interrupted (--resume goes on).
    A suite exits 130 if interrupted, 3 if no part measured anything, 1 if any part fell short."""
    from tunnelbench.runner import ResumeError, load_resume
    from tunnelbench.scenario import ScenarioError, load_scenario

    plan = None
    try:
        from tunnelbench.suite import load_suite

        suite = load_suite(scenario) if resume_ref is None else None
    except ScenarioError as e:
        err.print(Text(f"{e}", style="red"))
        sys.exit(2)
    if suite is not None:
        sys.exit(
            _run_suite(
                suite,
                vpns,
                repetitions,
                profiles,
                results,
                no_html,
                inventory,
                insecure,
                flamegraph,
                capture,
                not no_build,
            )
        )
    try:
        if resume_ref is not None:
            given = [name for name, v in (("SCENARIO", scenario), ("--vpn", vpns), ("--repetitions", repetitions),
                     ("--profile", profiles), ("--inventory", inventory), ("--insecure-no-host-key-check", insecure),
                     ("--flamegraph", flamegraph), ("--capture", capture))
                     if v]  # fmt: skip
            if given:
                raise click.UsageError(
                    f"--resume continues a run with the scenario and options it started with; "
                    f"it cannot be combined with {', '.join(given)}"
                )
            try:
                plan = load_resume(_find_run(resume_ref, results or Path("results")))
            except ResumeError as e:
                err.print(Text(f"cannot resume: {e}", style="red"))
                sys.exit(2)
            text, overrides = plan.text, plan.overrides
            sc = _with_overrides(text, overrides, f"run {plan.run_id}'s scenario.toml")
        else:
            sc, text = load_scenario(scenario)
            # kept in the run (run.overrides) so --resume parses the same scenario again
            overrides = {
                k: v
                for k, v in {
                    "inventory": str(inventory.resolve()) if inventory else None,
                    "insecure": insecure,
                    "vpns": [v for arg in vpns for v in arg.split(",")],
                    "repetitions": repetitions,
                    "profiles": [p for arg in profiles for p in arg.split(",")],
                    "flamegraph": flamegraph,
                    "capture": capture,
                }.items()
                if v
            }
        if overrides and plan is None:
            sc = _with_overrides(
                text, overrides, f"{scenario or 'default scenario'} with command-line overrides"
            )
            text = _dump_toml_note(text, vpns, repetitions, profiles, flamegraph, capture)
            if inventory:
                text = (
                    f"# --inventory {inventory}{' --insecure-no-host-key-check' if insecure else ''}\n{text}"
                )
    except ScenarioError as e:
        err.print(Text(f"{e}", style="red"))
        sys.exit(2)
    code, _, _ = _execute(sc, text, overrides, plan, results, no_html, not no_build)
    sys.exit(code)


def _execute(
    sc: Scenario,
    text: str,
    overrides: dict[str, Any],
    plan: ResumePlan | None,
    results: Path | None,
    no_html: bool,
    first_use: bool = True,
) -> tuple[int, Path, str]:
    """Run one scenario to the end, print its summary, write its report; (exit code, run folder, run id)."""
    from tunnelbench.runner import ResumeError

    if sc.lab.backend != "ssh":  # over SSH the hosts need root, not the controller
        _need_root()
        if first_use:
            _build_first_use(sc)
    from tunnelbench.analysis.summary import summarize
    from tunnelbench.report.html import write_html
    from tunnelbench.report.terminal import print_summary
    from tunnelbench.runner import Interrupted, Runner
    from tunnelbench.store import DB_NAME, Store

    lock = _hold_lab("run") if sc.lab.backend == "netns" else None  # before the run folder exists
    try:
        runner = Runner(sc, text, err, results, overrides=overrides, resume=plan)
    except ResumeError as e:
        err.print(Text(f"cannot resume: {e}", style="red"))
        sys.exit(2)
    if lock is not None:
        lock.describe(runner.run_id, runner.run_dir)
    err.print(Text(f"{'resuming run' if plan else 'run'} {runner.run_id} -> {runner.run_dir}"))
    code = 0
    res = None
    try:
        res = runner.run()
    except ResumeError as e:  # raised before the run is reopened: nothing to summarize
        err.print(Text(f"cannot resume: {e}", style="red"))
        sys.exit(2)
    except (Interrupted, KeyboardInterrupt):
        code = 130
    except Exception as e:  # the run is torn down and stored; say what broke, keep the traceback
        import traceback

        if _disk_full(e):
            err.print(Text(
                f"run stopped: the results disk is full ({runner.run_dir}): the lab is torn down and every case "
                f"stored before is kept; free space, then `tunnelbench run --resume {runner.run_id}` measures "
                "the rest", style="red"))  # fmt: skip
        else:
            where = runner.run_dir / "error.txt"
            try:
                where.write_text(traceback.format_exc())
            except OSError as w:
                where = f"not written: {w.strerror or w}"  # type: ignore[assignment]
            err.print(Text(f"run failed: {type(e).__name__}: {e} (traceback in {where})", style="red"))
        code = 1
    store = Store(runner.run_dir / DB_NAME)
    summary = summarize(store, runner.run_id)
    print_summary(store, runner.run_id, summary, console)
    if not no_html:
        try:
            path = write_html(store, runner.run_id, summary, runner.run_dir / "report.html")
            err.print(f"report: {path}")
        except OSError as e:
            err.print(Text(f"report not written: {e}", style="red"))
    if runner.secrets.values:  # after the report: every output the run wrote is searched for its keys
        from tunnelbench.security.keys import scan_line

        line, style = scan_line(runner.scan_outputs())
        console.print(Text(line, style=style))
    if lock is not None:  # the lab is gone: a suite's next part (or another run) may build one
        lock.release()
    if code != 130:  # an ended run: its exit code says whether every planned case was measured
        from tunnelbench.analysis.outcome import NOTHING_MEASURED, judge_store

        out = judge_store(store, runner.run_id)
        if code == 0 and res is not None and res.status != "ok":
            code = 1
        code = NOTHING_MEASURED if out.code == NOTHING_MEASURED else max(code, out.code)
        err.print(Text(out.line() if code == out.code else f"exit {code}: the run failed; {out.line()}",
                       style="green" if code == 0 else "yellow" if code == 1 else "red"))  # fmt: skip
    return code, runner.run_dir, runner.run_id


def _disk_full(e: BaseException) -> bool:
    """The run's results disk filled up (SQLite says so in its own words, a file write with ENOSPC)."""
    import errno
    import sqlite3

    if isinstance(e, sqlite3.OperationalError) and "disk is full" in str(e):
        return True
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def _hold_lab(what: str) -> LabLock:
    """This machine's lab lock (lab/lock.py) until the command ends (released when its click context closes,
    however it ends; the kernel drops it if the process dies), or exit 2 naming who holds it: nothing has
    run yet. Taken after the command's own input checks, so bad input is named as such."""
    from tunnelbench.lab.lock import LabBusy, LabLock

    try:
        lock = LabLock(what).acquire()
    except LabBusy as e:
        err.print(Text(str(e), style="red"))
        sys.exit(2)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(lock.release)
    return lock


def _build_first_use(sc: Scenario) -> None:
    """Build the tools and install the VPN builds this scenario needs and this machine lacks (builds.py), one
    line each; a failed build is said and the run goes on (the VPN is then skipped as unavailable, the
    workload fails, each with the reason)."""
    from tunnelbench.builds import cache_dir, install_vpn, missing, past_seconds, vpn_installs

    before = past_seconds()
    for vpn, src in vpn_installs(sc):
        took = f"; {before[src.label]:.0f} s here before" if src.label in before else ""
        err.print(Text(f"installing {vpn}: {src.label} (first use on this machine{took}) ...", style="dim"))
        r = install_vpn(src, cache_dir() / "logs" / f"{src.name}.log")
        ok = r.status != "failed"
        err.print(
            Text(
                f"{'installed' if ok else 'could not install'} {vpn} ({r.seconds:.0f} s): {r.detail}"[:400],
                style="green" if ok else "red",
            )
        )
    for b in missing(sc):
        _build_tool(b, before)


def _build_tool(b: Build, before: dict[str, float]) -> None:
    """Build one tool on first use (builds.build), a line before and one after; a failure is said only."""
    from tunnelbench.builds import build, cache_dir

    took = f"; {before[b.name]:.0f} s here before" if b.name in before else ""
    err.print(Text(f"building {b.name} for {b.why} (first use on this machine{took}) ...", style="dim"))
    ok, seconds, detail = build(b, cache_dir() / "logs" / f"build-{b.name}.log")
    if ok:
        err.print(Text(f"built {b.name} ({seconds:.0f} s): {detail}", style="green"))
    else:
        err.print(Text(f"could not build {b.name} ({seconds:.0f} s): {detail}", style="red"))


def _ensure_engine() -> None:
    """Build the native impairment engine now if this machine has none (a lean set-up leaves it to first
    use); a failed build is said, and the command then fails where it needs the engine."""
    from tunnelbench.builds import BUILDS, past_seconds, present

    if not present(BUILDS["impaird"]):
        _build_tool(BUILDS["impaird"], past_seconds())


def _run_suite(
    suite: Suite,
    vpns: tuple[str, ...],
    repetitions: int | None,
    profiles: tuple[str, ...],
    results: Path | None,
    no_html: bool,
    inventory: Path | None,
    insecure: bool,
    flamegraph: bool,
    capture: str | None,
    first_use: bool = True,
) -> int:
    """Every part of a suite as its own run (tunnelbench/suite.py), then the merged Security matrix. Every part
    is parsed before the first runs, so bad input fails before anything is measured."""
    from tunnelbench.analysis.analyze import load_run
    from tunnelbench.analysis.outcome import suite_code
    from tunnelbench.report.terminal import security_table
    from tunnelbench.scenario import ScenarioError
    from tunnelbench.suite import merged_rows, write_matrix

    common = {
        k: v
        for k, v in {
            "inventory": str(inventory.resolve()) if inventory else None,
            "insecure": insecure,
            "repetitions": repetitions,
            "profiles": [p for arg in profiles for p in arg.split(",")],
            "flamegraph": flamegraph,
            "capture": capture,
        }.items()
        if v
    }
    try:
        parts, notes = _suite_parts(suite, vpns, common)
    except ScenarioError as e:
        err.print(Text(f"{suite.source}: {e}", style="red"))
        return 2
    if not parts:  # every part left out: nothing to run and no matrix to merge
        for n in notes:
            err.print(Text(n, style="dim"))
        err.print(
            Text(
                f"--vpn: no part of suite {suite.name} can take {', '.join(vpns)}; "
                f"`tunnelbench plan {suite.name} --vpn all` shows which VPN each part takes",
                style="red",
            )
        )
        return 2
    done: list[tuple[Path, str]] = []
    codes = []
    for i, (part, sc, text, over) in enumerate(parts, 1):
        err.print(
            Text(f"suite {suite.name}: part {i}/{len(parts)}: {part} ({len(sc.vpns)} VPN(s))", style="bold")
        )
        code, run_dir, run_id = _execute(sc, text, over, None, results, no_html, first_use)
        done.append((run_dir, run_id))
        codes.append(code)
        if code == 130:  # interrupted: the finished parts stay, and the matrix shows what they measured
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


def _suite_parts(
    suite: Suite, vpns: tuple[str, ...], common: dict[str, Any]
) -> tuple[list[tuple[str, Scenario, str, dict[str, Any]]], list[str]]:
    """Each part's (name, scenario, text, overrides) with the command line applied, `--vpn` narrowed to the
    VPNs that can take the part's check; and notes on what was left out. Raises ScenarioError."""
    from tunnelbench.scenario import load_scenario
    from tunnelbench.suite import capable

    requested = [v for arg in vpns for v in arg.split(",")]
    parts, notes = [], []
    for part in suite.parts:
        sc, text = load_scenario(suite.part_path(part))
        over = dict(common)
        if requested:
            every = _with_overrides(text, {**over, "vpns": requested}, f"suite part {part} with --vpn")
            why = {v: capable(v, every) for v in every.vpns}
            keep = [v for v, w in why.items() if w is None]
            for w in sorted({w for w in why.values() if w}):
                notes.append(f"{part}: not run for {', '.join(v for v in why if why[v] == w)} ({w})")
            if not keep:
                notes.append(f"{part}: skipped, none of the requested VPNs can take its check")
                continue
            over["vpns"] = keep
        if over:
            sc = _with_overrides(text, over, f"suite part {part} with command-line overrides")
            text = _dump_toml_note(
                text,
                tuple(over.get("vpns", [])),
                over.get("repetitions"),
                tuple(over.get("profiles", [])),
                bool(over.get("flamegraph")),
                over.get("capture"),
            )
        parts.append((part, sc, text, over))
    return parts, notes


def _with_overrides(text: str, overrides: dict[str, Any], source: str) -> Scenario:
    """The scenario of `text` with the command-line overrides of `run` (as kept in run.overrides)."""
    import tomllib

    from tunnelbench.scenario import parse_scenario

    data = tomllib.loads(text)
    if overrides.get("inventory"):
        data.setdefault("lab", {}).update(backend="ssh", inventory=overrides["inventory"])
    if overrides.get("insecure"):
        data.setdefault("lab", {})["insecure_no_host_key_check"] = True
    if overrides.get("vpns"):
        data["vpns"] = overrides["vpns"]
    if overrides.get("repetitions"):
        data.setdefault("run", {})["repetitions"] = overrides["repetitions"]
    if overrides.get("profiles"):
        data["profiles"] = overrides["profiles"]
    if overrides.get("flamegraph"):
        data.setdefault("run", {})["flamegraph"] = True
    if overrides.get("capture"):
        data.setdefault("run", {})["capture"] = overrides["capture"]
    return parse_scenario(data, source)


def _dump_toml_note(
    text: str,
    vpns: tuple[str, ...],
    repetitions: int | None,
    profiles: tuple[str, ...],
    flamegraph: bool = False,
    capture: str | None = None,
) -> str:
    note = "# command-line overrides:"
    if flamegraph:
        note += " --flamegraph"
    if capture:
        note += f" --capture {capture}"
    if vpns:
        note += f" --vpn {','.join(vpns)}"
    if profiles:
        note += f" --profile {','.join(profiles)}"
    if repetitions:
        note += f" --repetitions {repetitions}"
    return note + "\n" + text


@main.command()
@click.option(
    "--inventory",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="probe every host of this inventory over SSH instead of this machine",
)
@click.option("--insecure-no-host-key-check", "insecure", is_flag=True, help="do not verify SSH host keys")
def doctor(inventory: Path | None = None, insecure: bool = False) -> None:
    """Probe this machine: tools, kernel features (netem, WireGuard, NFQUEUE, ...), VPNs, and what is missing."""
    from tunnelbench.doctor import run_doctor

    if inventory is not None:
        sys.exit(_doctor_inventory(inventory, insecure))

    checks = run_doctor()
    t = Table(title="tunnelbench doctor", title_justify="left")
    for col in ("group", "check", "status", "detail", "if missing"):
        t.add_column(col)
    for c in checks:
        t.add_row(
            c.group, c.name, "[green]yes[/]" if c.ok else "[red]no[/]", c.detail, "" if c.ok else c.meaning
        )
    console.print(t)
    required = {"root", "ip", "nft", "iperf3", "ping", "fping", "ss", "network namespaces", "veth"}
    bad = [c.name for c in checks if not c.ok and c.name in required]
    if bad:
        err.print(Text(f"cannot run the lab: {', '.join(bad)} missing", style="red"))
        sys.exit(1)


def _load_inventory(path: Path, insecure: bool) -> Inventory:
    from tunnelbench.lab.inventory import InventoryError, load_inventory

    try:
        inv = load_inventory(path)
    except InventoryError as e:
        err.print(Text(f"{e}", style="red"))
        sys.exit(2)
    if insecure:
        inv.insecure()
    return inv


def _doctor_inventory(path: Path, insecure: bool) -> int:
    """`doctor --inventory`: the doctor's checks on every host over SSH; exit 1 if a host cannot run the lab."""
    from tunnelbench.doctor import doctor_inventory

    inv = _load_inventory(path, insecure)
    required = {"reachable", "root", "ip", "iperf3", "ping", "fping", "ss", "/dev/net/tun"}
    code = 0
    for h, checks in doctor_inventory(inv):
        roles = ", ".join(sorted(h.roles)) or "no role"
        t = Table(title=f"{h.describe()} [{roles}]", title_justify="left")
        for col in ("group", "check", "status", "detail", "if missing"):
            t.add_column(col)
        for c in checks:
            t.add_row(
                c.group,
                c.name,
                "[green]yes[/]" if c.ok else "[red]no[/]",
                c.detail,
                "" if c.ok else c.meaning,
            )
        console.print(t)
        bad = [c.name for c in checks if not c.ok and c.name in required]
        if bad:
            err.print(Text(f"{h.name}: cannot run the lab: {', '.join(bad)}", style="red"))
            code = 1
    return code


@main.command()
@click.option(
    "--profile",
    "-p",
    "profiles",
    multiple=True,
    help="profile(s) to calibrate (repeat or comma-separate; default: every built-in)",
)
@click.option(
    "--scenario", type=click.Path(dir_okay=False, path_type=Path), help="take user-defined profiles from here"
)
@click.option(
    "--backend",
    default="auto",
    show_default=True,
    help="auto | netem | native, or several comma-separated (netem,native): each profile on each backend in "
    "turn over one lab, printed side by side",
)
@click.option(
    "--probes",
    type=click.IntRange(min=100),
    default=4000,
    show_default=True,
    help="UDP probes per profile (at least 100: fewer cannot estimate a 1% loss)",
)
@click.option("--json", "json_out", type=OutFile(), help="also write the results here")
def calibrate(
    profiles: tuple[str, ...], scenario: Path | None, backend: str, probes: int, json_out: Path | None
) -> None:
    """Measure impairment profiles on the raw (no VPN) path: configured vs measured, per backend."""
    from tunnelbench.impair.profiles import PROFILES
    from tunnelbench.scenario import ScenarioError, load_scenario

    known = dict(PROFILES)
    if scenario:
        try:
            sc, _ = load_scenario(scenario)
        except ScenarioError as e:
            err.print(Text(f"{e}", style="red"))
            sys.exit(2)
        known.update(sc.impair.profiles)
    names = [n for arg in profiles for n in arg.split(",") if n] or [n for n in known if n != "baseline"]
    unknown = [n for n in names if n not in known]
    if unknown:
        err.print(Text(f"--profile: unknown {', '.join(unknown)}; allowed: {', '.join(known)}", style="red"))
        sys.exit(2)
    backends = [b.strip() for b in backend.split(",") if b.strip()]
    bad = [b for b in backends if b not in ("auto", "netem", "native")]
    if bad or not backends or len(set(backends)) != len(backends):
        err.print(
            Text(
                f"--backend: {backend!r}: expected auto, netem or native, or distinct ones "
                "comma-separated (e.g. netem,native)",
                style="red",
            )
        )
        sys.exit(2)
    _need_root()
    _hold_lab("calibrate")  # until the command ends
    from tunnelbench.lab.kernel import missing as kernel_missing

    if "native" in backends or ("auto" in backends and kernel_missing(("netem",))):
        _ensure_engine()
    import tempfile

    from tunnelbench.impair.backend import ImpairError
    from tunnelbench.impair.calibrate import calibrate as calibrate_profile
    from tunnelbench.impair.calibrate import measure_base
    from tunnelbench.impair.session import impair_lab

    results = []
    try:
        with (
            tempfile.TemporaryDirectory(prefix="tunnelbench-cal-") as tmp,
            impair_lab(Path(tmp), 2, "auto") as (lab, _),
        ):
            h1, h2 = lab.hosts
            bes = _calibration_backends(lab, backends)
            base = measure_base(h1, h2, lab.run_dir)
            err.print(
                f"backend {', '.join(b.name for b in bes)}; base one-way {base.one_way_ms:.3f} ms, "
                f"RTT {base.rtt_ms:.3f} ms"
            )
            try:
                for n in names:  # each profile on every backend in turn: machine drift hits them alike
                    for be in bes:
                        be.apply(known[n])
                        try:
                            results.append(
                                calibrate_profile(be, known[n], h1, h2, lab.run_dir, base, count=probes)
                            )
                        finally:
                            be.clear()
            finally:
                for be in bes:
                    be.clear()
    except ImpairError as e:
        err.print(Text(f"--backend: {e}", style="red"))
        sys.exit(2)
    console.print(_calibration_table(results, names, known))
    if json_out:
        json_out.write_text("[" + ",\n".join(c.to_json() for c in results) + "]\n")
    flagged = sum(not c.ok for c in results)
    if flagged:
        err.print(Text(f"{flagged} profile calibration(s) out of tolerance", style="red"))
    sys.exit(1 if flagged else 0)


def _calibration_backends(lab: NetnsLab, names: list[str]) -> list[Backend]:
    """One backend per name over the same lab (the router's interfaces toward each host); `auto` resolves to
    netem where the kernel has it. Two names that resolve to the same backend are refused."""
    from tunnelbench.impair.backend import ImpairError, make_backend

    bes = [make_backend(n, lab.router, lab.hosts, lab.run_dir / f"impair-{n}") for n in names]
    if len({b.name for b in bes}) != len(bes):
        raise ImpairError(
            f"{', '.join(names)} resolve to the same backend here ({', '.join(b.name for b in bes)})"
        )
    return bes


def _calibration_table(results: list[Calibration], names: list[str], known: dict[str, Profile]) -> Table:
    """One column of measured values per backend, next to the configured value, per profile and quantity."""
    from tunnelbench.report.fmt import num

    backends = list(dict.fromkeys(c.backend for c in results))
    t = Table(title=f"calibration ({' vs '.join(backends)}), h1 -> h2 over the router", title_justify="left")
    for c in ("profile", "quantity", "configured", *(f"{b} measured" for b in backends), "detail", "ok"):
        t.add_column(c)
    for n in names:
        cals = {c.backend: c for c in results if c.profile == known[n].name or c.profile == n}
        quantities = list(dict.fromkeys(ch.quantity for c in cals.values() for ch in c.checks))
        t.add_section()
        for i, q in enumerate(quantities):
            checks = {
                b: next((ch for ch in cals[b].checks if ch.quantity == q), None)
                for b in backends
                if b in cals
            }
            first = next(ch for ch in checks.values() if ch is not None)
            oks = [
                ("" if ch is None or ch.ok is None else "yes" if ch.ok else "NO") for ch in checks.values()
            ]
            detail = " | ".join(
                f"{b}: {ch.detail}" for b, ch in checks.items() if ch is not None and ch.detail
            )
            t.add_row(
                f"{n}\n{known[n].summary()}" if i == 0 else "",
                f"{q} [{first.unit}]",
                num(first.configured),
                *(num(ch.measured) if ch is not None else "–" for ch in checks.values()),
                detail,
                "/".join(oks),
            )
    return t


@main.command("bench-engine")
@click.option(
    "--seconds",
    type=click.FloatRange(min=1, max=600),
    default=5.0,
    show_default=True,
    help="iperf3 duration per cell",
)
@click.option(
    "--vpn",
    "vpns",
    default="",
    help="also measure these VPNs' engine tax (comma-separated, e.g. "
    "openvpn,nebula): TCP through the mesh with the engine at zero impairment vs without it",
)
@click.option(
    "--placement",
    type=click.Choice(["auto", "off", "engine-apart"]),
    default="auto",
    show_default=True,
    help="CPU placement, as [cpu] placement in a scenario",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="off/on alternations of the tax check",
)
def bench_engine(seconds: float, vpns: str, placement: str, rounds: int) -> None:
    """The impairment engine's ceiling next to the raw path (Gbit/s, packets/s, CPU per packet), in both engine
    modes, and with --vpn the engine's tax on chosen VPNs."""
    _need_root()
    _hold_lab("bench-engine")  # until the command ends
    _ensure_engine()
    import statistics
    import tempfile

    from tunnelbench.enginebench import run_bench

    names = [v.strip() for v in vpns.split(",") if v.strip()]
    with tempfile.TemporaryDirectory(prefix="tunnelbench-bench-") as tmp:
        version, rows, checks, where = run_bench(
            Path(tmp), seconds, placement_mode=placement, vpns=names, tax_rounds=rounds
        )
    console.print(Text(where))
    t = Table(
        title=f"impairment engine benchmark ({version}), TCP h1 -> h2, {seconds:g} s per cell",
        title_justify="left",
    )
    for c in (
        "path",
        "streams",
        "goodput Gbit/s",
        "kpkt/s",
        "engine µs CPU/pkt",
        "engine CPU %",
        "retransmits",
    ):
        t.add_column(c, justify="left" if c == "path" else "right")
    for r in rows:
        t.add_row(
            r.path,
            str(r.streams),
            f"{r.goodput_gbps:.2f}",
            f"{r.kpps:.0f}",
            "–" if r.engine_cpu_us_per_pkt is None else f"{r.engine_cpu_us_per_pkt:.2f}",
            "–" if r.engine_cpu_pct is None else f"{r.engine_cpu_pct:.0f}",
            str(r.retransmits),
        )
    console.print(t)
    console.print(
        "µs CPU/pkt counts wire packets in both modes (a GSO super-packet counts as the wire packets it "
        "stands for); kpkt/s counts wire-size packets on both",
        highlight=False,
    )
    if checks:
        tt = Table(
            title=f"engine tax, TCP {max(1, round(seconds))} s legs, {rounds} off/on alternations",
            title_justify="left",
        )
        for c in ("VPN", "engine mode", "without engine Mbit/s", "with engine Mbit/s", "tax", "engine CPU %"):
            tt.add_column(c, justify="left" if c in ("VPN", "engine mode") else "right")
        for tc in checks:
            tt.add_row(
                tc.vpn,
                tc.mode,
                f"{statistics.median(tc.off_mbps):,.0f}",
                f"{statistics.median(tc.on_mbps):,.0f}",
                Text(f"{tc.tax_pct:+.1f}%", style="red" if tc.flagged else ""),
                f"{statistics.median(tc.engine_cpu_pct):.0f}" if tc.engine_cpu_pct else "–",
            )
        console.print(tt)


@main.command()
@click.option("--force", is_flag=True, help="also clean runs whose process is still alive")
@click.option(
    "--inventory",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="also undo what runs left on the SSH hosts of this inventory",
)
@click.option("--insecure-no-host-key-check", "insecure", is_flag=True, help="do not verify SSH host keys")
def clean(force: bool, inventory: Path | None = None, insecure: bool = False) -> None:
    """Remove namespaces, processes and files that crashed or killed runs left (from their journals only)."""
    _need_root()
    import tunnelbench.impair.backend  # noqa: F401  (registers the undo of what impairment journals)
    from tunnelbench.lab.clean import clean_all

    inv = _load_inventory(inventory, insecure) if inventory else None
    rep = clean_all(force, inv)
    for x in rep.removed:
        console.print(f"removed {x}")
    for x in rep.skipped:
        console.print(Text(x, style="yellow"))
    for x in rep.problems:
        err.print(Text(f"could not remove {x}", style="red"))
    for x in rep.unknown:
        console.print(
            Text(f"namespace {x} looks like tunnelbench's but is in no journal: left alone", style="yellow")
        )
    if not (rep.removed or rep.skipped or rep.problems):
        console.print("nothing to clean")
    sys.exit(1 if rep.problems else 0)


@main.command()
@click.argument("scenario", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--vpn",
    default="internal",
    show_default=True,
    help="the VPN whose mesh to bring up (NAME, NAME@debian, NAME@X.Y.Z); internal = no VPN",
)
@click.option("--profile", "-p", default="baseline", show_default=True, help="impairment profile on the path")
@click.option("--hosts", type=click.IntRange(min=2), help="override lab.hosts")
@click.option(
    "--results",
    type=click.Path(file_okay=False, path_type=Path),
    help="folder for the lab's configs, keys and logs (default: the scenario's results_dir)",
)
def up(scenario: Path | None, vpn: str, profile: str, hosts: int | None, results: Path | None) -> None:
    """Build the lab and one VPN's mesh and keep them up (until `tunnelbench down`)."""
    _need_root()
    from tunnelbench import interactive

    _hold_lab("up").release()  # busy: exit 2 here, naming the holder; the keeper takes the lock for real
    try:
        lab = interactive.up(scenario, vpn, profile, hosts, results, say=lambda m: err.print(Text(m)))
    except interactive.UpError as e:
        err.print(Text(str(e), style="red"))
        sys.exit(e.code)
    except KeyboardInterrupt:
        err.print(Text("interrupted: the lab was torn down", style="yellow"))
        sys.exit(130)
    interactive.print_up(lab, console)


@main.command("exec", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--lab", "lab_ref", metavar="RUN_ID", help="which lab, when more than one is up")
@click.argument("host")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def exec_(lab_ref: str | None, host: str, cmd: tuple[str, ...]) -> None:
    """Run CMD in HOST's namespace of the lab that is up (default: a shell): `exec h1 -- ping -c1 10.77.0.2`."""
    _need_root()
    from tunnelbench import interactive

    if cmd[:1] == ("--",):  # click keeps the separator once the host argument ended option parsing
        cmd = cmd[1:]
    try:
        interactive.exec_in(host, cmd, lab_ref)
    except interactive.UpError as e:
        err.print(Text(str(e), style="red"))
        sys.exit(e.code)


@main.command()
@click.argument("run_id", required=False)
def down(run_id: str | None) -> None:
    """Tear down the lab `tunnelbench up` made: verified VPN teardown, namespaces deleted, journal ended."""
    _need_root()
    from tunnelbench import interactive

    try:
        rep = interactive.down(run_id)
    except interactive.UpError as e:
        err.print(Text(str(e), style="red"))
        sys.exit(e.code)
    console.print(Text(f"lab {rep.run_id} down"))
    for x in rep.lines:
        console.print(Text(x))
    for x in rep.problems:
        err.print(Text(f"problem: {x}", style="red"))
    sys.exit(1 if rep.problems else 0)


@main.command()
@click.argument("vpns", nargs=-1)
@click.option(
    "--for-scenario",
    "for_scenario",
    metavar="SCENARIO",
    help="install what this scenario (a file or a built-in name, e.g. default) runs, nothing else",
)
@click.option("--force", is_flag=True, help="rebuild even if the cache has this version")
@click.option(
    "--inventory",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="install on every host of this inventory over SSH (apt there, or copies of the local cache)",
)
@click.option("--insecure-no-host-key-check", "insecure", is_flag=True, help="do not verify SSH host keys")
def install(
    vpns: tuple[str, ...],
    force: bool,
    inventory: Path | None = None,
    insecure: bool = False,
    for_scenario: str | None = None,
) -> None:
    """Install the pinned binaries of VPNs (default: all) from Debian, the Go proxy or crates.io.

    VPN is a driver name (its pinned default build), NAME@debian (Debian's build) or NAME@X.Y.Z (that
    release from the driver's Go module or crate, built into the cache), e.g. `install nebula@1.9.0`.
    Registry builds go to a cache keyed by name and version ($TUNNELBENCH_CACHE, default
    /var/cache/tunnelbench): a second install, or CI with the cache restored, does not rebuild.
    With --inventory: on each host, Debian packages with apt-get, registry builds copied from the local
    cache when the architecture matches (install them here first), plus the lab's tools."""
    from tunnelbench.catalog import DRIVERS, resolve
    from tunnelbench.vpns.install import cache_root, install_source

    if for_scenario is not None:
        from tunnelbench.scenario import ScenarioError, load_scenario

        try:
            sc, _ = load_scenario(Path(for_scenario))
        except ScenarioError as e:
            err.print(Text(f"{e}", style="red"))
            sys.exit(2)
        names = [*sc.vpns, *(v for arg in vpns for v in arg.split(",") if v not in sc.vpns)]
    else:
        names = list(DRIVERS) if not vpns or "all" in vpns else [v for arg in vpns for v in arg.split(",")]
    bad = []
    for n in names:
        try:
            resolve(n)
        except ValueError as e:
            bad.append(n)
            err.print(Text(f"{n}: {e}", style="red"))
    if inventory is not None:
        versioned = [n for n in names if "@" in n and n not in bad]
        if versioned:
            err.print(
                Text(
                    f"{', '.join(versioned)}: versions (NAME@VERSION) install on this machine only; SSH "
                    "hosts get the default builds",
                    style="red",
                )
            )
            sys.exit(2)
        sys.exit(_install_inventory(inventory, insecure, [n for n in names if n not in bad]) or bool(bad))
    _need_root()
    logdir = cache_root() / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    t = Table(title="tunnelbench install", title_justify="left")
    for c in ("vpn", "source", "status", "seconds", "where / why"):
        t.add_column(c)
    failed = bool(bad)
    for n in names:
        if n in bad:
            continue
        cls = resolve(n)
        why = cls.impossible_here()
        if why:
            t.add_row(n, "", "[red]impossible here[/]", "", why)
            continue
        for src in cls.installs:
            err.print(f"{n}: {src.label} ...")
            with open(logdir / f"{src.name}.log", "a") as log:
                r = install_source(src, log, force)
            failed |= r.status == "failed"
            colour = {"cached": "green", "installed": "green", "failed": "red"}[r.status]
            detail = r.detail + (f" (log: {logdir / (src.name + '.log')})" if r.status == "failed" else "")
            t.add_row(n, r.source, f"[{colour}]{r.status}[/]", f"{r.seconds:.0f}", detail)
    console.print(t)
    sys.exit(1 if failed else 0)


def _install_inventory(path: Path, insecure: bool, names: list[str]) -> int:
    from tunnelbench.catalog import DRIVERS
    from tunnelbench.vpns.remote_install import install_inventory

    inv = _load_inventory(path, insecure)
    err.print(f"installing {', '.join(names) or 'the lab tools'} on {', '.join(inv.order)} ...")
    t = Table(title=f"tunnelbench install --inventory {path}", title_justify="left")
    for c in ("host", "for", "source", "status", "seconds", "where / why"):
        t.add_column(c)
    failed = False
    colour = {"present": "green", "installed": "green", "copied": "green", "failed": "red"}
    for r in install_inventory(inv, {n: DRIVERS[n].installs for n in names}):
        failed |= r.status == "failed"
        t.add_row(
            r.host, r.what, r.source, f"[{colour[r.status]}]{r.status}[/]", f"{r.seconds:.0f}", r.detail
        )
    console.print(t)
    return 1 if failed else 0


@main.command()
@click.argument("scenario", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--vpn", "vpns", multiple=True, help="only these VPNs (repeat, or 'all')")
@click.option("--repetitions", "-n", type=click.IntRange(min=1), help="override run.repetitions")
@click.option(
    "--results",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("results"),
    show_default=True,
    help="earlier runs whose case times are the estimate",
)
def plan(scenario: Path | None, vpns: tuple[str, ...], repetitions: int | None, results: Path) -> None:
    """How long a scenario takes here: cases per VPN and workload, seconds per case from earlier runs on this
    machine (else the workload's declared upper bound), and the total, before anything runs."""
    from tunnelbench.scenario import ScenarioError, load_scenario
    from tunnelbench.suite import load_suite

    parts: Sequence[tuple[str | None, Scenario, str, dict[str, Any]]]  # a single scenario's part: None
    try:
        suite = load_suite(scenario)
        if suite is not None:  # a suite: each part planned as it would run
            parts, notes = _suite_parts(suite, vpns, {"repetitions": repetitions} if repetitions else {})
        else:
            sc, text = load_scenario(scenario)
            overrides = {
                k: v
                for k, v in {
                    "vpns": [v for a in vpns for v in a.split(",")],
                    "repetitions": repetitions,
                }.items()
                if v
            }
            if overrides:
                sc = _with_overrides(
                    text, overrides, f"{scenario or 'default scenario'} with command-line overrides"
                )
            parts, notes = [(None, sc, text, overrides)], []
    except ScenarioError as e:
        err.print(Text(f"{e}", style="red"))
        sys.exit(2)
    total = 0.0
    for _part, sc, _text, _over in parts:
        total += _print_plan(sc, results)
    for n in notes:
        console.print(Text(n, style="dim"))
    if len(parts) > 1:
        assert suite is not None  # a single scenario is one part
        console.print(
            f"suite {suite.name}: {len(parts)} runs, total about {total / 60:.0f} min ({total / 3600:.1f} h)"
        )


def _print_plan(sc: Scenario, results: Path) -> float:
    from tunnelbench.builds import vpn_installs
    from tunnelbench.catalog import resolve
    from tunnelbench.plan import make_plan

    installs = vpn_installs(sc)
    first_use = {vpn for vpn, _ in installs}

    def available(vpn: str) -> str | None:  # a VPN the run installs first is counted
        a = resolve(vpn).availability()
        return None if a.ok or vpn in first_use else a.reason

    p = make_plan(sc, results, available)
    t = Table(
        title=f"plan: {sc.name} · {sc.run.repetitions} repetition(s) x {len(sc.profiles)} profile(s)",
        title_justify="left",
    )
    for c in ("VPN", "workload", "cases", "s per case", "from", "minutes"):
        t.add_column(c, justify="right" if c in ("cases", "s per case", "minutes") else "left")
    for x in p.lines:
        t.add_row(x.vpn, x.label, str(x.cases), f"{x.per_case_s:.1f}", x.source, f"{x.seconds / 60:.1f}")
    console.print(t)
    for vpn, why in p.unavailable.items():
        console.print(Text(f"{vpn}: not counted, unavailable here: {why}"[:300], style="yellow"))
    from tunnelbench.builds import missing, past_seconds

    before = past_seconds()
    for vpn, src in installs:
        took = f"took {before[src.label]:.0f} s here before" if src.label in before else "not built here yet"
        console.print(
            Text(f"will install {vpn} first: {src.label} ({took}; not in the total)", style="yellow")
        )
    for b in missing(sc):
        took = (
            f"took {before[b.name]:.0f} s here before"
            if b.name in before
            else "not built on this machine yet"
        )
        console.print(
            Text(f"will build {b.name} first, for {b.why} ({took}; not in the total)", style="yellow")
        )
    console.print(
        f"{p.cases} cases; mesh start-ups and teardowns {p.sessions_s / 60:.1f} min; "
        f"total about {p.seconds / 60:.0f} min ({p.seconds / 3600:.1f} h)"
    )
    return p.seconds


@main.command("list")
def list_() -> None:
    """VPNs, workloads and impairment profiles, and whether each is available here."""
    from tunnelbench.catalog import DRIVERS, WORKLOADS, resolve
    from tunnelbench.doctor import vpn_and_workload_checks
    from tunnelbench.impair.profiles import PROFILES
    from tunnelbench.scenario import builtin_scenarios
    from tunnelbench.vpns.impossible import IMPOSSIBLE
    from tunnelbench.vpns.install import registry

    checks = vpn_and_workload_checks()  # the rows `doctor` shows
    vpn_rows = {c.name: c for c in checks if c.group == "vpns"}
    wl_rows = {c.name: c for c in checks if c.group == "workloads"}

    t = Table(
        title="VPNs (NAME = the pinned default build; NAME@debian, NAME@X.Y.Z select another)",
        title_justify="left",
    )
    for c in ("name", "state", "version (source) / reason", "pinned default", "Debian alternative", "paths",
              "what is tested"):  # fmt: skip
        t.add_column(c)
    colour = {"available": "green", "installable": "yellow", "impossible here": "red"}
    for name, cls in DRIVERS.items():
        a = vpn_rows[name]
        pin = ", ".join(s.label for s in cls.installs if registry(s)) or ("debian" if cls.installs else "")
        alt = ""
        if cls.__dict__.get("debian_installs"):  # a Debian build besides a registry default
            d = resolve(f"{name}@debian").availability()
            alt = f"{name}@debian: " + ((d.version or "") if d.ok else d.reason)
        t.add_row(
            name,
            f"[{colour[a.state]}]{a.state}[/]",
            a.detail.removeprefix(f"{a.state}: "),
            pin,
            alt,
            ", ".join(sorted(cls.paths)),
            cls.summary,
        )
    for name in IMPOSSIBLE:
        a = vpn_rows[name]
        t.add_row(
            name, "[red]impossible here[/]", a.detail.removeprefix(f"{a.state}: "), "", "", "", a.meaning
        )
    console.print(t)
    from tunnelbench.vpns.base import describe_options

    t = Table(
        title="VPN options (a scenario's vpn_options.NAME; all of them are stored with the run)",
        title_justify="left",
        box=None,
    )
    for c in ("vpn", "option", "type", "default"):
        t.add_column(c, no_wrap=True, min_width=len(max(DRIVERS, key=len)) if c == "vpn" else None)
    t.add_column("what it sets", no_wrap=True, overflow="ellipsis", max_width=70)
    for name, cls in DRIVERS.items():
        for opt, typ, default, desc in describe_options(cls.Options):
            t.add_row(name, opt, typ, "(VPN's own)" if default == "None" else default, desc)
    console.print(t)
    t = Table(title="Workloads", title_justify="left")
    for c in ("name", "what it measures", "available", "parameters", "metrics"):
        t.add_column(c)
    for name, wl in WORKLOADS.items():
        w = wl_rows[name]
        params = ", ".join(f"{k}={f.default}" for k, f in wl.Params.model_fields.items())
        t.add_row(
            name,
            wl.summary,
            "[green]yes[/]" if w.ok else f"[red]no: {w.detail}[/]",
            params,
            ", ".join(m.name for m in wl.metrics),
        )
    console.print(t)
    t = Table(title="Impairment profiles", title_justify="left")
    for c in ("name", "description"):
        t.add_column(c)
    for name, p in PROFILES.items():
        t.add_row(name, p.description)
    console.print(t)
    console.print(f"built-in scenarios: {', '.join(builtin_scenarios())}")
    console.print(
        "sweeps (each point a fresh lab): `tunnelbench nat-matrix` (NAT type pairs: direct, relayed "
        "or failed), `tunnelbench mesh-scale --vpn V` (full mesh of N = 10..100 hosts: time until every "
        "pair answers, per-node RSS and idle CPU, control plane, RTT)"
    )


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
    from tunnelbench.analysis.summary import summarize
    from tunnelbench.report.full import write_report
    from tunnelbench.report.terminal import print_summary
    from tunnelbench.store import Store

    run_dirs = [_find_run(r, results) for r in run_refs] if run_refs else [_find_run(None, results)]
    for run_dir in run_dirs:
        store = Store.open_run_dir(run_dir)
        run_id = store.run_row()["id"]
        print_summary(store, run_id, summarize(store, run_id), console, full=full)
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
    type=float,
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

    a = load_run(_find_run(run_a, results))
    b = load_run(_find_run(run_b, results))
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
    type=float,
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

    run = load_run(_find_run(run_ref, results))
    if fmt == "json":
        text = to_json(run, series)
    else:
        text = to_csv(series_rows(run), SERIES_COLUMNS) if series else to_csv(metric_rows(run))
    if out:
        out.write_text(text)
        err.print(f"{fmt}: {out}")
    else:
        sys.stdout.write(text)


@main.command("nat-matrix")
@click.option(
    "--vpn", "vpns", multiple=True, help="NAT-capable VPN (repeatable; default: every one with path nat)"
)
@click.option(
    "--pairs",
    type=click.Choice(["default", "all"]),
    default="default",
    show_default=True,
    help="default = the 4 same-type pairs + symmetric x each other type; all = every unordered pair",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("results/nat-matrix.json"),
    show_default=True,
    help="the matrix as JSON (rewritten after every cell)",
)
@click.option(
    "--no-record", is_flag=True, help="do not store the rows as the VPNs' nat_matrix feature probes"
)
def nat_matrix(vpns: tuple[str, ...], pairs: str, out: Path, no_record: bool) -> None:
    """NAT-traversal matrix: per VPN and pair of NAT types (h1, h2 behind them, h3 public), direct, relayed or failed
    (router path counters during an h1 -> h2 ping flood). One fresh 3-host lab per cell, ~10-30 s each."""
    import tempfile

    from tunnelbench import natmatrix as nm

    _need_root()
    names = [x.strip() for v in vpns for x in v.split(",") if x.strip()] or nm.nat_drivers()
    bad = [n for n in names if n not in nm.nat_drivers()]
    if bad:
        raise click.UsageError(
            f"not a NAT-capable VPN: {', '.join(bad)} (choose from {', '.join(nm.nat_drivers())})"
        )
    _hold_lab("nat-matrix")  # until the command ends
    with tempfile.TemporaryDirectory(prefix="tb-natmatrix-") as work:
        result = nm.run_matrix(
            names,
            nm.ALL_PAIRS if pairs == "all" else nm.DEFAULT_PAIRS,
            Path(work),
            out,
            record=not no_record,
            progress=lambda s: err.print(Text(s)),
        )
    head, rows = nm.table_rows(result)
    t = Table(
        title="NAT traversal h1 -> h2 (FC full cone, AR address-restricted, PR port-restricted, SYM symmetric)"
    )
    for h in head:
        t.add_column(h)
    for r in rows:
        t.add_row(*r)
    console.print(t)
    err.print(Text(f"nat matrix: {out}"))


@main.command("mesh-scale")
@click.option(
    "--vpn", "vpns", multiple=True, required=True, help="VPN(s) to grow (repeatable or comma-separated)"
)
@click.option(
    "--sizes",
    default=",".join(str(n) for n in (10, 25, 50, 100)),
    show_default=True,
    help="mesh sizes N, in order (comma-separated; each a fresh lab of N hosts)",
)
@click.option(
    "--idle-s",
    type=click.FloatRange(1, 600),
    default=10.0,
    show_default=True,
    help="seconds of idle after the mesh is ready over which daemon CPU and RSS are read",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("results/mesh-scale.json"),
    show_default=True,
    help="the curve as JSON (rewritten after every point); an SVG plot beside it",
)
def mesh_scale(vpns: tuple[str, ...], sizes: str, idle_s: float, out: Path) -> None:
    """Full-mesh scale: per VPN and mesh size N (every host a peer of every other), seconds until every pair
    answers, per-node daemon RSS and idle CPU (control plane on its own row), RTT h1 -> hN; stops at the
    first size that fails or would not fit in memory, and says which bound it reached."""
    import tempfile

    from tunnelbench import meshscale as ms
    from tunnelbench.catalog import DRIVERS

    _need_root()
    names = [x.strip() for v in vpns for x in v.split(",") if x.strip()]
    bad = [n for n in names if n not in DRIVERS]
    if bad:
        raise click.UsageError(f"--vpn: unknown VPN {', '.join(bad)} (see `tunnelbench list`)")
    star_only = [n for n in names if "mesh" not in DRIVERS[n].topologies]
    if star_only:
        raise click.UsageError(f"--vpn: {', '.join(star_only)} cannot build a full mesh")
    try:
        ns = [int(x) for x in sizes.split(",") if x.strip()]
    except ValueError:
        raise click.UsageError(
            f"--sizes: comma-separated host counts, e.g. 10,25,50,100 (got {sizes!r})"
        ) from None
    if not ns or any(n < 2 or n > 1000 for n in ns) or ns != sorted(ns):
        raise click.UsageError(
            f"--sizes: increasing host counts from 2 to 1000, e.g. 10,25,50,100 (got {sizes!r})"
        )
    _hold_lab("mesh-scale")  # until the command ends
    with tempfile.TemporaryDirectory(prefix="tb-meshscale-") as work:
        result = ms.run_sweep(names, ns, Path(work), out, idle_s, progress=lambda s: err.print(Text(s)))
    head, rows = ms.table_rows(result)
    t = Table(
        title=f"full-mesh scale ({result['cores']} cores, {result['mem_total_mb']:.0f} MB; idle {idle_s:g} s)",
        title_justify="left",
    )
    for h in head:
        t.add_column(h, overflow="fold")
    for r in rows:
        t.add_row(*r)
    console.print(t)
    svg = ms.plot_svg(result)
    if svg:
        out.with_suffix(".svg").write_text(svg)
        err.print(Text(f"plot: {out.with_suffix('.svg')}"))
    err.print(Text(f"mesh scale: {out}"))


if __name__ == "__main__":
    main()
