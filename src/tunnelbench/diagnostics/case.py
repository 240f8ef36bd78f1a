"""The diagnostics of one case, started before it measures and finished when its verdict is known."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tunnelbench.diagnostics.cpuprofile import FOLDED, CpuProfile, missing_tools
from tunnelbench.diagnostics.kmsg import KernelLog
from tunnelbench.diagnostics.pcap import RouterCapture
from tunnelbench.lab.host import Host, Process

T = TypeVar("T")

NOTES = "diagnostics.txt"
PCAP = "router.pcap"
KERNEL_LOG = "dmesg.txt"


class CaseDiagnostics:
    """capture: "on-failure" | "always" | "off" (the pcap and the kernel log); profile: take a CPU profile.
    Every part is best effort: what could not run is said in the case's diagnostics.txt."""

    def __init__(
        self,
        adir: Path,
        capture: str,
        packets: int,
        profile: bool,
        router: Host | None,
        client: Host,
        daemons: Callable[[], dict[str, list[Process]]],
        hosts: list[Host],
    ) -> None:
        self.adir = adir
        self.capture = capture
        self.packets = packets
        self.profile = profile
        self.router = router
        self.client = client
        self.daemons = daemons
        self.hosts = hosts
        self.notes: list[str] = []
        self.pcap: RouterCapture | None = None
        self.klog: KernelLog | None = None
        self.cpu: CpuProfile | None = None
        self.kernel_lines: list[str] = []
        self._stopped = False
        self._finished = False

    def start(self) -> None:
        if self.capture != "off":
            if any(h.remote for h in self.hosts):  # /dev/kmsg here is the controller's kernel, not theirs
                self.notes.append("kernel log: not read (SSH hosts: this machine's kernel is not theirs)")
            else:
                self.klog = self._try("kernel log", self._start_klog)
            if self.router is None:
                self.notes.append("pcap: no router of ours on this lab (SSH hosts): not captured")
            else:
                self.pcap = self._try("pcap", self._start_pcap)
        if self.profile:
            why = missing_tools([h for h in self.hosts if h.remote])
            if why:
                self.notes.append(f"CPU profile not taken: {why}")
            else:
                self.cpu = self._try("CPU profile", self._start_cpu)

    def _try(self, what: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except Exception as e:  # a diagnostic never fails the case it watches
            self.notes.append(f"{what}: {type(e).__name__}: {e}"[:400])
            return None

    def _start_klog(self) -> KernelLog:
        k = KernelLog()
        k.start()
        return k

    def _start_pcap(self) -> RouterCapture:
        assert self.router is not None
        c = RouterCapture(self.router, self.adir / PCAP, self.packets)
        c.start()
        return c

    def _start_cpu(self) -> CpuProfile:
        by_name = {h.name: h for h in self.hosts}
        pids = {
            by_name[n]: [p.pid for p in ps if p.alive()] for n, ps in self.daemons().items() if n in by_name
        }
        p = CpuProfile(pids, self.client, f"{self.adir.parent.name}-{self.adir.name}-{id(self):x}")
        p.start()
        return p

    def stop(self) -> None:
        """Stop the capture and the profiler (idempotent): called as soon as the case's measurement ends."""
        if self._stopped:
            return
        self._stopped = True
        for what, part in (("pcap", self.pcap), ("CPU profile", self.cpu)):
            if part is not None:
                self._try(what, part.stop)
        if self.klog is not None:
            lines = self._try("kernel log", self.klog.read) or []
            self.kernel_lines = [str(x) for x in lines]
            if self.klog.lost:
                self.kernel_lines.append(f"({self.klog.lost} records overwritten before they were read)")
            if self.klog.cut:
                self.kernel_lines.append("(cut: more records than kept)")

    def finish(self, failed: bool) -> None:
        """Keep or drop what was captured, by the verdict; fold the profile; write the notes (once)."""
        if self._finished:
            return
        self._finished = True
        self.stop()
        keep = self.capture == "always" or (failed and self.capture == "on-failure")
        if self.pcap is not None:
            if keep:
                self.notes.append(
                    f"pcap: {PCAP}, {self.pcap.summary()}, first {self.packets} packets, headers only"
                )
            else:
                for f in (self.pcap.dest, self.pcap.log):
                    f.unlink(missing_ok=True)
        if keep and self.klog is not None:
            (self.adir / KERNEL_LOG).write_text(
                "\n".join(self.kernel_lines) + ("\n" if self.kernel_lines else "")
            )
            self.notes.append(f"kernel log: {KERNEL_LOG}, {len(self.kernel_lines)} line(s) during the case")
        if (cpu := self.cpu) is not None:
            summary = self._try("CPU profile", lambda: cpu.collect(self.adir / FOLDED))
            if summary:
                self.notes.append(f"{summary}: {FOLDED}")
        if self.notes:
            (self.adir / NOTES).write_text("\n".join(self.notes) + "\n")
