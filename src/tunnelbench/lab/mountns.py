"""Private mount namespaces for daemons that hard-code paths under /run or /var/lib (strongSwan's charon
writes /run/charon.pid; SoftEther keeps /var/lib/softether, /var/log/softether and /run/softether).

Two such daemons in two network namespaces would share those directories (a network namespace does
not separate files). `private_mounts()` wraps a daemon's argv so it runs in its own mount namespace
(`unshare -m --propagation private`) where each listed directory has a per-host directory from the run
folder bind-mounted over it. The mounts exist only inside that mount namespace, which the kernel
destroys with its last process: stopping the daemon (its PID is journaled like every other daemon's,
because `sh` execs it) is the whole cleanup, and nothing is ever mounted in the root mount namespace.
`in_mounts_of()` runs a command inside a daemon's mount namespace (`nsenter -m`), e.g. its control CLI."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path


def private_mounts(binds: Mapping[str, Path], argv: Sequence[str]) -> list[str]:
    """argv that runs `argv` with each `binds` target (e.g. "/run") replaced by its source directory."""
    steps = [
        f"mkdir -p {shlex.quote(t)} && mount --bind {shlex.quote(str(s))} {shlex.quote(t)}"
        for t, s in binds.items()
    ]
    script = " && ".join([*steps, 'exec "$@"'])
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "tb-mountns", *argv]


def in_mounts_of(pid: int, argv: Sequence[str]) -> list[str]:
    """argv that runs `argv` in the mount namespace of process `pid` (the network namespace is the
    caller's: run it through the same host)."""
    return ["nsenter", "-t", str(pid), "-m", "--", *argv]
