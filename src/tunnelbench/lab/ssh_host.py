"""An SSH host: the same `Host` API on a real machine, driven over asyncssh (lab/ssh_transport.py).

One SSH connection per host, kept for the whole run and shared by every command. Nothing is installed on the
targets but what the VPNs and tools need; tunnelbench keeps its files in a per-run remote folder
(<workdir_root>/<run_id>/<host>) and records everything it creates on each host in the local run journal,
with the host's name and address, so `tunnelbench clean --inventory F` can undo a killed run
(lab/ssh_undo.py).

A process is "ours" only if its PID still has the start time (/proc/PID/stat field 22) we recorded.
Long-running processes start detached (setsid) with output to a remote log file, so a lost controller
leaves them to `clean`, never to chance."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shlex
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import asyncssh

from tunnelbench.lab import host as _hostmod
from tunnelbench.lab.host import THIS_MACHINE, BinarySource, CommandError, Host, Process, Result
from tunnelbench.lab.inventory import InvHost
from tunnelbench.lab.journal import Journal, register_undo
from tunnelbench.lab.lock import LabBusy, controller, holder_gone, holder_text
from tunnelbench.lab.procstat import ProcStat, parse_stat, starttime_sh, stat_argv
from tunnelbench.lab.ssh_transport import (
    CHANNEL_MAX_INPUT,
    CHANNEL_SERVER,
    CHANNELS_PER_HOST,
    Channel,
    EventLoop,
    SshError,
    env_argv,
    quote,
)
from tunnelbench.lab.tools import HOST_TOOLS

REMOTE_TOOLS = HOST_TOOLS
RECONNECT_S = 8.0  # how long a dropped connection is retried before the host counts as unreachable
DEFAULT_BIN_DIR = "/usr/local/bin"
# in workdir_root: the run that drives this host now (a folder, made by mkdir: atomic), its controller record
# in `holder` (lab/lock.py's `controller`)
LAB_LOCK = "lab.lock"


class RemoteRun:
    """A command in flight, so the watchdog (host.abort_running) can kill it on the remote host."""

    def __init__(self, host: SshHost):
        self.host = host
        self.pid: int | None = None
        self.proc: Any = None
        self.killed = False

    def kill(self) -> None:
        self.killed = True
        EventLoop.get().submit(self.host._akill(self))


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
            st = remote_stat(self.host, self.pid)
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
        THIS_MACHINE.write_file(dest, data, 0o600)  # a daemon's log may hold its secrets
        return True


WRITE_FLOOR_BPS = 1e6  # the slowest link a file write is given time for: 1 Mbit/s
CLOCK_SAMPLES = 5  # readings of a host's clock for its offset (the shortest round trip is kept)


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
        self._conn: asyncssh.SSHClientConnection | None = None
        self._alock: asyncio.Lock | None = None
        self._starts: dict[int, int | None] = {}
        self._sysconf: dict[str, int] | None = None
        self._clock_offset: float | None = None
        self._nlog = 0
        self._idle: list[Channel] = []  # command servers (only touched on the event loop thread)
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

    async def _aconn(self) -> asyncssh.SSHClientConnection:
        if self._alock is None:
            self._alock = asyncio.Lock()
        async with self._alock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            # a connection that dropped (its command servers went with it) is retried for RECONNECT_S: a
            # restarting sshd or a short link blip; a host that stays away fails the first command after
            until = time.monotonic() + (RECONNECT_S if self._conn is not None else 0)
            self._conn, self._idle, self._nchan = None, [], 0
            try:
                while True:
                    try:
                        self._conn = await asyncio.wait_for(
                            asyncssh.connect(**self._connect_kwargs()), self.inv.connect_timeout_s + 5
                        )
                        break
                    except (TimeoutError, OSError):
                        if time.monotonic() + 1 > until:
                            raise
                        await asyncio.sleep(1)
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
        EventLoop.get().call(self._aconn(), self.inv.connect_timeout_s + 10)

    def lost(self, e: BaseException) -> SshError:
        """The error for a command the connection dropped under (the next command reconnects)."""
        return SshError(f"{self.name} ({self.inv.describe()}): connection lost: {type(e).__name__}: {e}")

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
            EventLoop.get().call(_close(), 5)

    # -- commands --------------------------------------------------------------------------------------
    def _path(self) -> str:
        return f'PATH={quote(self.bin_dir)}:"$PATH"; export PATH; '

    def argv(self, argv: Sequence[str]) -> list[str]:
        raise NotImplementedError(
            f"{self.name} is an SSH host: run commands with host.run(), there is no local argv for it"
        )

    async def _arun(self, cmd: str, data: bytes | None, handle: RemoteRun) -> tuple[int | None, bytes, bytes]:
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

    async def _achan(self) -> Channel | None:
        """An idle command server, a new one, or None (pool full or the host cannot run one)."""
        if self._idle:
            return self._idle.pop()
        if self._nchan >= CHANNELS_PER_HOST or not self.use_channel:
            return None
        self._nchan += 1
        proc = None
        try:
            conn = await self._aconn()
            proc = await conn.create_process(
                "sh -c " + shlex.quote(self._path() + CHANNEL_SERVER), encoding=None
            )
            line = await asyncio.wait_for(proc.stdout.readline(), 20)
            if line.strip() != b"TBCH-READY":
                raise SshError(f"command server did not start: {line!r}")
            return Channel(proc)
        except SshError:
            raise
        except Exception:
            self._nchan -= 1
            if proc is not None:
                proc.close()
            self.use_channel = False  # e.g. no mktemp/base64 there: one session per command
            return None

    def _drop_chan(self, ch: Channel) -> None:
        self._nchan -= 1
        with contextlib.suppress(Exception):
            ch.proc.close()

    async def _arun_chan(
        self, script: str, data: bytes | None, handle: RemoteRun
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
        self, inner: str, data: bytes | None, handle: RemoteRun
    ) -> tuple[int | None, bytes, bytes]:
        if data is None or len(data) <= CHANNEL_MAX_INPUT:
            got = await self._arun_chan("exec " + inner, data, handle)
            if got is not None:
                return got
        cmd = f"sh -c {shlex.quote(self._path() + 'echo TBPID $$ >&2; exec ' + inner)}"
        return await self._arun(cmd, data, handle)

    async def _akill(self, handle: RemoteRun) -> None:
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
        inner = shlex.join(env_argv(argv, env))
        data = input.encode() if isinstance(input, str) else input
        handle = RemoteRun(self)
        loop = EventLoop.get()
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
        except (OSError, asyncssh.Error) as e:  # the connection dropped under the command
            fut.cancel()
            raise self.lost(e) from None
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
        log = quote(remote_log) if remote_log else "/dev/null"
        # the PID and its start time (kept across exec) in one line: one round trip per spawn
        inner = f'echo $$ $({starttime_sh("$$")}); exec "$@" >>{log} 2>&1 </dev/null'
        mk = f"mkdir -p {quote(remote_log.parent)} && " if remote_log else ""
        cmd = f"{self._path()}{mk}cd / && exec setsid sh -c {shlex.quote(inner)} tb {shlex.join(env_argv(argv, env))}"
        try:
            pid, start = EventLoop.get().call(self._aspawn(cmd), 40)
        except (OSError, asyncssh.Error) as e:
            raise self.lost(e) from None
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
        st = remote_stat(self, pid)
        return st.starttime if st else None

    def pid_alive(self, pid: int) -> bool:
        return remote_alive(self, pid, self._starts.get(pid))

    def signal(self, pid: int, sig: int) -> None:
        start = self._starts.get(pid)
        self.run(["sh", "-c", kill_script(pid, start, int(sig))], check=False)

    def ps_process(self, pid: int) -> RemoteProc:
        return RemoteProc(self, pid)

    def clock_offset(self) -> float:
        """The host's wall clock minus this machine's (s), once per host: of CLOCK_SAMPLES readings of its
        `date +%s.%N`, the one with the shortest round trip, against the midpoint of that trip (NTP's own
        estimate: off by at most half that round trip). 0 when the host's date cannot say nanoseconds."""
        if self._clock_offset is None:
            best: tuple[float, float] | None = None
            for _ in range(CLOCK_SAMPLES):
                t0 = time.time()
                out = self.run(["date", "+%s.%N"], check=False).stdout.strip()
                t1 = time.time()
                try:
                    remote = float(out)
                except ValueError:  # busybox's date prints "%N" as is
                    best = (0.0, 0.0)
                    break
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, remote - (t0 + t1) / 2)
            self._clock_offset = best[1] if best else 0.0
        return self._clock_offset

    def sysconf(self) -> dict[str, int]:
        if self._sysconf is None:
            out = self.run(["sh", "-c", "getconf CLK_TCK; getconf PAGESIZE"]).stdout.split()
            self._sysconf = {"CLK_TCK": int(out[0]), "PAGESIZE": int(out[1])}
        return self._sysconf

    # -- files -----------------------------------------------------------------------------------------
    def write_file(self, path: Path, data: str | bytes, mode: int = 0o644) -> None:
        """Write through a temp file created under umask 077 (a private key is never readable by others),
        then set the final mode and rename into place. The timeout grows with the size: 60 s, or the time the
        data takes at WRITE_FLOOR_BPS (a file set or a tool build over a slow management link)."""
        p = PurePosixPath(str(path))
        raw = data.encode() if isinstance(data, str) else data
        tmp = p.parent / f".{p.name}.tb-tmp"
        script = (
            f"umask 077 && mkdir -p {quote(p.parent)} && cat > {quote(tmp)} && chmod {mode:o} {quote(tmp)} "
            f"&& mv -f {quote(tmp)} {quote(p)}"
        )
        self.run(["sh", "-c", script], input=raw, timeout=max(60.0, 8 * len(raw) / WRITE_FLOOR_BPS))

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
            + quote(root.parent)
            + "; for d in "
            + " ".join(quote(d) for d in chain)
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


