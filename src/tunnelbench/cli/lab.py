"""Labs outside a scenario run: `up`/`exec`/`down`, `clean`, `calibrate`, `bench-engine`, `nat-matrix` and
`mesh-scale`."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from tunnelbench.cli.common import (
    Number,
    OutFile,
    console,
    ensure_engine,
    err,
    hold_lab,
    load_inventory,
    main,
    need_root,
)
from tunnelbench.core.files import write_atomic


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
    type=Number(100, 1_000_000, integer=True),
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
    need_root()
    hold_lab("calibrate")  # until the command ends
    from tunnelbench.lab.kernel import missing as kernel_missing

    if "native" in backends or ("auto" in backends and kernel_missing(("netem",))):
        ensure_engine()
    from tunnelbench.impair.backend import ImpairError
    from tunnelbench.impair.session import calibrate_backends
    from tunnelbench.report.calibration import calibration_table

    try:
        results = calibrate_backends([known[n] for n in names], backends, probes, lambda m: err.print(m))
    except ImpairError as e:
        err.print(Text(f"--backend: {e}", style="red"))
        sys.exit(2)
    console.print(calibration_table(results, names, known))
    if json_out:
        write_atomic(json_out, "[" + ",\n".join(c.to_json() for c in results) + "]\n")
    flagged = sum(not c.ok for c in results)
    if flagged:
        err.print(Text(f"{flagged} profile calibration(s) out of tolerance", style="red"))
    sys.exit(1 if flagged else 0)


@main.command("bench-engine")
@click.option(
    "--seconds",
    type=Number(1, 600),
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
    type=Number(1, 100, integer=True),
    default=3,
    show_default=True,
    help="off/on alternations of the tax check",
)
def bench_engine(seconds: float, vpns: str, placement: str, rounds: int) -> None:
    """The impairment engine's ceiling next to the raw path (Gbit/s, packets/s, CPU per packet), in both engine
    modes, and with --vpn the engine's tax on chosen VPNs."""
    need_root()
    hold_lab("bench-engine")  # until the command ends
    ensure_engine()
    import tempfile

    from tunnelbench.sweeps.enginebench import run_bench, tables

    names = [v.strip() for v in vpns.split(",") if v.strip()]
    with tempfile.TemporaryDirectory(prefix="tunnelbench-bench-") as tmp:
        version, rows, checks, where = run_bench(
            Path(tmp), seconds, placement_mode=placement, vpns=names, tax_rounds=rounds
        )
    console.print(Text(where))
    for t in tables(version, rows, checks, seconds, rounds):
        console.print(t, highlight=False)


def _clean_cluster(kubeconfig: Path, run_ids: tuple[str, ...], force: bool) -> None:
    """The cluster's part of clean: the RUN_IDs' objects (or every run's), never a run still running here
    (unless --force); the registry is read as far as this user may (a user's cluster needs no root)."""
    from tunnelbench.kube.fleet import FleetError, run_label
    from tunnelbench.kube.remote import clean as kube_clean
    from tunnelbench.lab.journal import registered_runs
    from tunnelbench.lab.tags import tag_of

    def label(run_id: str) -> str:
        return run_label(tag_of(run_id) or run_id)

    live: set[str] = set()
    if not force:
        with contextlib.suppress(OSError):
            live = {label(r.run_id) for r in registered_runs() if r.owner_alive()}
    try:
        gone, kept = kube_clean(kubeconfig, only={label(x) for x in run_ids} if run_ids else None, live=live)
    except FleetError as e:
        err.print(Text(str(e), style="red"), soft_wrap=True)
        sys.exit(2)
    for x in gone:
        console.print(f"removed {x} (cluster of {kubeconfig})")
    for x in kept:
        console.print(Text(f"{x} (cluster of {kubeconfig}; --force to remove it)", style="yellow"))
    if not gone and not kept:
        console.print(f"nothing of tunnelbench in the cluster of {kubeconfig}")


