"""Per-process CPU and memory of VPN daemons, sampled in a thread while a case runs.

CPU is reported as % of one core (100 = one core busy), summed over a host's daemon processes; RSS (MiB,
summed the same way) as its peak and its mean over the samples. Both are also stored as series per host
(`daemon_cpu_pct`, `daemon_rss_mb`): memory over time shows a daemon that grows during a case.
Machine-wide CPU is sampled too: a busy machine means the tools or the emulator, not the VPN, may be the
bottleneck. On SSH hosts (`machines`) it is each target's /proc/stat, not the controller's: machine_cpu_pct
is then the busiest target's mean, with one series per target."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from tunnelbench.core.results import Outcome, Series
from tunnelbench.lab.host import Host, Process, PsProcess


@dataclass
class _Track:
    host: str
    proc: PsProcess
    last_cpu: float
    last_t: float


@dataclass
class Monitor:
    # host name -> processes; a callable is asked again at every sample, so daemons that a workload
    # restarts (connect, resilience) are followed to their new PIDs
    daemons: dict[str, list[Process]] | Callable[[], dict[str, list[Process]]]
    interval_s: float = 0.5
    # watchdog: called every sample; a non-None answer is passed to on_unhealthy once (to abort the case)
    health: Callable[[], str | None] | None = None
    on_unhealthy: Callable[[str], object] | None = None
    unhealthy: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _cpu: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    _rss: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    _sys: list[float] = field(default_factory=list)
    _t0: float = 0.0
    _tracks: list[_Track] = field(default_factory=list)
    _cpu_s: dict[str, float] = field(default_factory=dict)  # host -> daemon CPU seconds over the case
    _tracks_started: bool = False  # after __enter__, new daemons are counted from their own start
    _elapsed: float = 0.0  # case wall seconds, set on exit
    # remote Hosts whose machine-wide CPU is sampled instead of this machine's
    machines: list[Host] | None = None
    _mcpu: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    _mlast: dict[str, tuple[int, int]] = field(default_factory=dict)

    def _machine_sample(self, rel: float) -> None:
        """Busy share of all CPUs on each remote machine since the last sample (from /proc/stat)."""
        for h in self.machines or []:
            try:
                f = h.run(["head", "-n1", "/proc/stat"], check=False, timeout=10).stdout.split()
                vals = [int(x) for x in f[1:]]
            except Exception:  # a lost sample is not a failed case
                continue
            if len(vals) < 5:
                continue
            idle, total = vals[3] + vals[4], sum(vals[:8])
            last = self._mlast.get(h.name)
            self._mlast[h.name] = (idle, total)
            if last is not None and total > last[1]:
                busy = 100.0 * (1 - (idle - last[0]) / (total - last[1]))
                self._mcpu.setdefault(h.name, []).append((rel, busy))

    def _track_new(self) -> None:
        daemons = self.daemons() if callable(self.daemons) else self.daemons
        known = {(t.host, t.proc.pid) for t in self._tracks}
        for host, procs in daemons.items():
            for p in procs:
                if (host, p.pid) in known:
                    continue
                try:
                    ps = p.host.ps_process(p.pid)  # psutil locally, /proc over SSH remotely
                    ct = ps.cpu_times()
                    # a daemon born during the case is counted from its start, not from now
                    base = 0.0 if self._tracks_started else ct.user + ct.system
                    self._tracks.append(_Track(host, ps, base, time.monotonic()))
                except psutil.Error:
                    continue

    def __enter__(self) -> Monitor:
        self._t0 = time.monotonic()
        self._track_new()
        self._tracks_started = True
        psutil.cpu_percent(None)  # prime the machine-wide counter
        self._machine_sample(0.0)
        self._thread = threading.Thread(target=self._loop, name="monitor", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        if callable(self.daemons):
            self._track_new()
        now = time.monotonic()
        cpu: dict[str, float] = {}
        rss: dict[str, float] = {}
        for t in self._tracks:
            try:
                ct = t.proc.cpu_times()
                mem = t.proc.memory_info().rss
            except psutil.Error:
                continue
            total = ct.user + ct.system
            dt = now - t.last_t
            self._cpu_s[t.host] = self._cpu_s.get(t.host, 0.0) + (total - t.last_cpu)
            # a few-ms tail reads 0 or 100% at the kernel's tick: it counts in _cpu_s, not as a series point
            if dt >= self.interval_s / 4:
                cpu[t.host] = cpu.get(t.host, 0.0) + 100.0 * (total - t.last_cpu) / dt
            rss[t.host] = rss.get(t.host, 0.0) + mem / 2**20
            t.last_cpu, t.last_t = total, now
        rel = now - self._t0
        for h, v in cpu.items():
            self._cpu.setdefault(h, []).append((rel, v))
        for h, v in rss.items():
            self._rss.setdefault(h, []).append((rel, v))
        if self.machines:
            self._machine_sample(rel)
        else:
            self._sys.append(psutil.cpu_percent(None))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
                if self.health is not None and self.unhealthy is None:
                    why = self.health()
                    if why:
                        self.unhealthy = why
                        if self.on_unhealthy:
                            self.on_unhealthy(why)
            except Exception:  # a lost sample is not a failed case: the case meets a host that stopped
                continue  # answering (SSH) and says so, and this thread must live to its stop

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self._sample()  # closing sample covers the tail of the case
        self._elapsed = time.monotonic() - self._t0

    def add_to(self, out: Outcome) -> None:
        for host in {**self._cpu_s, **self._cpu}:
            # CPU seconds over wall seconds (also for a case shorter than one sampling interval)
            if self._elapsed > 0:
                out.add("daemon_cpu_pct", 100.0 * self._cpu_s.get(host, 0.0) / self._elapsed, host)
            pts = self._cpu.get(host, [])
            if pts:
                out.add("daemon_cpu_peak_pct", max(v for _, v in pts), host)
                out.series.append(Series("daemon_cpu_pct", "%", pts, host))
        for host, pts in self._rss.items():
            if pts:
                out.add("daemon_rss_mb", max(v for _, v in pts), host)
                out.add("daemon_rss_mean_mb", sum(v for _, v in pts) / len(pts), host)
                out.series.append(Series("daemon_rss_mb", "MiB", pts, host))
        if self._sys:
            out.add("machine_cpu_pct", sum(self._sys) / len(self._sys))
        if self._mcpu:
            means = {h: sum(v for _, v in pts) / len(pts) for h, pts in self._mcpu.items() if pts}
            out.add("machine_cpu_pct", max(means.values()))
            for h, pts in self._mcpu.items():
                out.series.append(Series("machine_cpu_pct", "%", pts, h))
