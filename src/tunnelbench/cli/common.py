"""What every group of verbs shares: the consoles, the `tunnelbench` group itself, file and run arguments,
root, the lab lock, inventories and first-use builds."""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.text import Text

from tunnelbench import __version__
from tunnelbench.core.files import FileRefused, check_destination
from tunnelbench.report.fmt import Terminal

if TYPE_CHECKING:
    from tunnelbench.builds import Build
    from tunnelbench.lab.inventory import Inventory
    from tunnelbench.lab.lock import LabLock


# tables are wide: keep them readable when piped or in CI logs (rich assumes 80 columns off a terminal)
# a pipe or a log file gets 160 columns (rich's 80 would fold every table), unless COLUMNS says otherwise.
# Both print names as text, never markup or control codes (report/fmt.py Terminal): style is a Text's.
_wide = not os.environ.get("COLUMNS", "").isdigit()
console = Terminal() if sys.stdout.isatty() or not _wide else Terminal(width=160)
err = Terminal(stderr=True) if sys.stderr.isatty() or not _wide else Terminal(stderr=True, width=160)


class Number(click.FloatRange):
    """The type of every numeric option: a finite number (ASCII digits; an integer where `integer`) from
    `lo` to `hi`. NaN and the infinities pass a plain float range (every comparison with NaN is false), so
    they are refused here; the error names the option and its range (click: exit 2)."""

    _INT = re.compile(r"[+-]?[0-9]+")
    _FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")

    def __init__(self, lo: float, hi: float, *, integer: bool = False) -> None:
        super().__init__(lo, hi)
        self.lo, self.hi, self.integer = lo, hi, integer
        self.name = "integer" if integer else "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value).strip()
        pattern = self._INT if self.integer else self._FLOAT
        if isinstance(value, bool) or not pattern.fullmatch(text):
            what = "an integer" if self.integer else "a finite number"
            self.fail(f"{value!r} is not {what} in the range {self._describe_range()}", param, ctx)
        n = int(text) if self.integer else float(text)
        if not math.isfinite(n):  # 1e999
            self.fail(f"{value} is not a finite number in the range {self._describe_range()}", param, ctx)
        if not self.lo <= n <= self.hi:
            self.fail(f"{n} is not in the range {self._describe_range()}", param, ctx)
        return n

    def _describe_range(self) -> str:
        lo, hi = (f"{x:g}" if x % 1 else f"{int(x)}" for x in (self.lo, self.hi))
        return f"{lo}<=x<={hi}"


class OutFile(click.Path):
    """A file the command writes when its work is done: its folder is checked before the work starts, so a
    typo costs nothing measured (click's own error: exit 2, naming the option)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = Path(os.fsdecode(super().convert(value, param, ctx)))
        try:
            check_destination(path)  # the folder exists and is writable; the file is no link, no device
        except FileRefused as e:
            self.fail(str(e), param, ctx)
        return path


def need_root() -> None:
    if os.geteuid() != 0:
        err.print(
            Text(
                "tunnelbench needs root: it creates network namespaces, veth pairs and nftables rules", "red"
            )
        )
        sys.exit(2)


def find_run(ref: str | None, results: Path) -> Path:
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


class Verbs(click.Group):
    """The `tunnelbench` group: a file or folder the product refuses (FileRefused: a store it cannot read, a
    link where it would write, a folder other users can write) ends any verb with its one line and exit 2,
    never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FileRefused as e:
            err.print(Text(str(e), style="red"), soft_wrap=True)
            ctx.exit(2)


@click.group(cls=Verbs, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tunnelbench")
def main() -> None:
    """Benchmark VPNs and overlay tunnels in a namespace lab, fairly and reproducibly."""


def hold_lab(what: str) -> LabLock:
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


def probe_under_lab_lock(what: str) -> None:
    """plan, doctor and list ask the kernel what it can run, and that probe changes the machine (a scratch namespace,
    tunnel devices, modules loaded), so it runs under the lab lock. When another process holds the lab, none
    runs: this boot's last probe is read instead, or the kernel is not probed (every VPN counted), said."""
    from tunnelbench.lab import kernel
    from tunnelbench.lab.lock import LabBusy, LabLock

    try:
        lock = LabLock(what).acquire()
    except LabBusy as e:
        kernel.hold_probes("the lab is busy")
        console.print(
            Text(
                f"{str(e).split('. ')[0]}: the kernel is not probed now (the probe makes a namespace and loads "
                "modules); VPN availability is this boot's last probe, or not known (then every VPN is counted)",
                style="yellow",
            )
        )
        return
    except OSError:  # not root: no lock to take, and the probe can change nothing either
        return
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(lock.release)


def build_tool(b: Build, before: dict[str, float]) -> None:
    """Build one tool on first use (builds.build), a line before and one after; a failure is said only."""
    from tunnelbench.builds import build_announced

    build_announced(b, before, err)


def ensure_engine() -> None:
    """Build the native impairment engine now if this machine has none (a lean set-up leaves it to first
    use); a failed build is said, and the command then fails where it needs the engine."""
    from tunnelbench.builds import BUILDS, past_seconds, present

    if not present(BUILDS["impaird"]):
        build_tool(BUILDS["impaird"], past_seconds())


def load_inventory(path: Path, insecure: bool) -> Inventory:
    from tunnelbench.lab.inventory import InventoryError, load_inventory

    try:
        inv = load_inventory(path)
    except InventoryError as e:
        err.print(Text(f"{e}", style="red"))
        sys.exit(2)
    if insecure:
        inv.insecure()
    return inv
