"""`tunnelbench clean`: undo what crashed or SIGKILLed runs left behind, using their journals only.

Only what this machine's registry journaled is undone, and only what the rules every undo shares allow
(lab/journal.py `refusal`: a process with its start time and command line, names carrying the run's tag, paths
that are the run's); anything else a journal names is reported as left alone. The lab's own kinds (processes,
namespaces, files, links) are undone here; kinds other rooms journal are undone by the handler they registered
(lab/journal.py `register_undo`), in one of the run's namespaces. Entries made on SSH hosts are undone there
(lab/ssh_undo.py), through the same registry and rules. Then the sweeps other rooms registered run on the run's
folder (security/keys.py: its secret files)."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunnelbench.lab.host import THIS_MACHINE, Host
from tunnelbench.lab.journal import (
    Leftovers,
    describe,
    machine_wide_check,
    refusal,
    registered_runs,
    registry_files,
    sweeps,
    undo_handler,
)
from tunnelbench.lab.journaling import process_alive, read_cmdline, same_command
from tunnelbench.lab.netns import NetnsHost, destroy_netns, netns_exists
from tunnelbench.lab.tags import TAG_PREFIX, carries_tag, tag_of

if TYPE_CHECKING:
    from tunnelbench.lab.inventory import Inventory

KILL_WAIT_S = 5.0  # how long an undo waits for a SIGKILLed process to be gone before calling it a problem
LAB_KINDS = ("process", "netns", "path", "link")


@dataclass
class CleanReport:
    removed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # look like ours but are in no journal: not touched
    refused: list[str] = field(default_factory=list)  # named by a journal but not the run's: left alone


def _host_of(entry: dict[str, Any]) -> Host:
    if entry.get("netns"):
        return NetnsHost("local", entry["netns"], "", Path("/"), None)
    return THIS_MACHINE


def _local_refusal(entry: dict[str, Any], run: Leftovers) -> str | None:
    """The shared rules, and: a kind another room journals is undone only inside one of the run's namespaces
    (a local run makes nothing outside them)."""
    why = refusal(entry, run.run_id, [str(run.run_dir)])
    if why or entry.get("kind") in LAB_KINDS or undo_handler(str(entry.get("kind"))) is None:
        return why
    if entry.get("netns") is None and (check := machine_wide_check(str(entry.get("kind")))) is not None:
        return check(entry, run.run_id)  # machine-wide by nature: the kind's own rule says what may go
    if not carries_tag(str(entry.get("netns") or ""), tag_of(run.run_id)):
        return f"{describe(entry)}: not in one of run {run.run_id}'s namespaces"
    return None


def _kill(entry: dict[str, Any]) -> tuple[str | None, str | None]:
    """SIGKILL a journaled process if it is still the one started (its start time) and runs the journaled
    command; returns (what was killed, why it was left alone)."""
    pid, start = entry["pid"], entry["start"]
    if not process_alive(pid, start):
        return None, None  # gone, or the PID was reused by an unrelated process: not ours
    cmdline = read_cmdline(pid)
    if not same_command(cmdline, list(entry.get("argv") or [])):
        return None, f"{describe(entry)}: its start time matches but it runs {' '.join(cmdline)[:120]!r}"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    # SIGKILL is asynchronous: a many-threaded daemon takes a moment to exit, and callers verify right after
    end = time.monotonic() + KILL_WAIT_S
    while process_alive(pid, start) and time.monotonic() < end:
        time.sleep(0.02)
    return f"process {pid} ({' '.join(entry.get('argv', [])[:3])})", None


def _remove_file(path: Path) -> str | None:
    """Unlink a journaled file (a socket, a state file; never a folder); a problem, or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return f"{path} is a folder: not removed"
    path.unlink(missing_ok=True)
    return None


