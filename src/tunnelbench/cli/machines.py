"""The machine and its tools: `doctor`, `install`, `list` (locally or on an inventory's hosts)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from tunnelbench.cli.common import console, err, load_inventory, main, need_root, probe_under_lab_lock


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

    probe_under_lab_lock("doctor")
    checks = run_doctor()
    t = Table(title="tunnelbench doctor", title_justify="left")
    for col in ("group", "check", "status", "detail", "if missing"):
        t.add_column(col)
    for c in checks:
        t.add_row(
            c.group,
            c.name,
            Text("yes", "green") if c.ok else Text("no", "red"),
            c.detail,
            "" if c.ok else c.meaning,
        )
    console.print(t)
    required = {"root", "ip", "nft", "iperf3", "ping", "fping", "ss", "network namespaces", "veth"}
    bad = [c.name for c in checks if not c.ok and c.name in required]
    if bad:
        err.print(Text(f"cannot run the lab: {', '.join(bad)} missing", style="red"))
        sys.exit(1)


def _doctor_inventory(path: Path, insecure: bool) -> int:
    """`doctor --inventory`: the doctor's checks on every host over SSH; exit 1 if a host cannot run the lab."""
    from tunnelbench.doctor import doctor_inventory

    inv = load_inventory(path, insecure)
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
                Text("yes", "green") if c.ok else Text("no", "red"),
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
    help="install on every host of this Ansible inventory (one Ansible play: apt there, copies of the local cache)",
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
    With --inventory: one Ansible play over the inventory, every host at once: Debian packages with
    apt-get, registry builds copied from the local cache when the architecture matches (install them here
    first) and replaced when they differ, the VPNs' kernel features loaded and tried, the lab's tools, the
    clock looked at; a second run changes nothing."""
    from tunnelbench.catalog import DRIVERS, resolve

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
    # opt-in, never part of `all` (kube/build.py): named on its own, `install kubernetes`
    kube = KUBERNETES in names
    names = [n for n in names if n != KUBERNETES]
    if kube and inventory is not None:
        err.print(
            Text(f"{KUBERNETES}: installs on this machine only (the namespace lab runs it)", style="red")
        )
        sys.exit(2)
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
    need_root()
    from tunnelbench.builds import building

    with building(err):  # one writer of the cache: a second install (or a run's first use) waits for this one
        sys.exit(_install_here(names, bad, force, kube))


def _install_here(names: list[str], bad: list[str], force: bool, kube: bool = False) -> int:
    from tunnelbench.catalog import resolve
    from tunnelbench.vpns.install import cache_root, install_source

    logdir = cache_root() / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    t = Table(title="tunnelbench install", title_justify="left")
    for c in ("vpn", "source", "status", "seconds", "where / why"):
        t.add_column(c)
    failed = bool(bad)
    if kube:
        failed |= _install_kubernetes(t, force, logdir)
    for n in names:
        if n in bad:
            continue
        cls = resolve(n)
        why = cls.impossible_here()
        if why:
            t.add_row(n, "", Text("impossible here", "red"), "", why)
            continue
        for src in cls.installs:
            err.print(f"{n}: {src.label} ...")
            with open(logdir / f"{src.name}.log", "a") as log:
                r = install_source(src, log, force)
            failed |= r.status == "failed"
            colour = {"cached": "green", "installed": "green", "failed": "red"}[r.status]
            detail = r.detail + (f" (log: {logdir / (src.name + '.log')})" if r.status == "failed" else "")
            t.add_row(n, r.source, Text(r.status, colour), f"{r.seconds:.0f}", detail)
    console.print(t)
    return 1 if failed else 0


KUBERNETES = "kubernetes"


def _install_kubernetes(t: Table, force: bool, logdir: Path) -> bool:
    """`install kubernetes` (kube/build.py) into the table's rows; True when a part failed."""
    from tunnelbench.builds import BUILDS, build, present
    from tunnelbench.kube import build as kube

    hey = BUILDS["hey"]  # the tools image carries hey: built first where it is missing
    if not present(hey):
        ok, seconds, detail = build(hey, logdir / "build-hey.log")
        t.add_row(KUBERNETES, "hey (tools image)", "[green]installed[/]" if ok else "[red]failed[/]",
                  f"{seconds:.0f}", detail)  # fmt: skip
        if not ok:
            return True
    err.print(f"{KUBERNETES}: {', '.join(s.label for s in kube.SOURCES)}, images ...")
    log_path = logdir / f"{KUBERNETES}.log"
    with open(log_path, "a") as log:
        results = kube.install(log, force)
    colour = {"cached": "green", "installed": "green", "failed": "red"}
    for r in results:
        detail = r.detail + (f" (log: {log_path})" if r.status == "failed" else "")
        t.add_row(KUBERNETES, r.source, f"[{colour[r.status]}]{r.status}[/]", f"{r.seconds:.0f}", detail)
    rec = kube.record()
    if rec is not None and any(r.status == "installed" for r in results):
        t.add_row(KUBERNETES, "total", "[green]installed[/]", f"{rec['seconds']}",
                  f"{int(str(rec['size_bytes'])) / 1e6:.0f} MB kept in {kube.cache_dir()}")  # fmt: skip
    return any(r.status == "failed" for r in results)


def _install_inventory(path: Path, insecure: bool, names: list[str]) -> int:
    from tunnelbench.catalog import DRIVERS
    from tunnelbench.vpns.remote_install import install_inventory

    inv = load_inventory(path, insecure)
    err.print(f"installing {', '.join(names) or 'the lab tools'} on {', '.join(inv.order)} ...")
    t = Table(title=f"tunnelbench install --inventory {path}", title_justify="left")
    for c in ("host", "for", "source", "status", "where / why"):
        t.add_column(c)
    failed = False
    colour = {"present": "green", "installed": "green", "copied": "green", "loaded": "green", "failed": "red",
              "unsynced": "yellow", "differs": "yellow"}  # fmt: skip
    try:
        results, changed = install_inventory(inv, {n: DRIVERS[n] for n in names}, insecure)
    except RuntimeError as e:  # Ansible itself could not run the play
        err.print(Text(str(e), style="red"))
        return 1
    for r in results:
        failed |= r.status == "failed"
        t.add_row(r.host, r.what, r.source, Text(r.status, colour[r.status]), r.detail)
    console.print(t)
    console.print(
        "Ansible, per host: " + ", ".join(f"{h} {n} changed in {s:.1f} s" for h, (n, s) in changed.items())
    )
    return 1 if failed else 0


@main.command("list")
def list_() -> None:
    """VPNs, workloads and impairment profiles, and whether each is available here."""
    probe_under_lab_lock("list")
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
            Text(a.state, colour[a.state]),
            a.detail.removeprefix(f"{a.state}: "),
            pin,
            alt,
            ", ".join(sorted(cls.paths)),
            cls.summary,
        )
    for name in IMPOSSIBLE:
        a = vpn_rows[name]
        t.add_row(
            name, Text("impossible here", "red"), a.detail.removeprefix(f"{a.state}: "), "", "", "", a.meaning
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
            Text("yes", "green") if w.ok else Text(f"no: {w.detail}", "red"),
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
