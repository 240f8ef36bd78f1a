"""Plain HTTPS calls to the apiserver (no kubectl, no client library): JSON in, JSON out, a client certificate.

The apiserver listens on the control-plane host's tunnel address, inside that host's network namespace, which
this process (in the machine's own namespace) cannot route to. Each connection's socket is therefore made in a
short-lived thread that has entered the host's namespace (setns(2) changes the calling thread only); a socket
belongs to the namespace it was made in for its whole life, so the TLS and HTTP above it run here as usual. The
calls go to the apiserver on its own host: the lab's control traffic never loads the VPN it measures."""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CLONE_NEWNET = 0x40000000


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str):
        self.status = status
        super().__init__(f"{method} {path}: HTTP {status}: {body[:400]}")


def socket_in_netns(netns: str, address: tuple[str, int], timeout: float) -> socket.socket:
    """A TCP connection to `address` made inside the network namespace /run/netns/<netns>."""
    got: list[socket.socket | BaseException] = []

    def connect() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {netns}")
            finally:
                os.close(fd)
            got.append(socket.create_connection(address, timeout=timeout))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            got.append(e)

    t = threading.Thread(target=connect, name=f"netns-{netns}", daemon=True)
    t.start()
    t.join()
    r = got[0]
    if isinstance(r, BaseException):
        raise r
    return r


class _Conn(http.client.HTTPSConnection):
    def __init__(self, make: Callable[[], socket.socket], ctx: ssl.SSLContext, host: str, timeout: float):
        super().__init__(host, timeout=timeout, context=ctx)
        self._make = make
        self._ctx = ctx

    def connect(self) -> None:
        self.sock = self._ctx.wrap_socket(self._make(), server_hostname=self.host)


class Api:
    """One apiserver, called as one user (its client certificate) from inside `netns`."""

    def __init__(
        self, netns: str, host: str, port: int, ca: Path, cert: Path, key: Path, timeout: float = 30.0
    ):
        self.netns, self.host, self.port, self.timeout = netns, host, port, timeout
        ctx = ssl.create_default_context(cafile=str(ca))
        ctx.load_cert_chain(str(cert), str(key))
        ctx.check_hostname = True  # the serving certificate names the tunnel address (kube/pki.py)
        self.ctx = ctx

    def _conn(self) -> _Conn:
        return _Conn(lambda: socket_in_netns(self.netns, (self.host, self.port), self.timeout), self.ctx,
                     self.host, self.timeout)  # fmt: skip

    def request(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201)) -> Any:
        """The decoded JSON answer (the raw text for a non-JSON one, e.g. pod logs); ApiError otherwise."""
        conn = self._conn()
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json"} | ({"Content-Type": "application/json"} if data else {})
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            text = resp.read().decode(errors="replace")
        finally:
            conn.close()
        if resp.status not in ok:
            raise ApiError(method, path, resp.status, text)
        if resp.getheader("Content-Type", "").startswith("application/json"):
            return json.loads(text)
        return text

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def create(self, collection: str, obj: dict[str, Any]) -> Any:
        """POST, or nothing when it exists already (409)."""
        return self.request("POST", collection, obj, ok=(200, 201, 202, 409))

    def delete(self, path: str) -> None:
        self.request("DELETE", path, {"gracePeriodSeconds": 0}, ok=(200, 202, 404))

    def ready(self, deadline: float) -> None:
        """Wait until /readyz answers ok (or raise, with the last answer, at `deadline`, a monotonic time)."""
        last = ""
        while True:
            try:
                if self.request("GET", "/readyz") == "ok":
                    return
            except (OSError, ApiError, http.client.HTTPException) as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise TimeoutError(f"apiserver at {self.host}:{self.port} not ready: {last[:300]}")
            time.sleep(0.5)
