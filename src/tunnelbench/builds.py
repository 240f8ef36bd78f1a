"""Builds on first use: the first time a scenario that needs one is planned, `tunnelbench run` builds the lab's
built tools (hey, quicperf, inferno) through scripts/build-tools.sh, the pinned and cached path set-up takes,
and installs the scenario's VPN builds from the Go module proxy or crates.io through vpns/install.py, the path
`tunnelbench install` takes; one line of progress each. The native impairment engine too, for a scenario
whose profiles need it on a kernel without netem (and `calibrate` / `bench-engine`). `tunnelbench plan` lists what a scenario will build
and how long that took on this machine before. So set-up builds none of them for a bare `scripts/bench`.

Each build's seconds are kept in the install cache (builds.json) for `plan`. Whatever writes the cache (a run's
first-use builds, `install`) holds its build lock (`building`): a second process waits for the first, saying
for whom, instead of building into the same folders at once."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.text import Text

from tunnelbench.catalog import resolve
from tunnelbench.diagnostics.cpuprofile import tool as inferno_tool
from tunnelbench.impair.backend import impaird_binary
from tunnelbench.lab import kernel
from tunnelbench.lab.lock import BuildLock
from tunnelbench.scenario import Scenario
from tunnelbench.vpns.install import Crate, GoModule, InstallResult, install_source, registry

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-tools.sh"
PARALLEL_INSTALLS = 3  # VPN builds of one first use at once
_RECORD_LOCK = threading.Lock()
BUILD_TIMEOUT_S = 1800  # a fresh 2-core machine took 248 s for inferno, the slowest


@dataclass(frozen=True)
class Build:
    name: str  # scripts/build-tools.sh's argument
    binaries: tuple[str, ...]  # what the run looks for
    why: str  # who needs it, for the progress line


BUILDS = {
    "hey": Build("hey", ("hey",), "the http_api workload"),
    "quicperf": Build("quicperf", ("quicperf",), "the quic workload"),
    "inferno": Build("inferno", ("inferno-collapse-perf", "inferno-flamegraph"), "run.flamegraph"),
    # the native impairment engine (Rust, native/impaird): impairment other than a rate where the kernel
    # has no netem; a scenario of unimpaired profiles (the default) never starts it
    "impaird": Build("impaird", ("impaird",), "impairment without netem (the native engine)"),
}


def cache_dir() -> Path:
    return Path(os.environ.get("TUNNELBENCH_CACHE", "/var/cache/tunnelbench"))


_HELD: list[BuildLock] = []  # this process's build lock while it builds (one first use builds several)


@contextlib.contextmanager
def building(err: Console) -> Iterator[None]:
    """Hold the build cache's lock (lab/lock.py) for a block of builds: another process that holds it is
    waited for, a line saying who; already held by this process, nothing more (a flock is per open file:
    the same process taking it twice would wait for itself)."""
    if _HELD:
        yield
        return
    lock = BuildLock(cache_dir(), "build").acquire(wait=lambda text: err.print(Text(text, style="yellow")))
    _HELD.append(lock)
    try:
        yield
    finally:
        _HELD.pop()
        lock.release()


def present(b: Build) -> bool:
    if b.name == "inferno":  # kept in the cache, not on PATH
        return all(inferno_tool(x) is not None for x in b.binaries)
    if b.name == "impaird":  # the repo's release build, $TUNNELBENCH_IMPAIRD or PATH
        return impaird_binary() is not None
    return all(shutil.which(x) is not None for x in b.binaries)


def needed(sc: Scenario) -> list[Build]:
    """The built tools the scenario's workloads (their declared `tools`) and options use, in BUILDS order."""
    names = {t for w in sc.build_workloads() for t in type(w).tools}
    if sc.run.flamegraph:
        names.add("inferno")
    if needs_engine(sc):
        names.add("impaird")
    return [b for n, b in BUILDS.items() if n in names or any(x in names for x in b.binaries)]


def needs_engine(sc: Scenario) -> bool:
    """A profile of the scenario needs the native engine here: it impairs more than a rate, and the backend
    is `native`, or `auto` on a kernel without netem (probed once per process)."""
    if sc.impair.backend == "netem" or not any(sc.profile(n).needs_engine for n in sc.profiles):
        return False
    return sc.impair.backend == "native" or kernel.missing(("netem",)) is not None


def missing(sc: Scenario) -> list[Build]:
    return [b for b in needed(sc) if not present(b)]


