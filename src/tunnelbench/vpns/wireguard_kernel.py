"""WireGuard in the Linux kernel (wg(8) on an `ip link add type wireguard` device): the reference most
comparisons are made against. Same mesh as the userspace drivers (one peer per host, UDP 51820).

Where the kernel has no WireGuard module (this lab's kernel: `ip link add ... type wireguard` answers
"Error: Unknown device type."), availability() says so and the driver is reported impossible here; the
check creates the device in a scratch namespace, so it is the kernel's answer, not a guess."""

from __future__ import annotations

import functools
import platform
import secrets
import subprocess
from pathlib import Path

from tunnelbench.lab.host import Host
from tunnelbench.lab.tags import TAG_PREFIX
from tunnelbench.vpns.base import TunnelOptions
from tunnelbench.vpns.install import Apt
from tunnelbench.vpns.wireguard_go import WireguardGo


@functools.cache
def _kernel_wireguard() -> str | None:
    """None if the kernel can make a wireguard device, else the kernel's error."""
    ns = f"{TAG_PREFIX}wgk{secrets.token_hex(2)}"
    if subprocess.run(["ip", "netns", "add", ns], capture_output=True).returncode != 0:
        return "cannot probe: `ip netns add` failed (needs root)"
    try:
        p = subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "add", "wg0", "type", "wireguard"],
                           capture_output=True, text=True)  # fmt: skip
        return None if p.returncode == 0 else (p.stderr.strip() or f"exit {p.returncode}")
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class WireguardKernel(WireguardGo):
    name = "wireguard"
    summary = "WireGuard in the Linux kernel (wg + ip link type wireguard), full mesh UDP 51820"
    binaries = ("wg",)
    Options = TunnelOptions  # vpn_options: mtu (not wireguard-go's offloads)
    installs = (Apt(("wireguard-tools",)),)

    @classmethod
    def impossible_here(cls) -> str | None:
        why = _kernel_wireguard()
        if why:
            return f"this kernel ({platform.release()}) has no WireGuard module: `ip link add type wireguard`: {why}"
        return None

    @classmethod
    def version(cls) -> str:
        try:
            v = Path("/sys/module/wireguard/version").read_text().strip()
        except OSError:
            v = "built-in"
        return f"{v} (linux {platform.release()})"

    def start(self, host: Host) -> None:
        ifname = self.ifname(host)
        host.run(["ip", "link", "add", ifname, "type", "wireguard"])
        key_path, _ = self.keys[host.name]
        cmd = ["wg", "set", ifname, "listen-port", "51820", "private-key", str(key_path)]
        for peer in self.spec.hosts:
            if peer is not host:
                cmd += ["peer", self.keys[peer.name][1], "endpoint", f"{peer.public_ip}:51820",
                        "allowed-ips", f"{self.tunnel_ip(peer)}/32"]  # fmt: skip
        host.run(cmd)
        host.run(["ip", "addr", "add", f"{self.tunnel_ip(host)}/{self.tunnel_prefixlen}", "dev", ifname])
        host.run(["ip", "link", "set", ifname, "mtu", str(self.mtu), "up"])

    def after_stop(self, host: Host) -> None:
        ifname = self.ifname(host)
        if self.link_exists(host, ifname):
            host.run(["ip", "link", "del", ifname], check=False)
