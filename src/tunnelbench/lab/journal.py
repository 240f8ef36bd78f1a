"""On-disk journal of everything a run creates, so `tunnelbench clean` can undo a SIGKILLed run.

Each run appends JSON lines to ``<run_dir>/journal.jsonl`` (fsynced per entry) and registers itself in
``/run/tunnelbench/<run_id>`` (tmpfs: namespaces and processes do not survive a reboot either).
Entries:
  {"kind": "netns", "name": ...}                              a namespace we created
  {"kind": "process", "pid": ..., "start": ..., "argv": [...]} a process we started (start = /proc start ticks)
  {"kind": "path", "path": ...}                               a file outside the run dir we created
  {"kind": "link", "netns": ..., "name": ...}                  an interface in a namespace we do not own
  {"kind": ..., "backend": "ssh", "host": ..., "address": ...}  the same on an SSH host (see lab/ssh.py)
  {"kind": "release", "ref": {...}}                           the entry was undone by normal teardown
  {"kind": "end"}                                             teardown completed
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REGISTRY = Path(os.environ.get("TUNNELBENCH_REGISTRY", "/run/tunnelbench"))


def proc_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot; tells a live PID from a reused one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may contain spaces and parentheses: fields start after the last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19])


def process_alive(pid: int, start: int | None) -> bool:
    """True if `pid` is still the process that was started at `start` ticks and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0] != "Z" and (start is None or int(fields[19]) == start)


def entry_key(entry: dict) -> str:
    return json.dumps({k: v for k, v in entry.items() if k != "argv"}, sort_keys=True)


class Journal:
    def __init__(self, run_dir: Path, run_id: str):
        self.path = run_dir / "journal.jsonl"
        self.run_id = run_id
        self._lock = threading.Lock()
        run_dir.mkdir(parents=True, exist_ok=True)
        REGISTRY.mkdir(parents=True, exist_ok=True)
        self.registry_file = REGISTRY / run_id
        self.registry_file.write_text(
            json.dumps(
                {
                    "run_dir": str(run_dir.resolve()),
                    "pid": os.getpid(),
                    "start": proc_start_ticks(os.getpid()),
                }
            )
        )

    def _append(self, entry: dict) -> None:
        line = json.dumps(entry) + "\n"
        with self._lock, open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def add(self, entry: dict) -> dict:
        """Record any entry (the SSH lab adds "backend", "host" and "address" to its entries)."""
        self._append(entry)
        return entry

    def netns(self, name: str) -> dict:
        e = {"kind": "netns", "name": name}
        self._append(e)
        return e

    def process(self, pid: int, argv: list[str], host: str) -> dict:
        e = {"kind": "process", "pid": pid, "start": proc_start_ticks(pid), "host": host, "argv": argv}
        self._append(e)
        return e

    def path_entry(self, path: str) -> dict:
        e = {"kind": "path", "path": path}
        self._append(e)
        return e

    def release(self, entry: dict) -> None:
        self._append({"kind": "release", "ref": {k: v for k, v in entry.items() if k != "argv"}})

    def end(self) -> None:
        self._append({"kind": "end"})
        self.registry_file.unlink(missing_ok=True)


@dataclass
class Leftovers:
    run_id: str
    run_dir: Path
    owner_pid: int | None
    owner_start: int | None
    entries: list[dict]

    def owner_alive(self) -> bool:
        return self.owner_pid is not None and proc_start_ticks(self.owner_pid) == self.owner_start


def read_open_entries(journal_path: Path) -> list[dict]:
    """Entries of a journal that were created and never released."""
    created: dict[str, dict] = {}
    try:
        lines = journal_path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue  # torn last line after a SIGKILL
        if e["kind"] == "release":
            created.pop(json.dumps(e["ref"], sort_keys=True), None)
        elif e["kind"] != "end":
            created[entry_key(e)] = e
    return list(created.values())


def registered_runs() -> Iterator[Leftovers]:
    if not REGISTRY.is_dir():
        return
    for f in sorted(REGISTRY.iterdir()):
        try:
            info = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        run_dir = Path(info["run_dir"])
        yield Leftovers(
            f.name, run_dir, info.get("pid"), info.get("start"), read_open_entries(run_dir / "journal.jsonl")
        )
