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

What is ever undone (so that a journal another user planted undoes nothing): only what THIS machine's registry
journaled, and only when its folder and files are owned by root (or the user running tunnelbench) and writable
by nobody else (`untrusted`); a journal found only in a run folder (copied from elsewhere, or the registry
went with a reboot) names things that are reported and left alone. Even then each entry must be the run's own
(`refusal`): a process with its start time (and, where it is signalled, its command line), a name carrying the
run's tag (lab/tags.py), a path inside the run's folders or one of the lab's known places named after the run.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from tunnelbench.lab.journaling import process_alive
from tunnelbench.lab.procstat import read_stat
from tunnelbench.lab.tags import carries_tag, tag_of

if TYPE_CHECKING:
    from tunnelbench.lab.host import Host

REGISTRY = Path(os.environ.get("TUNNELBENCH_REGISTRY", "/run/tunnelbench"))
# where the lab's runs make files outside their run folder, each named after the run (tag or run id first):
# tailscaled's and Headscale's sockets (unix socket paths are short), wireguard-go's UAPI sockets; and
# REGISTRY/up (read at call time) for `tunnelbench up`'s state files
KNOWN_PLACES = ("/run/tbsock", "/run/wireguard", "/var/run/wireguard")

# kind -> how to undo such an entry on the host it was made on: returns what it removed ("qdisc on eth1"), or
# None when nothing was there any more; either way the entry is then released
UndoFn = Callable[["Host", dict[str, Any]], "str | None"]
_UNDO: dict[str, UndoFn] = {}
# kind -> why an entry of it outside the run's namespaces must be left alone (None: it may be undone), for a
# kind whose state is machine-wide by nature (kube/: the kubelet's global sysctls, its cgroup roots): the room
# that journals it says what may be undone, as `refusal` does for the lab's own kinds
MachineWideCheck = Callable[[dict[str, Any], str], "str | None"]
_MACHINE_WIDE: dict[str, MachineWideCheck] = {}
# what a dead run's folder still holds that must go with it (security/keys.py: its secret files): given the
# run folder, returns what it removed
SweepFn = Callable[[Path], list[str]]
_SWEEPS: list[SweepFn] = []


def register_undo(kind: str, fn: UndoFn, machine_wide: MachineWideCheck | None = None) -> None:
    """Make `clean` and the SSH teardown undo journal entries of `kind` with `fn(host, entry)`. Registered
    when the room that journals the kind is imported; every command that may clean imports it. A kind undone
    outside the run's namespaces gives `machine_wide(entry, run_id)`: why an entry must be left alone, or None
    (without it such an entry is only undone inside one of the run's namespaces)."""
    _UNDO[kind] = fn
    if machine_wide is not None:
        _MACHINE_WIDE[kind] = machine_wide


def machine_wide_check(kind: str) -> MachineWideCheck | None:
    """The registered rule for a kind undone outside the run's namespaces (None: it has none)."""
    return _MACHINE_WIDE.get(kind)


def undo_handler(kind: str) -> UndoFn | None:
    """The registered undo of a kind (None: not registered; the lab's own kinds are undone where they live)."""
    return _UNDO.get(kind)


def register_sweep(fn: SweepFn) -> None:
    """Make `clean` and `run --resume` run `fn(run_dir)` on a dead run's folder after undoing its entries."""
    if fn not in _SWEEPS:
        _SWEEPS.append(fn)


def sweeps() -> list[SweepFn]:
    return list(_SWEEPS)


