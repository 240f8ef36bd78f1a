"""Marker messages for the plaintext leak check (stdlib only, so it also runs as a copied script on an SSH
host). A stream is `proto:size:HEX`: `size` bytes of the marker HEX repeated; one TCP connection or one
UDP datagram carries one message.

    python3 leak_peer.py recv --bind IP --port P STREAM...
    python3 leak_peer.py send --to IP --port P --count N STREAM...

recv prints "ready" once bound and, at exit, one JSON line {"tcp:64": messages received intact, ...}; it
exits by itself once every stream has --count messages, or on SIGTERM / after --total-s."""

from __future__ import annotations

import argparse
import json
import selectors
import signal
import socket
import sys
import time
from typing import cast


def payload(marker: bytes, size: int) -> bytes:
    return (marker * (size // len(marker) + 1))[:size]


def parse_streams(specs: list[str]) -> dict[str, bytes]:
    """{"tcp:64": the exact message bytes}."""
    out = {}
    for s in specs:
        proto, size, hexm = s.split(":")
        out[f"{proto}:{size}"] = payload(bytes.fromhex(hexm), int(size))
    return out


def family(ip: str) -> socket.AddressFamily:
    """IPv6 for an IPv6 tunnel address (yggdrasil's 200::/7), else IPv4."""
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def recv(bind: str, port: int, streams: dict[str, bytes], count: int, total_s: float) -> int:
    got = dict.fromkeys(streams, 0)
    by_msg = {(k.split(":")[0], m): k for k, m in streams.items()}

    def seen(proto: str, data: bytes) -> None:
        k = by_msg.get((proto, data))
        if k is not None:  # only an intact message counts as delivered
            got[k] += 1

    def term(*_: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, term)
    sel = selectors.DefaultSelector()
    lst = socket.create_server((bind, port), family=family(bind), backlog=64)
    udp = socket.socket(family(bind), socket.SOCK_DGRAM)
    udp.bind((bind, port))
    for s in (lst, udp):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    bufs: dict[socket.socket, bytearray] = {}
    print("ready", flush=True)
    end = time.monotonic() + total_s
    try:
        while time.monotonic() < end and any(n < count for n in got.values()):
            for key, _ in sel.select(timeout=0.2):
                s = cast(socket.socket, key.fileobj)  # only sockets are registered
                if s is lst:
                    c, _ = lst.accept()
                    c.setblocking(False)
                    bufs[c] = bytearray()
                    sel.register(c, selectors.EVENT_READ)
                elif s is udp:
                    seen("udp", udp.recv(65535))
                else:
                    chunk = s.recv(65536)
                    if chunk:
                        bufs[s] += chunk
                    else:  # the sender shut down its side: the message is complete
                        seen("tcp", bytes(bufs.pop(s)))
                        sel.unregister(s)
                        s.close()
    finally:
        print(json.dumps(got), flush=True)
    return 0


def send(to: str, port: int, streams: dict[str, bytes], count: int, timeout: float) -> int:
    udp = socket.socket(family(to), socket.SOCK_DGRAM)
    for k, msg in streams.items():
        proto = k.split(":")[0]
        for _ in range(count):
            if proto == "udp":
                udp.sendto(msg, (to, port))
                time.sleep(0.002)  # paced: a burst must not overflow a VPN's queue (delivery is the control)
                continue
            try:
                with socket.create_connection((to, port), timeout=timeout) as c:
                    c.sendall(msg)
                    c.shutdown(socket.SHUT_WR)
                    c.recv(1)  # the receiver closes once it has read the whole message
            except OSError as e:
                print(f"{k}: {e}", file=sys.stderr)
                break  # a dead tunnel: do not wait out every connection
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tunnelbench.instruments.leak_peer")
    ap.add_argument("cmd", choices=("recv", "send"))
    ap.add_argument("streams", nargs="+", help="proto:size:HEX")
    ap.add_argument("--bind")
    ap.add_argument("--to")
    ap.add_argument("--port", type=int, default=47031)
    ap.add_argument("--count", type=int, default=5)
    ap.add_argument("--total-s", type=float, default=60.0)
    ap.add_argument("--timeout-s", type=float, default=2.0, help="send: TCP connect/read timeout")
    a = ap.parse_args(argv)
    streams = parse_streams(a.streams)
    if a.cmd == "recv":
        return recv(a.bind, a.port, streams, a.count, a.total_s)
    return send(a.to, a.port, streams, a.count, a.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
