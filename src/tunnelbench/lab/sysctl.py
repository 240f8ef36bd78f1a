"""Host TCP stack knobs: set, read back and restore sysctls in every lab host.

Only network sysctls (`net.*`) are per network namespace, so only they can differ between the hosts of a
namespace lab; some `net.*` keys are global all the same (net.core.rmem_max, wmem_max, ...: read-only in
a child namespace) or absent there (net.ipv4.tcp_mem): `check` refuses both before anything is set.

Keys are dotted (`net.ipv4.tcp_reordering`) and live at /proc/sys/net/ipv4/tcp_reordering. Values are
strings as the kernel prints them, whitespace collapsed to one space ("4096 131072 6291456").

Typical use (a run with tunings):

    check(hosts, keys)                       # at run start: every key exists and is writable here
    previous = snapshot(hosts, values)       # what to put back afterwards
    effective = apply(hosts, values)         # {host: {key: value read back}}
    ... measure ...
    restore(hosts, previous)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from tunnelbench.lab.host import Host

# recorded with every run (set or not), next to every key a tuning sets
RECORDED = (
    "net.ipv4.tcp_congestion_control",
    "net.ipv4.tcp_reordering",
    "net.ipv4.tcp_max_reordering",
    "net.ipv4.tcp_recovery",
    "net.ipv4.tcp_early_retrans",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_sack",
    "net.ipv4.tcp_timestamps",
    "net.core.rmem_max",
    "net.core.wmem_max",
)

MISSING = "<missing>"  # snapshot value of a key the host does not have

_CHECK = 'for f; do if [ ! -e "$f" ]; then echo "missing $f"; elif [ ! -w "$f" ]; then echo "readonly $f"; fi; done'
_WRITE = 'while [ $# -gt 1 ]; do printf "%s\\n" "$2" > "$1" || exit 1; shift 2; done'


class SysctlError(RuntimeError):
    pass


def path_of(key: str) -> str:
    return "/proc/sys/" + key.replace(".", "/")


def key_of(path: str) -> str:
    return path.removeprefix("/proc/sys/").replace("/", ".")


def recorded_keys(extra: Iterable[str] = ()) -> list[str]:
    """The fixed list plus `extra` (every key any tuning sets), in order, without repeats."""
    return list(dict.fromkeys([*RECORDED, *extra]))


T = TypeVar("T")


def _each(hosts: Sequence[Host], fn: Callable[[Host], T]) -> list[T]:
    """fn(host) for every host, a few at a time (a many-client lab has hundreds); results in host order."""
    if len(hosts) <= 1:
        return [fn(h) for h in hosts]
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        return list(pool.map(fn, hosts))


def check(hosts: Sequence[Host], keys: Iterable[str]) -> None:
    """Raise SysctlError unless every key exists and is writable in every host's network namespace."""
    keys = list(dict.fromkeys(keys))
    if not keys:
        return

    def one(h: Host) -> list[str]:
        out = h.run(["sh", "-c", _CHECK, "sh", *map(path_of, keys)]).stdout.split("\n")
        return [f"{h.name}: {line}" for line in out if line]

    bad: dict[str, str] = {}
    for lines in _each(hosts, one):
        for line in lines:
            host, rest = line.split(": ", 1)
            what, path = rest.split(" ", 1)
            bad.setdefault(key_of(path), f"{what} on {host}")
    if bad:
        why = {
            "missing": "no such sysctl in the host's network namespace (unknown, or not per namespace)",
            "readonly": "read-only in the host's network namespace (a global sysctl: set it on the machine)",
        }
        raise SysctlError(
            "cannot set these sysctls in the lab hosts:\n  "
            + "\n  ".join(f"{k}: {why[v.split(' ', 1)[0]]} ({v})" for k, v in bad.items())
        )


CC_KEY = "net.ipv4.tcp_congestion_control"
CC_ALLOWED = "net.ipv4.tcp_allowed_congestion_control"


def check_values(hosts: Sequence[Host], tunings: Mapping[str, Mapping[str, str]]) -> None:
    """Refuse values the namespaces will not take. A congestion control outside the machine-wide
    tcp_allowed_congestion_control cannot be chosen in a non-initial network namespace (the write fails with
    an I/O error), and widening that global list would change the machine, not the lab."""
    wanted = {name: str(v[CC_KEY]) for name, v in tunings.items() if CC_KEY in v}
    if not wanted or not hosts:
        return
    allowed = snapshot(hosts[:1], [CC_ALLOWED])[hosts[0].name][CC_ALLOWED].split()
    bad = {name: cc for name, cc in wanted.items() if cc not in allowed}
    if bad:
        raise SysctlError(
            "; ".join(
                f"tuning {name!r}: {CC_KEY} = {cc!r} cannot be set in a lab namespace"
                for name, cc in bad.items()
            )
            + f" (allowed there: {', '.join(allowed)}; the machine-wide {CC_ALLOWED} decides, and the lab does not "
            "change the machine)"
        )


def snapshot(hosts: Sequence[Host], keys: Iterable[str]) -> dict[str, dict[str, str]]:
    """{host name: {key: value}} read from /proc/sys in each host; MISSING for a key a host does not have."""
    keys = list(dict.fromkeys(keys))

    def one(h: Host) -> dict[str, str]:
        # grep -H prints "path:line" for each file it can read; -s: no complaints about missing ones
        out = h.run(["grep", "-H", "-s", ".", *map(path_of, keys)], check=False).stdout
        got = {}
        for line in out.splitlines():
            path, _, value = line.partition(":")
            got[key_of(path)] = " ".join(value.split())
        return {k: got.get(k, MISSING) for k in keys}

    return dict(zip([h.name for h in hosts], _each(hosts, one), strict=True))


def _write(hosts: Sequence[Host], per_host: Mapping[str, Mapping[str, str]]) -> None:
    def one(h: Host) -> None:
        values = per_host.get(h.name, {})
        if not values:
            return
        args = [x for k, v in values.items() for x in (path_of(k), str(v))]
        res = h.run(["sh", "-c", _WRITE, "sh", *args], check=False)
        if res.returncode != 0:
            raise SysctlError(
                f"{h.name}: cannot set sysctls {dict(values)}: {(res.stderr or res.stdout).strip()}"
            )

    _each(hosts, one)


def apply(hosts: Sequence[Host], values: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Set `values` ({key: value}) in every host; returns {host: {key: value read back}}. Checks every key
    first (nothing is set when one is unknown or read-only). Take a snapshot() first to restore() later."""
    if not values:
        return {h.name: {} for h in hosts}
    check(hosts, values)
    _write(hosts, {h.name: values for h in hosts})
    return snapshot(hosts, values)


def restore(hosts: Sequence[Host], previous: Mapping[str, Mapping[str, str]]) -> None:
    """Put back the values of a snapshot() taken before apply() (keys a host did not have are skipped)."""
    _write(hosts, {name: {k: v for k, v in vals.items() if v != MISSING} for name, vals in previous.items()})
