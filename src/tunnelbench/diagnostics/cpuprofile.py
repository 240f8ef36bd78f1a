"""A CPU profile of the VPN's daemons during one case: `perf record -g` attached to each host's daemon
PIDs (a VPN without daemons, a kernel data path, is profiled system-wide from the client host), then
`perf script` folded by inferno (`inferno-collapse-perf`, crates.io, pinned and built by scripts/setup.sh)
into one line per distinct stack: `host;comm;frame;...;frame samples` (kernel frames end in `_[k]`). The folded text is small and adds up
across repetitions; report/flamegraphs.py renders the sum with `inferno-flamegraph`."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tunnelbench.lab.host import Host, Process

INFERNO_VERSION = "0.12.8"  # scripts/setup.sh builds this version (a test keeps the two equal)
# odd, so the samples do not run in lockstep with a periodic timer; perf's own cost at this rate with call
# graphs is about 1% of a core per profiled CPU
PERF_HZ = 299
FOLDED = "cpu-profile.folded"


def tool(name: str) -> str | None:
    """An inferno binary: on PATH, else in the install cache where setup.sh builds it."""
    found = shutil.which(name)
    if found:
        return found
    cache = Path(os.environ.get("TUNNELBENCH_CACHE", "/var/cache/tunnelbench"))
    p = cache / f"inferno-{INFERNO_VERSION}" / "bin" / name
    return str(p) if p.is_file() else None


def missing_tools(hosts: Iterable[Host] = ()) -> str | None:
    """Why profiles cannot be taken here (None: they can)."""
    if not shutil.which("perf"):
        return "perf is not installed (Debian package linux-perf)"
    for name in ("inferno-collapse-perf", "inferno-flamegraph"):
        if tool(name) is None:
            return f"{name} is not installed (scripts/setup.sh builds inferno {INFERNO_VERSION} with cargo)"
    for h in hosts:
        if h.remote and h.run(["sh", "-c", "command -v perf"], check=False, timeout=20).returncode != 0:
            return f"perf is not installed on {h.name} (Debian package linux-perf)"
    return None


def fold(perf_script: str, prefix: str) -> Counter[str]:
    """`perf script` text -> {folded stack: samples}, each stack under `prefix` (the host)."""
    collapse = tool("inferno-collapse-perf")
    if collapse is None:
        raise RuntimeError("inferno-collapse-perf is not installed")
    out = subprocess.run(
        [collapse, "--kernel"], input=perf_script, capture_output=True, text=True, timeout=120, check=True
    )
    return parse_folded(out.stdout, prefix)


# a sample's first line in `perf script`: the thread's comm (padded, may hold spaces), then pid/tid
_SAMPLE_HEAD = re.compile(r"^(?P<comm>\S.*?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s")


def name_threads(perf_script: str, names: dict[int, str]) -> str:
    """Each sample of a process in `names` (pid -> its name) carries that name, whatever comm perf gave
    its thread. perf names a thread from the FORK/COMM records it saw; a thread the daemon made while perf
    was attaching has none and shows as `:<tid>`, and its samples would fall outside the daemon's stacks."""
    if not names:
        return perf_script
    out = []
    for line in perf_script.splitlines(keepends=True):
        m = _SAMPLE_HEAD.match(line)
        if m and int(m["pid"]) in names:
            line = f"{names[int(m['pid'])]} {line[m.start('pid') :]}"
        out.append(line)
    return "".join(out)


def parse_folded(text: str, prefix: str = "") -> Counter[str]:
    stacks: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            stacks[f"{prefix};{stack}" if prefix else stack] += int(n)
    return stacks


def write_folded(stacks: Counter[str], path: Path) -> None:
    path.write_text("".join(f"{s} {n}\n" for s, n in sorted(stacks.items())))


@dataclass
class _Session:
    host: Host
    data: Path  # perf.data on the host
    proc: Process


@dataclass
class CpuProfile:
    """perf on every host that runs a daemon of the VPN (or system-wide on `fallback` when none does)."""

    daemons: dict[Host, list[int]]  # host -> daemon PIDs on it
    fallback: Host  # the client: where a daemon-less VPN is profiled system-wide
    workdir_name: str  # unique per case: the perf.data file names
    sessions: list[_Session] = field(default_factory=list)
    scope: str = ""
    names: dict[Host, dict[int, str]] = field(default_factory=dict)  # host -> daemon pid -> its comm

    def start(self) -> None:
        targets = [(h, ["-p", ",".join(map(str, pids))]) for h, pids in self.daemons.items() if pids]
        self.scope = "the VPN's daemons"
        if not targets:
            targets = [(self.fallback, ["-a"])]
            self.scope = "system-wide (no VPN daemon: the kernel data path, the workload's tools and all)"
        for h, pids in self.daemons.items():
            for pid in pids:
                r = h.run(["cat", f"/proc/{pid}/comm"], check=False, timeout=20)
                if r.returncode == 0 and r.stdout.strip():
                    self.names.setdefault(h, {})[pid] = r.stdout.strip()
        for h, who in targets:
            data = h.workdir / f"{self.workdir_name}.perf.data"
            h.mkdir(data.parent)
            argv = ["perf", "record", "-q", "-F", str(PERF_HZ), "-g", *who, "-o", str(data)]
            proc = h.spawn(argv, label="case-perf", log_path=h.workdir / f"{self.workdir_name}.perf.log")
            self.sessions.append(_Session(h, data, proc))

    def stop(self) -> None:
        for s in self.sessions:
            if s.proc.alive():  # SIGINT: perf record writes its header and ends
                s.host.signal(s.proc.pid, signal.SIGINT)
                s.proc.wait(10)
            s.proc.stop(grace=2)

    def collect(self, dest: Path) -> str:
        """Fold every host's samples into `dest` (removing perf.data); returns a one-line summary."""
        total: Counter[str] = Counter()
        notes = []
        for s in self.sessions:
            try:
                # no period field: each sample then counts 1 in the folded stacks (with it, inferno sums the
                # event periods, nanoseconds of cpu-clock)
                fields = "comm,pid,tid,time,event,ip,sym,dso"
                r = s.host.run(["perf", "script", "-F", fields, "-i", str(s.data)], check=False, timeout=300)
                if r.returncode != 0:
                    notes.append(
                        f"{s.host.name}: perf script failed: {(r.stderr or r.stdout)[-200:].strip()}"
                    )
                    continue
                total += fold(name_threads(r.stdout, self.names.get(s.host, {})), s.host.name)
            finally:
                s.host.run(["rm", "-f", str(s.data), f"{s.data}.old"], check=False, timeout=30)
        write_folded(total, dest)
        n = sum(total.values())
        return "; ".join([f"CPU profile: {n} samples at {PERF_HZ} Hz, {self.scope}", *notes])
