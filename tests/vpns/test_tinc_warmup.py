"""tinc's warm-up check (vpns/tinc.py): a tunnel is warm once every tincd has fixed its path MTU to every other
node, read from the node list tincd logs on SIGUSR2. The reference is tincd's own format string, taken from
the installed binary (so a tinc whose dump changes breaks this test, not the runs), filled in by hand."""

from __future__ import annotations

import re
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

from tunnelbench.vpns.tinc import Tinc, node_pmtu


def dump_format() -> str:
    """The printf format of a node line in tincd's SIGUSR2 dump, as compiled into the installed tincd."""
    tincd = shutil.which("tincd") or "/usr/sbin/tincd"
    m = re.search(rb" %s at %s [ -~]*?pmtu %d \(min %d max %d\)", Path(tincd).read_bytes())
    assert m, f"{tincd}: no node-dump format string (tinc 1.0's dump_nodes)"
    return m.group().decode()


def dump(nodes: dict[str, tuple[int, int, int]], prefix: str = "2026-11-27 12:00:00 tinc.tb1[42]:") -> str:
    """A log with one complete dump: nodes = name -> (pmtu, min, max), each line formatted as tincd does."""
    fmt = dump_format()
    n_fields = fmt.count("%")
    lines = [f"{prefix} Nodes:"]
    for i, (name, (pmtu, lo, hi)) in enumerate(nodes.items()):
        # name, hostname, then the numbers up to the nexthop/via names, then pmtu, min, max
        values: list[object] = [name, f"10.100.{i + 1}.2 port 655"]
        values += [0] * (n_fields - 7) + [name, name, pmtu, lo, hi]
        lines.append(f"{prefix} {fmt % tuple(values)}")
    lines.append(f"{prefix} End of nodes.")
    return "\n".join(lines) + "\n"


def test_the_last_complete_dump_gives_each_nodes_pmtu_bounds():
    first = dump({"h1": (1518, 0, 0), "h2": (1518, 0, 1518), "h3": (1518, 0, 1518)})
    second = dump({"h1": (1518, 0, 0), "h2": (1459, 1459, 1459), "h3": (1518, 1200, 1518)})
    assert node_pmtu(first) == {"h1": (0, 0), "h2": (0, 1518), "h3": (0, 1518)}
    assert node_pmtu(first + second) == {"h1": (0, 0), "h2": (1459, 1459), "h3": (1200, 1518)}
    # a dump still being written (no "End of nodes." yet) is not read as a smaller node list
    torn = second.rsplit("\n", 2)[0] + "\n"
    assert node_pmtu(first + torn) == {}
    assert node_pmtu("tincd started\n") == {}


class FakeProc:
    def __init__(self, pid: int, log: str):
        self.pid, self.log, self.up = pid, log, True

    def alive(self) -> bool:
        return self.up

    def log_text(self) -> str:
        return self.log


class FakeHost:
    def __init__(self, name: str, signals: list[tuple[str, int, int]]):
        self.name, self.signals = name, signals

    def signal(self, pid: int, sig: int) -> None:
        self.signals.append((self.name, pid, sig))


def fake_tinc(logs: dict[str, str]) -> tuple[Tinc, list[tuple[str, int, int]]]:
    signals: list[tuple[str, int, int]] = []
    t = object.__new__(Tinc)  # the check needs the hosts and their daemons only
    t.spec = SimpleNamespace(hosts=[FakeHost(n, signals) for n in logs])  # type: ignore[assignment]
    t.procs = {n: [FakeProc(100 + i, log)] for i, (n, log) in enumerate(logs.items())}  # type: ignore[dict-item]
    return t, signals


def test_warm_once_every_daemon_fixed_the_pmtu_to_every_other_node():
    done = {"h1": (1459, 1459, 1459), "h2": (1459, 1459, 1459), "h3": (1459, 1459, 1459)}
    own = {"h1": (1518, 0, 0)}  # a daemon's own entry: never probed, not counted
    logs = {h: dump({**done, **{h: own["h1"]}}) for h in ("h1", "h2", "h3")}
    t, signals = fake_tinc(logs)
    assert t.warmed_up() is True
    assert sorted(signals) == [
        ("h1", 100, signal.SIGUSR2),
        ("h2", 101, signal.SIGUSR2),
        ("h3", 102, signal.SIGUSR2),
    ]
    # h3 still probing h2 (min 1200 < max 1518): not warm
    logs["h3"] = dump({**done, "h3": own["h1"], "h2": (1518, 1200, 1518)})
    assert fake_tinc(logs)[0].warmed_up() is False
    # h2 has no dump yet, or its daemon died: not warm
    assert fake_tinc({**logs, "h2": "tincd 1.0.36 starting\n"})[0].warmed_up() is False
    t, _ = fake_tinc(logs)
    t.procs["h1"][0].up = False  # type: ignore[attr-defined]
    assert t.warmed_up() is False