def proc_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot; tells a live PID from a reused one."""
    st = read_stat(pid)
    return None if st is None else st.starttime


def registry_files(run_id: str) -> tuple[Path, Path]:
    """A run's registration (run folder, owner PID) and the copy of its journal entries, under REGISTRY
    (read at call time: tests point the module's REGISTRY at a private folder)."""
    return REGISTRY / run_id, REGISTRY / f"{run_id}.jsonl"


def untrusted(path: Path) -> str | None:
    """Why the registry's folder or one of its files must not be believed (None: it may): a symlink, an owner
    other than root (or the user running tunnelbench, for a private registry), or writable by group or others,
    so that someone else could have written what it says."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink"
    if st.st_uid not in (0, os.geteuid()):
        return f"{path} is owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _private_fd(path: Path, flags: int) -> int:
    """A registry file opened for writing as 0600 whatever the umask, never through a symlink."""
    fd = os.open(path, flags | os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def entry_key(entry: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in entry.items() if k != "argv"}, sort_keys=True)


class Journal:
    def __init__(self, run_dir: Path, run_id: str):
        self.path = run_dir / "journal.jsonl"
        self.run_id = run_id
        self._lock = threading.Lock()
        run_dir.mkdir(parents=True, exist_ok=True)
        REGISTRY.mkdir(mode=0o755, parents=True, exist_ok=True)
        why = untrusted(REGISTRY)
        if why:  # clean would not believe what this run journals there
            raise OSError(f"the run registry cannot be trusted: {why}; make it root's, mode 0755")
        # the copy is appended to, never truncated: entries a failed clean left open stay findable
        self.registry_file, self.copy_path = registry_files(run_id)
        self.run_dir_error: str | None = None  # the first failed write of the results folder's copy
        info = {"run_dir": str(run_dir.resolve()), "pid": os.getpid(), "start": proc_start_ticks(os.getpid())}
        with os.fdopen(_private_fd(self.registry_file, os.O_TRUNC), "w") as f:
            f.write(json.dumps(info))

    def _append(self, entry: dict[str, Any]) -> None:
        """The registry's copy first, and it must be written (what clean reads while the run lives); the
        results folder's copy is the run's record afterwards, and a full results disk must not stop a
        teardown halfway: its write failing is noted (run_dir_error) and the teardown goes on."""
        line = json.dumps(entry) + "\n"
        with self._lock:
            for path in (self.copy_path, self.path):
                try:
                    if path == self.copy_path:
                        fd = _private_fd(path, os.O_APPEND)
                    else:
                        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                    with os.fdopen(fd, "a") as f:
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
    entries: list[dict[str, Any]]  # what this machine's registry journaled: the only things ever undone
    distrust: str = ""  # why the journal that named `ignored` is no source of things to undo
    ignored: list[dict[str, Any]] = field(default_factory=list)  # its open entries: reported, left alone
    registered: bool = False  # from a registration this machine's registry holds and that is believed

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
        if not isinstance(e, dict) or not isinstance(e.get("kind"), str):
            continue
        if e["kind"] == "release":
            created.pop(json.dumps(e.get("ref"), sort_keys=True), None)
        elif e["kind"] == "end":
            created.clear()  # teardown or clean undid everything before (a resumed run journals after it)
        else:
            created[entry_key(e)] = e
    return list(created.values())


def _registration(run_id: str) -> tuple[dict[str, Any] | None, str]:
    """A run's registration as this machine's registry holds it, or None and why it is not believed ("" when
    there is none)."""
    reg, _ = registry_files(run_id)
    if not os.path.lexists(reg):
        return None, ""
    why = untrusted(REGISTRY) or untrusted(reg)
    if why:
        return None, why
    try:
        info = json.loads(reg.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return None, f"{reg}: {e}"
    if not isinstance(info, dict) or not Path(str(info.get("run_dir", ""))).is_absolute():
        return None, f"{reg} names no absolute run folder"
    return info, ""


def _leftovers(run_id: str, info: dict[str, Any]) -> Leftovers:
    """A trusted registration's run: its entries from the registry's copy only (a run that registered and
    journaled nothing has none)."""
    run_dir = Path(info["run_dir"])
    pid, start = info.get("pid"), info.get("start")
    owner = (pid if isinstance(pid, int) else None), (start if isinstance(start, int) else None)
    _, copy = registry_files(run_id)
    if not os.path.lexists(copy):
        return Leftovers(run_id, run_dir, *owner, [], registered=True)
    why = untrusted(copy)
    if why:
        ignored = read_open_entries(copy)
        return Leftovers(run_id, run_dir, *owner, [], distrust=why, ignored=ignored, registered=True)
    return Leftovers(run_id, run_dir, *owner, read_open_entries(copy), registered=True)


def registered_runs() -> Iterator[Leftovers]:
    """Every run this machine's registry holds. One whose registration is not believed comes with `distrust`
    set, no entries and no run folder of its own (what it names is not read)."""
    if not REGISTRY.is_dir():
        return
    for f in sorted(REGISTRY.iterdir()):
        if f.suffix == ".jsonl" or f.is_dir():
            continue
        info, why = _registration(f.name)
        if info is None:
            yield Leftovers(f.name, Path(), None, None, [], distrust=why or f"{f}: unreadable")
            continue
        yield _leftovers(f.name, info)


def run_leftovers(run_id: str, run_dir: Path) -> Leftovers:
    """What one run left behind: from this machine's registration when it has one it can believe (owner PID
    included). Without one (a folder copied from elsewhere, a reboot since) the journal in its folder is no
    source of things to undo: its open entries come back as `ignored`, to be reported and left alone."""
    info, why = _registration(run_id)
    if info is not None:
        return _leftovers(run_id, info)
    return Leftovers(
        run_id,
        run_dir,
        None,
        None,
        [],
        distrust=why or f"this machine's registry ({REGISTRY}) has no record of run {run_id}",
        ignored=read_open_entries(run_dir / "journal.jsonl"),
    )


# -- what an entry may name ----------------------------------------------------------------------------
def describe(entry: dict[str, Any]) -> str:
    """An entry in a few words, for what was left alone."""
    kind = entry.get("kind")
    where = f" on {entry['host']}" if entry.get("backend") == "ssh" and entry.get("host") else ""
    if kind == "process":
        return f"process {entry.get('pid')} ({' '.join(map(str, (entry.get('argv') or [])[:3]))}){where}"
    if kind == "path":
        return f"file {entry.get('path')}{where}"
    if kind == "link":
        return f"interface {entry.get('name')} in {entry.get('netns') or 'this machine'}"
    if kind == "link_prefix":
        return f"interfaces {entry.get('prefix')!r}*{where}"
    for key in ("name", "path", "dev", "chain"):
        if key in entry:
            return f"{kind} {entry[key]}{where}"
    return f"{kind}{where}"


def _under(path: PurePosixPath, root: str) -> bool:
    r = PurePosixPath(root)
    return r.is_absolute() and len(r.parts) > 1 and path != r and path.is_relative_to(r)


def path_refusal(path: str, run_id: str, own: Sequence[str], local: bool) -> str | None:
    """Why a journaled path is not the run's to remove (None: it is): it must be inside one of the run's own
    folders (`own`), or directly in one of the lab's known places with a name that starts with the run's id
    or tag. A local path is judged with its folders' symlinks resolved."""
    p = PurePosixPath(path)
    if not p.is_absolute() or ".." in p.parts or len(p.parts) < 3:
        return f"{path!r} is not an absolute path inside a folder"
    places = [*KNOWN_PLACES, str(REGISTRY / "up")]
    if local:
        p = PurePosixPath(os.path.realpath(p.parent)) / p.name
        own = [os.path.realpath(d) for d in own]
        places = [os.path.realpath(d) for d in places]
    if any(_under(p, d) for d in own):
        return None
    tag = tag_of(run_id)
    named = tag is not None and (p.name.startswith(run_id) or carries_tag(p.name, tag))
    if str(p.parent) in places and named:
        return None
    return f"{path} is outside run {run_id}'s folders and not one of its files in the lab's known places"