def clean_run(run: Leftovers, inventory: Inventory | None = None) -> CleanReport:
    rep = CleanReport()
    if run.ignored:
        rep.refused.append(
            f"run {run.run_id}: {run.distrust}; its journal is no source of things to undo, so these are "
            f"left alone: {', '.join(describe(e) for e in run.ignored)}"
        )
    remote = [e for e in run.entries if e.get("backend") == "ssh"]
    if remote:  # entries on SSH hosts are undone there, never on this machine (lab/ssh_undo.py)
        if inventory is None:
            hosts = sorted({e["host"] for e in remote})
            rep.skipped.append(
                f"run {run.run_id} left things on SSH hosts ({', '.join(hosts)}): "
                "run `tunnelbench clean --inventory FILE`"
            )
        else:
            from tunnelbench.lab.ssh_undo import clean_ssh_entries

            undone = clean_ssh_entries(remote, inventory, run.run_id)
            rep.removed += undone.removed
            rep.problems += undone.problems
            rep.refused += undone.refused
    local = []
    for e in run.entries:
        if e.get("backend") == "ssh":
            continue
        why = _local_refusal(e, run)
        if why:
            rep.refused.append(why)
        else:
            local.append(e)
    # processes first (a daemon outside our namespaces would survive namespace deletion)
    for e in local:
        if e["kind"] == "process":
            what, why = _kill(e)
            if why:
                rep.refused.append(why)
            elif what and process_alive(e["pid"], e["start"]):
                rep.problems.append(f"{what} still runs {KILL_WAIT_S:g} s after SIGKILL")
            elif what:
                rep.removed.append(what)
    for e in local:
        if e["kind"] == "netns" and netns_exists(e["name"]):
            probs = destroy_netns(e["name"])
            (rep.problems if probs else rep.removed).extend(probs or [f"netns {e['name']}"])
        elif e["kind"] == "path":
            p = Path(e["path"])
            existed = os.path.lexists(p)
            prob = _remove_file(p)
            if prob:
                rep.problems.append(prob)
            elif existed:
                rep.removed.append(f"file {p}")
        elif e["kind"] == "link":
            r = subprocess.run(
                ["ip", "-n", e["netns"], "link", "del", e["name"]], capture_output=True, text=True
            )
            if r.returncode == 0:
                rep.removed.append(f"interface {e['name']} in {e['netns']}")
        elif (undo := undo_handler(e["kind"])) is not None:
            if e.get("netns") and not netns_exists(e["netns"]):
                continue  # went with its namespace
            what = undo(_host_of(e), e)
            if what:
                rep.removed.append(what)
    for sweep in sweeps():  # what the run's folder still holds that must go with it (its secret files)
        try:
            rep.removed += sweep(run.run_dir)
        except Exception as ex:
            rep.problems.append(f"run {run.run_id}: sweeping its folder {run.run_dir}: {ex}")
    if not rep.problems and not rep.skipped:
        with contextlib.suppress(OSError), open(run.run_dir / "journal.jsonl", "a") as f:
            f.write('{"kind": "end", "by": "clean"}\n')
        if run.registered:  # the registration and the journal copy (never a registry not believed)
            for reg in registry_files(run.run_id):
                reg.unlink(missing_ok=True)
    return rep


def clean_all(force: bool = False, inventory: Inventory | None = None) -> CleanReport:
    total = CleanReport()
    known_ns: set[str] = set()
    for run in registered_runs():
        if not run.registered:  # what it names (its run folder included) is not read
            total.skipped.append(
                f"run {run.run_id}: its registration is not believed ({run.distrust}): nothing of it is "
                "undone; check it and remove it by hand"
            )
            continue
        known_ns |= {str(e.get("name")) for e in run.entries if e["kind"] == "netns"}
        if run.owner_alive() and not force:
            total.skipped.append(
                f"run {run.run_id} is still running (pid {run.owner_pid}); use --force to clean it"
            )
            continue
        r = clean_run(run, inventory)
        total.removed += r.removed
        total.problems += r.problems
        total.skipped += r.skipped + [f"left alone: {x}" for x in r.refused]
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(TAG_PREFIX) and "-" in name and name not in known_ns and netns_exists(name):
            total.unknown.append(name)
    return total
