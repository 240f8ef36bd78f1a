"""Hosts: where commands run and daemons live. The namespace lab (lab/netns.py) and the SSH lab (lab/ssh_lab.py, its hosts in lab/ssh_host.py)
implement the same API."""

from __future__ import annotations

import contextlib
import os
import platform
import shlex
import shutil
import signal
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tunnelbench.lab.journaling import HostJournaling, process_alive

# where Debian packages put binaries: a binary that a system-package source declares is looked up here only
DEBIAN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class BinarySource(Protocol):
    """Where binaries come from (vpns/install.py's Apt, GoModule, Crate), as `Host.binary` reads it."""

    @property
    def binaries(self) -> tuple[str, ...]: ...

    def bin_dir(self) -> Path | None:
        """The registry build's cache folder; None for a system package (found on DEBIAN_PATH)."""

    @property
    def libexec(self) -> tuple[str, ...]:
        """Folders off PATH where a system package keeps a daemon (strongSwan's charon in /usr/lib/ipsec)."""


def find_binary(name: str, installs: Sequence[BinarySource] = ()) -> str | None:
    """Absolute path of a binary on this machine, else None. A registry source that declares it: its cache
    build only (a pinned version never silently becomes whatever PATH has); a system-package source: Debian's
    folders and its libexec folders; a binary no source declares: PATH."""
    for s in installs:
        if name not in s.binaries:
            continue
        d = s.bin_dir()
        if d is None:
            return shutil.which(name, path=":".join((*s.libexec, DEBIAN_PATH)))
        return str(d / name) if (d / name).is_file() else None
    return shutil.which(name)


class _CpuTimes(Protocol):
    @property
    def user(self) -> float: ...
    @property
    def system(self) -> float: ...


class _MemInfo(Protocol):
    @property
    def rss(self) -> int: ...


class PsProcess(
    Protocol
):  # the part of psutil.Process the monitor uses: psutil's, or lab.ssh_host.RemoteProc
    @property
    def pid(self) -> int: ...
    def cpu_times(self) -> _CpuTimes: ...
    def memory_info(self) -> _MemInfo: ...


class _Killable(Protocol):  # a Popen, or the SSH lab's handle on a remote command
    def kill(self) -> None: ...


# short-lived commands in flight, so a watchdog can abort a case whose path broke (e.g. the impairment
# engine died and iperf3 would otherwise wait for its timeout)
_RUNNING: set[_Killable] = set()
_RUNNING_LOCK = threading.Lock()


def abort_running() -> int:
    """Kill every command started through Host.run that is still running; returns how many."""
    with _RUNNING_LOCK:
        procs = list(_RUNNING)
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
    return len(procs)


class CommandError(RuntimeError):
    def __init__(self, host: str, argv: Sequence[str], returncode: int | None, output: str):
        self.host, self.argv, self.returncode, self.output = host, list(argv), returncode, output
        what = "timed out" if returncode is None else f"exited {returncode}"
        tail = output.strip()[-600:]
        super().__init__(f"[{host}] `{shlex.join(argv)}` {what}: {tail}")


@dataclass
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    stdout_bytes: bytes | None = field(default=None, repr=False)  # the SSH lab's run(binary=True)


