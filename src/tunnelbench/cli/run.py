"""`run` (a scenario, a suite, a resume) and `plan`: what a run will do, then doing it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table
from rich.text import Text

from tunnelbench.cli.common import (
    Number,
    console,
    err,
    find_run,
    hold_lab,
    main,
    need_root,
    probe_under_lab_lock,
)
from tunnelbench.core.files import check_private_folder

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tunnelbench.lab.lock import LabLock
    from tunnelbench.runner.resume import ResumePlan
    from tunnelbench.scenario import Scenario
    from tunnelbench.suite import Suite


@main.command()
@click.argument("scenario", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--vpn", "vpns", multiple=True, help="only these VPNs (repeat, or 'all'); overrides the scenario"
)
@click.option("--repetitions", "-n", type=Number(1, 10_000, integer=True), help="override run.repetitions")
@click.option("--profile", "-p", "profiles", multiple=True,
              help="impairment profile(s) to run under (repeat or comma-separate); overrides the scenario")  # fmt: skip
@click.option(
    "--results", type=click.Path(file_okay=False, path_type=Path), help="results folder (default ./results)"
)
@click.option("--no-html", is_flag=True, help="do not write report.html")
@click.option(
    "--inventory",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="run on the real hosts of this Ansible inventory (INI or YAML) over SSH (lab.backend = ssh)",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="many_clients' clients as pods of this Kubernetes cluster (lab.backend = kubernetes, lab.kubeconfig)",
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
    kubeconfig: Path | None = None,
) -> None:
    """Run a scenario (the built-in default when none is given) and print the summary.

    \b
    Exit codes: 0 every planned case measured (n/a cases count as answered);
    1 some cases not measured (a VPN unavailable or down, a case whose every attempt failed);
    2 bad input, nothing ran; 3 nothing measured; 130 interrupted (--resume goes on).
    A suite exits 130 if interrupted, 3 if no part measured anything, 1 if any part fell short."""
    from tunnelbench.runner.resume import ResumeError, load_resume
    from tunnelbench.scenario import ScenarioError, load_scenario, override_note, with_overrides

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
                plan = load_resume(find_run(resume_ref, results or Path("results")))
            except ResumeError as e:
                err.print(Text(f"cannot resume: {e}", style="red"))
                sys.exit(2)
            text, overrides = plan.text, plan.overrides
            sc = with_overrides(text, overrides, f"run {plan.run_id}'s scenario.toml")
        else:
            sc, text = load_scenario(scenario)
            # kept in the run (run.overrides) so --resume parses the same scenario again
            overrides = {
                k: v
                for k, v in {
                    "inventory": str(inventory.resolve()) if inventory else None,
                    "kubeconfig": str(kubeconfig.resolve()) if kubeconfig else None,
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
            sc = with_overrides(
                text, overrides, f"{scenario or 'default scenario'} with command-line overrides"
            )
            text = override_note(text, vpns, repetitions, profiles, flamegraph, capture)
            if inventory:
                text = (
                    f"# --inventory {inventory}{' --insecure-no-host-key-check' if insecure else ''}\n{text}"
                )
    except ScenarioError as e:
        err.print(Text(f"{e}", style="red"))
        sys.exit(2)
    if sc.lab.clients_on == "kubernetes" and sc.lab.kubeconfig and plan is None:
        _kube_preflight(sc)
    sys.exit(_execute(sc, text, overrides, plan, results, no_html, not no_build))


def _kube_preflight(sc: Scenario) -> None:
    """A user's cluster is asked before any lab comes up: its nodes, then a server-side dry run of one client
    pod in the namespace the run will use; a refusal is one line, exit 2, nothing left in the cluster."""
    from tunnelbench.kube.fleet import FleetError
    from tunnelbench.kube.fleetrun import preflight

    try:
        if not sc.lab.kube_image:
            raise FleetError("lab.kube_image: a user's cluster pulls the client pod image from a registry; push "
                             "it there (docs/real-hosts.md) and name it in the scenario's [lab] table")  # fmt: skip
        assert sc.lab.kubeconfig is not None
        preflight(Path(sc.lab.kubeconfig), sc.lab.kube_namespace, sc.lab.kube_image)
    except FleetError as e:
        err.print(Text(str(e), style="red"), soft_wrap=True)  # one line, whatever the width
        sys.exit(2)


def _execute(
    sc: Scenario,
    text: str,
    overrides: dict[str, Any],
    plan: ResumePlan | None,
    results: Path | None,
    no_html: bool,
    first_use: bool = True,
) -> int:
    """Run one scenario (runner/execute.py) with root, its first-use builds and the lab lock; its exit code."""
    from tunnelbench.runner.execute import execute
    from tunnelbench.runner.resume import ResumeError

    lock = _before_run(sc, first_use, results)
    try:
        return execute(sc, text, overrides, plan, results, not no_html, console, err, lock).code
    except ResumeError as e:
        err.print(Text(f"cannot resume: {e}", style="red"))
        sys.exit(2)


def _before_run(sc: Scenario, first_use: bool, results: Path | None = None) -> LabLock | None:
    """A results root another user can write is refused (core/files.py: exit 2, nothing ran). A namespace
    lab: root, this machine's lab lock (before the run folder exists, and before the first-use builds: a run
    that holds the lab must not find its cache changing), then those builds (under the build lock too). Over
    SSH the hosts need root, not the controller, and each host's own lock is taken when the lab is built
    (lab/ssh_lab.py)."""
    root = results or Path(sc.run.results_dir)
    if root.exists():
        check_private_folder(root)
    if sc.lab.backend == "ssh":
        return None
    need_root()
    lock = hold_lab("run")
    if first_use:
        from tunnelbench.builds import first_use as build_first_use

        build_first_use(sc, err)
    return lock


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
    from tunnelbench.runner.execute import execute_suite
    from tunnelbench.scenario import ScenarioError
    from tunnelbench.suite import suite_parts

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
        parts, notes = suite_parts(suite, vpns, common)
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
    return execute_suite(
        suite,
        parts,
        notes,
        results,
        not no_html,
        console,
        err,
        lambda sc: _before_run(sc, first_use, results),
    )


@main.command()
@click.argument("scenario", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--vpn", "vpns", multiple=True, help="only these VPNs (repeat, or 'all')")
@click.option("--repetitions", "-n", type=Number(1, 10_000, integer=True), help="override run.repetitions")
@click.option(
    "--results",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("results"),
    show_default=True,
    help="earlier runs whose case times are the estimate",
)
def plan(scenario: Path | None, vpns: tuple[str, ...], repetitions: int | None, results: Path) -> None:
    """How long a scenario takes here: cases per VPN and workload, seconds per case from earlier runs on this
    machine of the same parameters (or scaled from other parameters), else the workload's typical time from
    its parameters, each marked with its source, and the total, before anything runs."""
    from tunnelbench.scenario import ScenarioError, load_scenario, with_overrides
    from tunnelbench.suite import load_suite, suite_parts

    parts: Sequence[tuple[str | None, Scenario, str, dict[str, Any]]]  # a single scenario's part: None
    try:
        suite = load_suite(scenario)
        if suite is not None:  # a suite: each part planned as it would run
            parts, notes = suite_parts(suite, vpns, {"repetitions": repetitions} if repetitions else {})
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
                sc = with_overrides(
                    text, overrides, f"{scenario or 'default scenario'} with command-line overrides"
                )
            parts, notes = [(None, sc, text, overrides)], []
    except ScenarioError as e:
        err.print(Text(f"{e}", style="red"))
        sys.exit(2)
    probe_under_lab_lock("plan")
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
    from tunnelbench.lab.kernel import NOT_PROBED
    from tunnelbench.plan import make_plan

    installs = vpn_installs(sc)
    first_use = {vpn for vpn, _ in installs}

    def available(vpn: str) -> str | None:  # a VPN the run installs first, or the kernel was not asked about
        a = resolve(vpn).availability()
        return None if a.ok or vpn in first_use or NOT_PROBED in (a.reason or "") else a.reason

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
    from tunnelbench.workloads.pods import KUBE_WORKLOADS

    kube_wls = [w.name for w in sc.build_workloads() if w.name in KUBE_WORKLOADS]
    if sc.lab.clients_on == "kubernetes" and not sc.lab.kubeconfig:  # the lab's own cluster
        kube_wls.append("many_clients (lab.backend = kubernetes, no kubeconfig)")
    if kube_wls:  # opt-in, never built on first use (kube/build.py)
        from tunnelbench.kube import build as kube_build

        if not kube_build.installed():
            console.print(Text(f"{', '.join(sorted(set(kube_wls)))} need the Kubernetes build, not installed here: "
                               "`tunnelbench install kubernetes` first (opt-in, ~15 CPU-min); without it their "
                               "cases fail", style="yellow"))  # fmt: skip
    for b in missing(sc):
        took = (
            f"took {before[b.name]:.0f} s here before"
            if b.name in before
            else "not built on this machine yet"
        )
        console.print(
            Text(f"will build {b.name} first, for {b.why} ({took}; not in the total)", style="yellow")
        )
    sources: dict[str, list[str]] = {}
    for vpn, came in p.sessions_from.items():
        sources.setdefault(came, []).append(vpn)
    said = "; ".join(f"{came}: {', '.join(vpns)}" for came, vpns in sources.items())
    drift = f"; drift references {p.drift_s / 60:.1f} min" if p.drift_s else ""
    console.print(
        f"{p.cases} cases; mesh start-ups and teardowns {p.sessions_s / 60:.1f} min ({said}){drift}; "
        f"total about {p.seconds / 60:.0f} min ({p.seconds / 3600:.1f} h)"
    )
    return p.seconds
