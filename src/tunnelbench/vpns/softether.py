"""SoftEther VPN 5.01 (Debian softether-vpnserver / -vpnclient / -vpncmd): a layer-2 virtual hub reached
over SSL-VPN (TLS over TCP 443), with SoftEther's UDP acceleration when UDP to the server works.

Topology: a star. The hub host (the lab's relay host when it has one, else the last host) runs
vpnserver with its DEFAULT virtual hub and a local bridge to a tap device (tap_<ifname>), which carries
the hub host's own tunnel address; every other host runs vpnclient with one virtual NIC (vpn_<ifname>)
and one account that logs in to the hub as a per-host user with a random password. Frames between two
clients always cross the hub: SoftEther has no client-to-client path. So `relay` and `nat` change
nothing for it (clients dial out over TCP), and the relay-path test shows every byte crossing the hub.

Each daemon runs in the foreground (`execsvc`) in its own mount namespace (lab/mountns.py) with
per-host directories over /var/lib/softether, /var/log/softether and /run/softether, where Debian's
build keeps its configuration, logs and sockets (shared by all namespaces otherwise). vpncmd commands
are read from 0600 files (/IN:), so no password is ever on a command line. The server's phone-home
features are switched off (VPN Azure, keep-alive to keepalive.softether.org); the lab router drops and
counts whatever it still tries (DDNS).

ACL (vpn_options.softether.acl, vpns/acl.py): the virtual hub's access list, as its operator would set it with
`AccessAdd`: a discard rule per (isolated host -> client) and (isolated host -> server) IPv4 pair, on tunnel
addresses, all protocols. The hub applies the list to every frame it switches, its local bridge included, so the
hub host can be isolated too. The list is stateless: an isolated host's echo requests and SYNs die at the hub,
and so would the client's replies to it. The test-only control adds the same rules as `pass`."""

from __future__ import annotations

import re
import secrets
import signal
import time
from pathlib import Path
from typing import Any

from tunnelbench.lab.host import Host, Process
from tunnelbench.lab.mountns import in_mounts_of, private_mounts
from tunnelbench.vpns.acl import OFF, AclMode, acl_option, acl_policy, may_open
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver
from tunnelbench.vpns.features import one_source
from tunnelbench.vpns.install import Apt, debian_version

# documentation pages the feature record cites
SOFTETHER_DOC = "https://www.softether.org/1-features"

PORT = 443
CIPHER = "ECDHE-RSA-AES256-GCM-SHA384"
DIRS = ("/var/lib/softether", "/var/log/softether", "/run/softether")