@dataclass
class Process:
    """A long-running process we started on a host, recorded in the journal."""

    host: Host
    label: str
    argv: list[str]
    pid: int
    log_path: Path | None
    popen: subprocess.Popen[bytes] | None = None
    journal_entry: dict[str, Any] | None = None
    _exit: int | None = field(default=None, repr=False)

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return self.host.pid_alive(self.pid)

    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def wait(self, timeout: float) -> int | None:
        if self.popen is None:
            end = time.monotonic() + timeout
            while time.monotonic() < end and self.alive():
                time.sleep(0.02)
            return None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float = 5.0) -> bool:
        """SIGTERM, then SIGKILL after `grace` seconds; True when the process is gone, and only then is its
        journal entry released: one that survives SIGKILL (stuck in the kernel) stays in the journal, so
        teardown's leftover check names it and `tunnelbench clean` still finds it."""
        if self.alive():
            self.host.signal(self.pid, signal.SIGTERM)
            if self.wait(grace) is None and self.alive():
                self.host.signal(self.pid, signal.SIGKILL)
                self.wait(5)
            if self.alive():
                return False
        if self.journal_entry is not None and self.host.journal is not None:
            self.host.journal.release(self.journal_entry)
            self.journal_entry = None
        return True

    def log_tail(self, chars: int = 2000) -> str:
        return self.log_text()[-chars:]

    def log_text(self) -> str:
        """The whole log so far, where the process writes it (an SSH process: on its host, read over SSH)."""
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def copy_log(self, dest: Path) -> bool:
        """Copy the process's log to a local file (an SSH process fetches it from its host)."""
        if self.log_path is None or not self.log_path.exists():
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.log_path, dest)
        return True


