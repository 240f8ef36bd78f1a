"""Known-answer UDP probes for calibration: a sender stamps each datagram with its sequence number and the
send time; the receiver stamps the arrival. Both run on this machine's one clock (the lab's namespaces share
CLOCK_MONOTONIC), so one-way delay is measured directly, without clock sync.

    python -m tunnelbench.impair.probe recv --bind IP --port P --out FILE --idle-s S
    python -m tunnelbench.impair.probe send --to IP --port P --count N --interval-us U [--size B]
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time

HDR = struct.Struct("!IQ")  # seq, send time (ns, CLOCK_MONOTONIC)


def send(to: str, port: int, count: int, interval_us: int, size: int) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    pad = b"\0" * max(0, size - HDR.size)
    t0 = time.monotonic_ns()
    for seq in range(count):
        due = t0 + seq * interval_us * 1000
        while (now := time.monotonic_ns()) < due:
            if due - now > 200_000:
                time.sleep((due - now - 150_000) / 1e9)
        s.sendto(HDR.pack(seq, time.monotonic_ns()) + pad, (to, port))
    return 0


def recv(bind: str, port: int, out: str, idle_s: float, total_s: float) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind((bind, port))
    s.settimeout(total_s)
    got = []
    first = True
    end = time.monotonic() + total_s
    print("ready", flush=True)
    while time.monotonic() < end:
        try:
            data = s.recv(65535)
        except TimeoutError:
            break
        now = time.monotonic_ns()
        if len(data) >= HDR.size:
            seq, sent = HDR.unpack_from(data)
            got.append((seq, sent, now))
        if first:
            s.settimeout(idle_s)  # after the first datagram, stop when the stream has been quiet for idle_s
            first = False
    with open(out, "w") as f:
        for seq, sent, now in got:
            f.write(f"{seq} {sent} {now}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tunnelbench.impair.probe")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--bind", required=True)
    r.add_argument("--port", type=int, default=47001)
    r.add_argument("--out", required=True)
    r.add_argument("--idle-s", type=float, default=2.0)
    r.add_argument("--total-s", type=float, default=120.0)
    t = sub.add_parser("send")
    t.add_argument("--to", required=True)
    t.add_argument("--port", type=int, default=47001)
    t.add_argument("--count", type=int, default=5000)
    t.add_argument("--interval-us", type=int, default=500)
    t.add_argument("--size", type=int, default=64)
    a = ap.parse_args(argv)
    if a.cmd == "send":
        return send(a.to, a.port, a.count, a.interval_us, a.size)
    return recv(a.bind, a.port, a.out, a.idle_s, a.total_s)


if __name__ == "__main__":
    sys.exit(main())
