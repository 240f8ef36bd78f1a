"""WireGuard in userspace: wireguard-go, configured with wg(8). Full mesh, one peer per host.

Builds: by default the newest upstream commit the Go module proxy serves (golang.zx2c4.com/wireguard has
no tagged release there, only pseudo-versions; the binary reports the version constant of its source,
0.0.20250522), built into the install cache; `wireguard-go@debian` runs Debian 12's 0.0.20220316. Both
take the same command line (`-f IFNAME`, LOG_LEVEL) and the same wg(8) configuration.

wireguard-go keeps its UAPI socket in /var/run/wireguard/<ifname>.sock, shared by every namespace, so
interface names must be unique on the machine (the base class puts the run tag in them).

Offloads (vpn_options."wireguard-go".offloads): builds from 0.0.20230223 on open the TUN with IFF_VNET_HDR
(tun/tun_linux.go CreateTUN) and then, per initFromFlags, enable TSO/checksum offload on it (TUNSETOFFLOAD):
the kernel hands them TCP super-packets of up to 64 KB, they write GRO-coalesced packets back, and their
UDP socket uses UDP GSO/GRO (conn/). No flag or environment variable turns that off, and `ethtool -K` on the
TUN only stops the TSO reads (measured: GRO-coalesced writes continue). What does: WG_TUN_FD, the fd of a TUN
the caller opened. wireguard-go then reads the device's flags (initFromFlags) and, without IFF_VNET_HDR,
runs with a batch size of 1: no TSO, no GRO, and single datagrams on the UDP socket. So `offloads = false`
starts it through a small helper that opens the TUN (IFF_TUN | IFF_NO_PI, no IFF_VNET_HDR) in the host's
namespace and execs wireguard-go with WG_TUN_FD (same PID). After start the driver reads each TUN's
tun_flags back and records whether IFF_VNET_HDR is set; offloads = false with the flag still set fails.
Older builds (Debian 12's 0.0.20220316) have no offloads at all: false changes nothing there (and their
TUN uses a packet-information header, so the helper is not used)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from tunnelbench.lab.host import Host, Process
from tunnelbench.lab.journaling import HostJournaling
from tunnelbench.lab.raised import raise_at_least, restore
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver
from tunnelbench.vpns.features import wireguard_record
from tunnelbench.vpns.install import Apt, GoModule, Source
from tunnelbench.vpns.podclients import FILES_DIR, POD_LOG, PodClient, PodClients, pod_addresses, wait_for

LISTEN_PORT = 51820
UAPI_DIR = Path("/var/run/wireguard")
# the module root is the command; `go install` names it "wireguard": installed as wireguard-go
GO = GoModule(
    "wireguard-go",
    "golang.zx2c4.com/wireguard",
    "v0.0.0-20260522210424-ecfc5a8d5446",
    ("golang.zx2c4.com/wireguard",),
    ("wireguard-go",),
    renames=(("wireguard", "wireguard-go"),),
)


OFFLOADS_SINCE = 20230223  # wireguard-go release that added TUN TSO/GRO and UDP GSO/GRO
IFF_VNET_HDR = 0x4000
# argv: IFNAME CMD...: open a TUN named IFNAME without IFF_VNET_HDR (TUNSETIFF with IFF_TUN | IFF_NO_PI)
# and exec CMD with WG_TUN_FD set to it
TUN_FD_HELPER = """import fcntl, os, struct, sys
fd = os.open("/dev/net/tun", os.O_RDWR)
fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH", sys.argv[1].encode(), 0x0001 | 0x1000))
os.set_inheritable(fd, True)
os.execvpe(sys.argv[2], sys.argv[2:], {**os.environ, "WG_TUN_FD": str(fd)})
"""


INOTIFY = "fs.inotify.max_user_instances"


def inotify_needed(daemons: int) -> int:
    """Each daemon watches its UAPI socket with an inotify instance; Linux allows 128 per user by default,
    so a many-client lab (Goethals et al.) would stop at the 129th daemon ("too many open files"): room for
    these daemons and 256 more (the machine's own watchers), from 64 daemons up (0: leave it alone)."""
    return daemons + 256 if daemons > 64 else 0


class WireguardGo(VpnDriver):
    name = "wireguard-go"
    summary = "WireGuard, userspace Go implementation (wireguard-go + wg)"
    # the feature record (vpns/features.py): each fact with its source
    features = wireguard_record(
        "userspace (Go), TUN",
        "https://git.zx2c4.com/wireguard-go/about/",
        ("MIT", "https://git.zx2c4.com/wireguard-go/about/"),
    )
    # annotated: the kernel and boringtun drivers below replace them
    binaries: ClassVar[tuple[str, ...]] = ("wireguard-go", "wg")
    topologies = frozenset({"mesh", "star"})
    installs: ClassVar[tuple[Source, ...]] = (GO, Apt(("wireguard-tools",)))
    debian_installs: ClassVar[tuple[Source, ...]] = (
        Apt(("wireguard-go", "wireguard-tools"), ("wireguard-go",)),
    )
    paths_why = {
        "relay": "WireGuard has no relay: every pair needs direct UDP",
        "nat": "WireGuard has no NAT traversal: peers behind different NATs cannot reach each other",
    }
    default_mtu = 1420
    revocation = "`wg set <if> peer <pubkey> remove` on every other host"

    class Options(TunnelOptions):
        offloads: bool = Field(
            True,
            description="true: wireguard-go as shipped (from 0.0.20230223: TUN TSO/GRO and UDP GSO/GRO where "
            "the kernel has them); false: its TUN is opened without IFF_VNET_HDR (WG_TUN_FD), which turns "
            "all of them off",
        )

    @classmethod
    def version(cls, host: Host) -> str:
        # "wireguard-go v0.0.20250522" (Debian: "wireguard-go v0.0.20220316")
        return (
            cls._first_line(host, [host.binary("wireguard-go", cls.installs), "--version"], "wireguard-go")
            .split()[-1]
            .removeprefix("v")
        )

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self._raised: list[tuple[dict[str, Any], HostJournaling | None]] = []  # limits after_mesh puts back

    def configure(self) -> None:
        self.keys: dict[str, tuple[Path, str]] = {}
        self._raise_inotify(len(self.spec.hosts))
        for h in self.spec.hosts:
            d = self.host_dir(h)
            priv = h.run([h.binary("wg", self.installs), "genkey"]).stdout.strip()
            key_path = d / "private.key"
            h.write_file(key_path, priv + "\n", 0o600)
            pub = h.run([h.binary("wg", self.installs), "pubkey"], input=priv + "\n").stdout.strip()
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
        cmd = [
            host.binary("wg", self.installs),
            "set",
            ifname,
            "listen-port",
            str(LISTEN_PORT),
            "private-key",
            str(key_path),
        ]
        for peer in self.peers(host):  # every other host in a mesh; the hub only (or all, on it) in a star
            cmd += [
                "peer",
                self.keys[peer.name][1],
                "endpoint",
                f"{peer.underlay_ip}:{LISTEN_PORT}",
                "allowed-ips",
                f"{self.tunnel_ip(peer)}/32",
            ]
        for attempt in range(5):  # the UAPI socket file can appear a moment before the daemon accepts on it
            res = host.run(cmd, check=attempt == 4)
            if res.returncode == 0:
                break
            time.sleep(0.2)
        host.run(["ip", "addr", "add", f"{self.tunnel_ip(host)}/{self.tunnel_prefixlen}", "dev", ifname])
        host.run(["ip", "link", "set", ifname, "mtu", str(self.mtu), "up"])
        if isinstance(self.options, WireguardGo.Options):
            self._record_offloads(host, ifname)

    def revoke(self, host: Host) -> str:
        """WireGuard has no control plane: the operator deletes the peer's public key on every other host.
        start() configures every peer again, so a mesh restart undoes it."""
        pub = self.keys[host.name][1]
        others = [h for h in self.spec.hosts if h is not host and host in self.peers(h)]
        for h in others:
            h.run([h.binary("wg", self.installs), "set", self.ifname(h), "peer", pub, "remove"])
        return f"wg set <if> peer {pub} remove on {', '.join(h.name for h in others)}"

    def pod_clients(self, server: Host, n: int, names: list[str]) -> PodClients:
        """Each pod its own key pair (made here, X25519), added to the server's interface as one peer with its
        /32 (no endpoint: the pod starts the handshake); the pod runs wireguard-go + `wg setconf`. The server's
        peer count is the peers with a handshake (`wg show IF latest-handshakes`)."""
        if self.name != "wireguard-go":  # its kernel and boringtun children: the pods would run wireguard-go
            raise NotImplementedError(
                f"{self.name}: no recipe for VPN clients in pods (wireguard-go has one)"
            )
        import base64

        from cryptography.hazmat.primitives import serialization as ser
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        def b64(raw: bytes) -> str:
            return base64.b64encode(raw).decode()

        if not server.remote:  # the pods' daemons are this machine's too: one inotify instance each
            self._raise_inotify(n + len(self.spec.hosts))
        wg = server.binary("wg", self.installs)
        ifname = self.ifname(server)
        server_ip = self.tunnel_ip(server)
        addrs = pod_addresses(self.tunnel_prefix, len(self.spec.hosts), n)
        clients, pubs = [], []
        raw = ser.Encoding.Raw
        for name, ip in zip(names, addrs, strict=True):
            k = X25519PrivateKey.generate()
            priv = b64(k.private_bytes(raw, ser.PrivateFormat.Raw, ser.NoEncryption()))
            pub = b64(k.public_key().public_bytes(raw, ser.PublicFormat.Raw))
            pubs.append(pub)
            conf = (f"[Interface]\nPrivateKey = {priv}\n\n[Peer]\nPublicKey = {self.keys[server.name][1]}\n"
                    f"Endpoint = {server.public_ip}:{LISTEN_PORT}\nAllowedIPs = {server_ip}/32\n"
                    "PersistentKeepalive = 25\n")  # fmt: skip
            clients.append(
                PodClient(
                    name, ip, {"wg.conf": conf.encode(), "address": f"{ip}/{self.tunnel_prefixlen}".encode()}
                )
            )
        for i in range(0, n, 100):  # one `wg set` per 100 peers (the command line stays short)
            cmd = [wg, "set", ifname]
            for pub, ip in zip(pubs[i : i + 100], addrs[i : i + 100], strict=True):
                cmd += ["peer", pub, "allowed-ips", f"{ip}/32"]
            server.run(cmd)

        def peer_count() -> int:
            out = server.run([wg, "show", ifname, "latest-handshakes"]).stdout
            mine = set(pubs)
            return sum(1 for line in out.splitlines() if line.split()[:1] and line.split()[0] in mine
                       and line.split()[1] != "0")  # fmt: skip

        def undo() -> None:
            for i in range(0, n, 100):
                cmd = [wg, "set", ifname]
                for pub in pubs[i : i + 100]:
                    cmd += ["peer", pub, "remove"]
                server.run(cmd, check=False)

        tun = "tbwg"
        setup = "\n".join([
            "mkdir -p /var/run/wireguard",
            f"LOG_LEVEL=error wireguard-go -f {tun} >{POD_LOG} 2>&1 &",
            wait_for("wireguard-go's UAPI socket", f"[ -S /var/run/wireguard/{tun}.sock ]"),
            # the socket file can appear a moment before the daemon accepts on it (start() retries alike)
            f"n=0; until wg setconf {tun} {FILES_DIR}/wg.conf; do n=$((n+1)); [ $n -gt 300 ] && exit 5; usleep 100000; done",
            f"ip addr add $(cat {FILES_DIR}/address) dev {tun}",
            f"ip link set {tun} mtu {self.mtu} up",
        ])  # fmt: skip
        return PodClients(self.key, clients, server_ip, setup, ("wireguard-go", "wg"), peer_count, undo)

    def _spawn_daemon(self, host: Host, ifname: str, d: Path) -> Process:
        # -f keeps it in the foreground so the PID we hold is the daemon's
        argv = [host.binary("wireguard-go", self.installs), "-f", ifname]
        off = isinstance(self.options, WireguardGo.Options) and not self.options.offloads
        if off and self._has_offloads(host):
            python = "python3" if host.remote else sys.executable
            argv = [python, "-c", TUN_FD_HELPER, ifname, *argv]
        return host.spawn(argv, label="wireguard-go", log_path=d / "daemon.log", env={"LOG_LEVEL": "error"})

    def _has_offloads(self, host: Host) -> bool:
        """Whether this build opens its TUN with IFF_VNET_HDR (>= 0.0.20230223); unknown versions: assume so."""
        out = host.run([host.binary("wireguard-go", self.installs), "--version"], check=False).stdout
        m = re.search(r"v?0\.0\.(\d{8})", out)
        return m is None or int(m.group(1)) >= OFFLOADS_SINCE

    def _record_offloads(self, host: Host, ifname: str) -> None:
        """Read the TUN's flags back: IFF_VNET_HDR set = TSO/GRO in use. Recorded per host in settings."""
        flags = int(host.run(["cat", f"/sys/class/net/{ifname}/tun_flags"]).stdout.strip(), 16)
        vnet = bool(flags & IFF_VNET_HDR)
        assert isinstance(self.options, WireguardGo.Options)  # start() records only with these options
        if vnet and not self.options.offloads:
            raise RuntimeError(
                f"{self.name}: offloads = false, but {ifname} on {host.name} still has IFF_VNET_HDR "
                f"(tun_flags {flags:#x})"
            )
        seen = self.settings.setdefault("tun_vnet_hdr", {})
        seen[host.name] = vnet
        self.settings["offloads_effective"] = (
            "on (TUN IFF_VNET_HDR: TSO reads, GRO writes, UDP GSO/GRO)"
            if all(seen.values())
            else "off (TUN without IFF_VNET_HDR: no TSO/GRO, no UDP GSO/GRO)"
            if not any(seen.values())
            else "mixed"
        )

    def _raise_inotify(self, daemons: int) -> None:
        """Only on this machine (an SSH lab's hosts run one daemon each), journaled, put back by after_mesh."""
        need = inotify_needed(daemons)
        local = [h for h in self.spec.hosts if not h.remote]
        if not need or not local:
            return
        journal = local[0].journal
        entry = raise_at_least(INOTIFY, need, journal)
        if entry is not None:
            self._raised.append((entry, journal))

    def after_mesh(self) -> list[str]:
        raised, self._raised = self._raised, []
        return [p for entry, journal in reversed(raised) for p in restore(entry, journal)]

    def after_stop(self, host: Host) -> None:
        super().after_stop(host)
        sock = UAPI_DIR / f"{self.ifname(host)}.sock"
        host.remove(sock)
        if host.journal:
            host.journal.release({"kind": "path", "path": str(sock)})

    def leftovers(self, host: Host) -> list[str]:
        found = super().leftovers(host)
        sock = UAPI_DIR / f"{self.ifname(host)}.sock"
        if host.exists(sock):
            found.append(f"file {sock}")
        return found
