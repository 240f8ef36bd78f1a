"""innernet 2.0.0 (crates.io `innernet` + `innernet-server`, built into the install cache): a WireGuard
mesh with a central coordination server that hands out peers by CIDR and admin rights.

The server host (the lab's relay host when it has one, else the last host) creates the network
(`innernet-server new`, root CIDR 10.77.0.0/24, the server itself at 10.77.0.1), one CIDR for the
peers (10.77.0.128/25) and one peer per other host with a fixed address 10.77.0.(128 + i) and a
one-time invitation (`add-peer --save-config`), then serves its API on the WireGuard interface. Each
other host redeems its invitation (`innernet install`, which needs a second `up`) and runs
`innernet up --daemon`, which fetches the peer list from the server every few seconds and configures
WireGuard peers to every other host: the data plane is a direct full mesh.

WireGuard in userspace: Debian's wireguard-go (`--backend userspace`, WG_USERSPACE_IMPLEMENTATION;
innernet hung with boringtun here). Interface names are unique on the machine (wireguard-go's sockets
in /var/run/wireguard are shared by every namespace), so the server's network name and every client's
`--name` are the host's ifname. Configuration and state go to per-host directories in the run folder
(`--config-dir`, `--data-dir`), never to /etc/innernet*; `--no-write-hosts` keeps /etc/hosts untouched.
The configs hold the WireGuard private keys (0600, written by innernet).

ACL (vpn_options.innernet.acl, vpns/acl.py): innernet's own CIDRs and associations. A peer sees (gets WireGuard
peers for) only the peers of its own CIDR and of CIDRs associated with it, plus the server. Under a policy each
host gets its own /32 CIDR under the root, named by its role (tb-client, tb-server, tb-isolated-<host>), instead
of the shared `peers` CIDR; "isolate" associates tb-client with tb-server only, so an isolated host has no
WireGuard peer for either (and they none for it); the test-only control associates every pair of them. The
coordination server (its own CIDR, reachable from every peer by design) is exempt from the policy, so the
check needs a host beyond client, server and innernet server ([lab] hosts >= 4). innernet-server 2.0.0 has no
`add-association` command (only the admin client `innernet add-association`, over the server's API): the driver
writes the association rows into the server's database (`associations` table, the rows that API writes) before
`serve`.

Revocation: `innernet-server disable-peer <network> --name <host> --yes` on the server host. The server stops
listing the disabled peer, and every other peer's `innernet up --interval 2` drops its WireGuard peer on its
next fetch. A start of the server after a revocation re-enables the peer (`enable-peer`), so a restarted mesh
is whole again. The coordination server itself cannot be revoked."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path as Path

from tunnelbench.lab.host import Host, Process
from tunnelbench.vpns.acl import OFF, AclMode, AclPolicy, acl_option, acl_policy, may_open
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver
from tunnelbench.vpns.features import one_source
from tunnelbench.vpns.install import Apt, Crate

# documentation pages the feature record cites
INNERNET_GH = "https://github.com/tonarino/innernet"

VERSION = "2.0.0"
PORT = 51820
# associate CIDRs by name, pairwise from argv[2:], in the server's database (argv[1]); prints the association count
ASSOCIATE = (
    "import sqlite3,sys\n"
    "c=sqlite3.connect(sys.argv[1]);a=sys.argv[2:]\n"
    "for x,y in zip(a[::2],a[1::2]):\n"
    "    c.execute('INSERT INTO associations (cidr_id_1,cidr_id_2) SELECT a.id,b.id FROM cidrs a,cidrs b "
    "WHERE a.name=? AND b.name=?',(x,y))\n"
    "c.commit();print(c.execute('SELECT count(*) FROM associations').fetchone()[0])\n"
)


class Innernet(VpnDriver):
    name = "innernet"
    summary = "innernet WireGuard mesh with a coordination server (userspace wireguard-go)"
    # the feature record (vpns/features.py): each fact with its source
    features = one_source(
        INNERNET_GH,
        protocol="WireGuard, coordination server API over the tunnel",
        ciphers="WireGuard (ChaCha20-Poly1305, Curve25519)",
        data_plane="kernel WireGuard or userspace (wireguard-go, used here)",
        topology="full mesh, peers grouped in CIDRs",
        nat_traversal="endpoint discovery and NAT traversal via the server (since 1.5)",
        relay="none",
        acl="CIDR associations between groups",
        unattended_join="one-time invitation files",
        self_hosted_control="yes (innernet-server)",
        platforms="Linux, macOS",
        license="MIT",
    )
    binaries = ("innernet", "innernet-server", "wireguard-go")
    installs = (
        Crate("innernet", VERSION, ("innernet",)),
        Crate("innernet-server", VERSION, ("innernet-server",)),
        Apt(("wireguard-go", "wireguard-tools")),
    )
    versioned_sources = ("innernet", "innernet-server")  # innernet@X.Y.Z pins both crates (catalog.resolve)
    default_mtu = 1280  # innernet's default (`innernet --mtu`, "default: 1280")
    acl_support = True
    revocation = "`innernet-server disable-peer <network> --name <host>` on the server; peers drop it on their next fetch"

    class Options(TunnelOptions):  # vpn_options: mtu, acl
        acl: AclMode = acl_option()

    options: Options

    settle_s = 1.0
    paths = frozenset({"direct"})
    # the WireGuard private key lives in the interface config innernet writes (etc/<network>.conf)
    secret_patterns = ("*.conf",)
    paths_why = {
        "relay": "innernet has no relay: peers need direct UDP to each other",
        "nat": "not probed here yet: NAT traversal needs the server to learn endpoints (innernet >= 1.5)",
    }

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.server = self.control_host(spec)
        self.settings = {
            "mode": "WireGuard full mesh, peers from the innernet server",
            "server": self.server.name,
            "backend": "userspace (wireguard-go)",
            "cipher": "ChaCha20-Poly1305 (WireGuard)",
            "mtu": self.mtu,
            "port": PORT,
        }
        self.revoked: set[str] = set()  # peers disabled on the server: re-enabled when the server starts
        acl = self.options.acl
        exempt = {self.server.name: "innernet's coordination server: every peer reaches it by design"}
        self.acl: AclPolicy | None = None if acl == OFF else acl_policy(spec, acl, exempt=exempt)
        if self.acl is not None and self.acl.server is self.server:
            raise ValueError(
                f"innernet acl: the case's server {self.server.name} is innernet's coordination server, "
                "which every peer reaches by design: put [lab] server on another host"
            )
        if self.acl is not None:
            self.settings["acl"] = self.acl.record(
                "innernet CIDRs: one /32 per host named by role (tb-client, tb-server, tb-isolated-<host>), "
                + (
                    "association tb-client <-> tb-server only"
                    if self.acl.enforced
                    else "every pair of them associated (not enforced)"
                )
            )

    @classmethod
    def control_host(cls, spec: MeshSpec) -> Host:
        """The innernet server: the relay host when the lab has one, else the last host."""
        return spec.relay or spec.hosts[-1]

    @classmethod
    def version(cls, host: Host) -> str:
        return cls._first_line(
            host, [host.binary("innernet", cls.installs), "--version"], "innernet"
        ).split()[-1]

    def peers(self, host: Host) -> list[Host]:
        return may_open(self.acl, host, super().peers(host))

    def cidr(self, host: Host) -> str:
        """The innernet CIDR `host` joins: `peers` without a policy, else its own role CIDR."""
        if self.acl is None:
            return "peers"
        role = self.acl.role(host)
        return f"tb-{role}-{host.name}" if role == "isolated" else f"tb-{role}"

    def associations(self) -> list[tuple[str, str]]:
        """The CIDR pairs to associate: client <-> server under "isolate", every pair under the control."""
        if self.acl is None:
            return []
        if self.acl.enforced:
            return [("tb-client", "tb-server")]
        return list(
            itertools.combinations([self.cidr(h) for h in self.spec.hosts if h is not self.server], 2)
        )

    def tunnel_ip(self, host: Host) -> str:
        return "10.77.0.1" if host is self.server else f"10.77.0.{128 + self.index(host)}"

    def _dirs(self, host: Host) -> list[str]:
        d = self.host_dir(host)
        return ["--config-dir", str(d / "etc"), "--data-dir", str(d / "data")]

    def _env(self, host: Host) -> dict[str, str]:
        return {  # innernet's userspace backend runs the wireguard-go on the host's PATH
            "WG_USERSPACE_IMPLEMENTATION": host.binary("wireguard-go"),
            "WG_LOG_LEVEL": "error",
        }

    def configure(self) -> None:
        s = self.server
        net = self.ifname(s)
        srv = [s.binary("innernet-server", self.installs), *self._dirs(s)]
        s.run([*srv, "new", "--network-name", net, "--network-cidr", "10.77.0.0/24",
               "--external-endpoint", f"{s.public_ip}:{PORT}", "--listen-port", str(PORT)], env=self._env(s))  # fmt: skip
        if self.acl is None:
            s.run(
                [
                    *srv,
                    "add-cidr",
                    net,
                    "--name",
                    "peers",
                    "--cidr",
                    "10.77.0.128/25",
                    "--parent",
                    net,
                    "--yes",
                ]
            )
        else:
            for h in self.spec.hosts:
                if h is not s:
                    s.run([*srv, "add-cidr", net, "--name", self.cidr(h), "--cidr", f"{self.tunnel_ip(h)}/32",
                           "--parent", net, "--yes"])  # fmt: skip
            self._associate(s, net)
        for h in self.spec.hosts:
            if h is s:
                continue
            invite = self.host_dir(s) / f"invite-{h.name}.toml"
            s.run([*srv, "add-peer", net, "--name", h.name, "--cidr", self.cidr(h), "--ip", self.tunnel_ip(h),
                   "--admin", "false", "--save-config", str(invite), "--invite-expires", "1h", "--yes"])  # fmt: skip
            h.write_file(self.host_dir(h) / "invite.toml", s.read_file(invite), 0o600)
            s.remove(invite)

    def _associate(self, s: Host, net: str) -> None:
        """innernet-server 2.0.0 has no add-association: insert the rows its API (`innernet add-association`)
        would, into the server's database, before it serves."""
        pairs = self.associations()
        if not pairs:
            return
        db = self.host_dir(s) / "data" / f"{net}.db"
        py = "python3" if s.remote else sys.executable
        n = s.run([py, "-c", ASSOCIATE, str(db), *(c for pair in pairs for c in pair)]).stdout.strip()
        if n != str(len(pairs)):
            raise RuntimeError(f"innernet: {n} associations in {db}, expected {len(pairs)} ({pairs})")
        self.settings["associations"] = [f"{a} <-> {b}" for a, b in pairs]

    def revoke(self, host: Host) -> str:
        """Disable the host's peer on the innernet server: the others drop it on their next fetch (2 s)."""
        if host is self.server:
            raise NotImplementedError(
                f"{host.name} is innernet's coordination server, which cannot be revoked: "
                "revoke a peer ([lab] hosts >= 4 puts the server on the last host)"
            )
        net = self.ifname(self.server)
        # the server also removes the peer from its own WireGuard device: its backend, as for serve
        self.server.run([self.server.binary("innernet-server", self.installs), *self._dirs(self.server), "--backend", "userspace",
                         "disable-peer", net, "--name", host.name, "--yes"], env=self._env(self.server))  # fmt: skip
        self.revoked.add(host.name)
        return f"innernet-server disable-peer {net} --name {host.name} on {self.server.name}"

    def start(self, host: Host) -> None:
        if any(p.alive() for p in self.procs[host.name]):
            return
        d = self.host_dir(host)
        ifname = self.ifname(host)
        if host is self.server:
            for name in sorted(self.revoked):  # a revoked peer is welcome again in a restarted mesh
                host.run([host.binary("innernet-server", self.installs), *self._dirs(host), "--backend", "userspace", "enable-peer",
                          ifname, "--name", name, "--yes"], env=self._env(host))  # fmt: skip
            self.revoked.clear()
            argv = [host.binary("innernet-server", self.installs), *self._dirs(host), "serve", ifname, "--backend", "userspace",
                    "--mtu", str(self.mtu), "--no-write-hosts"]  # fmt: skip
            proc = host.spawn(argv, label="innernet-server", log_path=d / "daemon.log", env=self._env(host))
            self.procs[host.name].append(proc)
            self.wait_for(
                "innernet-server API",
                lambda: (
                    not proc.alive()
                    or bool(host.run(["ss", "-Hltn", f"sport = :{PORT}"], check=False).stdout.strip())
                ),
                timeout=20,
            )
        else:
            self.start(self.server)
            cli = [
                host.binary("innernet", self.installs),
                "--backend",
                "userspace",
                "--mtu",
                str(self.mtu),
                *self._dirs(host),
            ]
            if host.exists(d / "invite.toml"):
                host.run([*cli, "install", str(d / "invite.toml"), "--name", ifname, "--delete-invite",
                          "--no-write-hosts"], env=self._env(host), timeout=60)  # fmt: skip
            argv = [*cli, "up", ifname, "--daemon", "--interval", "2", "--no-write-hosts"]
            proc = host.spawn(argv, label="innernet", log_path=d / "daemon.log", env=self._env(host))
            self.procs[host.name].append(proc)
        self.wait_for(
            f"innernet interface {ifname}",
            lambda: not proc.alive() or self.link_exists(host, ifname),
            timeout=30,
        )
        if not proc.alive():
            raise RuntimeError(f"{proc.label} exited: {proc.log_tail()}")
        host.run(["ip", "link", "set", ifname, "mtu", str(self.mtu)])
        # innernet forks wireguard-go, which carries the data plane: journal it and hand it to the monitor
        if not any(p.label == "wireguard-go" for p in self.procs[host.name]):
            for pid in host.run(["pgrep", "-f", f"wireguard-go {ifname}$"], check=False).stdout.split():
                argv = ["wireguard-go", ifname]
                entry = host.journal.process(int(pid), argv, host.name) if host.journal else None
                self.procs[host.name].append(Process(host, "wireguard-go", argv, int(pid), None, None, entry))

    def after_stop(self, host: Host) -> None:
        super().after_stop(host)  # wireguard-go (forked by innernet) exits with its device
        host.remove(Path("/var/run/wireguard") / f"{self.ifname(host)}.sock")
