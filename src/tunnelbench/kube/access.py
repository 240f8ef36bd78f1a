"""The lab's own cluster reached as a user reaches theirs: a kubeconfig (the cluster's CA, a client certificate)
naming https://127.0.0.1:PORT, where a forwarder of this process listens on loopback only and carries each
connection into the control-plane host's namespace to the apiserver (api.socket_in_netns). Everything above it
(kube/remote.py) uses the kubeconfig and nothing else of the lab. The apiserver's serving certificate names
127.0.0.1 (kube/cluster.py), so TLS is verified as usual."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
from pathlib import Path
from typing import Any

from tunnelbench.kube.api import socket_in_netns


class Forwarder:
    """127.0.0.1:port (a free port) -> (address, port) inside network namespace `netns`, both ways, per
    connection; stop() closes the listener and every connection."""

    def __init__(self, netns: str, address: tuple[str, int]):
        self.netns, self.address = netns, address
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port: int = self.listener.getsockname()[1]
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.stopped = False
        threading.Thread(target=self._accept, name="kube-forwarder", daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            upstream = socket_in_netns(self.netns, self.address, 10.0)
        except OSError:
            conn.close()
            return
        upstream.settimeout(None)
        with self.lock:
            self.open |= {conn, upstream}
        t = threading.Thread(target=self._pipe, args=(upstream, conn), daemon=True)
        t.start()
        self._pipe(conn, upstream)
        t.join()
        with self.lock:
            self.open -= {conn, upstream}
        conn.close()
        upstream.close()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def stop(self) -> None:
        self.stopped = True
        with contextlib.suppress(OSError):
            self.listener.close()
        with self.lock:
            for s in list(self.open):
                with contextlib.suppress(OSError):
                    s.close()
            self.open.clear()


def kubeconfig(
    server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, user: str = "tunnelbench"
) -> dict[str, Any]:
    """A self-contained kubeconfig (certificates inline), as a cluster's admin hands one to a user."""

    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "tb-lab", "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)},
            }
        ],
        "contexts": [{"name": "tb-lab", "context": {"cluster": "tb-lab", "user": user}}],
        "current-context": "tb-lab",
    }


def write_kubeconfig(path: Path, data: dict[str, Any]) -> Path:
    """JSON is YAML: written 0600 (it holds a private key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
