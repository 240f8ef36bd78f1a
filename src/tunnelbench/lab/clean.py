"""`tunnelbench clean`: undo what crashed or SIGKILLed runs left behind, using their journals only.

The lab's own kinds (processes, namespaces, files, links) are undone here; kinds other rooms journal are
undone by the handler they registered (lab/journal.py `register_undo`), on this machine or in the entry's
namespace. Entries made on SSH hosts are undone there (lab/ssh_undo.py), through the same registry."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunnelbench.lab.host import THIS_MACHINE, Host
from tunnelbench.lab.journal import Leftovers, registered_runs, registry_files, undo_handler
from tunnelbench.lab.journaling import process_alive
from tunnelbench.lab.netns import NetnsHost, destroy_netns, netns_exists
from tunnelbench.lab.tags import TAG_PREFIX

if TYPE_CHECKING:
    from tunnelbench.lab.inventory import Inventory

KILL_WAIT_S = 5.0  # how long an undo waits for a SIGKILLed process to be gone before calling it a problem


@dataclass
class CleanReport:
    removed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # look like ours but are in no journal: not touched


def _host_of(entry: dict[str, Any]) -> Host:
    if entry.get("netns"):
        return NetnsHost("local", entry["netns"], "", Path("/"), None)
    return THIS_MACHINE


def _kill(entry: dict[str, Any]) -> str | None:
    pid, start = entry["pid"], entry.get("start")
    if not process_alive(pid, start):
        return None  # gone, or the PID was reused by an unrelated process: not ours
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    # SIGKILL is asynchronous: a many-threaded daemon takes a moment to exit, and callers verify right after
    end = time.monotonic() + KILL_WAIT_S
    while process_alive(pid, start) and time.monotonic() < end:
        time.sleep(0.02)
    return f"process {pid} ({' '.join(entry.get('argv', [])[:3])})"


def clean_run(run: Leftovers, inventory: Inventory | None = None) -> CleanReport:
    rep = CleanReport()
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

            undone = clean_ssh_entries(remote, inventory)
            rep.removed += undone.removed
            rep.problems += undone.problems
        run = Leftovers(
            run.run_id,
            run.run_dir,
            run.owner_pid,
            run.owner_start,
            [e for e in run.entries if e.get("backend") != "ssh"],
        )
    # processes first (a daemon outside our namespaces would survive namespace deletion)
    for e in run.entries:
        if e["kind"] == "process":
            what = _kill(e)
            if what and process_alive(e["pid"], e.get("start")):
                rep.problems.append(f"{what} still runs {KILL_WAIT_S:g} s after SIGKILL")
            elif what:
                rep.removed.append(what)
    for e in run.entries:
        if e["kind"] == "netns" and netns_exists(e["name"]):
            probs = destroy_netns(e["name"])
            (rep.problems if probs else rep.removed).extend(probs or [f"netns {e['name']}"])
        elif e["kind"] == "path":
            p = Path(e["path"])
            if p.exists() or p.is_symlink():
                p.unlink()
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
    if not rep.problems and not rep.skipped:
        with contextlib.suppress(OSError), open(run.run_dir / "journal.jsonl", "a") as f:
            f.write('{"kind": "end", "by": "clean"}\n')
        for reg in registry_files(run.run_id):  # the registration and the journal copy
            reg.unlink(missing_ok=True)
    return rep


def clean_all(force: bool = False, inventory: Inventory | None = None) -> CleanReport:
    total = CleanReport()
    known_ns: set[str] = set()
    for run in registered_runs():
        known_ns |= {e["name"] for e in run.entries if e["kind"] == "netns"}
        if run.owner_alive() and not force:
            total.skipped.append(
                f"run {run.run_id} is still running (pid {run.owner_pid}); use --force to clean it"
            )
            continue
        r = clean_run(run, inventory)
        total.removed += r.removed
        total.problems += r.problems
        total.skipped += r.skipped
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(TAG_PREFIX) and "-" in name and name not in known_ns and netns_exists(name):
            total.unknown.append(name)
    return total
