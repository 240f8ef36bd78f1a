"""The embedded lab: host namespaces, each joined to a router namespace by its own veth pair.

    h1 (10.100.1.2) --- r (10.100.1.1 | 10.100.2.1 | ...) --- h2 (10.100.2.2) ...

Every underlay packet between hosts is forwarded by the router, so impairment and firewall policies
live there.

Path scenarios (`[lab] path`, see VpnDriver.paths):
  direct  the topology above.
  relay   the router drops UDP between any two peers unless one of them is the relay host, so a VPN
          must carry peer-to-peer traffic through its relay there (DERP, TURN, EasyTier/Nebula relay).
          `watch_relay()` counts the relay host's bytes per peer, to prove the traffic crossed it.
  nat     every peer except the relay host sits behind its own masquerading NAT namespace:
            hI (172.16.I.2) --- nI (172.16.I.1 | 10.100.I.2, masquerade) --- r
          The NAT keeps the host's old address on its WAN side, so the router is unchanged. The relay host
          stays public: the rendezvous for the others. Each NAT has a type (`nat_type`, RFC 4787 terms;
          "mapping" = which public port an internal socket gets, "filtering" = who may send to it):
            full-cone           endpoint-independent mapping and filtering: once hI sent from port p
                                (UDP), anyone may send to public:p. Not a 1:1 NAT: ports hI never sent
                                from stay closed.
            address-restricted  endpoint-independent mapping, address-dependent filtering: inbound to
                                public:p from any port of an IP that hI sent to from p.
            port-restricted     endpoint-independent mapping, address-and-port-dependent filtering: only
                                replies from the exact IP:port (Linux masquerade + conntrack; the default,
                                this lab's only NAT before NAT types).
            symmetric           ("hard") endpoint-dependent mapping (a random public port per destination,
                                `masquerade fully-random`) and address-and-port-dependent filtering.
          Mapping: masquerade keeps the source port when the public tuple is free, which behind a one-host
          NAT it always is (endpoint-independent); fully-random draws a new port per conntrack entry, i.e.
          per destination. Filtering: conntrack lets replies in (exact IP:port). The two cone types add
          endpoint-independent / address-dependent filtering with a dynamic nft set that the forward path
          fills from hI's outbound UDP (`update @cone { udp sport }`, `update @seen { ip daddr . udp
          sport }`, 180 s timeout refreshed per packet) and a prerouting dnat of inbound UDP that matches
          the set to hI at the same port (the mapped port is the source port: preserved). TCP is
          port-restricted under every type (conntrack only). Unsolicited inbound that is not forwarded
          to hI is dropped in the NAT's input chain (counted in `inbound_dropped`), not answered: a
          dropped packet's conntrack entry is never confirmed, so a stranger's probe to public:p cannot
          occupy the tuple and push hI's next mapping towards that stranger onto another port (it would,
          with the packet delivered locally and answered with ICMP port unreachable).
The router has no uplink; an nftables table drops and counts anything not addressed to the lab (some VPNs
probe public STUN servers at start)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tunnelbench.lab.addressing import LAB_PREFIX, TUNNEL_RANGES_V4, TUNNEL_RANGES_V6, host_ip, router_ip
from tunnelbench.lab.counters import nft_counter
from tunnelbench.lab.host import CommandError, Host
from tunnelbench.lab.journal import Journal

PATHS = ("direct", "relay", "nat")
NAT_TYPES = ("full-cone", "address-restricted", "port-restricted", "symmetric")
DEFAULT_NAT_TYPE = "port-restricted"
NAT_SET_TIMEOUT_S = 180  # a cone mapping's inbound opening lives this long after hI's last packet from it


def sh(argv: Sequence[str], timeout: float = 20.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise CommandError("local", argv, p.returncode, p.stdout + p.stderr)
    return p


def add_veth(name: str, netns: str, peer: str, peer_netns: str) -> None:
    """A veth pair made directly inside the two namespaces: no name ever lives in the root namespace."""
    sh(["ip", "link", "add", name, "netns", netns, "type", "veth", "peer", "name", peer, "netns", peer_netns])  # fmt: skip


OFFLAB_DESTS = 4096  # off-lab destination addresses the router remembers (with a packet counter each)
BATCH_ABOVE = 16  # labs with more hosts are built with `ip -batch`


def raise_neigh_limits(entries: int) -> None:
    """The router holds one ARP/ND entry per host; the neighbour-table thresholds are global (set in the
    root namespace, default 128/512/1024): above gc_thresh2 entries get evicted and hosts stop answering.
    Only raised, never lowered."""
    for fam in ("ipv4", "ipv6"):
        for k, v in (("gc_thresh1", entries // 2), ("gc_thresh2", entries), ("gc_thresh3", 2 * entries)):
            knob = Path(f"/proc/sys/net/{fam}/neigh/default/{k}")
            with contextlib.suppress(OSError, ValueError):
                if int(knob.read_text()) < v:
                    knob.write_text(str(v))


def ip_batch(lines: list[str], netns: str | None = None, timeout: float = 300.0) -> None:
    argv = ["ip", *(["-n", netns] if netns else []), "-batch", "-"]
    p = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise CommandError("local", argv, p.returncode, p.stdout + p.stderr)


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
        self.public_ip = underlay_ip
        self.behind_nat = False
        self.nat_type: str | None = None  # lab path nat: the type of the NAT in front of this host
        self.workdir = workdir
        self.journal = journal
        self.underlay_if = "eth0"

    def argv(self, argv: Sequence[str]) -> list[str]:
        # taskset execs the command: the PID we journal and signal stays the command's own
        pin = ["taskset", "-c", self.cpus] if self.cpus and argv else []
        return ["ip", "netns", "exec", self.netns, *pin, *argv]

    def pids(self) -> list[int]:
        return netns_pids(self.netns)


class NetnsLab:
    """Builds and destroys the namespace topology for one run (names carry the run's tag)."""

    def __init__(
        self,
        tag: str,
        n_hosts: int,
        run_dir: Path,
        journal: Journal,
        path: str = "direct",
        relay: str | None = None,
        nat_type: str = DEFAULT_NAT_TYPE,
        nat_types: Mapping[str, str] | None = None,
        underlay_mtu: int | None = None,
    ):
        """nat_type: every NATted host's NAT type (path nat); nat_types: per-host overrides {"h1": ...}."""
        if path not in PATHS:
            raise ValueError(f"lab path must be one of {', '.join(PATHS)}, not {path!r}")
        for t in [nat_type, *(nat_types or {}).values()]:
            if t not in NAT_TYPES:
                raise ValueError(f"NAT type must be one of {', '.join(NAT_TYPES)}, not {t!r}")
        self.tag = tag
        self.run_dir = run_dir
        self.journal = journal
        self.path = path
        self._ns_entries: dict[str, dict[str, Any]] = {}
        self.router = NetnsHost("router", f"{tag}-r", "", run_dir / "hosts" / "router", journal)
        self.hosts = [
            NetnsHost(f"h{i}", f"{tag}-h{i}", host_ip(i), run_dir / "hosts" / f"h{i}", journal)
            for i in range(1, n_hosts + 1)
        ]
        self.relay: NetnsHost | None = None
        self.path_policies = True
        if path != "direct":
            if n_hosts < 3:
                raise ValueError(f"lab path {path!r} needs at least 3 hosts (two peers and a relay host)")
            self.relay = next(h for h in self.hosts if h.name == (relay or self.hosts[-1].name))
        self.nats: dict[str, NetnsHost] = {}
        self.underlay_mtu = underlay_mtu
        if path == "nat":
            for i, h in enumerate(self.hosts, start=1):
                if h is not self.relay:
                    self.nats[h.name] = NetnsHost(
                        f"n{i}", f"{tag}-n{i}", host_ip(i), run_dir / "hosts" / f"n{i}", journal
                    )
                    h.underlay_ip, h.behind_nat = f"172.16.{i}.2", True
                    h.nat_type = (nat_types or {}).get(h.name, nat_type)
        unknown = set(nat_types or {}) - set(self.nats)
        if unknown:
            raise ValueError(f"nat_types names hosts that are not behind a NAT: {', '.join(sorted(unknown))}")
        self.nft_table = f"{tag}guard"
        self.path_table = f"{tag}path"

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
        batched = len(self.hosts) > BATCH_ABOVE and not self.nats
        if batched:
            self._build_hosts_batched()
        for i, h in enumerate([] if batched else self.hosts, start=1):
            self._add_ns(h)
            nat = self.nats.get(h.name)
            if nat is not None:
                self._build_nat(i, h, nat)
                continue
            add_veth("eth0", h.netns, f"h{i}", self.router.netns)
            self.router.run(["ip", "addr", "add", f"{router_ip(i)}/24", "dev", f"h{i}"])
            self.router.run(["ip", "link", "set", f"h{i}", "up"])
            h.run(["ip", "addr", "add", f"{host_ip(i)}/24", "dev", "eth0"])
            h.run(["ip", "link", "set", "eth0", "up"])
            # a default route keeps VPNs that look up "their" address (vpncloud) working; the router drops it
            h.run(["ip", "route", "add", "default", "via", router_ip(i)])
        if self.underlay_mtu is not None:
            self._set_mtu(self.underlay_mtu)
        self._install_guard()
        if self.path == "relay":
            self.block_udp_between_peers()

    def _set_mtu(self, mtu: int) -> None:
        """Every veth of the lab (hosts, NATs, router) at `mtu`: both ends of a link agree, so neither the
        router nor a NAT fragments or drops what a host sends at its MTU."""
        for ns in [self.router, *self.hosts, *self.nats.values()]:
            links = json.loads(ns.run(["ip", "-j", "link", "show", "type", "veth"]).stdout or "[]")
            for link in links:
                ns.run(["ip", "link", "set", "dev", link["ifname"], "mtu", str(mtu)])

    def _build_hosts_batched(self) -> None:
        """The hosts of build() for large labs (many-client scenarios): a few `ip -batch` runs plus one
        `ip -n NS -batch` per host instead of ~8 commands per host (1000 hosts: seconds, not minutes)."""
        for h in self.hosts:  # journal first: clean finds half-made ones
            self._ns_entries[h.netns] = self.journal.netns(h.netns)
        raise_neigh_limits(2 * len(self.hosts) + 256)
        ip_batch([f"netns add {h.netns}" for h in self.hosts])
        ip_batch(
            [
                f"link add eth0 netns {h.netns} type veth peer name h{i} netns {self.router.netns}"
                for i, h in enumerate(self.hosts, start=1)
            ]
        )
        ip_batch(
            [
                line
                for i in range(1, len(self.hosts) + 1)
                for line in (f"addr add {router_ip(i)}/24 dev h{i}", f"link set h{i} up")
            ],
            self.router.netns,
        )

        def one(i: int, h: NetnsHost) -> None:
            h.workdir.mkdir(parents=True, exist_ok=True)
            ip_batch(
                [
                    "link set lo up",
                    f"addr add {host_ip(i)}/24 dev eth0",
                    "link set eth0 up",
                    f"route add default via {router_ip(i)}",
                ],
                h.netns,
            )

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(one, range(1, len(self.hosts) + 1), self.hosts))

    def _build_nat(self, i: int, h: NetnsHost, nat: NetnsHost) -> None:
        """hI --- nI (masquerade) --- router; nI takes the address the host would have had."""
        self._add_ns(nat)
        nat.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        add_veth("wan", nat.netns, f"h{i}", self.router.netns)
        self.router.run(["ip", "addr", "add", f"{router_ip(i)}/24", "dev", f"h{i}"])
        self.router.run(["ip", "link", "set", f"h{i}", "up"])
        nat.run(["ip", "addr", "add", f"{host_ip(i)}/24", "dev", "wan"])
        nat.run(["ip", "link", "set", "wan", "up"])
        nat.run(["ip", "route", "add", "default", "via", router_ip(i)])
        add_veth("eth0", h.netns, "lan", nat.netns)
        nat.run(["ip", "addr", "add", f"172.16.{i}.1/24", "dev", "lan"])
        nat.run(["ip", "link", "set", "lan", "up"])
        h.run(["ip", "addr", "add", f"{h.underlay_ip}/24", "dev", "eth0"])
        h.run(["ip", "link", "set", "eth0", "up"])
        h.run(["ip", "route", "add", "default", "via", f"172.16.{i}.1"])
        nat.run(
            ["nft", "-f", "-"],
            input=nat_rules(f"{self.tag}nat", h.nat_type or DEFAULT_NAT_TYPE, h.underlay_ip),
        )

    # -- path policies (relay scenario) ------------------------------------------------------------
    def block_udp_between_peers(self, except_host: Host | None = None) -> None:
        """Drop (and count) UDP the router forwards between two peers, unless one is `except_host`
        (default: the relay host). All UDP, not only to the peer's tunnel port: VPNs that find no direct
        path try every port they know (Tailscale disco, STUN)."""
        keep = except_host or self.relay
        peers = ", ".join(h.public_ip for h in self.hosts if h is not keep)
        rules = f"""
table inet {self.path_table} {{
  counter udp_blocked {{ }}
  chain forward {{
    type filter hook forward priority -10; policy accept;
    meta nfproto ipv4 meta l4proto udp ip saddr {{ {peers} }} ip daddr {{ {peers} }} counter name udp_blocked drop
  }}
}}
"""
        self.unblock()
        self.router.run(["nft", "-f", "-"], input=rules)

    def block_udp_pair(self, a: Host, b: Host) -> None:
        """Drop UDP between two hosts only (the `plant_fault = "udp-blocked"` negative control of the path
        check): a VPN that still connects them does so through another host."""
        rules = f"""
table inet {self.path_table} {{
  counter udp_blocked {{ }}
  chain forward {{
    type filter hook forward priority -10; policy accept;
    meta nfproto ipv4 meta l4proto udp ip saddr {{ {a.public_ip}, {b.public_ip} }} ip daddr {{ {a.public_ip}, {b.public_ip} }} counter name udp_blocked drop
  }}
}}
"""
        self.unblock()
        self.router.run(["nft", "-f", "-"], input=rules)

    def unblock(self) -> None:
        self.router.run(["nft", "delete", "table", "inet", self.path_table], check=False)

    def udp_blocked(self) -> int:
        return self._counter(self.router, self.path_table, "udp_blocked")["packets"]

    def watch_relay(self, relay: Host | None = None) -> None:
        """Count the relay host's underlay bytes to and from every other peer (nft counters there)."""
        relay = relay or self.relay
        assert relay is not None
        lines = []
        for h in self.hosts:
            if h is relay:
                continue
            lines.append(f"  counter from_{h.name} {{ }}\n  counter to_{h.name} {{ }}")
        inp = "\n".join(
            f"    ip saddr {h.public_ip} counter name from_{h.name}" for h in self.hosts if h is not relay
        )
        out = "\n".join(
            f"    ip daddr {h.public_ip} counter name to_{h.name}" for h in self.hosts if h is not relay
        )
        rules = (
            f"table inet {self.tag}relay {{\n"
            + "\n".join(lines)
            + f"\n  chain input {{\n    type filter hook input priority -300; policy accept;\n{inp}\n  }}"
            + f"\n  chain output {{\n    type filter hook output priority -300; policy accept;\n{out}\n  }}\n}}\n"
        )
        relay.run(["nft", "delete", "table", "inet", f"{self.tag}relay"], check=False)
        relay.run(["nft", "-f", "-"], input=rules)

    def relay_bytes(self, relay: Host | None = None) -> dict[str, int]:
        """Bytes the relay host received from / sent to each peer since watch_relay(): from_h1, to_h1, ..."""
        relay = relay or self.relay
        assert relay is not None
        out = relay.run(["nft", "-j", "list", "table", "inet", f"{self.tag}relay"]).stdout
        return {
            item["counter"]["name"]: int(item["counter"]["bytes"])
            for item in json.loads(out)["nftables"]
            if "counter" in item
        }

    def _counter(self, host: NetnsHost, table: str, name: str) -> dict[str, int]:
        out = host.run(["nft", "-j", "list", "counter", "inet", table, name]).stdout
        for item in json.loads(out)["nftables"]:
            if "counter" in item:
                return {"packets": int(item["counter"]["packets"]), "bytes": int(item["counter"]["bytes"])}
        return {"packets": -1, "bytes": -1}

    def _install_guard(self) -> None:
        # the router forwards lab traffic only; anything else is dropped and counted as `offlab`, with its
        # destination remembered (offlab4/6). Multicast (IPv4 224/4, IPv6 ff00::/8) is link-local discovery
        # (SSDP/UPnP, mDNS), never routed here: accepted to the router's own stack, not counted as off-lab
        rules = f"""
table inet {self.nft_table} {{
  counter offlab {{ }}
  counter tunnel_leak {{ }}
  set offlab4 {{ type ipv4_addr; size {OFFLAB_DESTS}; flags dynamic; counter; }}
  set offlab6 {{ type ipv6_addr; size {OFFLAB_DESTS}; flags dynamic; counter; }}
  chain prerouting {{
    type filter hook prerouting priority -300; policy accept;
    meta nfproto ipv4 ip daddr {LAB_PREFIX} accept
    meta nfproto ipv4 ip daddr {{ {TUNNEL_RANGES_V4} }} counter name tunnel_leak drop
    meta nfproto ipv6 ip6 daddr {{ {TUNNEL_RANGES_V6} }} counter name tunnel_leak drop
    meta nfproto ipv4 ip daddr 224.0.0.0/4 accept
    meta nfproto ipv4 add @offlab4 {{ ip daddr }} counter name offlab drop
    meta nfproto ipv6 ip6 daddr {{ fe80::/10, ff00::/8 }} accept
    meta nfproto ipv6 add @offlab6 {{ ip6 daddr }} counter name offlab drop
  }}
  chain output {{
    type filter hook output priority -300; policy accept;
    meta nfproto ipv4 ip daddr {{ {LAB_PREFIX}, 127.0.0.0/8 }} accept
    meta nfproto ipv4 add @offlab4 {{ ip daddr }} counter name offlab drop
  }}
}}
"""
        self.router.run(["nft", "-f", "-"], input=rules)

    def all_hosts(self) -> list[NetnsHost]:
        """The peers: the router and NAT namespaces are this same machine, read once through the peers."""
        return list(self.hosts)

    def mapping(self) -> None:
        return None  # the hosts are the lab's own namespaces: no inventory names

    def offlab_drops(self, counter: str = "offlab") -> int:
        """Packets the router dropped: `offlab` = addressed outside the lab (a VPN probing the internet),
        `tunnel_leak` = addressed to a tunnel range but sent unencapsulated (tunnel not up yet)."""
        return nft_counter(self.router, self.nft_table, counter)

    def offlab_destinations(self) -> dict[str, int]:
        """Packets per off-lab destination address the router dropped (the `offlab` counter, split by where
        the VPN tried to go: its STUN, DNS or update servers); {} when unreadable."""
        out: dict[str, int] = {}
        for name in ("offlab4", "offlab6"):
            try:
                text = self.router.run(["nft", "-j", "list", "set", "inet", self.nft_table, name]).stdout
            except CommandError:
                return {}
            for item in json.loads(text)["nftables"]:
                for e in item.get("set", {}).get("elem", []):
                    el = e.get("elem", {}) if isinstance(e, dict) else {}
                    if "val" in el:
                        out[str(el["val"])] = int(el.get("counter", {}).get("packets", 0))
        return out

    def wait_links(self, timeout: float = 5.0) -> None:
        """Block until every host reaches the router (DAD/ARP settle)."""
        end = time.monotonic() + timeout
        if len(self.hosts) > BATCH_ABOVE and not self.nats:  # one fping from the router, 1 ms apart
            todo = [h.underlay_ip for h in self.hosts]
            while todo:
                alive = set(self.router.run(["fping", "-a", "-r", "0", "-i", "1", "-t", "500", *todo], check=False,
                                            timeout=30 + len(todo) / 500).stdout.split())  # fmt: skip
                todo = [ip for ip in todo if ip not in alive]
                if todo and time.monotonic() > end + len(self.hosts) / 100:
                    raise RuntimeError(f"hosts do not answer the router: {todo[:10]}")
            return
        for i, h in enumerate(self.hosts, start=1):
            if h.name in self.nats:  # through its NAT: the NAT's WAN side must be up too
                self.nats[h.name].run(["ping", "-c1", "-W1", router_ip(i)], check=False)
            while h.run(["ping", "-c1", "-W1", router_ip(i)], check=False).returncode != 0:
                if time.monotonic() > end:
                    raise RuntimeError(f"{h.name} cannot reach the router at {router_ip(i)}")
                time.sleep(0.05)

    # -- teardown ----------------------------------------------------------------------------------
    def destroy(self) -> list[str]:
        """Kill whatever still runs in our namespaces (all of it is ours), delete them; return problems."""
        problems: list[str] = []
        for h in [*self.hosts, *self.nats.values(), self.router]:
            problems += destroy_netns(h.netns)
            entry = self._ns_entries.pop(h.netns, None)
            if entry is not None and not netns_exists(h.netns):
                self.journal.release(entry)
        return problems