@main.command()
@click.option("--force", is_flag=True, help="also clean runs whose process is still alive")
@click.option(
    "--inventory",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="also undo what runs left on the SSH hosts of this inventory",
)
@click.option("--insecure-no-host-key-check", "insecure", is_flag=True, help="do not verify SSH host keys")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="also delete, in this Kubernetes cluster, the namespaces, pods and secrets labelled by tunnelbench "
    "runs (many_clients on Kubernetes): the RUN_IDs' or every run's, never a run still running here (--force)",
)
@click.argument("run_ids", nargs=-1, metavar="[RUN_ID]...")
def clean(
    run_ids: tuple[str, ...],
    force: bool,
    inventory: Path | None = None,
    insecure: bool = False,
    kubeconfig: Path | None = None,
) -> None:
    """Remove namespaces, processes and files that crashed or killed runs left (from their journals only):
    every registered run's, or only those of the RUN_IDs given; with --kubeconfig, also the cluster's objects
    of tunnelbench runs (they carry the run label)."""
    if kubeconfig is not None:
        _clean_cluster(kubeconfig, run_ids, force)
    need_root()
    import tunnelbench.impair.backend  # noqa: F401  (registers the undo of what impairment journals)
    import tunnelbench.kube.system  # noqa: F401  (registers the undo of the Kubernetes layer's global state)
    import tunnelbench.lab.raised  # noqa: F401  (registers the undo of a limit a driver raised)
    import tunnelbench.security.keys  # noqa: F401  (registers the sweep of a dead run's secret files)
    from tunnelbench.lab.clean import CleanReport, clean_all, clean_run
    from tunnelbench.lab.journal import registered_runs

    inv = load_inventory(inventory, insecure) if inventory else None
    if run_ids:  # only these runs: someone else's killed run stays theirs to clean
        rep = CleanReport()
        runs = {r.run_id: r for r in registered_runs() if r.run_id in run_ids}
        rep.skipped += [
            f"run {x} is not registered (nothing left, or not this machine's)"
            for x in run_ids
            if x not in runs
        ]
        for r in runs.values():
            if r.owner_alive() and not force:
                rep.skipped.append(
                    f"run {r.run_id} is still running (pid {r.owner_pid}); use --force to clean it"
                )
                continue
            one = clean_run(r, inv)
            rep.removed, rep.problems, rep.skipped = (
                rep.removed + one.removed,
                rep.problems + one.problems,
                rep.skipped + one.skipped,
            )
    else:
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
@click.option("--hosts", type=Number(2, 1023, integer=True), help="override lab.hosts")
@click.option(
    "--results",
    type=click.Path(file_okay=False, path_type=Path),
    help="folder for the lab's configs, keys and logs (default: the scenario's results_dir)",
)
def up(scenario: Path | None, vpn: str, profile: str, hosts: int | None, results: Path | None) -> None:
    """Build the lab and one VPN's mesh and keep them up (until `tunnelbench down`)."""
    need_root()
    from tunnelbench import interactive

    hold_lab("up").release()  # busy: exit 2 here, naming the holder; the keeper takes the lock for real
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
    need_root()
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
    need_root()
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

    from tunnelbench.sweeps import natmatrix as nm

    need_root()
    names = [x.strip() for v in vpns for x in v.split(",") if x.strip()] or nm.nat_drivers()
    bad = [n for n in names if n not in nm.nat_drivers()]
    if bad:
        raise click.UsageError(
            f"not a NAT-capable VPN: {', '.join(bad)} (choose from {', '.join(nm.nat_drivers())})"
        )
    hold_lab("nat-matrix")  # until the command ends
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
    type=Number(1, 600),
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

    from tunnelbench.catalog import DRIVERS
    from tunnelbench.sweeps import meshscale as ms

    need_root()
    names = [x.strip() for v in vpns for x in v.split(",") if x.strip()]
    bad = [n for n in names if n not in DRIVERS]
    if bad:
        raise click.UsageError(f"--vpn: unknown VPN {', '.join(bad)} (see `tunnelbench list`)")
    star_only = [n for n in names if "mesh" not in DRIVERS[n].topologies]
    if star_only:
        raise click.UsageError(f"--vpn: {', '.join(star_only)} cannot build a full mesh")
    counts = [x.strip() for x in sizes.split(",") if x.strip()]
    if not all(x.isascii() and x.isdigit() for x in counts):
        raise click.UsageError(f"--sizes: comma-separated host counts, e.g. 10,25,50,100 (got {sizes!r})")
    ns = [int(x) for x in counts]
    if not ns or any(n < 2 or n > 1000 for n in ns) or ns != sorted(ns):
        raise click.UsageError(
            f"--sizes: increasing host counts from 2 to 1000, e.g. 10,25,50,100 (got {sizes!r})"
        )
    hold_lab("mesh-scale")  # until the command ends
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
        write_atomic(out.with_suffix(".svg"), svg)
        err.print(Text(f"plot: {out.with_suffix('.svg')}"))
    err.print(Text(f"mesh scale: {out}"))
