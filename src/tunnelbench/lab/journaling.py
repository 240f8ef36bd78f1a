"""What a host records through (the run's Journal, or the SSH lab's per-host journal), and whether a journaled
process is still the one that was started: below both lab/host.py and lab/journal.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from tunnelbench.lab.procstat import read_stat


def process_alive(pid: int, start: int | None) -> bool:
    """True if `pid` is still the process that was started at `start` ticks and is not a zombie."""
    st = read_stat(pid)
    return st is not None and st.state != "Z" and (start is None or st.starttime == start)


def parse_cmdline(raw: bytes) -> list[str]:
    """/proc/PID/cmdline's NUL-separated arguments (a title a process wrote over them: one string)."""
    return [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")] if raw.strip(b"\0") else []


def read_cmdline(pid: int) -> list[str]:
    """A local process's command line ([]: gone, a zombie or a kernel thread)."""
    try:
        return parse_cmdline(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return []


def same_command(cmdline: list[str], argv: list[str]) -> bool:
    """Whether a running process's command line is the journaled `argv`: the whole of it, or the command its
    journaled wrappers exec'd into (`taskset -c 1 impaird ...` runs as `impaird ...`; `unshare ... sh -c
    'exec "$@"' tb-mountns vpnserver execsvc` as `vpnserver execsvc`), or a title the daemon wrote over its
    arguments that ends with them (nginx: "nginx: master process <its argv>"). An empty side never matches."""
    if not cmdline or not argv:
        return False
    if len(cmdline) <= len(argv) and cmdline == argv[len(argv) - len(cmdline) :]:
        return True
    return len(cmdline) == 1 and len(argv) > 1 and cmdline[0].endswith(" " + " ".join(argv))


def ours(pid: int, start: int | None, argv: list[str]) -> bool:
    """Whether a journaled local process may be signalled: its start time (ticks since boot: a reused PID
    has another) AND its command line are the journaled ones. An entry without a start time never is."""
    return start is not None and process_alive(pid, start) and same_command(read_cmdline(pid), argv)


class HostJournaling(Protocol):
    """What a host records through: the run's Journal, or the SSH lab's HostJournal (tags each entry)."""

    path: Path
    run_id: str

    def add(self, entry: dict[str, Any]) -> dict[str, Any]: ...
    def netns(self, name: str) -> dict[str, Any]: ...
    def process(self, pid: int, argv: list[str], host: str) -> dict[str, Any]: ...
    def path_entry(self, path: str) -> dict[str, Any]: ...
    def release(self, entry: dict[str, Any]) -> None: ...
    def end(self) -> None: ...