def refusal(entry: dict[str, Any], run_id: str, own: Sequence[str]) -> str | None:
    """Why an entry of run `run_id` must be left alone whatever its journal says (None: it may be undone). The
    rules every undo shares, on this machine and on SSH hosts: a process needs its start time; a namespace,
    interface, interface prefix or nft table must carry the run's tag; a path must be the run's
    (`path_refusal`, against its folders `own`)."""
    kind, tag = entry.get("kind"), tag_of(run_id)
    what = describe(entry)
    if kind == "process":
        if not isinstance(entry.get("pid"), int) or not isinstance(entry.get("start"), int):
            return f"{what}: journaled without its start time, so it cannot be told from a reused PID"
        return None
    remote = entry.get("backend") == "ssh"
    names = {
        "netns": [entry.get("name")],
        # in a namespace of the run here; on an SSH host in its own (the run's interfaces go by link_prefix)
        "link": [entry.get("name")] + ([] if remote else [entry.get("netns")]),
        "link_prefix": [entry.get("prefix")],
        "nft_table": [entry.get("name")],
    }.get(str(kind), [])
    for n in names:
        if not isinstance(n, str) or not carries_tag(n, tag):
            return (
                f"{what}: {n!r} does not carry run {run_id}'s tag ({tag or 'none: not a tunnelbench run id'})"
            )
    if kind == "path":
        path = entry.get("path")
        if not isinstance(path, str):
            return f"{what}: no path"
        why = path_refusal(path, run_id, own, local=not remote)
        return f"{what}: {why}" if why else None
    return None
