"""WireGuard in the Linux kernel (wg(8) on an `ip link add type wireguard` device): the reference most
comparisons are made against. Same mesh as the userspace drivers (one peer per host, UDP 51820).

Where the kernel has no WireGuard module (this lab's kernel: `ip link add ... type wireguard` answers
"Error: Unknown device type."), availability() says so and the driver is reported impossible here; the
check (lab/kernel.py) creates the device in a scratch namespace on the machine that runs the VPN (an SSH
host's own kernel), so it is that kernel's answer, not a guess."""

from __future__ import annotations

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import TunnelOptions, VpnDriver
from tunnelbench.vpns.features import wireguard_record
from tunnelbench.vpns.install import Apt
from tunnelbench.vpns.wireguard_go import WireguardGo


class WireguardKernel(WireguardGo):
    name = "wireguard"
    summary = "WireGuard in the Linux kernel (wg + ip link type wireguard), full mesh UDP 51820"
    # the feature record (vpns/features.py): each fact with its source
    features = wireguard_record(
        "kernel", "https://www.wireguard.com/", ("GPL-2.0", "https://www.wireguard.com/")
    )
    binaries = ("wg",)
    Options = TunnelOptions  # type: ignore[assignment]  # vpn_options: mtu (not wireguard-go's offloads)
    installs = (Apt(("wireguard-tools",)),)
    kernel_features = ("wireguard",)
    wire = "udp dport 51820"

    @classmethod
    def version(cls, host: Host) -> str:
        # on the machine that runs it (an SSH host's own kernel): a built-in module has no version file (cat's
        # complaint about it is no version)
        r = host.run(["cat", "/sys/module/wireguard/version"], check=False, timeout=10)
        v = r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "built-in"
        return f"{v} (linux {cls._first_line(host, ['uname', '-r'])})"

    def start(self, host: Host) -> None:
        ifname = self.ifname(host)
        host.run(["ip", "link", "add", ifname, "type", "wireguard"])
        key_path, _ = self.keys[host.name]
        cmd = [
            host.binary("wg", self.installs),
            "set",
            ifname,
            "listen-port",
            "51820",
            "private-key",
            str(key_path),
        ]
        for peer in self.spec.hosts:
            if peer is not host:
                cmd += [
                    "peer",
                    self.keys[peer.name][1],
                    "endpoint",
                    f"{peer.public_ip}:51820",
                    "allowed-ips",
                    f"{self.tunnel_ip(peer)}/32",
                ]
        host.run(cmd)
        host.run(["ip", "addr", "add", f"{self.tunnel_ip(host)}/{self.tunnel_prefixlen}", "dev", ifname])
        host.run(["ip", "link", "set", ifname, "mtu", str(self.mtu), "up"])

    def after_stop(self, host: Host) -> None:
        VpnDriver.after_stop(self, host)  # the interface only: the kernel keeps no wireguard-go UAPI socket
