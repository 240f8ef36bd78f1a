#!/usr/bin/env python3
"""Tiny one-way UDP probe for impaird end-to-end checks.

All namespaces share the machine's clock, so the receiver computes true
one-way delays: sender timestamp (CLOCK_REALTIME just before sendto) vs. the
kernel's receive timestamp (SO_TIMESTAMPNS), so a CPU-starved receiver process
does not inflate the delays.

  udp_probe.py recv BIND_IP PORT OUT.json [--idle 1.5] [--fast-ms MS] [--ready FILE]
  udp_probe.py send DST_IP PORT COUNT PPS [--size 200]

The receiver writes a JSON summary: received, unique, duplicates, lost,
loss, delay mean/sd/median/min/max (ms), share of packets faster than half
the median-ish threshold (--fast-ms) = "immediate" (reordered) share, arrival
order inversions, mean loss-burst length, and the number of bursts.
"""
import json
import socket
import statistics
import struct
import sys
import time

HDR = struct.Struct("!IQ")
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


def recv(ip, port, out, idle=1.5, fast_ms=None, ready=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.bind((ip, int(port)))
    if ready:
        open(ready, "w").close()
    s.settimeout(30)
    seen = {}
    order = []
    dups = 0
    total = None
    try:
        while True:
            data, anc, _, _ = s.recvmsg(65536, 64)
            now = time.time_ns()
            for lvl, typ, cd in anc:
                if lvl == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS and len(cd) >= 16:
                    sec, nsec = struct.unpack_from("qq", cd)
                    now = sec * 1_000_000_000 + nsec
            seq, t = HDR.unpack_from(data)
            if seq == 0xFFFFFFFF:
                total = t
                s.settimeout(idle)
                continue
            if seq in seen:
                dups += 1
                continue
            seen[seq] = (now - t) / 1e6
            order.append(seq)
            if total is None:
                s.settimeout(max(idle, 5))
    except socket.timeout:
        pass
    n = total if total is not None else (max(seen) + 1 if seen else 0)
    d = list(seen.values())
    res = {"sent": n, "received": len(seen), "duplicates": dups}
    res["lost"] = n - len(seen)
    res["loss"] = res["lost"] / n if n else None
    if d:
        ds = sorted(d)
        k = len(ds) // 200
        trim = ds[k:len(ds) - k] if k else ds
        res["delay_ms"] = {
            "p0.5": ds[k],
            "p99.5": ds[-1 - k],
            "sd_trim1": statistics.pstdev(trim),
            "mean": statistics.fmean(d),
            "sd": statistics.pstdev(d),
            "median": statistics.median(d),
            "min": min(d),
            "max": max(d),
        }
        if fast_ms is not None:
            res["fast_share"] = sum(1 for x in d if x < fast_ms) / len(d)
    inv = 0
    hi = -1
    for q in order:
        if q < hi:
            inv += 1
        hi = max(hi, q)
    res["late_arrivals"] = inv
    # loss bursts over the sequence space
    bursts, burst_lost, run = 0, 0, 0
    for q in range(n):
        if q not in seen:
            run += 1
        elif run:
            bursts += 1
            burst_lost += run
            run = 0
    if run:
        bursts += 1
        burst_lost += run
    res["loss_bursts"] = bursts
    res["mean_burst_len"] = burst_lost / bursts if bursts else 0.0
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))


def send(ip, port, count, pps, size=200):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dst = (ip, int(port))
    count, pps = int(count), float(pps)
    pad = b"\0" * max(0, int(size) - HDR.size)
    gap = 1e9 / pps
    t0 = time.monotonic_ns()
    for i in range(count):
        target = t0 + i * gap
        now = time.monotonic_ns()
        if target > now:
            time.sleep((target - now) / 1e9)
        s.sendto(HDR.pack(i, time.time_ns()) + pad, dst)
    time.sleep(0.2)
    for _ in range(5):
        s.sendto(HDR.pack(0xFFFFFFFF, count), dst)
        time.sleep(0.05)


def main(a):
    opts = {}
    pos = []
    i = 0
    while i < len(a):
        if a[i].startswith("--"):
            opts[a[i][2:]] = a[i + 1]
            i += 2
        else:
            pos.append(a[i])
            i += 1
    if pos[0] == "recv":
        recv(pos[1], pos[2], pos[3], float(opts.get("idle", 1.5)),
             float(opts["fast-ms"]) if "fast-ms" in opts else None,
             opts.get("ready"))
    elif pos[0] == "send":
        send(pos[1], pos[2], pos[3], pos[4], int(opts.get("size", 200)))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
