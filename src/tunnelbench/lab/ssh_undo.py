"""Undo on SSH hosts, for a run's teardown and for `tunnelbench clean --inventory F`: what the run journaled
on each host, with the host's name and address, and nothing else:

  {"kind": "remote_dir", "backend": "ssh", "host": "h1", "address": ..., "path": ...}
  {"kind": "process", "backend": "ssh", "host": "h1", "address": ..., "pid": ..., "start": ..., "argv": [...]}
  {"kind": "link_prefix", "backend": "ssh", "host": "h1", "address": ..., "prefix": "<tag>"}  interfaces
  {"kind": "nft_table", "backend": "ssh", "host": "router", "address": ..., "family": "inet", "name": ...}
  {"kind": "path", "backend": "ssh", "host": "h1", "address": ..., "path": ...}   e.g. a UAPI socket

Kinds other rooms journal on a host (impair/: "qdisc", "iptables_chain") are undone by the handlers they
register (lab/journal.py `register_undo`). Every entry first passes the rules all undos share (lab/journal.py
`refusal`: a process with its start time, and here its command line read on the host; names carrying the run's
tag, never an empty prefix; paths inside the run's host folder or the lab's known places); a host folder must be
<root>/<this run's id>/<host>. What fails them is reported (`refused`) and left alone."""

from __future__ import annotations

import signal as _signal
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from tunnelbench.lab.host import CommandError
from tunnelbench.lab.inventory import Inventory, InvHost
from tunnelbench.lab.journal import Journal, describe, refusal, undo_handler
from tunnelbench.lab.journaling import parse_cmdline, same_command
from tunnelbench.lab.ssh_host import SshHost, kill_script, remote_alive
from tunnelbench.lab.ssh_transport import SshError
from tunnelbench.lab.tags import RUN_ID


# -- undo (teardown and clean) -------------------------------------------------------------------------
@dataclass
class UndoReport:
    removed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # named by the journal but not the run's: left alone


def _safe_workdir(path: str, run_id: str) -> bool:
    """Only the <root>/<run_id>/<host> folders tunnelbench made for this run are ever removed."""
    p = PurePosixPath(path)
    return (
        p.is_absolute()
        and ".." not in p.parts
        and len(p.parts) >= 4
        and RUN_ID.fullmatch(p.parent.name) is not None
        and p.parent.name == run_id
    )


def remote_cmdline(h: SshHost, pid: int) -> list[str]:
    """A process's command line on the host, read as hex (NUL separators survive any transport)."""
    r = h.run(["od", "-An", "-v", "-tx1", f"/proc/{pid}/cmdline"], check=False)
    try:
        raw = bytes.fromhex("".join(r.stdout.split()))
    except ValueError:
        return []
    return parse_cmdline(raw) if r.returncode == 0 else []