# -- one run per host ------------------------------------------------------------------------------------
def lab_lock_path(host: SshHost) -> PurePosixPath:
    return PurePosixPath(host.inv.workdir_root) / LAB_LOCK


def _lock_script(lock: PurePosixPath, mine: str, replace: str | None) -> str:
    """Take `lock` (mkdir), writing `mine` in it; `replace`: first remove a holder whose record is exactly that
    (an ended one), in the same step. Prints TB-TAKEN, or TB-HELD and the holder's record."""
    drop = (
        f'[ "$(cat -- "$l/holder" 2>/dev/null)" = {shlex.quote(replace)} ] && rm -rf -- "$l"; '
        if replace is not None
        else ""
    )
    return (
        f"set -u; umask 077; l={quote(lock)}; "
        '[ -L "$l" ] && { echo "TB-UNSAFE $l is a symbolic link"; exit 3; }; '
        + drop
        + f'if mkdir -m 700 -- "$l" 2>/dev/null; then printf "%s\\n" {shlex.quote(mine)} > "$l/holder"; '
        'echo TB-TAKEN; exit 0; fi; printf "TB-HELD "; head -c 4000 -- "$l/holder" 2>/dev/null | tr -d "\\n"; echo'
    )


def _held_by(out: str) -> dict[str, Any] | None:
    """The holder's record from the lock script's answer (None: taken by us; {} when it names nobody)."""
    for line in out.splitlines():
        if line.startswith("TB-TAKEN"):
            return None
        if line.startswith("TB-HELD"):
            try:
                got = json.loads(line[len("TB-HELD") :].strip() or "{}")
            except ValueError:
                return {}
            return got if isinstance(got, dict) else {}
    return {}


