"""The interference guard: CPU that something outside the lab took from the lab's CPUs while a case ran.

A benchmark on a laptop or a shared CI runner shares its CPUs with whatever else runs there. Interleaving
spreads load that stays over every VPN alike (the numbers all fall, the ranking holds); load that comes and
goes lands on some cases and not others and breaks the ranking. Neither shows in the measurement itself, so
the lab looks at the machine: every process's CPU time from /proc (utime + stime, and the time of children it
reaped, cutime + cstime, so short-lived processes such as a compiler's are counted through their parent), and
the VM's steal time from /proc/stat.

A process is the lab's when it is this process, a descendant of it, lives in one of the lab's network
namespaces (VPN daemons, measuring tools, the impairment engine), or descends from one that does (a pod's
iperf3 lives in the pod's own namespace, made by the CNI plugin; its parent, the containerd shim of a lab
host, lives in the host's); kernel threads are neither (they carry
the lab's own packets), and neither are processes of the idle scheduling class (SCHED_IDLE: they run only on a
CPU that nothing else wants, as a careful user's background build does). Everything else that may run on the
lab's CPUs is "other". A reading is the others'
CPU seconds and the steal over a window, as a share of the lab's CPU capacity (wall seconds x lab CPUs):
100% = every lab CPU taken for the whole window.

The guard samples in a thread (default every second) so a process that ends between two readings still
counts up to its last sample, and the time its parent reaps is not counted twice: a vanished process's last
total is subtracted from its parent's next children-time increase. `mark()` takes a reading now (a case's
start and end); `recent(window)` and `wait_quiet()` read the thread's history (is the machine quiet now?)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

PF_KTHREAD = 0x00200000  # task flag of kernel threads (include/linux/sched.h)
SCHED_IDLE = 5  # a policy that runs only when no other task wants the CPU (sched(7)): it takes nothing
CLK_TCK = os.sysconf("SC_CLK_TCK")
DISTURBED_PCT = 10.0  # default: others + steal at or above this share of the lab's CPUs disturb a case
TOP_N = 3  # processes named in a reading's text


@dataclass(frozen=True)
class Mark:
    """Cumulative counters at one moment (monotonic seconds)."""

    t: float
    other_s: dict[str, float]  # process name -> CPU seconds counted since the guard started
    steal_s: float


@dataclass(frozen=True)
class Reading:
    """What the machine did outside the lab over a window."""

    wall_s: float
    cpus: int  # the lab's CPUs the shares are taken of
    other_s: float  # CPU seconds of processes outside the lab
    steal_s: float  # steal time on the lab's CPUs
    top: tuple[tuple[str, float], ...] = ()  # (process name, CPU seconds), busiest first

    def _pct(self, seconds: float) -> float:
        cap = self.wall_s * self.cpus
        return 100.0 * seconds / cap if cap > 0 else 0.0

    @property
    def other_pct(self) -> float:
        return self._pct(self.other_s)

    @property
    def steal_pct(self) -> float:
        return self._pct(self.steal_s)

    @property
    def taken_pct(self) -> float:
        """The share of the lab's CPU capacity that something outside the lab took."""
        return self.other_pct + self.steal_pct

    def disturbed(self, threshold_pct: float) -> bool:
        return self.taken_pct >= threshold_pct

    def top_pct(self) -> list[tuple[str, float]]:
        return [(name, self._pct(s)) for name, s in self.top]

    def text(self, whose: str = "the lab's") -> str:
        """'others took 48% of the lab's 2 CPUs (stress-ng 47%, chromium 1%); steal 0%' (plain text)."""
        who = ", ".join(f"{n} {p:.0f}%" for n, p in self.top_pct()[:TOP_N] if p >= 1)
        s = f"others took {self.other_pct:.0f}% of {whose} {self.cpus} CPU{'s' if self.cpus != 1 else ''}"
        s += f" ({who})" if who else ""
        if self.steal_s > 0:
            s += f"; steal {self.steal_pct:.0f}%"
        return s

    def to_json(self) -> dict[str, object]:
        return {
            "wall_s": round(self.wall_s, 3),
            "cpus": self.cpus,
            "other_pct": round(self.other_pct, 2),
            "steal_pct": round(self.steal_pct, 2),
            "top": [[n, round(p, 2)] for n, p in self.top_pct()],
        }


def between(m0: Mark, m1: Mark, cpus: int) -> Reading:
    """The reading of the window from m0 to m1."""
    per = {n: s - m0.other_s.get(n, 0.0) for n, s in m1.other_s.items()}
    per = {n: s for n, s in per.items() if s > 0}
    top = tuple(sorted(per.items(), key=lambda kv: -kv[1]))
    return Reading(max(m1.t - m0.t, 0.0), cpus, sum(per.values()), max(m1.steal_s - m0.steal_s, 0.0), top)


@dataclass
class _Proc:
    name: str
    ppid: int
    own: int  # utime + stime, ticks
    children: int  # cutime + cstime, ticks
    lab: bool
    allowed: bool  # may run on a lab CPU
    seen: int = 1


