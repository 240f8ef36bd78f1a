"""The streaming workload's source and sink (workload `streaming`), stdlib only, run as a plain script on a
host (copied to an SSH host), so a remote machine needs nothing of tunnelbench:

  source HOST PORT MBPS SIZE DURATION_S
      paced UDP datagrams (sequence number + send time, then padding) to HOST:PORT; prints {"sent": N}.
  sink HOST PORT SECONDS OUT
      receives for up to SECONDS (ends 2 s after the stream stops) and writes {"arrivals": [[seq, send time,
      arrival time], ...]} to OUT."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import sys
import time
from pathlib import Path

HDR = struct.Struct("!Qd")  # sequence number, send time (CLOCK_REALTIME: namespaces share it)


def source(host: str, port: int, mbps: float, size: int, duration: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    gap = size * 8 / (mbps * 1e6)
    n = int(duration / gap)
    pad = bytes(size - HDR.size)
    t0 = time.monotonic() + 0.01
    seq = 0
    while seq < n:  # every ~1 ms send what is due: paced like a media sender, without spinning a core
        due_now = min(n, int((time.monotonic() - t0) / gap) + 1)
        while seq < due_now:
            with contextlib.suppress(OSError):  # a refused datagram is counted as lost at the sink
                s.sendto(HDR.pack(seq, time.time()) + pad, (host, port))
            seq += 1
        time.sleep(0.001)
    print(json.dumps({"sent": n}))


def sink(host: str, port: int, seconds: float, out: str) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind((host, port))
    s.settimeout(0.2)
    arrivals = []
    end = time.monotonic() + seconds
    started, last = False, time.monotonic()
    while time.monotonic() < end:
        try:
            data = s.recv(65535)
        except TimeoutError:
            if started and time.monotonic() > last + 2.0:  # the stream ended a while ago
                break
            continue
        now = time.time()
        last = time.monotonic()
        started = True
        if len(data) >= HDR.size:
            seq, ts = HDR.unpack_from(data)
            arrivals.append((seq, ts, now))
    Path(out).write_text(json.dumps({"arrivals": arrivals}))


if __name__ == "__main__":
    if sys.argv[1] == "source":
        source(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))
    else:
        sink(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
