"""WireGuard in userspace: Debian's wireguard-go, configured with wg(8). Full mesh, one peer per host.

wireguard-go keeps its UAPI socket in /var/run/wireguard/<ifname>.sock, shared by every namespace, so
interface names must be unique on the machine (the base class puts the run tag in them)."""

from __future__ import annotations

import time
from pathlib import Path

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import VpnDriver
from tunnelbench.vpns.install import Apt

LISTEN_PORT = 51820
UAPI_DIR = Path("/var/run/wireguard")


def raise_inotify_limit(daemons: int) -> None:
    """Each daemon watches its UAPI socket with an inotify instance; Linux allows 128 per user by default,
    so a many-client lab (seed 001) would stop at the 129th daemon ("too many open files"). Only raised,
    never lowered; only on this machine (an SSH lab's hosts run one daemon each)."""
    knob = Path("/proc/sys/fs/inotify/max_user_instances")
    try:
        if daemons > 64 and int(knob.read_text()) < daemons + 256:
            knob.write_text(str(daemons + 256))
    except OSError:
        pass


class WireguardGo(VpnDriver):
    name = "wireguard-go"
    summary = "WireGuard, userspace Go implementation (Debian wireguard-go + wg)"
    binaries = ("wireguard-go", "wg")
    topologies = frozenset({"mesh", "star"})
    installs = (Apt(("wireguard-go", "wireguard-tools")),)
    paths_why = {
        "relay": "WireGuard has no relay: every pair needs direct UDP",
        "nat": "WireGuard has no NAT traversal: peers behind different NATs cannot reach each other",
    }
    default_mtu = 1420

    @classmethod
    def version(cls) -> str:
        return cls._first_line(["wireguard-go", "--version"], "wireguard-go").split()[-1]

    def configure(self) -> None:
        self.keys: dict[str, tuple[Path, str]] = {}
        raise_inotify_limit(len(self.spec.hosts))
        for h in self.spec.hosts:
            d = self.host_dir(h)
            priv = h.run(["wg", "genkey"]).stdout.strip()
            key_path = d / "private.key"
            h.write_file(key_path, priv + "\n", 0o600)
            pub = h.run(["wg", "pubkey"], input=priv + "\n").stdout.strip()
            self.keys[h.name] = (key_path, pub)

    def start(self, host: Host) -> None:
        ifname = self.ifname(host)
        d = self.host_dir(host)
        sock = UAPI_DIR / f"{ifname}.sock"
        if host.journal:
            host.journal.path_entry(str(sock))
        proc = self._spawn_daemon(host, ifname, d)
        self.procs[host.name].append(proc)
        self.wait_for(f"{self.name} UAPI socket", lambda: host.exists(sock) or not proc.alive(), timeout=10)
        if not proc.alive():
            raise RuntimeError(f"{self.name} exited: {proc.log_tail()}")
        key_path, _ = self.keys[host.name]
        cmd = ["wg", "set", ifname, "listen-port", str(LISTEN_PORT), "private-key", str(key_path)]
        for peer in self.peers(host):  # every other host in a mesh; the hub only (or all, on it) in a star
            cmd += ["peer", self.keys[peer.name][1], "endpoint", f"{peer.underlay_ip}:{LISTEN_PORT}",
                    "allowed-ips", f"{self.tunnel_ip(peer)}/32"]  # fmt: skip
        for attempt in range(5):  # the UAPI socket file can appear a moment before the daemon accepts on it
            res = host.run(cmd, check=attempt == 4)
            if res.returncode == 0:
                break
            time.sleep(0.2)
        host.run(["ip", "addr", "add", f"{self.tunnel_ip(host)}/{self.tunnel_prefixlen}", "dev", ifname])
        host.run(["ip", "link", "set", ifname, "mtu", str(self.mtu), "up"])

    def _spawn_daemon(self, host: Host, ifname: str, d: Path):
        # -f keeps it in the foreground so the PID we hold is the daemon's
        return host.spawn([self.bin("wireguard-go"), "-f", ifname], label="wireguard-go", log_path=d / "daemon.log",
                          env={"LOG_LEVEL": "error"})  # fmt: skip

    def after_stop(self, host: Host) -> None:
        ifname = self.ifname(host)
        if self.link_exists(host, ifname):
            host.run(["ip", "link", "del", ifname], check=False)
        sock = UAPI_DIR / f"{ifname}.sock"
        host.remove(sock)
        if host.journal:
            host.journal.release({"kind": "path", "path": str(sock)})

    def leftovers(self, host: Host) -> list[str]:
        found = super().leftovers(host)
        sock = UAPI_DIR / f"{self.ifname(host)}.sock"
        if host.exists(sock):
            found.append(f"file {sock}")
        return found