@dataclass
class _Stat:
    pid: int
    name: str
    ppid: int
    flags: int
    own: int
    children: int
    start: int
    policy: int = 0


def parse_stat(pid: int, line: str) -> _Stat | None:
    """The fields the guard needs from one /proc/PID/stat line (comm may hold spaces and parentheses)."""
    open_, close = line.find("("), line.rfind(")")
    if open_ < 0 or close < 0:
        return None
    f = line[close + 2 :].split()
    try:
        return _Stat(
            pid,
            line[open_ + 1 : close],
            int(f[1]),  # field 4: ppid
            int(f[6]),  # field 9: flags
            int(f[11]) + int(f[12]),  # fields 14, 15: utime, stime
            int(f[13]) + int(f[14]),  # fields 16, 17: cutime, cstime
            int(f[19]),  # field 22: starttime
            int(f[38]) if len(f) > 38 else 0,  # field 41: policy
        )
    except (IndexError, ValueError):
        return None


def cpu_set(text: str) -> set[int]:
    """'0-2,5' -> {0, 1, 2, 5}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        elif part:
            out.add(int(part))
    return out


@dataclass
class Guard:
    """Samples the machine's processes and steal time; see the module's docstring.

    lab_netns: the lab's network namespace names now (read at every sample: a rebuilt lab has new ones);
    cpus: the lab's CPUs (None: every CPU of this process's affinity); proc: the /proc to read (a test's
    hand-made tree); own_pid: the process whose descendants are the lab's."""

    lab_netns: Callable[[], Iterable[str]] = lambda: ()
    cpus: Iterable[int] | None = None
    interval_s: float = 1.0
    proc: Path = Path("/proc")
    netns_dir: Path = Path("/run/netns")
    own_pid: int = field(default_factory=os.getpid)
    clock: Callable[[], float] = time.monotonic
    history_s: float = 120.0  # how far back `recent` can look
    _procs: dict[tuple[int, int], _Proc] = field(default_factory=dict)
    _other: dict[str, float] = field(default_factory=dict)
    _steal0: int | None = None
    _steal: int = 0
    _history: list[Mark] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _recheck: bool = False

    def __post_init__(self) -> None:
        self.lab_cpus: set[int] = set(self.cpus) if self.cpus is not None else set(os.sched_getaffinity(0))
        self._all_cpus = self.lab_cpus >= self._online_cpus()

    def set_cpus(self, cpus: Iterable[int]) -> None:
        """The lab's CPUs from now on (its CPU placement)."""
        with self._lock:
            self.lab_cpus = set(cpus)
            self._all_cpus = self.lab_cpus >= self._online_cpus()
            for p in self._procs.values():  # affinity is read again for every process
                p.allowed = True
            self._recheck = True

    # -- the thread ---------------------------------------------------------------------------------
    def start(self) -> Guard:
        self.mark()
        self._thread = threading.Thread(target=self._loop, name="interference", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.mark()
            except OSError:  # a lost sample is not a failed run
                continue

    # -- readings -----------------------------------------------------------------------------------
    def mark(self) -> Mark:
        """Sample now and return the cumulative counters."""
        with self._lock:
            self._sample()
            m = Mark(self.clock(), dict(self._other), self._steal / CLK_TCK)
            self._history.append(m)
            cut = m.t - self.history_s
            while len(self._history) > 2 and self._history[0].t < cut:
                self._history.pop(0)
            return m

    def between(self, m0: Mark, m1: Mark) -> Reading:
        return between(m0, m1, len(self.lab_cpus))

    def recent(self, window_s: float) -> Reading | None:
        """The reading over about the last `window_s` of the thread's samples (None: too few yet)."""
        with self._lock:
            hist = list(self._history)
        if len(hist) < 2:
            return None
        last = hist[-1]
        first = next((m for m in reversed(hist[:-1]) if last.t - m.t >= window_s), hist[0])
        return self.between(first, last)

    def wait_quiet(
        self,
        threshold_pct: float,
        max_wait_s: float,
        window_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> tuple[bool, float]:
        """Wait until a window of `window_s` is below the threshold, at most `max_wait_s`: (quiet, seconds waited)."""
        t0 = self.clock()
        m0 = self.mark()
        while True:
            sleep(window_s)
            m1 = self.mark()
            if not self.between(m0, m1).disturbed(threshold_pct):
                return True, self.clock() - t0
            if self.clock() - t0 >= max_wait_s:
                return False, self.clock() - t0
            m0 = m1

    # -- one sample ---------------------------------------------------------------------------------
    def _online_cpus(self) -> set[int]:
        try:
            return cpu_set((self.proc / "../sys/devices/system/cpu/online").read_text())
        except OSError:
            return set(self.lab_cpus)

    def _read_steal(self) -> int:
        total = 0
        try:
            lines = (self.proc / "stat").read_text().splitlines()
        except OSError:
            return self._steal
        for line in lines:
            f = line.split()
            if not f or not f[0].startswith("cpu") or f[0] == "cpu":
                continue
            if int(f[0][3:]) in self.lab_cpus and len(f) > 8:
                total += int(f[8])  # user nice system idle iowait irq softirq steal
        return total

    def _netns_inodes(self) -> set[str]:
        out = set()
        for name in self.lab_netns():
            try:
                out.add(f"net:[{(self.netns_dir / name).stat().st_ino}]")
            except OSError:
                continue
        return out

    def _allowed(self, pid: int) -> bool:
        if self._all_cpus:
            return True
        try:
            for line in (self.proc / str(pid) / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    return bool(cpu_set(line.split(":", 1)[1]) & self.lab_cpus)
        except OSError:
            return False
        return True

    def _sample(self) -> None:
        steal = self._read_steal()
        if self._steal0 is None:
            self._steal0 = steal
        self._steal = steal - self._steal0
        stats: dict[int, _Stat] = {}
        for d in os.listdir(self.proc):
            if not d.isdigit():
                continue
            try:
                st = parse_stat(int(d), (self.proc / d / "stat").read_text())
            except OSError:
                continue
            # kernel threads carry the lab's own packets; an idle-class process runs only on a CPU nothing
            # else wants (a careful user's background job): neither takes the lab's CPU
            if st is not None and not st.flags & PF_KTHREAD and st.policy != SCHED_IDLE:
                stats[st.pid] = st
        first = not self._procs and not self._other
        inodes = self._netns_inodes()
        ppid = {p: s.ppid for p, s in stats.items()}

        key_of = {p: (p, s.start) for p, s in stats.items()}
        alone: dict[int, bool] = {}  # the lab's by itself: this process, or one in a lab namespace
        for p in stats:
            old = self._procs.get(key_of[p])
            lab = p == self.own_pid
            if not lab and (old is None or old.seen < 3 or old.lab):  # a process settles in its netns early
                try:
                    lab = os.readlink(self.proc / str(p) / "ns" / "net") in inodes
                except OSError:
                    lab = False
            elif not lab and old is not None:
                lab = old.lab
            alone[p] = lab

        def inherits(pid: int) -> bool:
            for _ in range(64):  # a bounded walk up the tree: this process's and a lab process's descendants
                if alone.get(pid, False):
                    return True
                if pid <= 1 or pid not in ppid:
                    return False
                pid = ppid[pid]
            return False

        now: dict[tuple[int, int], _Proc] = {}
        for p, s in stats.items():
            key = key_of[p]
            old = self._procs.get(key)
            lab = inherits(p)
            allowed = old.allowed if old is not None and not self._recheck else self._allowed(p)
            # the highest totals seen: a zombie's stat shows less than the process used (its threads' time
            # is gone with them), and the parent's reaped time is its whole total
            own, kids = (max(s.own, old.own), max(s.children, old.children)) if old else (s.own, s.children)
            now[key] = _Proc(s.name, s.ppid, own, kids, lab, allowed, (old.seen + 1) if old else 1)
        # a vanished process's whole time reaches its parent's children time when it is reaped: not again.
        # Its whole time includes what it reaped itself since its last sample (a subshell that reaped a
        # pytest, then ended too): credits flow up through processes that vanished in the same window
        gone = {old_key[0]: old for old_key, old in self._procs.items() if old_key not in now}
        kids_of: dict[int, list[int]] = {}
        for pid, old in gone.items():
            kids_of.setdefault(old.ppid, []).append(pid)

        def credit(pid: int, depth: int = 0) -> int:
            old = gone[pid]
            below = sum(credit(c, depth + 1) for c in kids_of.get(pid, ()) if depth < 64)
            return old.own + old.children + below

        reaped: dict[int, int] = {}
        for pid, old in gone.items():
            if old.ppid not in gone:
                reaped[old.ppid] = reaped.get(old.ppid, 0) + credit(pid)
        for key, cur in now.items():
            old = self._procs.get(key)
            if cur.lab or not cur.allowed:
                continue
            if old is None:
                # born since the last sample: all its time is new; on the first sample, nothing is
                ticks = 0 if first else cur.own + cur.children
            else:
                kids = cur.children - old.children - reaped.get(key[0], 0)
                ticks = (cur.own - old.own) + max(kids, 0)
            if ticks > 0:
                self._other[cur.name] = self._other.get(cur.name, 0.0) + ticks / CLK_TCK
        self._procs = now
        self._recheck = False


def quick_reading(
    seconds: float = 1.0, lab_netns: Iterable[str] = (), cpus: Iterable[int] | None = None
) -> Reading:
    """What else takes this machine's CPUs right now, over `seconds` (before a run; `doctor`)."""
    names = list(lab_netns)
    g = Guard(lambda: names, cpus)
    m0 = g.mark()
    time.sleep(seconds)
    return g.between(m0, g.mark())
