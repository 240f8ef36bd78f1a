"""The kernel's log lines of one case, read from /dev/kmsg (one record per read, positioned at the end of
the ring when the case starts, so only what the kernel logged during the case is read: no dmesg diffing
that a wrapped ring would break)."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

KMSG = "/dev/kmsg"
MAX_RECORDS = 2000  # a flood (e.g. a conntrack table full every packet) is cut here, and said so


@dataclass(frozen=True)
class KernelLine:
    t_s: float  # seconds since boot, as dmesg prints them
    level: int  # syslog priority 0 (emerg) .. 7 (debug)
    text: str

    def __str__(self) -> str:
        return f"[{self.t_s:12.6f}] <{self.level}> {self.text}"


def parse_record(raw: bytes) -> KernelLine | None:
    """One /dev/kmsg record: 'PRI,SEQ,TS_USEC,FLAGS[,...];MESSAGE\\n[ continuation lines]'."""
    head, sep, rest = raw.decode(errors="replace").partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3:
        return None
    try:
        pri, ts = int(fields[0]), int(fields[2])
    except ValueError:
        return None
    return KernelLine(ts / 1e6, pri & 7, rest.split("\n", 1)[0])


class KernelLog:
    """Opened at the case's start, read at its end."""

    def __init__(self, path: str = KMSG) -> None:
        self.path = path
        self.fd: int | None = None
        self.lost = 0  # records the ring overwrote before we read them
        self.cut = False

    def start(self) -> None:
        self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)

    def read(self) -> list[KernelLine]:
        if self.fd is None:
            return []
        out: list[KernelLine] = []
        try:
            while len(out) < MAX_RECORDS:
                try:
                    raw = os.read(self.fd, 8192)
                except BlockingIOError:
                    break
                except OSError as e:
                    if e.errno == errno.EPIPE:  # overwritten while we read: the next read goes on
                        self.lost += 1
                        continue
                    raise
                if not raw:
                    break
                line = parse_record(raw)
                if line is not None:
                    out.append(line)
            else:
                self.cut = True
        finally:
            os.close(self.fd)
            self.fd = None
        return out
