"""One namespace lab at a time per machine. Two runs at once would pin the same CPUs, set the same host
sysctls, share the impairment engine's queues and each measure the other's traffic: a run, `up`, `calibrate`,
`bench-engine`, `nat-matrix` and `mesh-scale` each hold an exclusive flock on /run/tunnelbench.lock while their
lab exists. The kernel drops the lock when its holder ends however it ends (SIGKILL too), so a crash never
leaves a stale lock; the file names the holder so the one refused can say who."""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path
from types import TracebackType

from tunnelbench.lab import journal


class LabBusy(RuntimeError):
    """Another process holds the lab; the message names it and what to do."""


def lock_path() -> Path:
    """Beside the registry, not in it (/run/tunnelbench.lock): the registry holds run registrations only, which
    `clean` reads one by one. Read at call time: tests point REGISTRY at a private folder."""
    return journal.REGISTRY.with_name(journal.REGISTRY.name + ".lock")


class LabLock:
    def __init__(self, what: str, run_id: str = "", run_dir: Path | None = None) -> None:
        self.what, self.run_id, self.run_dir = what, run_id, run_dir
        self.fd: int | None = None

    def acquire(self) -> LabLock:
        path = lock_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise LabBusy(_busy_text(holder, path)) from None
        os.ftruncate(fd, 0)
        info = {
            "pid": os.getpid(),
            "what": self.what,
            "run_id": self.run_id,
            "run_dir": str(self.run_dir or ""),
            "argv": sys.argv,
            "since": time.time(),
        }
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self.fd = fd
        return self

    def describe(self, run_id: str, run_dir: Path) -> None:
        """Name the run once it has an id (the lock is taken before anything of the run exists)."""
        if self.fd is not None:
            self.run_id, self.run_dir = run_id, run_dir
            info = _read(self.fd) | {"run_id": run_id, "run_dir": str(run_dir)}
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, (json.dumps(info) + "\n").encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)  # the next holder writes its own line; an idle file names nobody
            os.close(self.fd)  # closing the only descriptor drops the flock
            self.fd = None

    def __enter__(self) -> LabLock:
        return self.acquire()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _read(fd: int) -> dict[str, object]:
    try:
        data = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        got = json.loads(data) if data else {}
        return got if isinstance(got, dict) else {}
    except (OSError, ValueError):
        return {}


def _busy_text(h: dict[str, object], path: Path) -> str:
    if not h:
        return (
            f"the lab is busy: another tunnelbench process holds {path}; wait for it to end, then run again"
        )
    since = time.strftime("%H:%M:%S", time.localtime(float(str(h.get("since") or 0))))
    run = (
        f" (run {h['run_id']}" + (f" in {h['run_dir']})" if h.get("run_dir") else ")")
        if h.get("run_id")
        else ""
    )
    stop = (
        "`tunnelbench down`" if h.get("what") == "up" else f"Ctrl-C in its terminal or `kill {h.get('pid')}`"
    )
    return (
        f"the lab is busy: `tunnelbench {h.get('what')}`{run}, pid {h.get('pid')}, holds it since {since}. "
        f"One lab at a time per machine (two would share CPUs, sysctls and each other's traffic): wait for it "
        f"to end or stop it ({stop}), then run again"
    )
