"""The embedded lab: host namespaces, each joined to a router namespace by its own veth pair.

    h1 (10.100.1.2) --- r (10.100.1.1 | 10.100.2.1 | ...) --- h2 (10.100.2.2) ...

Every underlay packet between hosts is forwarded by the router, so impairment and firewall policies
live there. The router has no uplink; an nftables table drops and counts anything not addressed to the
lab (some VPNs probe public STUN servers at start)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tunnelbench.lab.addressing import LAB_PREFIX, TUNNEL_RANGES_V4, TUNNEL_RANGES_V6, host_ip, router_ip
from tunnelbench.lab.host import CommandError, Host
from tunnelbench.lab.journal import Journal


def sh(argv: Sequence[str], timeout: float = 20.0, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise CommandError("local", argv, p.returncode, p.stdout + p.stderr)
    return p


def netns_exists(name: str) -> bool:
    return Path(f"/run/netns/{name}").exists()


def netns_pids(name: str) -> list[int]:
    p = sh(["ip", "netns", "pids", name], check=False)
    return [int(x) for x in p.stdout.split()] if p.returncode == 0 else []


class NetnsHost(Host):
    def __init__(self, name: str, netns: str, underlay_ip: str, workdir: Path, journal: Journal | None):
        self.name = name
        self.netns = netns
        self.underlay_ip = underlay_ip
        self.workdir = workdir
        self.journal = journal
        self.underlay_if = "eth0"

    def argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def pids(self) -> list[int]:
        return netns_pids(self.netns)


class NetnsLab:
    """Builds and destroys the namespace topology for one run (names carry the run's tag)."""

    def __init__(self, tag: str, n_hosts: int, run_dir: Path, journal: Journal):
        self.tag = tag
        self.run_dir = run_dir
        self.journal = journal
        self._ns_entries: dict[str, dict] = {}
        self.router = NetnsHost("router", f"{tag}-r", "", run_dir / "hosts" / "router", journal)
        self.hosts = [
            NetnsHost(f"h{i}", f"{tag}-h{i}", host_ip(i), run_dir / "hosts" / f"h{i}", journal)
            for i in range(1, n_hosts + 1)
        ]
        self.nft_table = f"{tag}guard"

    # -- build -------------------------------------------------------------------------------------
    def _add_ns(self, host: NetnsHost) -> None:
        self._ns_entries[host.netns] = self.journal.netns(
            host.netns
        )  # journal first: clean finds half-made ones
        sh(["ip", "netns", "add", host.netns])
        host.run(["ip", "link", "set", "lo", "up"])
        host.workdir.mkdir(parents=True, exist_ok=True)

    def build(self) -> None:
        self._add_ns(self.router)
        self.router.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        self.router.run(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])
        for i, h in enumerate(self.hosts, start=1):
            self._add_ns(h)
            # create the pair directly inside the two namespaces: no name ever lives in the root namespace
            sh(["ip", "link", "add", "eth0", "netns", h.netns, "type", "veth",
                "peer", "name", f"h{i}", "netns", self.router.netns])  # fmt: skip
            self.router.run(["ip", "addr", "add", f"{router_ip(i)}/24", "dev", f"h{i}"])
            self.router.run(["ip", "link", "set", f"h{i}", "up"])
            h.run(["ip", "addr", "add", f"{host_ip(i)}/24", "dev", "eth0"])
            h.run(["ip", "link", "set", "eth0", "up"])
            # a default route keeps VPNs that look up "their" address (vpncloud) working; the router drops it
            h.run(["ip", "route", "add", "default", "via", router_ip(i)])
        self._install_guard()

    def _install_guard(self) -> None:
        rules = f"""
table inet {self.nft_table} {{
  counter offlab {{ }}
  counter tunnel_leak {{ }}
  chain prerouting {{
    type filter hook prerouting priority -300; policy accept;
    meta nfproto ipv4 ip daddr {LAB_PREFIX} accept
    meta nfproto ipv4 ip daddr {{ {TUNNEL_RANGES_V4} }} counter name tunnel_leak drop
    meta nfproto ipv6 ip6 daddr {{ {TUNNEL_RANGES_V6} }} counter name tunnel_leak drop
    meta nfproto ipv4 counter name offlab drop
    meta nfproto ipv6 ip6 daddr {{ fe80::/10, ff00::/8 }} accept
    meta nfproto ipv6 counter name offlab drop
  }}
  chain output {{
    type filter hook output priority -300; policy accept;
    meta nfproto ipv4 ip daddr {{ {LAB_PREFIX}, 127.0.0.0/8 }} accept
    meta nfproto ipv4 counter name offlab drop
  }}
}}
"""
        self.router.run(["nft", "-f", "-"], input=rules)

    def offlab_drops(self, counter: str = "offlab") -> int:
        """Packets the router dropped: `offlab` = addressed outside the lab (a VPN probing the internet),
        `tunnel_leak` = addressed to a tunnel range but sent unencapsulated (tunnel not up yet)."""
        try:
            out = self.router.run(["nft", "-j", "list", "counter", "inet", self.nft_table, counter]).stdout
        except CommandError:
            return -1
        for item in json.loads(out)["nftables"]:
            if "counter" in item:
                return int(item["counter"]["packets"])
        return -1

    def wait_links(self, timeout: float = 5.0) -> None:
        """Block until every host reaches the router (DAD/ARP settle)."""
        end = time.monotonic() + timeout
        for i, h in enumerate(self.hosts, start=1):
            while h.run(["ping", "-c1", "-W1", router_ip(i)], check=False).returncode != 0:
                if time.monotonic() > end:
                    raise RuntimeError(f"{h.name} cannot reach the router at {router_ip(i)}")
                time.sleep(0.05)

    # -- teardown ----------------------------------------------------------------------------------
    def destroy(self) -> list[str]:
        """Kill whatever still runs in our namespaces (all of it is ours), delete them; return problems."""
        problems: list[str] = []
        for h in [*self.hosts, self.router]:
            problems += destroy_netns(h.netns)
            entry = self._ns_entries.pop(h.netns, None)
            if entry is not None and not netns_exists(h.netns):
                self.journal.release(entry)
        return problems


def destroy_netns(name: str) -> list[str]:
    if not netns_exists(name):
        return []
    for _ in range(3):
        pids = netns_pids(name)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    p = sh(["ip", "netns", "del", name], check=False)
    if p.returncode != 0 and netns_exists(name):
        return [f"netns {name}: {p.stderr.strip()}"]
    return []
