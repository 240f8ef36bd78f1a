"""The one reader of /proc/PID/stat: local PIDs read here, PIDs on SSH hosts read with `cat` and parsed here.

comm (field 2) may hold spaces and parentheses, so the fields are split after the LAST ')'.
Shell scripts that must read and act in one step on a remote host (kill only our PID) use `starttime_sh`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcStat:
    state: str  # field 3: R, S, D, Z, ...
    utime: int  # field 14, clock ticks
    stime: int  # field 15, clock ticks
    starttime: int  # field 22, clock ticks since boot: tells a live PID from a reused one
    rss: int  # field 24, pages


def parse_stat(line: str) -> ProcStat | None:
    """Parse one /proc/PID/stat line (None if it is not one)."""
    cut = line.rfind(")")
    f = line[cut + 2 :].split() if cut >= 0 else []
    try:
        return ProcStat(f[0], int(f[11]), int(f[12]), int(f[19]), int(f[21]))
    except (IndexError, ValueError):
        return None


def read_stat(pid: int) -> ProcStat | None:
    """The stat of a local PID (None: no such process)."""
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None


def stat_argv(pid: int | str) -> list[str]:
    """The command that prints a PID's stat line on a host (parse its output with `parse_stat`)."""
    return ["cat", f"/proc/{pid}/stat"]


def starttime_sh(pid: int | str) -> str:
    """A shell pipeline printing a PID's start time (field 22): sed's greedy '.*) ' ends at the last ')'."""
    return f"sed 's/.*) //' /proc/{pid}/stat 2>/dev/null | cut -d' ' -f20"