class SoftEther(VpnDriver):
    name = "softether"
    summary = (
        "SoftEther VPN 5.01 (Debian): star around a virtual hub, L2 over TLS/TCP 443 (+UDP acceleration)"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = one_source(
        SOFTETHER_DOC,
        protocol="SSL-VPN (SoftEther protocol, L2 over TLS/TCP) plus L2TP/IPsec, OpenVPN, SSTP servers",
        ciphers="TLS cipher suites (here ECDHE-RSA-AES256-GCM-SHA384)",
        data_plane="userspace (C), TAP",
        topology="star around a virtual hub",
        nat_traversal="clients dial out over TCP 443; NAT-T and VPN Azure",
        relay="the hub carries all traffic (TCP)",
        acl="per-user/group access lists on the virtual hub",
        unattended_join="accounts via vpncmd",
        self_hosted_control="yes (the server is the hub)",
        platforms="Windows, Linux, macOS, FreeBSD, Solaris",
        license=("Apache-2.0", "https://github.com/SoftEtherVPN/SoftEtherVPN"),
    )
    binaries = ("vpnserver", "vpnclient", "vpncmd")
    installs = (Apt(("softether-vpnserver", "softether-vpnclient", "softether-vpncmd")),)
    default_mtu = 1500  # the tap devices' default; SoftEther fragments inside its TLS stream
    acl_support = True
    secret_patterns = ("*.cmds",)  # vpncmd scripts hold the account passwords
    settle_s = 2.0
    paths = frozenset({"direct", "relay", "nat"})
    topologies = frozenset({"mesh", "star"})  # a hub by design: star puts it on the star's hub host

    class Options(TunnelOptions):
        acl: AclMode = acl_option()

    options: Options

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        # the virtual hub: the star's hub (the scenario's server) in a star, else the relay host or the last one
        self.hub = (
            spec.hub if spec.topology == "star" and spec.hub is not None else spec.relay or spec.hosts[-1]
        )
        acl = self.options.acl
        self.acl = None if acl == OFF else acl_policy(spec, acl)
        self.settings = {
            "mode": f"star: virtual hub on {self.hub.name}, clients over TLS/TCP {PORT}",
            "hub_host": self.hub.name,
            "cipher": CIPHER,
            "layer": 2,
            "mtu": self.mtu,
            "udp_acceleration": "SoftEther default (on)",
        }
        if self.acl is not None:
            self.settings["acl"] = self.acl.record(
                "virtual hub access list: AccessAdd discard per isolated source -> client/server (IPv4, all "
                "protocols)"
                if self.acl.enforced
                else "virtual hub access list with the same rules as pass"
            )

    def peers(self, host: Host) -> list[Host]:
        return may_open(self.acl, host, super().peers(host))

    def _access_list(self) -> list[str]:
        """The policy as the hub's IPv4 access list (vpncmd wants every parameter, empty ones included)."""
        if self.acl is None:
            return []
        action = "discard" if self.acl.enforced else "pass"
        return [
            f"AccessAdd {action} /MEMO:tb-{src.name}-{dst.name} /PRIORITY:{10 + i} /SRCUSERNAME: "
            "/DESTUSERNAME: /SRCMAC: /DESTMAC: "
            f"/SRCIP:{self.tunnel_ip(src)}/32 /DESTIP:{self.tunnel_ip(dst)}/32 /PROTOCOL:0 /SRCPORT: "
            "/DESTPORT: /TCPSTATE:"
            for i, (src, dst) in enumerate(
                (s, d) for s in self.acl.isolated for d in (self.acl.client, self.acl.server)
            )
        ]

    @classmethod
    def version(cls, host: Host) -> str:
        return f"debian {debian_version('softether-vpnserver')}"

    def _mounts(self, host: Host) -> dict[str, Any]:
        d = self.host_dir(host)
        return {t: d / t.strip("/").replace("/", "_") for t in DIRS}

    def _iface(self, host: Host) -> str:
        return ("tap_" if host is self.hub else "vpn_") + self.ifname(host)

    def configure(self) -> None:
        self.passwords = {h.name: secrets.token_urlsafe(18) for h in self.spec.hosts if h is not self.hub}
        for h in self.spec.hosts:
            for src in self._mounts(h).values():
                h.mkdir(src)
        hub_cmds = [
            "VpnAzureSetEnable no",
            "KeepDisable",
            f"ServerCipherSet {CIPHER}",
            f"BridgeCreate DEFAULT /DEVICE:{self.ifname(self.hub)} /TAP:yes",
            "Hub DEFAULT",
            *self._access_list(),
        ]
        for name, pw in self.passwords.items():
            hub_cmds += [
                f"UserCreate {name} /GROUP:none /REALNAME:none /NOTE:none",
                f"UserPasswordSet {name} /PASSWORD:{pw}",
            ]
        self.hub.write_file(self.host_dir(self.hub) / "server.cmds", "\n".join(hub_cmds) + "\n", 0o600)
        for h in self.spec.hosts:
            if h is self.hub:
                continue
            cmds = [
                f"NicCreate {self.ifname(h)}",
                f"AccountCreate tb /SERVER:{self.hub.public_ip}:{PORT} /HUB:DEFAULT /USERNAME:{h.name} /NICNAME:{self.ifname(h)}",
                f"AccountPasswordSet tb /PASSWORD:{self.passwords[h.name]} /TYPE:standard",
                "AccountConnect tb",
            ]
            h.write_file(self.host_dir(h) / "client.cmds", "\n".join(cmds) + "\n", 0o600)

    def _vpncmd(self, host: Host, proc: Process, target: list[str], cmds: Path) -> None:
        """vpncmd exits 0 whatever happens: its output says whether every command worked."""
        for _ in range(20):
            out = host.run(
                in_mounts_of(proc.pid, [host.binary("vpncmd", self.installs), *target, f"/IN:{cmds}"]),
                timeout=60,
            ).stdout
            if "Connection to the server failed" not in out:  # the daemon listens before it serves
                break
            time.sleep(0.5)
        if "Error occurred" in out:  # vpncmd echoes its commands: never let a password reach a log
            out = re.sub(r"/PASSWORD:\S+", "/PASSWORD:***", out)
            raise RuntimeError(f"softether: vpncmd {' '.join(target)} failed: {out[-800:]}")

    def _wait_port(self, host: Host, proc: Process, port: int, what: str) -> None:
        self.wait_for(
            what,
            lambda: (
                not proc.alive()
                or bool(host.run(["ss", "-Hltn", f"sport = :{port}"], check=False).stdout.strip())
            ),
            timeout=30,
        )
        if not proc.alive():
            raise RuntimeError(f"{what}: daemon exited: {proc.log_tail()}")
        # the forked worker does the work: journal it and hand it to the monitor (CPU/RSS) as well
        for pid in host.run(["pgrep", "-P", str(proc.pid)], check=False).stdout.split():
            entry = host.journal.process(int(pid), proc.argv, host.name) if host.journal else None
            self.procs[host.name].append(
                Process(host, f"{proc.label}-worker", proc.argv, int(pid), proc.log_path, None, entry)
            )

    def start(self, host: Host) -> None:
        if any(p.alive() for p in self.procs[host.name]):
            return
        if host is not self.hub:
            self.start(self.hub)  # clients need the hub
        d = self.host_dir(host)
        iface = self._iface(host)
        for src in self._mounts(
            host
        ).values():  # a restart starts from a clean configuration (vpncmd re-adds it)
            host.run(["rm", "-rf", str(src)])
            host.mkdir(src)
        if host is self.hub:
            proc = host.spawn(
                private_mounts(self._mounts(host), [host.binary("vpnserver", self.installs), "execsvc"]),
                label="vpnserver",
                log_path=d / "daemon.log",
            )
            self.procs[host.name].append(proc)
            self._wait_port(host, proc, 5555, "vpnserver admin port")
            self._vpncmd(host, proc, ["127.0.0.1:5555", "/SERVER"], d / "server.cmds")
        else:
            proc = host.spawn(
                private_mounts(self._mounts(host), [host.binary("vpnclient", self.installs), "execsvc"]),
                label="vpnclient",
                log_path=d / "daemon.log",
            )
            self.procs[host.name].append(proc)
            self._wait_port(host, proc, 9931, "vpnclient admin port")
            self._vpncmd(host, proc, ["127.0.0.1:9931", "/CLIENT"], d / "client.cmds")
        self.wait_for(f"softether device {iface}", lambda: self.link_exists(host, iface), timeout=30)
        host.run(["ip", "addr", "add", f"{self.tunnel_ip(host)}/{self.tunnel_prefixlen}", "dev", iface])
        host.run(["ip", "link", "set", iface, "mtu", str(self.mtu), "up"])

    def stop(self, host: Host) -> None:
        # vpnserver/vpnclient `execsvc` fork a worker that holds the sockets and the tap device, and the
        # worker ignores SIGTERM for a while: signal the whole process group (spawn makes each daemon a
        # session leader), then let Process.stop escalate to SIGKILL
        for p in self.procs[host.name]:
            if p.alive():
                host.signal(-p.pid, signal.SIGTERM)
        end = time.monotonic() + 3
        while time.monotonic() < end and self._group_alive(host):
            time.sleep(0.05)
        for p in self.procs[host.name]:
            host.signal(-p.pid, signal.SIGKILL)
        super().stop(host)

    def _group_alive(self, host: Host) -> bool:
        return any(
            host.run(["pgrep", "-g", str(p.pid)], check=False).stdout.strip() for p in self.procs[host.name]
        )

    def leftovers(self, host: Host) -> list[str]:
        found = super().leftovers(host)
        found += [
            f"process group {p.pid} still has members"
            for p in self.procs[host.name]
            if self._group_alive(host)
        ]
        return found

    def stop_links(self, host: Host) -> list[str]:
        return [self._iface(host)]