class Host(ABC):
    """A machine (or namespace) that runs commands. Everything above the lab talks to hosts only here."""

    name: str
    underlay_ip: str  # the host's own address (private when behind NAT)
    underlay_if: str  # the interface to the underlay (set by each lab's hosts)
    journal: HostJournaling | None
    workdir: Path  # per-host folder for configs, keys and logs
    remote = False  # True: workdir, PIDs and files live on another machine (the SSH lab)
    preexisting_links: frozenset[str] = frozenset()  # interfaces the host had before the run (not ours)
    behind_nat = False  # lab path "nat": the host is reachable only through its NAT, at public_ip
    cpus: str | None = None  # CPU list every command on this host is confined to (cpu placement); None = any

    @property
    def public_ip(self) -> str:
        """Where other hosts reach this one: underlay_ip, or its NAT's address when behind NAT."""
        return self.__dict__.get("public_ip") or self.underlay_ip

    @public_ip.setter
    def public_ip(self, value: str) -> None:
        self.__dict__["public_ip"] = value

    @abstractmethod
    def argv(self, argv: Sequence[str]) -> list[str]:
        """The local argv that runs `argv` on this host."""

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 30.0,
        check: bool = True,
        input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Result:
        t0 = time.monotonic()
        full_env = None if env is None else {**os.environ, **env}
        popen = subprocess.Popen(
            self.argv(argv),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
        )
        with _RUNNING_LOCK:
            _RUNNING.add(popen)
        try:
            stdout, stderr = popen.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            try:
                stdout, _ = popen.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                # a grandchild the command left behind still holds its stdout open: reading to EOF would
                # wait as long as that process lives (an unbounded hang), so give up on the rest of the output
                stdout = ""
                for pipe in (popen.stdout, popen.stderr, popen.stdin):
                    if pipe:
                        pipe.close()
                popen.wait(timeout=5)
            raise CommandError(self.name, argv, None, stdout or "") from None
        except BaseException:  # Ctrl-C or an abort: never leave the child behind
            popen.kill()
            popen.wait()
            raise
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(popen)
        p = subprocess.CompletedProcess(popen.args, popen.returncode, stdout, stderr)
        res = Result(list(argv), p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
        if check and p.returncode != 0:
            raise CommandError(self.name, argv, p.returncode, p.stdout + p.stderr)
        return res

    def spawn(
        self,
        argv: Sequence[str],
        *,
        label: str,
        log_path: Path | None,
        env: dict[str, str] | None = None,
        stdin_devnull: bool = True,
    ) -> Process:
        """Start a long-running process; stdout+stderr go to log_path. Recorded in the journal."""
        if log_path:
            log_path.parent.mkdir(parents=True, exist_ok=True)
        # 0600: a daemon's log may hold its secrets (EasyTier logs its network secret)
        log = (
            os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
            if log_path
            else subprocess.DEVNULL
        )
        full_env = None if env is None else {**os.environ, **env}
        try:
            popen = subprocess.Popen(
                self.argv(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL if stdin_devnull else None,
                env=full_env,
                start_new_session=True,  # Ctrl-C reaches the runner only; teardown stops daemons in order
            )
        finally:
            if not isinstance(log, int):  # subprocess.DEVNULL without a log file
                log.close()
        entry = self.journal.process(popen.pid, list(argv), self.name) if self.journal else None
        return Process(self, label, list(argv), popen.pid, log_path, popen, entry)

    def pid_alive(self, pid: int) -> bool:
        return process_alive(pid, None)

    def signal(self, pid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    def write_file(self, path: Path, data: str | bytes, mode: int = 0o644) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # create with the final mode so a private key is never world-readable, not even briefly
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(path, mode)

    def read_file(self, path: Path) -> bytes:
        return path.read_bytes()

    def exists(self, path: Path) -> bool:
        return path.exists() or path.is_symlink()

    def remove(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def mkdir(self, path: Path, mode: int = 0o755) -> None:
        path.mkdir(parents=True, exist_ok=True, mode=mode)

    def binary(self, name: str, installs: Sequence[BinarySource] = ()) -> str:
        """The binary `name` as this host runs it: the absolute path `find_binary` gives, or the bare name
        when the host has none (then `binary(...) == name` says it is missing, and a spawn fails naming it).
        Every driver resolves its binaries here, with its `installs`: namespaces share this machine's files."""
        return find_binary(name, installs) or name

    def clock_offset(self) -> float:
        """This host's wall clock minus this machine's, in seconds: 0 for a namespace (one kernel, one clock);
        a remote host's is estimated (SshHost), so the wall-clock stamps its tools print (ping -D) can be set
        against this machine's time.time()."""
        return 0.0

    def which(self, tools: Iterable[str]) -> dict[str, str | None]:
        """Each tool's path on the host's own PATH (None: missing): remote hosts only (SshHost)."""
        raise NotImplementedError(f"{type(self).__name__}.which: look tools up here with shutil.which")

    def ps_process(self, pid: int) -> PsProcess:
        """A psutil-like handle (cpu_times, memory_info) for the monitor."""
        import psutil

        return psutil.Process(pid)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.underlay_ip}>"


class ThisMachine(Host):
    """This machine outside any namespace: where version checks ask a binary for its version and where `clean`
    undoes an entry made outside any namespace."""

    name = "local"
    underlay_ip = ""
    underlay_if = ""
    journal = None
    workdir = Path("/")

    def argv(self, argv: Sequence[str]) -> list[str]:
        return list(argv)


THIS_MACHINE = ThisMachine()


def host_arch(host: Host) -> str:
    """The host's `uname -m` (asked once per host)."""
    if "_tb_arch" not in host.__dict__:
        host.__dict__["_tb_arch"] = host.run(["uname", "-m"]).stdout.strip()
    return str(host.__dict__["_tb_arch"])


def remote_build(host: Host, name: str, local: Path | None) -> str | None:
    """A binary built on this machine (`local`), as a remote `host` runs it: the build copied into the host's
    work folder once per run and host when the architectures are equal, else the host's own `name` on its
    PATH; None when it has neither (the caller says why: host_arch tells the host's architecture)."""
    key = f"_tb_build_{name}"
    if key not in host.__dict__:
        found: str | None
        if local is not None and local.is_file() and host_arch(host) == platform.machine():
            dest = host.workdir / "tools" / name
            host.write_file(dest, local.read_bytes(), 0o755)
            found = str(dest)
        else:
            out = host.run(["sh", "-c", f"command -v {shlex.quote(name)}"], check=False).stdout.strip()
            found = out if out.startswith("/") else None
        host.__dict__[key] = found
    return host.__dict__[key]  # type: ignore[no-any-return]
