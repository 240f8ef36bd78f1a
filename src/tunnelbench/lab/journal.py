"""On-disk journal of everything a run creates, so `tunnelbench clean` can undo a SIGKILLed run.

Each run appends JSON lines to ``<run_dir>/journal.jsonl`` (fsynced per entry) and registers itself in
``/run/tunnelbench/<run_id>`` (tmpfs: namespaces and processes do not survive a reboot either), keeping a copy of
its entries in ``/run/tunnelbench/<run_id>.jsonl`` so `clean` can undo it even when the results folder was deleted.
A resumed run appends to the same journal after `clean` has undone the killed process's entries; an "end" closes
everything before it.
Entries:
  {"kind": "netns", "name": ...}                              a namespace we created
  {"kind": "process", "pid": ..., "start": ..., "argv": [...]} a process we started (start = /proc start ticks)
  {"kind": "path", "path": ...}                               a file outside the run dir we created
  {"kind": "link", "netns": ..., "name": ...}                  an interface in a namespace we do not own
  {"kind": ..., "backend": "ssh", "host": ..., "address": ...}  the same on an SSH host (see lab/ssh_undo.py)
  {"kind": "release", "ref": {...}}                           the entry was undone by normal teardown
  {"kind": "end"}                                             teardown completed

Rooms above the lab journal kinds of their own (impair/: "qdisc", "iptables_chain") and register how to undo
them with `register_undo`; `clean` (lab/clean.py) and the SSH undo (lab/ssh_undo.py) look the handler up by kind,
as Mininet's cleanup does with its callbacks, so the lab never imports those rooms.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunnelbench.lab.journaling import process_alive
from tunnelbench.lab.procstat import read_stat

if TYPE_CHECKING:
    from tunnelbench.lab.host import Host

REGISTRY = Path(os.environ.get("TUNNELBENCH_REGISTRY", "/run/tunnelbench"))

# kind -> how to undo such an entry on the host it was made on: returns what it removed ("qdisc on eth1"), or
# None when nothing was there any more; either way the entry is then released
UndoFn = Callable[["Host", dict[str, Any]], "str | None"]
_UNDO: dict[str, UndoFn] = {}


def register_undo(kind: str, fn: UndoFn) -> None:
    """Make `clean` and the SSH teardown undo journal entries of `kind` with `fn(host, entry)`. Registered
    when the room that journals the kind is imported; every command that may clean imports it."""
    _UNDO[kind] = fn


def undo_handler(kind: str) -> UndoFn | None:
    """The registered undo of a kind (None: not registered; the lab's own kinds are undone where they live)."""
    return _UNDO.get(kind)


def proc_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot; tells a live PID from a reused one."""
    st = read_stat(pid)
    return None if st is None else st.starttime


def registry_files(run_id: str) -> tuple[Path, Path]:
    """A run's registration (run folder, owner PID) and the copy of its journal entries, under REGISTRY
    (read at call time: tests point the module's REGISTRY at a private folder)."""
    return REGISTRY / run_id, REGISTRY / f"{run_id}.jsonl"


def entry_key(entry: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in entry.items() if k != "argv"}, sort_keys=True)


class Journal:
    def __init__(self, run_dir: Path, run_id: str):
        self.path = run_dir / "journal.jsonl"
        self.run_id = run_id
        self._lock = threading.Lock()
        run_dir.mkdir(parents=True, exist_ok=True)
        REGISTRY.mkdir(parents=True, exist_ok=True)
        # the copy is appended to, never truncated: entries a failed clean left open stay findable
        self.registry_file, self.copy_path = registry_files(run_id)
        self.run_dir_error: str | None = None  # the first failed write of the results folder's copy
        self.registry_file.write_text(
            json.dumps(
                {
                    "run_dir": str(run_dir.resolve()),
                    "pid": os.getpid(),
                    "start": proc_start_ticks(os.getpid()),
                }
            )
        )

    def _append(self, entry: dict[str, Any]) -> None:
        """The registry's copy first, and it must be written (what clean reads while the run lives); the
        results folder's copy is the run's record afterwards, and a full results disk must not stop a
        teardown halfway: its write failing is noted (run_dir_error) and the teardown goes on."""
        line = json.dumps(entry) + "\n"
        with self._lock:
            for path in (self.copy_path, self.path):
                try:
                    with open(path, "a") as f:
                        f.write(line)
                        f.flush()
                        os.fsync(f.fileno())
                except OSError as e:
                    if path == self.copy_path:
                        raise
                    self.run_dir_error = self.run_dir_error or f"{path}: {e.strerror or e}"

    def add(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Record any entry (the SSH lab adds "backend", "host" and "address" to its entries)."""
        self._append(entry)
        return entry

    def netns(self, name: str) -> dict[str, Any]:
        e = {"kind": "netns", "name": name}
        self._append(e)
        return e

    def process(self, pid: int, argv: list[str], host: str) -> dict[str, Any]:
        e = {"kind": "process", "pid": pid, "start": proc_start_ticks(pid), "host": host, "argv": argv}
        self._append(e)
        return e

    def path_entry(self, path: str) -> dict[str, Any]:
        e = {"kind": "path", "path": path}
        self._append(e)
        return e

    def release(self, entry: dict[str, Any]) -> None:
        self._append({"kind": "release", "ref": {k: v for k, v in entry.items() if k != "argv"}})

    def end(self) -> None:
        """Close the run's journal: everything was undone. A teardown that met problems does not call it, so
        the run stays registered and `tunnelbench clean` retries what is left once this process is gone."""
        self._append({"kind": "end"})
        self.registry_file.unlink(missing_ok=True)
        self.copy_path.unlink(missing_ok=True)


@dataclass
class Leftovers:
    run_id: str
    run_dir: Path
    owner_pid: int | None
    owner_start: int | None
    entries: list[dict[str, Any]]

    def owner_alive(self) -> bool:
        # a zombie (killed, not yet reaped by its parent) owns nothing any more: clean may undo its run
        return self.owner_pid is not None and process_alive(self.owner_pid, self.owner_start)


def read_open_entries(journal_path: Path) -> list[dict[str, Any]]:
    """Entries of a journal that were created and never released."""
    created: dict[str, dict[str, Any]] = {}
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
        elif e["kind"] == "end":
            created.clear()  # teardown or clean undid everything before (a resumed run journals after it)
        else:
            created[entry_key(e)] = e
    return list(created.values())


def _leftovers(run_id: str, info: dict[str, Any]) -> Leftovers:
    run_dir = Path(info["run_dir"])
    _, copy = registry_files(run_id)
    # the copy holds every entry since the run registered; the run folder's journal is read for runs made
    # before copies were kept
    entries = read_open_entries(copy if copy.exists() else run_dir / "journal.jsonl")
    return Leftovers(run_id, run_dir, info.get("pid"), info.get("start"), entries)


def registered_runs() -> Iterator[Leftovers]:
    if not REGISTRY.is_dir():
        return
    for f in sorted(REGISTRY.iterdir()):
        if f.suffix == ".jsonl":
            continue
        try:
            info = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        yield _leftovers(f.name, info)


def run_leftovers(run_id: str, run_dir: Path) -> Leftovers:
    """What one run left behind: from its registration if it has one (owner PID included), else from the
    journal in its folder (no owner: a run that unregistered or predates this machine's boot)."""
    reg, _ = registry_files(run_id)
    try:
        return _leftovers(run_id, json.loads(reg.read_text()))
    except (OSError, json.JSONDecodeError):
        return Leftovers(run_id, run_dir, None, None, read_open_entries(run_dir / "journal.jsonl"))
