"""The SSH lab: the same `Host` API on real machines, driven over asyncssh.

One SSH connection per host, kept for the whole run and shared by every command; a background thread runs
the asyncio event loop and the synchronous Host API waits on it with bounded timeouts. Nothing is installed
on the targets but what the VPNs and tools need; tunnelbench keeps its files in a per-run remote folder
(<workdir_root>/<run_id>/<host>) and records everything it creates on each host in the local run journal,
with the host's name and address, so `tunnelbench clean --inventory F` can undo a killed run:

  {"kind": "remote_dir", "backend": "ssh", "host": "h1", "address": ..., "path": ...}
  {"kind": "process", "backend": "ssh", "host": "h1", "address": ..., "pid": ..., "start": ..., "argv": [...]}
  {"kind": "link_prefix", "backend": "ssh", "host": "h1", "address": ..., "prefix": "<tag>"}  interfaces
  {"kind": "nft_table", "backend": "ssh", "host": "router", "address": ..., "family": "inet", "name": ...}
  {"kind": "path", "backend": "ssh", "host": "h1", "address": ..., "path": ...}   e.g. a UAPI socket

Kinds other rooms journal on a host (impair/: "qdisc", "iptables_chain") are undone by the handlers they
register (lab/journal.py `register_undo`). Where impairment goes on these hosts is impair/placement.py's
business, the doctor's checks over SSH doctor.py's: this module only runs commands and undoes.

A process is "ours" only if its PID still has the start time (/proc/PID/stat field 22) we recorded.
Long-running processes start detached (setsid) with output to a remote log file, so a lost controller
leaves them to `clean`, never to chance."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import shlex
import signal as _signal
import threading
import time
from collections.abc import Coroutine, Iterable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeVar

from tunnelbench.lab import host as _hostmod
from tunnelbench.lab.addressing import TUNNEL_RANGES_V4, TUNNEL_RANGES_V6
from tunnelbench.lab.base import LabError
from tunnelbench.lab.host import BinarySource, CommandError, Host, Process, Result
from tunnelbench.lab.inventory import Inventory, InvHost
from tunnelbench.lab.journal import Journal, read_open_entries, undo_handler
from tunnelbench.lab.procstat import ProcStat, parse_stat, starttime_sh, stat_argv
from tunnelbench.lab.tags import TAG_PREFIX
from tunnelbench.lab.tools import HOST_TOOLS

if TYPE_CHECKING:
    from asyncssh import SSHClientConnection

REMOTE_TOOLS = HOST_TOOLS
DEFAULT_BIN_DIR = "/usr/local/bin"


T = TypeVar("T")


class SshError(RuntimeError):
    pass


# -- the event loop thread ---------------------------------------------------------------------------
class _Loop:
    _inst: _Loop | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="tunnelbench-ssh", daemon=True)
        self.thread.start()

    @classmethod
    def get(cls) -> _Loop:
        with cls._lock:
            if cls._inst is None:
                cls._inst = _Loop()
            return cls._inst

    def call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except FutureTimeout:
            fut.cancel()
            raise TimeoutError(f"SSH operation did not finish within {timeout:.0f} s") from None
        except BaseException:
            fut.cancel()
            raise

    def submit(self, coro: Coroutine[Any, Any, object]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop)


def _wrap(argv: Sequence[str], env: dict[str, str] | None) -> list[str]:
    return ["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else list(argv)


def _q(p: PurePath | str) -> str:
    return shlex.quote(str(p))


class _RemoteRun:
    """A command in flight, so the watchdog (host.abort_running) can kill it on the remote host."""

    def __init__(self, host: SshHost):
        self.host = host
        self.pid: int | None = None
        self.proc: Any = None
        self.killed = False

    def kill(self) -> None:
        self.killed = True
        _Loop.get().submit(self.host._akill(self))


# -- the persistent command channel ----------------------------------------------------------------------
# Opening an SSH session per command costs a round trip or two plus sshd's session setup (0.2-0.5 s on a
# busy machine). Instead each host keeps a few long-lived POSIX sh "command servers" (one SSH session
# each, nothing installed): the controller sends one line per command, `C <base64 script> [<base64
# stdin>]`; the server runs it in the background with output to temp files, reports `P <pid>` (so a
# timeout can kill it), waits, then `R <rc> <stdout bytes> <stderr bytes>` followed by both outputs.
# One command at a time per server; a pool gives concurrency (the monitor thread polls while a workload
# runs). While a command runs nothing is sent, so a watcher reads the channel: EOF there means the
# controller died (SIGKILL, lost link) and the command is killed rather than left running for ever
# (an iperf3 client whose tunnel vanished blocks for minutes). The watcher gets SIGKILL: a SIGTERM sent
# before the forked sh has reset the server's TERM trap is lost, and a live watcher eats the next
# command. Large stdin (> _CHAN_MAX_INPUT) and a host without base64/mktemp use one session per command.
_CHAN_SERVER = r"""
d=$(mktemp -d "${TMPDIR:-/tmp}/tbch.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
trap 'exit 1' HUP TERM PIPE
exec 3<&0
echo TBCH-READY
while IFS= read -r line; do
  set -- $line
  printf %s "$2" | base64 -d >"$d/s" || { echo "E bad-script"; continue; }
  if [ -n "$3" ]; then printf %s "$3" | base64 -d >"$d/i"; else : >"$d/i"; fi
  sh "$d/s" <"$d/i" >"$d/o" 2>"$d/e" 3<&- &
  p=$!
  echo "P $p"
  { IFS= read -r _ <&3; kill -KILL $p 2>/dev/null; } &
  w=$!
  wait $p
  rc=$?
  kill -KILL $w 2>/dev/null; wait $w 2>/dev/null
  echo "R $rc $(wc -c <"$d/o") $(wc -c <"$d/e")"
  cat "$d/o" "$d/e"
done
"""
_CHAN_MAX = 6  # command servers per host
_CHAN_MAX_INPUT = 48 * 1024  # stdin up to this goes through the channel (sh `read` is bytewise)


class _Chan:
    def __init__(self, proc: Any):
        self.proc = proc


# -- remote process statistics for the monitor --------------------------------------------------------
@dataclass
class _CpuTimes:
    user: float
    system: float


@dataclass
class _Mem:
    rss: int


class RemoteProc:
    """Duck-types the part of psutil.Process the monitor uses (cpu_times, memory_info) for a remote PID."""

    def __init__(self, host: SshHost, pid: int):
        import psutil

        self._err = psutil.NoSuchProcess
        self.host, self.pid = host, pid
        self._last: ProcStat | None = None
        if not self._read():
            raise self._err(pid)

    def _read(self) -> bool:
        try:
            st = _remote_stat(self.host, self.pid)
        except (CommandError, SshError, TimeoutError):
            st = None
        start = self.host._starts.get(self.pid)
        ok = st is not None and st.state != "Z" and (start is None or st.starttime == start)
        self._last = st if ok else None
        return ok

    def cpu_times(self) -> _CpuTimes:
        if not self._read():
            raise self._err(self.pid)
        assert self._last is not None
        tck = self.host.sysconf()["CLK_TCK"]
        return _CpuTimes(self._last.utime / tck, self._last.stime / tck)

    def memory_info(self) -> _Mem:  # from the read cpu_times just made: one round trip per sample
        if self._last is None:
            raise self._err(self.pid)
        return _Mem(self._last.rss * self.host.sysconf()["PAGESIZE"])


# -- journal view that tags every entry with the host -------------------------------------------------
class HostJournal:
    """The run journal as one SSH host sees it: every entry and release carries backend/host/address."""

    def __init__(self, journal: Journal, tags: dict[str, Any]):
        self.journal = journal
        self.tags = tags
        self.path = journal.path
        self.run_id = journal.run_id

    def _tag(self, e: dict[str, Any]) -> dict[str, Any]:
        return {**e, **self.tags}

    def add(self, entry: dict[str, Any]) -> dict[str, Any]:
        e = self._tag(entry)
        self.journal.add(e)
        return e

    def path_entry(self, path: str) -> dict[str, Any]:
        return self.add({"kind": "path", "path": path})

    def process(self, pid: int, argv: list[str], host: str, start: int | None = None) -> dict[str, Any]:
        return self.add({"kind": "process", "pid": pid, "start": start, "argv": argv})

    def netns(self, name: str) -> dict[str, Any]:
        return self.add({"kind": "netns", "name": name})

    def release(self, entry: dict[str, Any]) -> None:
        self.journal.release(self._tag(entry))

    def end(self) -> None:
        self.journal.end()


# -- the host --------------------------------------------------------------------------------------------
@dataclass
class SshProcess(Process):
    start: int | None = None
    local_log: Path | None = None  # where the remote log is copied when the process stops

    def alive(self) -> bool:
        return self.host.pid_alive(self.pid)

    def wait(self, timeout: float) -> int | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.alive():
            time.sleep(0.1)
        return None

    def stop(self, grace: float = 5.0) -> bool:
        gone = super().stop(grace)
        if self.local_log is not None:
            self.copy_log(self.local_log)
        return gone

    def log_tail(self, chars: int = 2000) -> str:
        if self.log_path is None:
            return ""
        r = self.host.run(["tail", "-c", str(chars), str(self.log_path)], check=False)
        return r.stdout

    def log_text(self) -> str:
        if self.log_path is None:
            return ""
        try:
            return self.host.read_file(self.log_path).decode(errors="replace")
        except (CommandError, OSError, TimeoutError):
            return ""

    def copy_log(self, dest: Path) -> bool:
        if self.log_path is None:
            return False
        try:
            data = self.host.read_file(self.log_path)
        except (CommandError, OSError, TimeoutError):
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        return True


class SshHost(Host):
    """A real machine reached over SSH; `workdir` is a folder on that machine."""

    remote = True

    def __init__(self, name: str, inv: InvHost, workdir: PurePosixPath | None, journal: Journal | None):
        self.name = name
        self.inv = inv
        self.address = inv.address
        self.underlay_ip = inv.underlay_ip
        self.underlay_if = "eth0"  # replaced by the real egress interface in SshLab.build
        self.workdir = Path(str(workdir)) if workdir else Path(inv.workdir_root)
        tags = {"backend": "ssh", "host": name, "address": inv.address, "port": inv.port}
        self.journal: HostJournal | None = HostJournal(journal, tags) if journal is not None else None
        self.preexisting_links: frozenset[str] = frozenset()
        self._conn: SSHClientConnection | None = None
        self._alock: asyncio.Lock | None = None
        self._starts: dict[int, int | None] = {}
        self._sysconf: dict[str, int] | None = None
        self._nlog = 0
        self._idle: list[_Chan] = []  # command servers (only touched on the event loop thread)
        self._nchan = 0
        self.use_channel = True  # False: one SSH session per command (the fallback, and for comparison)
        # where `install --inventory` copies binaries; first on PATH for every command tunnelbench runs there
        self.bin_dir = str(inv.vars.get("tunnelbench_bin_dir") or DEFAULT_BIN_DIR)
        self._binaries: dict[tuple[str, tuple[str, ...]], str | None] = {}  # binary(): what `command -v` said

    # -- connection ------------------------------------------------------------------------------------
    def _connect_kwargs(self) -> dict[str, Any]:
        inv = self.inv
        kw: dict[str, Any] = {
            "host": inv.address,
            "port": inv.port,
            "username": inv.user,
            "connect_timeout": inv.connect_timeout_s,
            "keepalive_interval": 15,
            "keepalive_count_max": 4,
        }
        if inv.key_file:
            kw["client_keys"] = [inv.key_file]
        if not inv.host_key_check:
            kw["known_hosts"] = None
        elif inv.known_hosts:
            kw["known_hosts"] = inv.known_hosts
        return kw

    async def _aconn(self) -> SSHClientConnection:
        import asyncssh

        if self._alock is None:
            self._alock = asyncio.Lock()
        async with self._alock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            try:
                self._conn = await asyncio.wait_for(
                    asyncssh.connect(**self._connect_kwargs()), self.inv.connect_timeout_s + 5
                )
            except asyncssh.HostKeyNotVerifiable as e:
                raise SshError(
                    f"{self.name} ({self.inv.describe()}): host key not verified ({e}). Add the host's key "
                    f"to {self.inv.known_hosts or '~/.ssh/known_hosts'} (compare `ssh-keyscan -p {self.inv.port} "
                    f"{self.inv.address}` with the host's real fingerprint), or, on a lab network you fully "
                    "control, use --insecure-no-host-key-check / tunnelbench_host_key_check: false"
                ) from None
            except asyncssh.PermissionDenied as e:
                raise SshError(
                    f"{self.name} ({self.inv.describe()}): authentication failed ({e}); tunnelbench uses keys "
                    "from ssh-agent or ansible_ssh_private_key_file"
                ) from None
            except (TimeoutError, OSError, asyncssh.Error) as e:
                raise SshError(
                    f"{self.name} ({self.inv.describe()}): cannot connect: {e or type(e).__name__}"
                ) from None
            return self._conn

    def connect(self) -> None:
        _Loop.get().call(self._aconn(), self.inv.connect_timeout_s + 10)

    def close(self) -> None:
        async def _close() -> None:
            idle, self._idle = self._idle, []
            for ch in idle:  # end the command servers first: they remove their temp folders
                with contextlib.suppress(Exception):
                    ch.proc.stdin.write_eof()
                    await asyncio.wait_for(ch.proc.wait(check=False), 2)
            self._nchan = 0
            if self._conn is not None:
                self._conn.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._conn.wait_closed(), 3)
                self._conn = None

        with contextlib.suppress(Exception):
            _Loop.get().call(_close(), 5)

    # -- commands --------------------------------------------------------------------------------------
    def _path(self) -> str:
        return f'PATH={_q(self.bin_dir)}:"$PATH"; export PATH; '

    def argv(self, argv: Sequence[str]) -> list[str]:
        raise NotImplementedError(
            f"{self.name} is an SSH host: run commands with host.run(), there is no local argv for it"
        )

    async def _arun(
        self, cmd: str, data: bytes | None, handle: _RemoteRun
    ) -> tuple[int | None, bytes, bytes]:
        conn = await self._aconn()
        proc = await conn.create_process(cmd, encoding=None)
        handle.proc = proc
        if data is not None:
            proc.stdin.write(data)
        proc.stdin.write_eof()
        first = await proc.stderr.readline()
        with contextlib.suppress(ValueError, IndexError):
            handle.pid = int(first.split()[1])
        out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
        done = await proc.wait(check=False)
        return done.returncode, out, err

    async def _achan(self) -> _Chan | None:
        """An idle command server, a new one, or None (pool full or the host cannot run one)."""
        if self._idle:
            return self._idle.pop()
        if self._nchan >= _CHAN_MAX or not self.use_channel:
            return None
        self._nchan += 1
        proc = None
        try:
            conn = await self._aconn()
            proc = await conn.create_process(
                "sh -c " + shlex.quote(self._path() + _CHAN_SERVER), encoding=None
            )
            line = await asyncio.wait_for(proc.stdout.readline(), 20)
            if line.strip() != b"TBCH-READY":
                raise SshError(f"command server did not start: {line!r}")
            return _Chan(proc)
        except SshError:
            raise
        except Exception:
            self._nchan -= 1
            if proc is not None:
                proc.close()
            self.use_channel = False  # e.g. no mktemp/base64 there: one session per command
            return None

    def _drop_chan(self, ch: _Chan) -> None:
        self._nchan -= 1
        with contextlib.suppress(Exception):
            ch.proc.close()

    async def _arun_chan(
        self, script: str, data: bytes | None, handle: _RemoteRun
    ) -> tuple[int | None, bytes, bytes] | None:
        """Run through a command server; None if there is none to use (the caller opens a session)."""
        ch = await self._achan()
        if ch is None:
            return None
        handle.proc = ch.proc
        try:
            line = b"C " + base64.b64encode(script.encode())
            if data:
                line += b" " + base64.b64encode(data)
            ch.proc.stdin.write(line + b"\n")
            hdr = await ch.proc.stdout.readline()
            if not hdr.startswith(b"P "):
                self._drop_chan(ch)
                if not hdr:  # the server is gone before it started the command: use a session
                    return None
                raise SshError(f"{self.name}: command server: {hdr!r}")
            handle.pid = int(hdr.split()[1])
            hdr = await ch.proc.stdout.readline()
            f = hdr.split()
            if len(f) != 4 or f[0] != b"R":
                self._drop_chan(ch)
                return None, b"", f"{self.name}: command channel closed mid-command".encode()
            try:
                out = await ch.proc.stdout.readexactly(int(f[2]))
                err = await ch.proc.stdout.readexactly(int(f[3]))
            except asyncio.IncompleteReadError:
                self._drop_chan(ch)
                return None, b"", f"{self.name}: command channel closed mid-output".encode()
        except BaseException:  # cancelled (timeout, abort) or broken: never reuse a server mid-command
            self._drop_chan(ch)
            raise
        self._idle.append(ch)
        return (None if handle.killed else int(f[1])), out, err

    async def _arun_any(
        self, inner: str, data: bytes | None, handle: _RemoteRun
    ) -> tuple[int | None, bytes, bytes]:
        if data is None or len(data) <= _CHAN_MAX_INPUT:
            got = await self._arun_chan("exec " + inner, data, handle)
            if got is not None:
                return got
        cmd = f"sh -c {shlex.quote(self._path() + 'echo TBPID $$ >&2; exec ' + inner)}"
        return await self._arun(cmd, data, handle)

    async def _akill(self, handle: _RemoteRun) -> None:
        with contextlib.suppress(Exception):
            if handle.pid:
                conn = await self._aconn()
                await asyncio.wait_for(conn.run(f"kill -KILL {handle.pid} 2>/dev/null", check=False), 5)
        with contextlib.suppress(Exception):
            if handle.proc is not None:
                handle.proc.close()

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 30.0,
        check: bool = True,
        input: str | bytes | None = None,
        env: dict[str, str] | None = None,
        binary: bool = False,
    ) -> Result:
        """Run a command on the host; the PID is reported first on stderr so a timeout can kill it there."""
        t0 = time.monotonic()
        inner = shlex.join(_wrap(argv, env))
        data = input.encode() if isinstance(input, str) else input
        handle = _RemoteRun(self)
        loop = _Loop.get()
        with _hostmod._RUNNING_LOCK:
            _hostmod._RUNNING.add(handle)
        fut = asyncio.run_coroutine_threadsafe(self._arun_any(inner, data, handle), loop.loop)
        try:
            rc, out, err = fut.result(timeout)
        except FutureTimeout:
            fut.cancel()
            loop.call(self._akill(handle), 10)
            raise CommandError(self.name, argv, None, "") from None
        except SshError:
            raise
        except BaseException:  # Ctrl-C or an abort: never leave the command running on the host
            fut.cancel()
            with contextlib.suppress(Exception):
                loop.call(self._akill(handle), 10)
            raise
        finally:
            with _hostmod._RUNNING_LOCK:
                _hostmod._RUNNING.discard(handle)
        if rc is None:  # killed by a signal (the watchdog) or the channel broke
            raise CommandError(self.name, argv, -1, (out + err).decode(errors="replace"))
        sout = out.decode(errors="replace")
        serr = err.decode(errors="replace")
        res = Result(list(argv), rc, sout, serr, time.monotonic() - t0)
        if binary:
            res.stdout_bytes = out
        if check and rc != 0:
            raise CommandError(self.name, argv, rc, sout + serr)
        return res

    def sh(self, script: str, **kw: Any) -> Result:
        return self.run(["sh", "-c", script], **kw)

    # -- long-running processes ------------------------------------------------------------------------
    def _remote_log(self, log_path: Path | None, label: str) -> tuple[PurePosixPath | None, Path | None]:
        """Remote log path, and the local path to copy it to on stop when the caller asked for a local file."""
        if log_path is None:
            return None, None
        if str(log_path).startswith(str(self.workdir) + "/"):
            return PurePosixPath(str(log_path)), None
        self._nlog += 1
        return PurePosixPath(str(self.workdir)) / "logs" / f"{self._nlog:04d}-{label}.log", log_path

    async def _aspawn(self, cmd: str) -> tuple[int, int]:
        conn = await self._aconn()
        proc = await conn.create_process(cmd, encoding=None)
        proc.stdin.write_eof()
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        err = b""
        if not line.strip():
            err = await asyncio.wait_for(proc.stderr.read(), 5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(check=False), 10)
        proc.close()
        try:
            pid, start = line.split()
            return int(pid), int(start)
        except ValueError:
            raise SshError(
                f"{self.name}: could not start process: {(line + err).decode(errors='replace')}"
            ) from None

    def spawn(
        self,
        argv: Sequence[str],
        *,
        label: str,
        log_path: Path | None,
        env: dict[str, str] | None = None,
        stdin_devnull: bool = True,
    ) -> Process:
        """Start a detached process (own session); its stdout+stderr go to a remote log file."""
        remote_log, local_log = self._remote_log(log_path, label)
        log = _q(remote_log) if remote_log else "/dev/null"
        # the PID and its start time (kept across exec) in one line: one round trip per spawn
        inner = f'echo $$ $({starttime_sh("$$")}); exec "$@" >>{log} 2>&1 </dev/null'
        mk = f"mkdir -p {_q(remote_log.parent)} && " if remote_log else ""
        cmd = f"{self._path()}{mk}cd / && exec setsid sh -c {shlex.quote(inner)} tb {shlex.join(_wrap(argv, env))}"
        pid, start = _Loop.get().call(self._aspawn(cmd), 40)
        self._starts[pid] = start
        entry = self.journal.process(pid, list(argv), self.name, start) if self.journal else None
        return SshProcess(
            self,
            label,
            list(argv),
            pid,
            Path(str(remote_log)) if remote_log else None,
            None,
            entry,
            start=start,
            local_log=local_log,
        )

    def proc_start(self, pid: int) -> int | None:
        st = _remote_stat(self, pid)
        return st.starttime if st else None

    def pid_alive(self, pid: int) -> bool:
        return remote_alive(self, pid, self._starts.get(pid))

    def signal(self, pid: int, sig: int) -> None:
        start = self._starts.get(pid)
        self.run(["sh", "-c", _kill_script(pid, start, int(sig))], check=False)

    def ps_process(self, pid: int) -> RemoteProc:
        return RemoteProc(self, pid)

    def sysconf(self) -> dict[str, int]:
        if self._sysconf is None:
            out = self.run(["sh", "-c", "getconf CLK_TCK; getconf PAGESIZE"]).stdout.split()
            self._sysconf = {"CLK_TCK": int(out[0]), "PAGESIZE": int(out[1])}
        return self._sysconf

    # -- files -----------------------------------------------------------------------------------------
    def write_file(self, path: Path, data: str | bytes, mode: int = 0o644) -> None:
        """Write through a temp file created under umask 077 (a private key is never readable by others),
        then set the final mode and rename into place."""
        p = PurePosixPath(str(path))
        tmp = p.parent / f".{p.name}.tb-tmp"
        script = (
            f"umask 077 && mkdir -p {_q(p.parent)} && cat > {_q(tmp)} && chmod {mode:o} {_q(tmp)} "
            f"&& mv -f {_q(tmp)} {_q(p)}"
        )
        self.run(["sh", "-c", script], input=data.encode() if isinstance(data, str) else data, timeout=60)

    def read_file(self, path: Path) -> bytes:
        r = self.run(["cat", "--", str(path)], binary=True, timeout=60)
        assert r.stdout_bytes is not None  # binary=True
        return r.stdout_bytes

    def exists(self, path: Path) -> bool:
        return self.run(["test", "-e", str(path)], check=False).returncode == 0

    def remove(self, path: Path) -> None:
        self.run(["rm", "-f", "--", str(path)], check=False)

    def mkdir(self, path: Path, mode: int = 0o700) -> None:
        self.run(["mkdir", "-p", "-m", f"{mode:o}", "--", str(path)])

    def make_workdir(self) -> None:
        """The run's work folder, made so that no other user of that machine can read or replace what we put
        in it: workdir_root and each folder below it down to the workdir are made 0700 one at a time (mkdir
        -p would leave the parents at the umask), and each, new or found, must be a real folder (no
        symlink) owned by the SSH user and writable by nobody else; else the run stops naming the folder.
        workdir_root's default sits in /var/tmp, where any local user may have made it first."""
        root = PurePosixPath(self.inv.workdir_root)
        work = PurePosixPath(str(self.workdir))
        rel = work.relative_to(root).parts  # <run_id>, <host>
        chain = [root.joinpath(*rel[:i]) for i in range(len(rel) + 1)]
        script = (
            "set -u; umask 077; u=$(id -u); mkdir -p -- "
            + _q(root.parent)
            + "; for d in "
            + " ".join(_q(d) for d in chain)
            + "; do "
            '[ -L "$d" ] && { echo "$d is a symbolic link"; exit 3; }; '
            '[ -d "$d" ] || mkdir -m 700 -- "$d" || { echo "$d could not be made"; exit 3; }; '
            'set -- $(stat -c "%u %A" -- "$d"); '
            '[ "$1" = "$u" ] || { echo "$d is owned by uid $1, not by uid $u (the SSH user)"; exit 3; }; '
            'case "$2" in ?????w????|????????w?) echo "$d is writable by other users ($2)"; exit 3;; esac; '
            "done"
        )
        r = self.run(["sh", "-c", script], check=False)
        if r.returncode != 0:
            raise RuntimeError(
                f"{self.name} ({self.inv.describe()}): unsafe work folder: {r.stdout.strip() or r.stderr.strip()}; "
                f"remove it there if it is not yours, or set tunnelbench_workdir_root to a folder only the SSH "
                f"user owns"
            )

    def binary(self, name: str, installs: Sequence[BinarySource] = ()) -> str:
        """`name` as this machine runs it: `command -v` there, on its own PATH (bin_dir first, where `install
        --inventory` puts pinned builds) plus a system package's libexec folders; the bare name when it has
        none. This machine's install cache never applies: its paths are not the remote's."""
        libexec = next((s.libexec for s in installs if name in s.binaries and s.bin_dir() is None), ())
        key = (name, libexec)
        if key not in self._binaries:
            extra = "".join(f":{shlex.quote(d)}" for d in libexec)
            out = self.run(["sh", "-c", f'PATH="$PATH{extra}"; command -v {shlex.quote(name)}'], check=False)
            found = out.stdout.strip()
            self._binaries[key] = found if found.startswith("/") else None
        return self._binaries[key] or name

    def which(self, tools: Iterable[str]) -> dict[str, str | None]:
        tools = list(tools)
        script = "; ".join(f"echo {shlex.quote(t)} $(command -v {shlex.quote(t)} || echo -)" for t in tools)
        found: dict[str, str | None] = dict.fromkeys(tools)
        for line in self.run(["sh", "-c", script]).stdout.splitlines():
            name, _, path = line.partition(" ")
            found[name] = None if path.strip() in ("", "-") else path.strip()
        return found


def _kill_script(pid: int, start: int | None, sig: int) -> str:
    """Signal `pid` only if it is still the process started at `start` ticks (PIDs get reused)."""
    if start is None:
        return f"kill -{sig} {pid} 2>/dev/null; true"
    return f's=$({starttime_sh(pid)}) && [ "$s" = {start} ] && kill -{sig} {pid} 2>/dev/null; true'


def _remote_stat(host: SshHost, pid: int) -> ProcStat | None:
    r = host.run(stat_argv(pid), check=False)
    return parse_stat(r.stdout) if r.returncode == 0 else None


def remote_alive(host: SshHost, pid: int, start: int | None) -> bool:
    st = _remote_stat(host, pid)
    return st is not None and st.state != "Z" and (start is None or st.starttime == start)


# -- the lab ---------------------------------------------------------------------------------------------
def _workdir(inv: InvHost, run_id: str, name: str) -> PurePosixPath:
    return PurePosixPath(inv.workdir_root) / run_id / name


def _guard_rules(table: str) -> str:
    # count only, never drop: on real networks the "tunnel" ranges may be in legitimate use
    return f"""
table inet {table} {{
  counter offlab {{ }}
  counter tunnel_leak {{ }}
  chain forward {{
    type filter hook forward priority -300; policy accept;
    meta nfproto ipv4 ip daddr {{ {TUNNEL_RANGES_V4} }} counter name tunnel_leak
    meta nfproto ipv6 ip6 daddr {{ {TUNNEL_RANGES_V6} }} counter name tunnel_leak
  }}
}}
"""


class SshLab:
    """Peers h1..hN (and optionally a router, relays, a control server) from an inventory."""

    backend = "ssh"

    def __init__(self, inventory: Inventory, n_hosts: int, tag: str, run_dir: Path, journal: Journal):
        self.inventory = inventory
        self.tag = tag
        self.run_dir = run_dir
        self.journal = journal
        peers = inventory.peers()
        if len(peers) < n_hosts:
            raise ValueError(
                f"the scenario needs {n_hosts} peers but inventory {inventory.path} has {len(peers)} "
                f"({', '.join(p.name for p in peers)})"
            )
        rid = journal.run_id

        def mk(name: str, inv: InvHost) -> SshHost:
            return SshHost(name, inv, _workdir(inv, rid, name), journal)

        self.hosts: list[SshHost] = [mk(f"h{i}", inv) for i, inv in enumerate(peers[:n_hosts], start=1)]
        r = inventory.router()
        self.router: SshHost | None = mk("router", r) if r else None
        self.relays = [mk(f"relay{i}", inv) for i, inv in enumerate(inventory.with_role("relay"), start=1)]
        ctl = inventory.with_role("control")
        self.control: SshHost | None = mk("control", ctl[0]) if ctl else None
        self.nft_table = f"{tag}guard"
        self._guard = False
        self._entries: dict[str, list[dict[str, Any]]] = {}

    relay: SshHost | None = None  # lab.path must be "direct" here (lab.make_lab)
    path_policies = False

    def all_hosts(self) -> list[SshHost]:
        return [
            *self.hosts,
            *([self.router] if self.router else []),
            *self.relays,
            *([self.control] if self.control else []),
        ]

    def mapping(self) -> str:
        return ", ".join(f"{h.name}={h.inv.name}" for h in self.all_hosts())

    def offlab_destinations(self) -> dict[str, int]:
        return {}  # real hosts have other traffic: nothing off the lab is dropped or counted

    # -- path policies: not on real networks (Lab.path_policies is False) ---------------------------
    def _no_policies(self, what: str) -> LabError:
        return LabError(
            f"{what} needs the namespace lab's path policies; the SSH lab does not filter real "
            "networks (run it without --inventory)"
        )

    def block_udp_between_peers(self, except_host: Host | None = None) -> None:
        raise self._no_policies("blocking UDP between peers")

    def block_udp_pair(self, a: Host, b: Host) -> None:
        raise self._no_policies("blocking UDP between two hosts")

    def unblock(self) -> None:
        raise self._no_policies("unblocking UDP between peers")

    def watch_relay(self, relay: Host | None = None) -> None:
        raise self._no_policies("counting a relay's bytes")

    def relay_bytes(self, relay: Host | None = None) -> dict[str, int]:
        raise self._no_policies("counting a relay's bytes")

    # -- build -----------------------------------------------------------------------------------------
    def build(self) -> None:
        problems: list[str] = []
        for h in self.all_hosts():
            h.connect()
            need = REMOTE_TOOLS if h in self.hosts else ("ip",)
            missing = [t for t, p in h.which(need).items() if p is None]
            if missing:
                problems.append(f"{h.name} ({h.inv.describe()}) is missing {', '.join(missing)}")
        if problems:
            raise RuntimeError(
                "hosts not ready: " + "; ".join(problems) + " (see `tunnelbench doctor --inventory`)"
            )
        for h in self.all_hosts():
            assert h.journal is not None
            ents = self._entries.setdefault(h.name, [])
            # journal first: clean finds half-made ones
            ents.append(h.journal.add({"kind": "remote_dir", "path": str(h.workdir)}))
            h.make_workdir()
            ents.append(h.journal.add({"kind": "link_prefix", "prefix": self.tag}))
            links = h.run(["ip", "-o", "link", "show"]).stdout
            h.preexisting_links = frozenset(
                line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if ":" in line
            )
        for i, h in enumerate(self.hosts):
            peer = self.hosts[(i + 1) % len(self.hosts)]
            with contextlib.suppress(CommandError, ValueError, IndexError, KeyError):
                route = json.loads(h.run(["ip", "-j", "route", "get", peer.underlay_ip]).stdout)
                h.underlay_if = route[0]["dev"]
        self._install_guard()

    def _install_guard(self) -> None:
        """Counting-only nft table on the router host (if there is one and it has nft): never drops."""
        r = self.router
        if r is None or r.which(["nft"])["nft"] is None:
            return
        assert r.journal is not None
        self._entries["router"].append(
            r.journal.add({"kind": "nft_table", "family": "inet", "name": self.nft_table})
        )
        r.run(["nft", "-f", "-"], input=_guard_rules(self.nft_table))
        self._guard = True

    def wait_links(self, timeout: float = 10.0) -> None:
        """Every peer reaches the next one's underlay address."""
        end = time.monotonic() + timeout
        for i, h in enumerate(self.hosts):
            peer = self.hosts[(i + 1) % len(self.hosts)]
            while h.run(["ping", "-c1", "-W1", peer.underlay_ip], check=False).returncode != 0:
                if time.monotonic() > end:
                    raise RuntimeError(f"{h.name} cannot reach {peer.name} at {peer.underlay_ip}")
                time.sleep(0.2)

    def offlab_drops(self, counter: str = "offlab") -> int:
        """Packets the router counted (-1: not measured). On real networks nothing is dropped and "offlab"
        is not defined (hosts have other traffic): only `tunnel_leak` is counted."""
        if not self._guard or self.router is None or counter == "offlab":
            return -1
        try:
            out = self.router.run(["nft", "-j", "list", "counter", "inet", self.nft_table, counter]).stdout
        except CommandError:
            return -1
        for item in json.loads(out)["nftables"]:
            if "counter" in item:
                return int(item["counter"]["packets"])
        return -1

    def router_ifnames(self) -> dict[str, str]:
        """The router host's interface toward each peer, from its routing table."""
        assert self.router is not None
        out: dict[str, str] = {}
        for h in self.hosts:
            r = self.router.run(["ip", "-j", "route", "get", h.underlay_ip], check=False)
            try:
                out[h.name] = json.loads(r.stdout)[0]["dev"]
            except (json.JSONDecodeError, IndexError, KeyError):
                raise RuntimeError(
                    f"router {self.router.inv.name} has no route to {h.name} ({h.underlay_ip}): "
                    f"{r.stderr.strip()}"
                ) from None
            if out[h.name] == "lo":
                raise RuntimeError(
                    f"router {self.router.inv.name}: {h.underlay_ip} is its own address; "
                    "the router must be a separate box on the peers' path"
                )
        return out

    # -- teardown --------------------------------------------------------------------------------------
    def collect_logs(self) -> None:
        """Copy every *.log of the remote workdirs into <run_dir>/hosts/<host>/ (keys and configs stay)."""
        for h in self.all_hosts():
            with contextlib.suppress(CommandError, SshError, TimeoutError, OSError):
                found = h.run(
                    ["find", str(h.workdir), "-name", "*.log", "-size", "-20M", "-type", "f"], check=False
                )
                for line in found.stdout.splitlines():
                    rel = PurePosixPath(line).relative_to(str(h.workdir))
                    dest = self.run_dir / "hosts" / h.name / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(h.read_file(Path(line)))

    def destroy(self) -> list[str]:
        """Stop everything this run started on every host (per the journal), remove interfaces it made,
        the guard table and the remote workdirs; return problems."""
        with contextlib.suppress(Exception):
            self.collect_logs()
        problems: list[str] = []
        open_entries = read_open_entries(self.journal.path)
        for h in self.all_hosts():
            mine = [
                e
                for e in open_entries
                if e.get("backend") == "ssh" and e.get("host") == h.name and e.get("address") == h.address
            ]
            try:
                rep = undo_entries(h, mine, self.journal)
                problems += rep.problems
            except (SshError, TimeoutError, OSError) as e:
                problems.append(f"{h.name}: {e}")
            h.close()
        self._guard = False
        return problems


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
            h.run(["sh", "-c", _kill_script(e["pid"], e.get("start"), int(_signal.SIGTERM))], check=False)
    deadline = time.monotonic() + 3
    for e in procs:
        while remote_alive(h, e["pid"], e.get("start")) and time.monotonic() < deadline:
            time.sleep(0.1)
        what = None
        if remote_alive(h, e["pid"], e.get("start")):
            h.run(["sh", "-c", _kill_script(e["pid"], e.get("start"), int(_signal.SIGKILL))], check=False)
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
