"""boringtun: Cloudflare's userspace WireGuard in Rust (crates.io `boringtun-cli`), configured with wg(8).

Same mesh as the wireguard-go driver (one peer per host, UDP 51820, /32 allowed-ips), only the data plane
differs. boringtun keeps its UAPI socket in /var/run/wireguard/<ifname>.sock like wireguard-go, so the
socket directory is shared by every namespace and interface names are unique on the machine (the run tag
is in them), which also lets both drivers run in the same run one after the other.

boringtun-cli runs in the foreground (-f) so the PID we hold is the daemon's; it would drop privileges to
the invoking sudo user, which root in a namespace does not need (--disable-drop-privileges, and WG_SUDO
must be the string "true", not 1); its log goes to a file in the run folder (--log)."""

from __future__ import annotations

from pathlib import Path

from tunnelbench.lab.host import Host, Process
from tunnelbench.vpns.base import MeshSpec, TunnelOptions
from tunnelbench.vpns.features import wireguard_record
from tunnelbench.vpns.install import Apt, Crate
from tunnelbench.vpns.wireguard_go import WireguardGo

VERSION = "0.7.1"


class Boringtun(WireguardGo):
    name = "boringtun"
    summary = (
        "WireGuard, userspace Rust implementation (boringtun-cli from crates.io + wg), full mesh UDP 51820"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = wireguard_record(
        "userspace (Rust), TUN",
        "https://github.com/cloudflare/boringtun",
        ("BSD-3-Clause", "https://github.com/cloudflare/boringtun"),
    )
    binaries = ("boringtun-cli", "wg")
    Options = TunnelOptions  # type: ignore[assignment]  # vpn_options: mtu (not wireguard-go's offloads)
    installs = (Crate("boringtun-cli", VERSION, ("boringtun-cli",)), Apt(("wireguard-tools",)))
    debian_installs = ()  # no Debian package

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.settings = {
            "mode": "full mesh, one WireGuard peer per host, direct UDP",
            "cipher": "ChaCha20-Poly1305 (WireGuard, Noise IK, Curve25519)",
            "mtu": self.mtu,
            "port": 51820,
            "threads": "boringtun default (4)",
        }

    @classmethod
    def version(cls, host: Host) -> str:
        # "boringtun 0.7.1"
        return cls._first_line(
            host, [host.binary("boringtun-cli", cls.installs), "--version"], "boringtun"
        ).split()[-1]

    def _spawn_daemon(self, host: Host, ifname: str, d: Path) -> Process:
        argv = [host.binary("boringtun-cli", self.installs), "-f", "--disable-drop-privileges", "--log", str(d / "boringtun.log"),
                "--verbosity", "error", ifname]  # fmt: skip
        return host.spawn(argv, label="boringtun", log_path=d / "daemon.log", env={"WG_SUDO": "true"})
