"""The connection-rate agent (workload `crr`): a TCP request/response server and a load client, stdlib only,
run as a plain script inside a host's namespace (or copied to an SSH host), like netperf's TCP_CRR / TCP_RR.

  server BIND PORT REQUEST_BYTES RESPONSE_BYTES
      prints `ready`, answers every REQUEST_BYTES read on a connection with RESPONSE_BYTES, closes a
      connection when the peer closes it; on SIGTERM prints one JSON line with its own counts (accepted
      connections, responses sent, connections closed by the peer, errors) and its CPU, and exits.
  client SERVER PORT MODE CONCURRENCY DURATION_S REQUEST_BYTES RESPONSE_BYTES TIMEOUT_S
      CONCURRENCY workers for DURATION_S, then lets the transactions in flight finish; prints one JSON line.
      crr: a transaction is socket + connect + send request + read the whole response + close (the client
           closes first, so TIME_WAIT stays on the client side, as in netperf's TCP_CRR); timed from
           before connect() to after close().
      rr:  one connection per worker made before the clock starts; a transaction is send request + read
           the whole response, timed from before send to the response's last byte.

One epoll loop per side (no asyncio: no futures or transports per connection, so the agent spends its CPU
on the sockets). A failed connect, a reset, a short response or a transaction slower than TIMEOUT_S counts
as an error; the worker starts again 10 ms later. Only completed transactions are counted."""

from __future__ import annotations

import errno
import json
import select
import signal
import socket
import sys
import time
from typing import Any

RETRY_S = 0.01