def nat_rules(table: str, nat_type: str, inside_ip: str) -> str:
    """The nftables table of a NAT namespace of type `nat_type` (see the module docstring) in front of the
    host at `inside_ip` (LAN side `lan`, WAN side `wan`)."""
    if nat_type not in NAT_TYPES:
        raise ValueError(f"NAT type must be one of {', '.join(NAT_TYPES)}, not {nat_type!r}")
    sets, learn, open_ = "", "", ""
    t = f"flags dynamic, timeout; timeout {NAT_SET_TIMEOUT_S}s;"
    if nat_type == "full-cone":  # endpoint-independent filtering: the mapped port, from anyone
        sets = f"  set cone {{ type inet_service; {t} }}\n"
        learn = '    iifname "lan" oifname "wan" meta l4proto udp update @cone { udp sport }\n'
        open_ = f'    iifname "wan" meta l4proto udp udp dport @cone dnat ip to {inside_ip}\n'
    elif nat_type == "address-restricted":  # address-dependent filtering: the mapped port, from peers' IPs
        sets = f"  set seen {{ type ipv4_addr . inet_service; {t} }}\n"
        learn = '    iifname "lan" oifname "wan" meta l4proto udp update @seen { ip daddr . udp sport }\n'
        open_ = f'    iifname "wan" meta l4proto udp ip saddr . udp dport @seen dnat ip to {inside_ip}\n'
    masq = "masquerade fully-random" if nat_type == "symmetric" else "masquerade"
    return f"""
table inet {table} {{
  counter inbound_dropped {{ }}
{sets}  chain forward {{
    type filter hook forward priority 0; policy accept;
{learn}    iifname "wan" ct state established,related accept
    iifname "wan" ct status dnat accept
    iifname "wan" counter name inbound_dropped drop
  }}
  chain input {{
    type filter hook input priority 0; policy accept;
    iifname "wan" ct state established,related accept
    iifname "wan" counter name inbound_dropped drop
  }}
  chain prerouting {{
    type nat hook prerouting priority -100; policy accept;
{open_}  }}
  chain postrouting {{
    type nat hook postrouting priority 100; policy accept;
    oifname "wan" {masq}
  }}
}}
"""


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