def undo_entries(
    h: SshHost, entries: list[dict[str, Any]], journal: Journal | None = None, run_id: str | None = None
) -> UndoReport:
    """Undo journal entries of run `run_id` (the journal's run without it) on one host, processes first. Only
    what the entries name, and only what the rules allow, is touched."""
    rid = run_id or (journal.run_id if journal is not None else None)
    if rid is None:
        raise ValueError("undo_entries needs the run id (or its journal) to tell the run's things")
    rep = UndoReport()

    def done(e: dict[str, Any], what: str | None) -> None:
        if what:
            rep.removed.append(f"{h.name} ({h.address}): {what}")
        if journal is not None:
            journal.release(e)

    own = [
        e["path"] for e in entries if e.get("kind") == "remote_dir" and _safe_workdir(str(e.get("path")), rid)
    ]
    allowed = []
    for e in entries:
        why = refusal(e, rid, own)
        if why:
            rep.refused.append(f"{h.name} ({h.address}): {why}")
        else:
            allowed.append(e)
    procs = []
    for e in [x for x in allowed if x["kind"] == "process"]:
        if not remote_alive(h, e["pid"], e["start"]):
            done(e, None)  # gone, or its PID reused by another process
            continue
        cmdline = remote_cmdline(h, e["pid"])
        if not same_command(cmdline, list(e.get("argv") or [])):
            rep.refused.append(
                f"{h.name} ({h.address}): {describe(e)}: its start time matches but it runs "
                f"{' '.join(cmdline)[:120]!r}"
            )
            continue
        procs.append(e)
        h.run(["sh", "-c", kill_script(e["pid"], e["start"], int(_signal.SIGTERM))], check=False)
    deadline = time.monotonic() + 3
    for e in procs:
        while remote_alive(h, e["pid"], e["start"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        what = None
        if remote_alive(h, e["pid"], e["start"]):
            h.run(["sh", "-c", kill_script(e["pid"], e["start"], int(_signal.SIGKILL))], check=False)
            time.sleep(0.1)
            what = f"process {e['pid']} ({' '.join(e.get('argv', [])[:3])})"
        if remote_alive(h, e["pid"], e["start"]):
            rep.problems.append(f"{h.name}: process {e['pid']} survived SIGKILL")
            continue
        done(e, what)
    for e in allowed:
        kind = e["kind"]
        if kind == "link_prefix":
            prefix = e["prefix"]  # carries the run's tag (refusal): never empty
            links = h.run(["ip", "-o", "link", "show"], check=False).stdout
            for line in links.splitlines():
                if ":" not in line:
                    continue
                name = line.split(":")[1].strip().split("@")[0]
                if name.startswith(prefix):
                    r = h.run(["ip", "link", "del", name], check=False)
                    (rep.removed if r.returncode == 0 else rep.problems).append(
                        f"{h.name}: interface {name}" + ("" if r.returncode == 0 else f": {r.stderr.strip()}")
                    )
            if journal is not None:
                journal.release(e)
        elif kind == "nft_table":
            r = h.run(["nft", "delete", "table", e.get("family", "inet"), e["name"]], check=False)
            done(e, f"nft table {e['name']}" if r.returncode == 0 else None)
        elif kind == "path":
            if h.exists(Path(e["path"])):
                h.remove(Path(e["path"]))
                done(e, f"file {e['path']}")
            else:
                done(e, None)
        elif (undo := undo_handler(kind)) is not None:  # kinds other rooms journal (impair/: qdiscs, chains)
            done(e, undo(h, e))
    for e in allowed:
        if e["kind"] == "remote_dir":
            path = e["path"]
            if not _safe_workdir(path, rid):
                rep.problems.append(f"{h.name}: refusing to remove unexpected path {path!r}")
                continue
            existed = h.exists(Path(path))
            h.run(["rm", "-rf", "--", path], check=False)
            # the run folder above the host folder goes too once it is empty
            h.run(["rmdir", "--", str(PurePosixPath(path).parent)], check=False)
            if h.exists(Path(path)):
                rep.problems.append(f"{h.name}: could not remove {path}")
            else:
                done(e, f"folder {path}" if existed else None)
    return rep


def clean_ssh_entries(entries: list[dict[str, Any]], inventory: Inventory, run_id: str) -> UndoReport:
    """`clean --inventory`: undo a killed run's SSH entries, host by host (matched by name and address)."""
    rep = UndoReport()
    by_host: dict[tuple[str, str, int | None], list[dict[str, Any]]] = {}
    for e in entries:
        if e.get("backend") == "ssh":
            by_host.setdefault((e["host"], e["address"], e.get("port")), []).append(e)
    for (name, address, port), ents in by_host.items():
        found = _find_inv(inventory, address, port)
        if len(found) != 1:
            why = "not in" if not found else "ambiguous (several hosts share the address) in"
            rep.problems.append(
                f"{name} ({address}:{port or '?'}): {why} inventory {inventory.path}; cannot clean it"
            )
            continue
        inv = found[0]
        h = SshHost(name, inv, None, None)
        try:
            h.connect()
            r = undo_entries(h, ents, run_id=run_id)
            rep.removed += r.removed
            rep.problems += r.problems
            rep.refused += r.refused
        except (SshError, CommandError, TimeoutError, OSError) as e:
            rep.problems.append(f"{name} ({address}): {e}")
        finally:
            h.close()
    return rep


def _find_inv(inventory: Inventory, address: str, port: int | None) -> list[InvHost]:
    """The inventory hosts a journal entry was made on: same address and SSH port (two hosts behind one
    NAT address differ by port; journals without a port match by address alone)."""
    return [i for i in inventory.hosts.values() if i.address == address and port in (None, i.port)]
