"""Machine-wide limits a lab must raise on this machine, journaled first and put back after.

One so far: fs.inotify.max_user_instances. Every wireguard-go daemon watches its UAPI socket with an inotify
instance and Linux allows 128 per user, so a many-client lab (or 100 client pods, whose daemons are this
machine's processes too) stops at the 129th daemon ("too many open files"). The value before is journaled
before the write; the mesh's stop puts it back (vpns/mesh.py `Mesh.stop` -> the driver's `after_mesh`), and
`tunnelbench clean` does after a kill. It is put back only while it still holds the value written: a value
someone raised further since (another run, the user) is theirs, and stays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunnelbench.lab.host import Host
from tunnelbench.lab.journal import register_undo
from tunnelbench.lab.journaling import HostJournaling

KIND = "raised_sysctl"
RAISABLE = ("fs.inotify.max_user_instances",)  # what a journal may make `clean` write, and nothing else
PROC_SYS = Path("/proc/sys")


def _path(key: str, root: Path | None) -> Path:
    return (root or PROC_SYS) / key.replace(".", "/")


def raise_at_least(
    key: str, value: int, journal: HostJournaling | None, root: Path | None = None
) -> dict[str, Any] | None:
    """Raise `key` to `value` if it is lower: the entry (journaled before the write), or None when nothing
    was written (already high enough, or not writable here: the daemons then say what failed)."""
    if key not in RAISABLE:
        raise ValueError(f"{key}: not a limit the lab raises ({', '.join(RAISABLE)})")
    path = _path(key, root)
    try:
        before = int(path.read_text())
    except (OSError, ValueError):
        return None
    if before >= value:
        return None
    entry: dict[str, Any] = {"kind": KIND, "key": key, "before": before, "set": value}
    if journal is not None:
        journal.add(entry)
    try:
        path.write_text(f"{value}\n")
    except OSError:
        if journal is not None:
            journal.release(entry)
        return None
    return entry


def put_back(entry: dict[str, Any], root: Path | None = None) -> str | None:
    """The value before, if the limit still holds the one written; what was done (None: nothing)."""
    path = _path(str(entry["key"]), root)
    try:
        now = int(path.read_text())
    except (OSError, ValueError):
        return None
    if now != int(entry["set"]):
        return None
    path.write_text(f"{int(entry['before'])}\n")
    return f"{entry['key']} put back to {entry['before']}"


def restore(
    entry: dict[str, Any] | None, journal: HostJournaling | None, root: Path | None = None
) -> list[str]:
    """At the mesh's stop: put the value back and release the entry; what could not be done (the entry
    then stays open, for `clean`)."""
    if entry is None:
        return []
    try:
        put_back(entry, root)
    except OSError as e:
        return [f"{entry['key']} not put back to {entry['before']}: {e.strerror or e}"]
    if journal is not None:
        journal.release(entry)
    return []


def _undo(_host: Host, entry: dict[str, Any]) -> str | None:
    try:
        return put_back(entry)
    except OSError:
        return None


def _refusal(entry: dict[str, Any], _run_id: str) -> str | None:
    """Only a raisable key, both values plain integers: a journal cannot make clean write anything else."""
    key, before, set_ = entry.get("key"), entry.get("before"), entry.get("set")
    if key not in RAISABLE:
        return f"{KIND}: {key!r} is not a limit the lab raises"
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (before, set_)):
        return f"{KIND} {key}: values not plain integers"
    return None


register_undo(KIND, _undo, _refusal)
