"""Known-answer UDP probes for calibration: a sender stamps each datagram with its sequence number and the
send time; the kernel stamps the arrival (SO_TIMESTAMPNS, so the receiver's own scheduling delay does not
count). Both run on this machine's one clock (CLOCK_REALTIME, shared by the lab's namespaces), so one-way
delay is measured directly, without clock sync.

    python -m tunnelbench.impair.probe recv --bind IP --port P --out FILE --idle-s S
    python -m tunnelbench.impair.probe send --to IP --port P --count N --interval-us U [--size B]
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import struct
import sys
import time

HDR = struct.Struct("!IQ")  # seq, send time (ns, CLOCK_REALTIME)
TS = struct.Struct("@qq")  # struct timespec
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux values; Python does not export them
SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
OVFL = struct.Struct("@I")


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
        s.sendto(HDR.pack(seq, time.time_ns()) + pad, (to, port))
    return 0


def recv(bind: str, port: int, out: str, idle_s: float, total_s: float) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # a big buffer regardless of rmem_max (root), so a descheduled receiver does not lose probes; any
    # socket-level drop is still counted (SO_RXQ_OVFL) and reported, so it is never blamed on the path
    try:
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
    except PermissionError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
    s.bind((bind, port))
    got: list[tuple[int, int, int]] = []
    overflow = [0]
    # SIGTERM (from the caller once its sender is done: nothing more can come) ends the wait early; what
    # arrived is written either way
    signal.signal(signal.SIGTERM, _terminated)
    print("ready", flush=True)
    with contextlib.suppress(_Terminated):
        _receive(s, got, overflow, idle_s, total_s)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(out, "w") as f:
        f.write(f"# socket_drops {overflow[0]}\n")
        for seq, sent, now in got:
            f.write(f"{seq} {sent} {now}\n")
    return 0


class _Terminated(Exception):
    pass


def _terminated(signum: int, frame: object) -> None:
    raise _Terminated


def _receive(
    s: socket.socket, got: list[tuple[int, int, int]], overflow: list[int], idle_s: float, total_s: float
) -> None:
    s.settimeout(total_s)
    end = time.monotonic() + total_s
    first = True
    while time.monotonic() < end:
        try:
            data, anc, _, _ = s.recvmsg(65535, socket.CMSG_SPACE(TS.size) + socket.CMSG_SPACE(OVFL.size))
        except TimeoutError:
            break
        now = time.time_ns()
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = TS.unpack(payload[: TS.size])
                now = sec * 1_000_000_000 + nsec
            elif level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL:
                overflow[0] = OVFL.unpack(payload[: OVFL.size])[0]
        if len(data) >= HDR.size:
            seq, sent = HDR.unpack_from(data)
            got.append((seq, sent, now))
        if first:
            s.settimeout(idle_s)  # after the first datagram, stop when the stream has been quiet for idle_s
            # and count the cap from here: a sender that takes seconds to start (Python under the kernel
            # lane's emulated CPU, a small board over SSH) must not have the tail of its stream cut off and
            # counted as lost (seen under TCG: 38% "loss" for 5%, 100% over SSH)
            end = time.monotonic() + total_s
            first = False


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