def past_seconds() -> dict[str, float]:
    """Each tool's last build time on this machine (builds.json in the cache); {} when none was timed."""
    try:
        data = json.loads((cache_dir() / "builds.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v["seconds"]) for k, v in data.items() if isinstance(v, dict) and "seconds" in v}


def vpn_installs(sc: Scenario) -> list[tuple[str, GoModule | Crate]]:
    """(VPN, registry build) for each of the scenario's VPNs whose pinned build is not in the cache and that
    can run here (a VPN the kernel cannot run is skipped by the run with that reason, not built)."""
    out: list[tuple[str, GoModule | Crate]] = []
    for name in sc.vpns:
        try:
            cls = resolve(name)
        except ValueError:
            continue  # the scenario's validation names it
        if cls.impossible_here():
            continue
        out += [(name, s) for s in cls.installs if registry(s) and not s.cached()]
    return out


def install_vpn(src: GoModule | Crate, log: Path) -> InstallResult:
    """One VPN build through `tunnelbench install`'s path (pinned, into the cache), its output in `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        r = install_source(src, f)
    if r.status == "installed":
        _record(src.label, r.seconds)
    return r


def _record(name: str, seconds: float) -> None:
    with _RECORD_LOCK:  # builds side by side record their times into one file
        _record_unlocked(name, seconds)


def _record_unlocked(name: str, seconds: float) -> None:
    path = cache_dir() / "builds.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[name] = {"seconds": round(seconds, 1), "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def build(b: Build, log: Path) -> tuple[bool, float, str]:
    """Build one tool through scripts/build-tools.sh, its output in `log`: (ok, seconds, the script's last
    line or why it failed)."""
    if not SCRIPT.is_file():
        return False, 0.0, f"{SCRIPT} is not here (a checkout's scripts/setup.sh builds {b.name})"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with log.open("w") as f:
        try:
            r = subprocess.run(
                ["bash", str(SCRIPT), b.name], stdout=f, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S
            )
            rc = r.returncode
        except subprocess.TimeoutExpired:
            rc = -1
    seconds = time.monotonic() - t0
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    last = lines[-1] if lines else ""
    if rc != 0:
        return False, seconds, f"exit {rc}: {last[-200:]} (log: {log})"
    if not present(b):
        return False, seconds, f"{last[-200:]} (log: {log})"
    _record(b.name, seconds)
    return True, seconds, last[-200:]


def build_announced(b: Build, before: dict[str, float], err: Console) -> None:
    """Build one tool on first use, a line before and one after; a failure is said only."""
    took = f"; {before[b.name]:.0f} s here before" if b.name in before else ""
    err.print(Text(f"building {b.name} for {b.why} (first use on this machine{took}) ...", style="dim"))
    with building(err):
        if present(b):  # built by the process this one waited for
            err.print(Text(f"{b.name}: built meanwhile by another tunnelbench", style="green"))
            return
        ok, seconds, detail = build(b, cache_dir() / "logs" / f"build-{b.name}.log")
    if ok:
        err.print(Text(f"built {b.name} ({seconds:.0f} s): {detail}", style="green"))
    else:
        err.print(Text(f"could not build {b.name} ({seconds:.0f} s): {detail}", style="red"))


def first_use(sc: Scenario, err: Console) -> None:
    """Build the tools and install the VPN builds this scenario needs and this machine lacks, one line each; a
    failed build is said and the run goes on (the VPN is then skipped as unavailable, the workload fails, each
    with the reason). The VPN builds run side by side (each its own cache folder; Go and cargo lock their
    shared caches): much of a build is waiting on the registry, so two take less than one after the other."""
    if not vpn_installs(sc) and not missing(sc):
        return
    with building(err):  # after the wait, what another process built meanwhile is there
        _first_use(sc, err)


def _first_use(sc: Scenario, err: Console) -> None:
    before = past_seconds()
    todo = vpn_installs(sc)
    for vpn, src in todo:
        took = f"; {before[src.label]:.0f} s here before" if src.label in before else ""
        err.print(Text(f"installing {vpn}: {src.label} (first use on this machine{took}) ...", style="dim"))
    if todo:
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=PARALLEL_INSTALLS) as pool:
            jobs = {
                pool.submit(install_vpn, src, cache_dir() / "logs" / f"{src.name}.log"): vpn
                for vpn, src in todo
            }
            for job in as_completed(jobs):
                r, vpn = job.result(), jobs[job]
                ok = r.status != "failed"
                err.print(
                    Text(
                        f"{'installed' if ok else 'could not install'} {vpn} ({r.seconds:.0f} s): {r.detail}"[
                            :400
                        ],
                        style="green" if ok else "red",
                    )
                )
        if len(todo) > 1:
            err.print(
                Text(f"{len(todo)} VPN builds side by side: {time.monotonic() - t0:.0f} s", style="dim")
            )
    for b in missing(sc):
        build_announced(b, before, err)
