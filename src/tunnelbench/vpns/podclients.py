"""VPN clients that are not lab hosts: one identity each (its own WireGuard key, its own Nebula certificate) for
a client that runs in a Kubernetes pod (kube/fleet.py), joined to a running mesh through its server host.

A driver that supports it implements `VpnDriver.pod_clients(server, n, names)`: it makes n identities, tells
the server side about them where the VPN needs that (WireGuard: one peer per key; Nebula: nothing, the
server admits any certificate its CA signed), and returns what a pod needs: the files of each identity, the
shell lines that bring the tunnel up inside the pod (busybox sh, the files under FILES_DIR), the binaries the
pod's image must carry, and how to read the server's count of connected peers (the proof that every client
is its own peer). The pods' tunnel addresses follow the mesh's hosts in the mesh's own network."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

FILES_DIR = "/etc/tb"  # where a pod finds its identity's files (a Secret mounted read-only)
POD_LOG = "/tmp/vpn.log"  # the VPN daemon's output inside the pod


@dataclass
class PodClient:
    name: str  # the pod's name (and the identity's: certificate name, peer comment)
    tunnel_ip: str  # "" when the VPN gives the pod none (no VPN)
    files: dict[str, bytes]  # file name under FILES_DIR -> contents


@dataclass
class PodClients:
    vpn: str
    clients: list[PodClient]
    target_ip: str  # where the pods call the REST service: the server's tunnel address
    setup: str  # shell lines run first in every pod: the VPN up (an empty string: nothing to bring up)
    binaries: tuple[str, ...]  # what the pod's image must carry (names the image recipe knows)
    peer_count: Callable[[], int | None] = field(default=lambda: None)  # the server's connected peers
    undo: Callable[[], None] = field(default=lambda: None)  # take the identities back off the server


def pod_addresses(prefix: str, mesh_hosts: int, n: int) -> list[str]:
    """The pods' tunnel addresses: the mesh's /24 after its hosts (PREFIX.(m+1) .. PREFIX.(m+n))."""
    if mesh_hosts + n > 254:
        raise ValueError(
            f"{n} pod clients and {mesh_hosts} mesh hosts do not fit the mesh's /24 ({prefix}.0/24: 254 "
            f"addresses); lower clients to {254 - mesh_hosts} or fewer"
        )
    return [f"{prefix}.{mesh_hosts + 1 + i}" for i in range(n)]


def wait_for(what: str, test: str, tries: int = 200) -> str:
    """busybox sh: poll `test` every 50 ms up to `tries` times, then print the VPN's log and exit 4."""
    say = shlex.quote(f"{what} did not appear")
    return (
        f"i=0; until {test}; do i=$((i+1)); if [ $i -gt {tries} ]; then echo {say} >&2; "
        f"cat {POD_LOG} >&2; exit 4; fi; usleep 50000; done"
    )