def take_lab_lock(host: SshHost, run_id: str) -> None:
    """Take `host` for run `run_id` before anything is started there: journaled first (the teardown and `clean`
    release it, only while it names this run), refused with LabBusy naming the run and controller that hold
    it. A holder that is known to have ended (it ran on this controller and its process is gone: a killed run,
    or the run this resumes) is replaced."""
    lock = lab_lock_path(host)
    mine = json.dumps(controller(run_id), sort_keys=True)
    if host.journal is not None:
        host.journal.add({"kind": "ssh_lab_lock", "path": str(lock), "run_id": run_id})
    r = host.run(["sh", "-c", _lock_script(lock, mine, None)], check=False)
    held = _held_by(r.stdout)
    if held and holder_gone(held):
        old = host.run(["cat", "--", str(lock / "holder")], check=False).stdout.rstrip("\n")
        r = host.run(["sh", "-c", _lock_script(lock, mine, old)], check=False)
        held = _held_by(r.stdout)
    if "TB-UNSAFE" in r.stdout:
        raise RuntimeError(f"{host.name} ({host.inv.describe()}): unsafe lock: {r.stdout.strip()[10:]}")
    if held is not None:
        who = holder_text(held)
        raise LabBusy(
            f"{host.name} ({host.inv.describe()}) is in use by {who}: one run at a time drives a host (two "
            f"would share its ports, interfaces and CPU). Wait for it to end; if that run is gone (its "
            f"controller died), `tunnelbench clean --inventory INVENTORY` on {held.get('controller', 'it')} "
            f"releases the host, or remove {lock} there"
        )


def _release_lab_lock(host: Host, e: dict[str, Any]) -> str | None:
    """The teardown's and `clean`'s undo of a host lock: removed only while it still names this entry's run."""
    lock = PurePosixPath(e["path"])
    if lock.name != LAB_LOCK:
        return None  # not a lock this code made
    text = host.run(["cat", "--", str(lock / "holder")], check=False).stdout.rstrip("\n")
    try:
        holder = json.loads(text) if text else {}
    except ValueError:
        return None
    if not isinstance(holder, dict) or holder.get("run_id") != e.get("run_id"):
        return None  # another run's (ours was refused, or replaced once ours ended)
    script = (
        f'l={quote(lock)}; [ "$(cat -- "$l/holder" 2>/dev/null)" = {shlex.quote(text)} ] && rm -rf -- "$l"'
    )
    host.run(["sh", "-c", script], check=False)
    return f"lock {lock} of run {e.get('run_id')}"


register_undo("ssh_lab_lock", _release_lab_lock)


def kill_script(pid: int, start: int | None, sig: int) -> str:
    """Signal `pid` only if it is still the process started at `start` ticks (PIDs get reused)."""
    if start is None:
        return f"kill -{sig} {pid} 2>/dev/null; true"
    return f's=$({starttime_sh(pid)}) && [ "$s" = {start} ] && kill -{sig} {pid} 2>/dev/null; true'


def remote_stat(host: SshHost, pid: int) -> ProcStat | None:
    r = host.run(stat_argv(pid), check=False)
    return parse_stat(r.stdout) if r.returncode == 0 else None


def remote_alive(host: SshHost, pid: int, start: int | None) -> bool:
    st = remote_stat(host, pid)
    return st is not None and st.state != "Z" and (start is None or st.starttime == start)
