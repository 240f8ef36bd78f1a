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
