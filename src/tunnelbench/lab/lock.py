"""Who may use what at once, each lock naming its holder so the one refused (or kept waiting) can say who.

- The lab (`LabLock`): one namespace lab at a time per machine. Two runs at once would pin the same CPUs, set
  the same host sysctls, share the impairment engine's queues and each measure the other's traffic: a run
  (from before its first-use builds), `up`, `calibrate`, `bench-engine`, `nat-matrix` and `mesh-scale` each
  hold an exclusive flock on /run/tunnelbench.lock while their lab exists; `plan` probes the kernel under it.
- The build cache (`BuildLock`, its file in the cache folder): `install` and a run's first-use builds write it;
  a second waits, saying for whom.
- A run folder (`RunLock`): one process per run, so a run and its `--resume`, or two resumes, never write one
  store and journal at once; refused, naming the holder.
- An SSH host's work folder root: a lock folder naming the run and the controller that drives the host
  (lab/ssh_host.py takes it; `controller` and `holder_gone` here say who that is and whether it still runs).

A flock is dropped by the kernel when its holder ends however it ends (SIGKILL too), so a crash never leaves a
stale local lock."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tunnelbench.lab import journal
from tunnelbench.lab.procstat import read_stat


class LabBusy(RuntimeError):
    """Another process holds the lock; the message names it and what to do."""


def lock_path() -> Path:
    """Beside the registry, not in it (/run/tunnelbench.lock): the registry holds run registrations only, which
    `clean` reads one by one. Read at call time: tests point REGISTRY at a private folder."""
    return journal.REGISTRY.with_name(journal.REGISTRY.name + ".lock")


def _since(h: dict[str, Any]) -> str:
    return time.strftime("%H:%M:%S", time.localtime(float(str(h.get("since") or 0))))


def _command(h: dict[str, Any]) -> str:
    """The holder's command line as typed (its argv[0] is a path: python's module runner, or the script)."""
    argv = h.get("argv") or []
    return "tunnelbench " + " ".join(str(a) for a in argv[1:]) if argv else f"tunnelbench {h.get('what')}"


def _stop(h: dict[str, Any]) -> str:
    return (
        "`tunnelbench down`" if h.get("what") == "up" else f"Ctrl-C in its terminal or `kill {h.get('pid')}`"
    )


class HeldLock:
    """An exclusive flock on `path`, whose file names the holder (pid, command, run) while it is held."""

    def __init__(self, path: Path, what: str, run_id: str = "", run_dir: Path | None = None) -> None:
        self.path, self.what, self.run_id, self.run_dir = path, what, run_id, run_dir
        self.fd: int | None = None

    def busy_text(self, holder: dict[str, Any]) -> str:
        raise NotImplementedError

    def acquire(self, wait: Callable[[str], None] | None = None) -> Self:
        """Take the lock; held by another: LabBusy naming it, or with `wait`, say so through it and block
        until the holder ends."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = self.busy_text(_read(fd))
            if wait is None:
                os.close(fd)
                raise LabBusy(text) from None
            wait(text)
            fcntl.flock(fd, fcntl.LOCK_EX)
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

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class LabLock(HeldLock):
    def __init__(self, what: str, run_id: str = "", run_dir: Path | None = None) -> None:
        super().__init__(lock_path(), what, run_id, run_dir)

    def acquire(self, wait: Callable[[str], None] | None = None) -> Self:
        self.path = lock_path()  # read at call time (tests point REGISTRY elsewhere)
        return super().acquire(wait)

    def busy_text(self, h: dict[str, Any]) -> str:
        if not h:
            return (
                f"the lab is busy: another tunnelbench process holds {self.path}; wait for it to end, then run "
                "again"
            )
        run = (
            f" (run {h['run_id']}" + (f" in {h['run_dir']})" if h.get("run_dir") else ")")
            if h.get("run_id")
            else ""
        )
        return (
            f"the lab is busy: `tunnelbench {h.get('what')}`{run}, pid {h.get('pid')}, holds it since {_since(h)}. "
            f"One lab at a time per machine (two would share CPUs, sysctls and each other's traffic): wait for "
            f"it to end or stop it ({_stop(h)}), then run again"
        )


class BuildLock(HeldLock):
    """The build cache `folder` (its lock file inside it): one writer at a time."""

    def __init__(self, folder: Path, what: str) -> None:
        super().__init__(folder / "build.lock", what)

    def busy_text(self, h: dict[str, Any]) -> str:
        who = f"`{_command(h)}`, pid {h.get('pid')}, since {_since(h)}" if h else "another process"
        return (
            f"the build cache {self.path.parent} is being written by {who}: waiting for it to end (two "
            f"builds into one cache folder would mix their files; {_stop(h)} stops it)"
        )


class RunLock(HeldLock):
    """A run folder (run.lock in it): one process runs or resumes it at a time."""

    def __init__(self, run_dir: Path, what: str = "run") -> None:
        super().__init__(run_dir / "run.lock", what, run_dir.name, run_dir)

    def busy_text(self, h: dict[str, Any]) -> str:
        who = f"`{_command(h)}`, pid {h.get('pid')}, since {_since(h)}" if h else "another process"
        return (
            f"run {self.run_id} is in use: {who} runs it in {self.run_dir}. One process per run (two would write "
            f"one store and journal and drive the same hosts): wait for it to end or stop it ({_stop(h)}), then "
            f"`tunnelbench run --resume {self.run_id}`"
        )


def _read(fd: int) -> dict[str, Any]:
    try:
        data = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        got = json.loads(data) if data else {}
        return got if isinstance(got, dict) else {}
    except (OSError, ValueError):
        return {}


# -- the controller: who drives an SSH host ----------------------------------------------------------------
def _first_line(path: str) -> str:
    try:
        return Path(path).read_text().strip().splitlines()[0]
    except (OSError, IndexError):
        return ""


def controller(run_id: str) -> dict[str, Any]:
    """This process as an SSH host's lock names it: the run, this machine (its name, machine and boot id) and
    this process (PID and start time: a reused PID is not the holder)."""
    st = read_stat(os.getpid())
    return {
        "run_id": run_id,
        "controller": socket.gethostname(),
        "machine_id": _first_line("/etc/machine-id"),
        "boot_id": _first_line("/proc/sys/kernel/random/boot_id"),
        "pid": os.getpid(),
        "start": st.starttime if st else None,
        "since": time.time(),
    }


def holder_gone(holder: dict[str, Any]) -> bool:
    """True when the holder is known to have ended: it ran on this machine, since its last boot, and its PID
    is gone or is another process now. A holder on another controller (or one whose record says too little)
    is never judged gone from here."""
    me = controller("")
    if not holder.get("machine_id") or holder.get("machine_id") != me["machine_id"]:
        return False
    if holder.get("boot_id") != me["boot_id"]:
        return True  # this machine restarted since: every process of then has ended
    try:
        st = read_stat(int(holder["pid"]))
    except (KeyError, TypeError, ValueError):
        return False
    return (
        st is None or st.state == "Z" or (holder.get("start") is not None and st.starttime != holder["start"])
    )


def holder_text(holder: dict[str, Any]) -> str:
    """An SSH host lock's holder in words."""
    if not holder:
        return "a run whose lock names nobody (being taken, or written by hand)"
    return (
        f"run {holder.get('run_id')} from {holder.get('controller')} (pid {holder.get('pid')}), since "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(float(str(holder.get('since') or 0))))}"
    )
