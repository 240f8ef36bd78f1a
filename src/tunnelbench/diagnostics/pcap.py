"""A bounded underlay capture of one case on the router: the first N packets (tcpdump -c N), headers only
(-s SNAPLEN), on every router interface. Bounded by count, not by time, so a capture costs CPU only for
the case's first packets (the handshake, the first window of a transfer: where a broken path shows) and
never competes with the VPN for the rest of a bulk transfer."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from tunnelbench.lab.host import Host, Process

SNAPLEN = 128  # outer IP/UDP/TCP headers and the VPN's own header; not the payload
STATS = re.compile(r"(\d+) packets? (captured|received by filter|dropped by kernel)")
START_TIMEOUT_S = 10.0


class RouterCapture:
    def __init__(self, router: Host, dest: Path, packets: int) -> None:
        self.router = router
        self.dest = dest  # the local file (the case's artifact folder)
        # where tcpdump writes: there directly for a namespace router; a remote router's work folder, the
        # file copied back when the capture stops
        self.written = router.workdir / "pcap" / dest.name if router.remote else dest
        self.log = dest.with_suffix(".log")
        self.packets = packets
        self.proc: Process | None = None
        self.stats: dict[str, int] = {}

    def start(self) -> None:
        argv = ["tcpdump", "-n", "-i", "any", "-s", str(SNAPLEN), "-c", str(self.packets), "-U",
                "--immediate-mode", "-Z", "root", "-w", str(self.written)]  # fmt: skip
        if self.router.remote:
            self.router.mkdir(self.written.parent)
        # --immediate-mode: without it libpcap hands packets over in blocks, after a 1 s timeout, and a case
        # shorter than that ends with its packets still in the kernel's ring (seen: 0 of a ping case's).
        # -Z root: Debian's tcpdump would otherwise drop to user tcpdump, who cannot write the case folder.
        self.proc = self.router.spawn(argv, label="case-pcap", log_path=self.log)
        end = time.monotonic() + START_TIMEOUT_S
        while "listening on" not in self.proc.log_tail(2000):
            if not self.proc.alive() or time.monotonic() > end:
                why = self.proc.log_tail(300).strip() or "no output"
                self.proc.stop(grace=1)
                raise RuntimeError(f"tcpdump on the router did not start: {why}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.alive():  # it ends by itself after N packets; else SIGINT makes it flush and count
            self.router.signal(self.proc.pid, signal.SIGINT)
            self.proc.wait(5)
        self.proc.stop(grace=2)
        self.stats = {what: int(n) for n, what in STATS.findall(self.proc.log_tail(4000))}
        self.proc = None
        if self.router.remote and self.router.exists(self.written):
            self.dest.write_bytes(self.router.read_file(self.written))
            self.router.remove(self.written)

    def summary(self) -> str:
        got = self.stats.get("captured")
        full = " (the bound: later packets not captured)" if got is not None and got >= self.packets else ""
        return f"{got if got is not None else '?'} packets captured{full}"
