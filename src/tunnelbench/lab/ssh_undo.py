"""Undo on SSH hosts, for a run's teardown and for `tunnelbench clean --inventory F`: what the run journaled
on each host, with the host's name and address, and nothing else:

  {"kind": "remote_dir", "backend": "ssh", "host": "h1", "address": ..., "path": ...}
  {"kind": "process", "backend": "ssh", "host": "h1", "address": ..., "pid": ..., "start": ..., "argv": [...]}
  {"kind": "link_prefix", "backend": "ssh", "host": "h1", "address": ..., "prefix": "<tag>"}  interfaces
  {"kind": "nft_table", "backend": "ssh", "host": "router", "address": ..., "family": "inet", "name": ...}
  {"kind": "path", "backend": "ssh", "host": "h1", "address": ..., "path": ...}   e.g. a UAPI socket

Kinds other rooms journal on a host (impair/: "qdisc", "iptables_chain") are undone by the handlers they
register (lab/journal.py `register_undo`)."""

from __future__ import annotations

import re
import signal as _signal
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from tunnelbench.lab.host import CommandError
from tunnelbench.lab.inventory import Inventory, InvHost
from tunnelbench.lab.journal import Journal, undo_handler
from tunnelbench.lab.ssh_host import SshHost, kill_script, remote_alive
from tunnelbench.lab.ssh_transport import SshError
from tunnelbench.lab.tags import TAG_PREFIX


# -- undo (teardown and clean) -------------------------------------------------------------------------
@dataclass
class UndoReport:
    removed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _safe_workdir(path: str) -> bool:
    """Only <root>/<run_id>/<host> folders tunnelbench made are ever removed."""
    p = PurePosixPath(path)
    return (
        p.is_absolute()
        and ".." not in p.parts
        and len(p.parts) >= 4
        and re.fullmatch(r"\d{8}-\d{6}-" + TAG_PREFIX + r"[0-9a-f]+", p.parent.name) is not None
    )


def undo_entries(h: SshHost, entries: list[dict[str, Any]], journal: Journal | None = None) -> UndoReport:
    """Undo journal entries on one host, processes first. Only what the entries name is touched."""
    rep = UndoReport()

    def done(e: dict[str, Any], what: str | None) -> None:
        if what:
            rep.removed.append(f"{h.name} ({h.address}): {what}")
        if journal is not None:
            journal.release(e)

    procs = [e for e in entries if e["kind"] == "process"]
    for e in procs:
        if remote_alive(h, e["pid"], e.get("start")):
            h.run(["sh", "-c", kill_script(e["pid"], e.get("start"), int(_signal.SIGTERM))], check=False)
    deadline = time.monotonic() + 3
    for e in procs:
        while remote_alive(h, e["pid"], e.get("start")) and time.monotonic() < deadline:
            time.sleep(0.1)
        what = None
        if remote_alive(h, e["pid"], e.get("start")):
            h.run(["sh", "-c", kill_script(e["pid"], e.get("start"), int(_signal.SIGKILL))], check=False)
            time.sleep(0.1)
            what = f"process {e['pid']} ({' '.join(e.get('argv', [])[:3])})"
        if remote_alive(h, e["pid"], e.get("start")):
            rep.problems.append(f"{h.name}: process {e['pid']} survived SIGKILL")
            continue
        done(e, what)
    for e in entries:
        kind = e["kind"]
        if kind == "link_prefix":
            prefix = e["prefix"]
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
    for e in entries:
        if e["kind"] == "remote_dir":
            path = e["path"]
            if not _safe_workdir(path):
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


def clean_ssh_entries(
    entries: list[dict[str, Any]], inventory: Inventory, journal_path: Path | None = None
) -> UndoReport:
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
            r = undo_entries(h, ents)
            rep.removed += r.removed
            rep.problems += r.problems
        except (SshError, CommandError, TimeoutError, OSError) as e:
            rep.problems.append(f"{name} ({address}): {e}")
        finally:
            h.close()
    return rep


def _find_inv(inventory: Inventory, address: str, port: int | None) -> list[InvHost]:
    """The inventory hosts a journal entry was made on: same address and SSH port (two hosts behind one
    NAT address differ by port; journals without a port match by address alone)."""
    return [i for i in inventory.hosts.values() if i.address == address and port in (None, i.port)]