def percentile(sorted_vals: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on a sorted list."""
    if not sorted_vals:
        return float("nan")
    k = (len(sorted_vals) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


# -- server ------------------------------------------------------------------------------------------------
def serve(bind: str, port: int, req: int, resp: int) -> dict[str, Any]:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    lsock = socket.socket(family, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((bind, port))
    lsock.listen(4096)
    lsock.setblocking(False)
    ep = select.epoll()
    ep.register(lsock.fileno(), select.EPOLLIN)
    response = b"r" * resp
    # fd -> [socket, request bytes pending, memoryview of the response left to send or None, watching EPOLLOUT]
    conns: dict[int, list[Any]] = {}
    counts = {"accepted": 0, "answered": 0, "closed": 0, "errors": 0, "partial_requests": 0}
    first = last = None  # (monotonic, cpu) at the first accept and at the last event: CPU while busy
    print("ready", flush=True)

    def drop(fd: int, error: bool) -> None:
        c = conns.pop(fd)
        ep.unregister(fd)
        c[0].close()
        counts["errors" if error else "closed"] += 1

    def push(fd: int, c: list[Any]) -> None:
        """Send what is left of the response(s); watch for writability while some is left."""
        while c[2] is not None:
            n = c[0].send(c[2])
            if n < len(c[2]):
                c[2] = c[2][n:]
                if not c[3]:
                    ep.modify(fd, select.EPOLLOUT)
                    c[3] = True
                return
            c[2] = None
            counts["answered"] += 1
            if (
                c[1] >= req
            ):  # a further request already arrived whole (a client never pipelines; be exact anyway)
                c[1] -= req
                c[2] = memoryview(response)
        if c[3]:
            ep.modify(fd, select.EPOLLIN)
            c[3] = False

    while not stop:
        try:
            events = ep.poll(0.2)
        except InterruptedError:
            continue
        for fd, _ev in events:
            if fd == lsock.fileno():
                while True:
                    try:
                        s, _ = lsock.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:  # ECONNABORTED, EMFILE: the peer sees a failure; count it here too
                        counts["errors"] += 1
                        break
                    s.setblocking(False)
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conns[s.fileno()] = [s, 0, None, False]
                    ep.register(s.fileno(), select.EPOLLIN)
                    counts["accepted"] += 1
                    if first is None:
                        first = (time.monotonic(), time.process_time())
                continue
            c = conns.get(fd)
            if c is None:
                continue
            try:
                if c[2] is not None:  # EPOLLOUT (or an error while a response is pending)
                    push(fd, c)
                    continue
                data = c[0].recv(65536)
                if not data:  # the client closed: close our side too (LAST_ACK, no TIME_WAIT here)
                    if c[1]:
                        counts["partial_requests"] += 1
                    drop(fd, error=False)
                    continue
                c[1] += len(data)
                if c[1] >= req:
                    c[1] -= req
                    c[2] = memoryview(response)
                    push(fd, c)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                drop(fd, error=True)
        if events and first is not None:
            last = (time.monotonic(), time.process_time())
    busy = (last[0] - first[0], last[1] - first[1]) if first and last else (0.0, 0.0)
    return {**counts, "busy_wall_s": busy[0], "busy_cpu_s": busy[1], "open_at_stop": len(conns)}


# -- client ------------------------------------------------------------------------------------------------
IDLE, CONNECTING, SENDING, RECEIVING, WAITING, DONE = range(6)


class Worker:
    __slots__ = ("sock", "state", "t_start", "got", "out", "deadline", "wake")

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.state = IDLE
        self.t_start = 0.0
        self.got = 0
        self.out: memoryview | None = None
        self.deadline = 0.0
        self.wake = 0.0


def client(
    server: str, port: int, mode: str, concurrency: int, duration: float, req: int, resp: int, timeout: float
) -> dict[str, Any]:
    if mode not in ("crr", "rr"):
        raise SystemExit(f"mode must be crr or rr, not {mode!r}")
    family = socket.AF_INET6 if ":" in server else socket.AF_INET
    addr = (server, port)
    request = b"q" * req
    ep = select.epoll()
    fds: dict[int, Worker] = {}
    workers = [Worker() for _ in range(concurrency)]
    lat: list[float] = []
    per_s: list[int] = []
    errors: dict[str, int] = {}
    connects = 0  # connections established (crr: one per transaction attempt that got that far)
    perf = time.perf_counter

    def error(w: Worker, why: str) -> None:
        errors[why] = errors.get(why, 0) + 1
        close(w)
        w.state, w.wake = WAITING, perf() + RETRY_S

    def close(w: Worker) -> None:
        if w.sock is not None:
            fds.pop(w.sock.fileno(), None)
            ep.unregister(w.sock.fileno())
            w.sock.close()
            w.sock = None

    def open_conn(w: Worker) -> None:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        w.sock = s
        fds[s.fileno()] = w
        w.deadline = perf() + timeout
        err = s.connect_ex(addr)
        if err in (0, errno.EINPROGRESS):
            w.state = CONNECTING
            ep.register(s.fileno(), select.EPOLLOUT)
        else:
            ep.register(s.fileno(), 0)
            error(w, errno.errorcode.get(err, str(err)))

    def send_request(w: Worker, now: float) -> None:
        w.state, w.got, w.out = SENDING, 0, memoryview(request)
        if mode == "rr":
            w.t_start, w.deadline = now, now + timeout
        push(w)

    def push(w: Worker) -> None:
        sock, out = w.sock, w.out
        assert sock is not None and out is not None  # a sending worker has both (send_request)
        n = sock.send(out)
        if n < len(out):
            w.out = out[n:]
            ep.modify(sock.fileno(), select.EPOLLOUT)
            return
        w.out = None
        w.state = RECEIVING
        ep.modify(sock.fileno(), select.EPOLLIN)

    def begin(w: Worker, now: float) -> None:
        """Start the worker's next transaction, or retire it when the time is up."""
        if now >= t_end:
            close(w)
            w.state = DONE
            return
        if mode == "crr":
            w.t_start = now
            open_conn(w)
        elif w.sock is None:  # rr after an error: a new connection, not timed
            open_conn(w)
        else:
            send_request(w, now)

    def completed(w: Worker, now: float) -> None:
        lat.append((now - w.t_start) * 1000.0)
        sec = int(now - t0)
        while len(per_s) <= sec:
            per_s.append(0)
        per_s[sec] += 1

    if mode == "rr":  # the persistent connections, made (blocking, in turn) before the clock starts
        for w in workers:
            s = socket.create_connection(addr, timeout=timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
            w.sock = s
            fds[s.fileno()] = w
            ep.register(s.fileno(), select.EPOLLIN)
            connects += 1
    cpu0 = time.process_time()
    t0 = perf()
    t_end = t0 + duration
    for w in workers:
        begin(w, perf())
    next_scan = t0
    while True:
        now = perf()
        if now >= next_scan:  # timeouts and retries: a scan every 10 ms, not per event
            next_scan = now + 0.01
            live = 0
            for w in workers:
                if w.state == DONE:
                    continue
                live += 1
                if w.state == WAITING:
                    if now >= w.wake:
                        begin(w, now)
                elif w.state != IDLE and now >= w.deadline:
                    error(w, "timeout")
            if not live:
                break
        try:
            events = ep.poll(0.01)
        except InterruptedError:
            continue
        for fd, ev in events:
            found = fds.get(fd)
            if found is None:
                continue
            w, sock = found, found.sock
            assert sock is not None  # fds holds workers with a socket (close() drops them)
            now = perf()
            try:
                if w.state == CONNECTING:
                    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        error(w, errno.errorcode.get(err, str(err)))
                        continue
                    connects += 1
                    send_request(w, now)
                elif w.state == SENDING:
                    push(w)
                elif w.state == RECEIVING:
                    data = sock.recv(resp - w.got)
                    if not data:
                        error(w, "short_response")
                        continue
                    w.got += len(data)
                    if w.got < resp:
                        continue
                    if mode == "crr":
                        close(w)
                        now = perf()
                    completed(w, now)
                    begin(w, now)
                elif ev & (select.EPOLLERR | select.EPOLLHUP):  # rr: the server went away between requests
                    error(w, "closed_by_server")
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as e:
                error(w, errno.errorcode.get(e.errno or 0, type(e).__name__))
    elapsed = perf() - t0
    cpu = time.process_time() - cpu0
    for w in workers:
        close(w)
    lat.sort()
    return {
        "mode": mode,
        "transactions": len(lat),
        "connects": connects,
        "elapsed_s": elapsed,
        "tps": len(lat) / elapsed if elapsed > 0 else 0.0,
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "latency_ms": {f"p{q}": percentile(lat, q) for q in (50, 90, 99)},
        "latency_mean_ms": sum(lat) / len(lat) if lat else float("nan"),
        "per_second": per_s,
        "cpu_pct": 100.0 * cpu / elapsed if elapsed > 0 else 0.0,
    }


def main(argv: list[str]) -> None:
    if argv[:1] == ["server"] and len(argv) == 5:
        print(json.dumps({"server": serve(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))}), flush=True)
    elif argv[:1] == ["client"] and len(argv) == 9:
        a = argv
        res = client(a[1], int(a[2]), a[3], int(a[4]), float(a[5]), int(a[6]), int(a[7]), float(a[8]))
        print(json.dumps(res), flush=True)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
