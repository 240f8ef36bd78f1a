"""The SSH transport under the SSH lab's hosts: one asyncio event loop thread that the synchronous Host API
waits on with bounded timeouts, and the persistent command channel (a few long-lived POSIX sh "command
servers" per host, one SSH session each, nothing installed on the target)."""

from __future__ import annotations

import asyncio
import shlex
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import PurePath
from typing import Any, TypeVar

T = TypeVar("T")


class SshError(RuntimeError):
    pass


# -- the event loop thread ---------------------------------------------------------------------------
class EventLoop:
    _inst: EventLoop | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="tunnelbench-ssh", daemon=True)
        self.thread.start()

    @classmethod
    def get(cls) -> EventLoop:
        with cls._lock:
            if cls._inst is None:
                cls._inst = EventLoop()
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


def env_argv(argv: Sequence[str], env: dict[str, str] | None) -> list[str]:
    return ["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else list(argv)


def quote(p: PurePath | str) -> str:
    return shlex.quote(str(p))


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
# command. Large stdin (> CHANNEL_MAX_INPUT) and a host without base64/mktemp use one session per command.
CHANNEL_SERVER = r"""
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
CHANNELS_PER_HOST = 6  # command servers per host
CHANNEL_MAX_INPUT = 48 * 1024  # stdin up to this goes through the channel (sh `read` is bytewise)


class Channel:
    def __init__(self, proc: Any):
        self.proc = proc
