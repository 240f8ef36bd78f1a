#!/usr/bin/env python3
"""UDP GSO (UDP_SEGMENT) probe for impaird's per-wire decisions.

  udp_gso.py recv HOST PORT OUT.json [--ready FILE] [--idle 1.0]
  udp_gso.py send HOST PORT SENDS SEGS SEG_SIZE [--gap-us 200]

The sender hands the kernel SENDS super-datagrams of SEGS datagrams of
SEG_SIZE bytes each in one sendto (UDP_SEGMENT), as wireguard-go and tailscale
do; every datagram carries (send number, index, size) and a pattern. The
receiver counts datagrams and checks each one's size and bytes, so a wrongly
cut segment or a corrupted one shows up as bad, a lost one as missing.
"""

import json
import socket
import struct
import sys
import time

UDP_SEGMENT = 103
HDR = struct.Struct("!IHH")


def payload(send: int, idx: int, size: int) -> bytes:
    body = bytes((send + idx + i) & 0xFF for i in range(size - HDR.size))
    return HDR.pack(send, idx, size) + body


def send(host: str, port: int, sends: int, segs: int, size: int, gap_us: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    s.setsockopt(socket.IPPROTO_UDP, UDP_SEGMENT, size)
    s.connect((host, port))
    for n in range(sends):
        buf = b"".join(payload(n, i, size) for i in range(segs))
        s.send(buf)
        if gap_us:
            time.sleep(gap_us / 1e6)
    s.close()
    print(json.dumps({"sent": sends * segs, "sends": sends, "segs": segs, "size": size}))


def recv(host: str, port: int, out: str, ready: str | None, idle: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:  # root: past net.core.rmem_max, so that a slow receiver does not drop
        s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
    s.bind((host, port))
    if ready:
        open(ready, "w").close()
    s.settimeout(30)
    got = 0
    bad = 0
    seen: set[tuple[int, int]] = set()
    dups = 0
    sizes: dict[int, int] = {}
    while True:
        try:
            d = s.recv(65536)
        except socket.timeout:
            break
        s.settimeout(idle)
        got += 1
        sizes[len(d)] = sizes.get(len(d), 0) + 1
        if len(d) < HDR.size:
            bad += 1
            continue
        n, i, size = HDR.unpack_from(d)
        if len(d) != size or d != payload(n, i, size):
            bad += 1
            continue
        if (n, i) in seen:
            dups += 1
        seen.add((n, i))
    json.dump({"received": got, "distinct": len(seen), "bad": bad, "duplicates": dups, "sizes": sizes}, open(out, "w"))


def main() -> None:
    a = sys.argv[1:]
    opt = {}
    pos = []
    while a:
        x = a.pop(0)
        if x.startswith("--"):
            opt[x[2:]] = a.pop(0)
        else:
            pos.append(x)
    if pos[0] == "send":
        send(pos[1], int(pos[2]), int(pos[3]), int(pos[4]), int(pos[5]), float(opt.get("gap-us", 200)))
    else:
        recv(pos[1], int(pos[2]), pos[3], opt.get("ready"), float(opt.get("idle", 1.0)))


if __name__ == "__main__":
    main()
