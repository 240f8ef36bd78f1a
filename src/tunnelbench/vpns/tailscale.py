"""Tailscale (tailscaled + tailscale, Go proxy v1.102.5) with a self-hosted control server (Headscale
v0.29.3) and a self-hosted DERP relay (derper): no Tailscale-operated service is ever contacted.

Infrastructure host: the lab's relay host when it has one (path relay/nat), else the last host. It runs
  derper    DERP over HTTPS on :8443 with a self-signed certificate (`--certmode=manual`), STUN on :3478;
            Headscale's DERP map pins the certificate by hash (`certname: sha256-raw:...`, from derper's log);
  headscale control server on :8080 (plain HTTP inside the lab; clients speak Noise to it), embedded
            DERP off, tailnet 100.64.0.0/10 (outside it Headscale is "not supported" and tailscaled used
            its own tailnet IP as an endpoint), v6 off, SQLite in the run folder, no update checks.
One reusable pre-auth key (`headscale preauthkeys create -u <id> --reusable`) joins every node unattended;
it is passed to `tailscale up` as `--auth-key=file:...` (0600), never on a command line.

Every host runs tailscaled with its own state dir, socket and tun device (`--tun=<ifname>`), logtail off
(`--no-logs-no-support`), `tailscale up --accept-dns=false --netfilter-mode=off` (it still makes empty
nft tables in the namespace, which go with it). The data plane is WireGuard in userspace (wireguard-go
inside tailscaled, with the kernel TUN's GSO/GRO). Tunnel addresses are whatever Headscale assigned,
read back with `tailscale ip -4`. MTU: tailscaled's 1280 unless the scenario sets one (TS_DEBUG_MTU).
A new node takes ~7 s to its first direct ping (the first disco handshake is retried after 5 s).

Paths: direct (peers find each other's underlay endpoints); relay (UDP blocked between peers: all
their traffic goes over DERP on the infrastructure host, TCP 8443); nat (peers behind their own NATs
learn their public endpoints by STUN and punch through; DERP carries traffic until then).

ACL (vpn_options.tailscale.acl, vpns/acl.py): a Headscale policy file (`policy.mode: file`, `policy.path`)
written before Headscale starts. Each host joins with a reusable pre-auth key tagged with its policy role
(`preauthkeys create --tags tag:tb-client|tb-server|tb-isolated`): tags are fixed before a node exists and
survive a rejoin, where tailnet IPs (a "hosts" alias) depend on join order and change when a revoked node
comes back. Under "isolate" the only rule is tag:tb-client -> tag:tb-server:* (TCP, UDP, ICMP); tailscaled's
own packet filter enforces it (the netfilter mode does not matter) and Headscale does not even send the
isolated host its peers. The test-only control keeps the tags and accepts * -> *:*. The control server is
reached over the underlay, never the tailnet, so no host is exempt."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tunnelbench.lab.host import Host
from tunnelbench.vpns.acl import OFF, AclMode, AclPolicy, acl_option, acl_policy, may_open
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver
from tunnelbench.vpns.features import fact
from tunnelbench.vpns.install import GoModule

# documentation pages the feature record cites
HS_DERP = "https://headscale.net/latest/ref/derp"
TS_DERP = "https://tailscale.com/kb/1232/derp-servers"

TS = GoModule(
    "tailscale",
    "tailscale.com",
    "v1.102.5",
    ("tailscale.com/cmd/tailscaled", "tailscale.com/cmd/tailscale", "tailscale.com/cmd/derper"),
    ("tailscaled", "tailscale", "derper"),
)
HS = GoModule(
    "headscale",
    "github.com/juanfont/headscale",
    "v0.29.3",
    ("github.com/juanfont/headscale/cmd/headscale",),
    ("headscale",),
    download_first=True,
)
HS_PORT, DERP_PORT, STUN_PORT, TS_PORT = 8080, 8443, 3478, 41641
REGION = 900
SOCK_DIR = Path("/run/tbsock")


class Tailscale(VpnDriver):
    name = "tailscale"
    summary = "Tailscale + Headscale + self-hosted DERP (no public services), userspace WireGuard"
    # the feature record (vpns/features.py): each fact with its source
    features = {
        "protocol": fact(
            "WireGuard data plane; disco + DERP control side channel", "https://pkg.go.dev/tailscale.com/derp"
        ),
        "ciphers": fact("ChaCha20-Poly1305 / Curve25519 (WireGuard); DERP over TLS", TS_DERP),
        "data_plane": fact(
            "userspace (wireguard-go in tailscaled) on a kernel TUN with GSO/GRO",
            "https://tailscale.com/blog/more-throughput",
        ),
        "topology": fact("full mesh, coordinated by a control server", TS_DERP),
        "nat_traversal": fact(
            "STUN + disco hole punching", "https://tailscale.com/blog/how-nat-traversal-works"
        ),
        "relay": fact("DERP over HTTPS/TCP (and peer relays over UDP)", TS_DERP),
        "acl": fact("tailnet policy (users, groups, tags, ports)", "https://tailscale.com/kb/1018/acls"),
        "unattended_join": fact(
            "pre-auth keys (reusable, ephemeral)", "https://headscale.net/latest/ref/integration/"
        ),
        "self_hosted_control": fact("yes with Headscale (and self-hosted derper)", HS_DERP),
        "platforms": fact("Linux, Windows, macOS, iOS, Android, BSD", "https://tailscale.com/download"),
        "license": fact(
            "BSD-3-Clause (client, derper); Headscale BSD-3-Clause", "https://pkg.go.dev/tailscale.com/derp"
        ),
    }
    binaries = ("tailscaled", "tailscale", "derper", "headscale")
    installs = (TS, HS)
    default_mtu = 1280  # tailscaled's tun MTU

    class Options(TunnelOptions):
        acl: AclMode = acl_option()

    options: Options

    settle_s = 1.0
    # Headscale's SQLite database (and its WAL): its nodes' keys and the pre-auth keys; its Noise private key,
    # derper's and tailscaled's keys and state already match SECRET_PATTERNS (*.key, authkey, *.state)
    secret_patterns = ("db.sqlite*",)
    paths = frozenset({"direct", "relay", "nat"})
    revocation = "`headscale nodes delete -i <id>` on the control server"
    acl_support = True

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.infra = self.control_host(spec)
        self.addrs: dict[str, str] = {}
        self.certname: str | None = None
        self.revoked: set[str] = set()  # hosts whose node was deleted: they rejoin as a new node
        self.settings = {
            "mode": "full mesh of WireGuard peers, control by Headscale, DERP relay on the infrastructure host",
            "infrastructure_host": self.infra.name,
            "cipher": "ChaCha20-Poly1305 (WireGuard, Noise IK, Curve25519)",
            "mtu": self.mtu,
            "control": f"headscale {HS.version} (http :{HS_PORT})",
            "derp": f"derper {TS.version} (https :{DERP_PORT}, stun :{STUN_PORT}), no public DERP",
            "tailnet": "100.64.0.0/10",
            "port": TS_PORT,
        }
        acl = self.options.acl
        self.acl: AclPolicy | None = None if acl == OFF else acl_policy(spec, acl)
        if self.acl is not None:
            self.settings["acl"] = self.acl.record(
                "Headscale policy file: tagged pre-auth keys (tag:tb-<role>), acls tag:tb-client -> tag:tb-server:*"
                if self.acl.enforced
                else "Headscale policy file: tagged pre-auth keys (tag:tb-<role>), acls * -> *:* (not enforced)"
            )

    @classmethod
    def control_host(cls, spec: MeshSpec) -> Host:
        """Headscale and derper: the relay host when the lab has one, else the last host."""
        return spec.relay or spec.hosts[-1]

    def peers(self, host: Host) -> list[Host]:
        return may_open(self.acl, host, super().peers(host))

    def _tag(self, host: Host) -> str:
        assert self.acl is not None
        return f"tag:tb-{self.acl.role(host)}"

    def _policy(self) -> dict[str, Any]:
        """Headscale's policy (HuJSON; plain JSON is valid). The tags have no owners: only the admin (the
        CLI making the tagged pre-auth keys) may assign them, and no node can advertise them itself."""
        assert self.acl is not None
        tags: dict[str, list[str]] = {f"tag:tb-{role}": [] for role in ("client", "server", "isolated")}
        rule = (
            {"action": "accept", "src": ["tag:tb-client"], "dst": ["tag:tb-server:*"]}
            if self.acl.enforced
            else {"action": "accept", "src": ["*"], "dst": ["*:*"]}
        )
        return {"tagOwners": tags, "acls": [rule]}

    @classmethod
    def version(cls, host: Host) -> str:
        # `tailscaled --version` prints "1.102.5\n  tailscale commit: ..."; the control server's version too
        ts = cls._first_line(host, [host.binary("tailscaled", cls.installs), "--version"]).split()[0]
        ts = ts.split("-ERR-")[0]  # `go install` builds lack the build info: "1.102.5-ERR-BuildInfo"
        hs = cls._first_line(host, [host.binary("headscale", cls.installs), "version"]).split()[-1]
        return f"{ts} (headscale {hs})"

    def tunnel_ip(self, host: Host) -> str:
        return self.addrs[host.name]

    # -- paths -------------------------------------------------------------------------------------
    def _infra_dir(self) -> Path:
        return self.host_dir(self.infra) / "infra"

    def _sock(self, host: Host) -> Path:
        # unix socket paths are limited to 108 bytes: not in the (deep) run folder; journaled for `clean`
        return SOCK_DIR / f"{self.spec.tag}-{host.name}-tailscaled.sock"

    def _hs_sock(self) -> Path:
        return SOCK_DIR / f"{self.spec.tag}-headscale.sock"

    # -- configure ---------------------------------------------------------------------------------
    def configure(self) -> None:
        d = self._infra_dir()
        self.infra.mkdir(d)
        self.infra.mkdir(SOCK_DIR)
        self.infra.mkdir(d / "certs")
        ip = self.infra.public_ip
        hs = {
            "server_url": f"http://{ip}:{HS_PORT}",
            "listen_addr": f"{self.infra.underlay_ip}:{HS_PORT}",
            "metrics_listen_addr": "127.0.0.1:9090",
            "grpc_listen_addr": "127.0.0.1:50443",
            "grpc_allow_insecure": False,
            "unix_socket": str(self._hs_sock()),
            "unix_socket_permission": "0770",
            "noise": {"private_key_path": str(d / "noise_private.key")},
            "prefixes": {"v4": "100.64.0.0/10", "allocation": "sequential"},
            "derp": {
                "server": {"enabled": False},
                "urls": [],
                "paths": [str(d / "derp.yaml")],
                "auto_update_enabled": False,
                "update_frequency": "24h",
            },
            "disable_check_updates": True,
            "node": {"expiry": 0, "ephemeral": {"inactivity_timeout": "30m"}},
            "database": {"type": "sqlite", "sqlite": {"path": str(d / "db.sqlite"), "write_ahead_log": True}},
            "log": {"level": "warn", "format": "text"},
            "logtail": {"enabled": False},
            "auto_update": {"enabled": False},
            "dns": {
                "magic_dns": False,
                "base_domain": "tailnet.lab",
                "override_local_dns": False,
                "nameservers": {"global": []},
            },  # fmt: skip
            "policy": {"mode": "file", "path": ""},
        }
        if self.acl is not None:
            self.infra.write_file(d / "policy.json", json.dumps(self._policy(), indent=2) + "\n", 0o600)
            hs["policy"] = {"mode": "file", "path": str(d / "policy.json")}
        self.infra.write_file(d / "headscale.yaml", json.dumps(hs, indent=2) + "\n", 0o600)
        # the database holds node and pre-auth keys: made empty and 0600 here, since headscale would make it
        # 0644 (its umask); SQLite gives the -wal and -shm files the database's mode
        self.infra.write_file(d / "db.sqlite", "", 0o600)

    def _derp_map(self) -> str:
        """YAML (region ids must be integer keys, which JSON cannot express)."""
        ip = self.infra.public_ip
        return (
            f"regions:\n  {REGION}:\n    regionid: {REGION}\n    regioncode: lab\n    regionname: tunnelbench lab DERP\n"
            f'    nodes:\n      - name: {REGION}a\n        regionid: {REGION}\n        hostname: "{ip}"\n'
            f'        ipv4: "{ip}"\n        stunport: {STUN_PORT}\n        stunonly: false\n'
            f'        derpport: {DERP_PORT}\n        certname: "{self.certname}"\n'
        )

    # -- infrastructure ----------------------------------------------------------------------------
    def _infra_running(self) -> bool:
        return any(p.label == "headscale" and p.alive() for p in self.procs[self.infra.name])

    def _start_infra(self) -> None:
        h, d = self.infra, self._infra_dir()
        ip = h.underlay_ip
        derper = h.spawn(
            [
                h.binary("derper", self.installs),
                "-a",
                f"{ip}:{DERP_PORT}",
                "--http-port=-1",
                f"--stun-port={STUN_PORT}",
                "--certmode=manual",
                f"--certdir={d / 'certs'}",
                f"-c={d / 'derper.key'}",
                f"--hostname={h.public_ip}",
            ],
            label="derper",
            log_path=d / "derper.log",
        )
        self.procs[h.name].insert(0, derper)
        found: list[str] = []

        def certname() -> bool:
            m = re.search(r"(sha256-raw:[0-9a-f]{64})", derper.log_tail(20000))
            if m:
                found.append(m.group(1))
            return bool(m) or not derper.alive()

        self.wait_for("derper certificate name", certname, timeout=30)
        if not derper.alive():
            raise RuntimeError(f"derper exited: {derper.log_tail()}")
        self.certname = found[0]
        for f in (d / "certs").iterdir():  # derper's self-signed key
            if f.suffix == ".key":
                h.run(["chmod", "600", str(f)])
        h.write_file(d / "derp.yaml", self._derp_map() + "\n", 0o644)
        if h.journal:
            h.journal.path_entry(str(self._hs_sock()))
        hs = h.spawn(
            [h.binary("headscale", self.installs), "serve", "-c", str(d / "headscale.yaml")],
            label="headscale",
            log_path=d / "headscale.log",
        )
        self.procs[h.name].insert(1, hs)
        self.wait_for(
            "headscale listening",
            lambda: (
                not hs.alive()
                or bool(h.run(["ss", "-Hltn", f"sport = :{HS_PORT}"], check=False).stdout.strip())
            ),
            timeout=30,
        )
        if not hs.alive():
            raise RuntimeError(f"headscale exited: {hs.log_tail()}")
        hsctl = [h.binary("headscale", self.installs), "-c", str(d / "headscale.yaml"), "--force"]
        # a restart (the connect workload restarts the mesh) finds the user already in Headscale's database
        users = json.loads(h.run([*hsctl, "users", "list", "-o", "json"]).stdout or "null") or []
        if not any(u["name"] == "tunnelbench" for u in users):
            h.run([*hsctl, "users", "create", "tunnelbench"])
            users = json.loads(h.run([*hsctl, "users", "list", "-o", "json"]).stdout)
        uid = next(str(u["id"]) for u in users if u["name"] == "tunnelbench")
        keys: dict[str, str] = {}  # owner (user id or tag) -> key
        for host in self.spec.hosts:
            # under a policy each role gets its own tagged key (a tagged node belongs to no user)
            owner = ["--tags", self._tag(host)] if self.acl is not None else ["-u", uid]
            if owner[1] not in keys:
                out = h.run(
                    [*hsctl, "preauthkeys", "create", *owner, "--reusable", "-e", "2h", "-o", "json"]
                ).stdout
                keys[owner[1]] = json.loads(out)["key"]
            host.write_file(self.host_dir(host) / "authkey", keys[owner[1]] + "\n", 0o600)

    # -- revocation --------------------------------------------------------------------------------
    def _hsctl(self) -> list[str]:
        return [
            self.infra.binary("headscale", self.installs),
            "-c",
            str(self._infra_dir() / "headscale.yaml"),
            "--force",
        ]

    def revoke(self, host: Host) -> str:
        """Delete the host's node on Headscale, what an operator does to remove a machine for good (`nodes
        expire` only forces a re-login, and the host still holds the reusable pre-auth key). Headscale then
        pushes the other nodes a netmap without it, and they drop its WireGuard peer."""
        ip = self.addrs[host.name]
        nodes = (
            json.loads(self.infra.run([*self._hsctl(), "nodes", "list", "-o", "json"]).stdout or "null") or []
        )
        ids = [str(n["id"]) for n in nodes if ip in (n.get("ip_addresses") or [])]
        if len(ids) != 1:
            raise RuntimeError(f"{self.name}: {len(ids)} Headscale nodes hold {ip} ({host.name})")
        self.infra.run([*self._hsctl(), "nodes", "delete", "-i", ids[0]])
        self.revoked.add(host.name)
        return f"headscale nodes delete -i {ids[0]} ({host.name}, {ip})"

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, host: Host) -> None:
        if not self._infra_running():
            self._start_infra()
        d = self.host_dir(host)
        if host.name in self.revoked:  # its node key is gone from Headscale: join again as a new node
            host.run(["rm", "-rf", str(d / "state")])
            self.revoked.discard(host.name)
        sock = self._sock(host)
        host.mkdir(SOCK_DIR)
        if host.journal:
            host.journal.path_entry(str(sock))
        env = {"TS_NO_LOGS_NO_SUPPORT": "true", "TS_DEBUG_MTU": str(self.mtu)}
        proc = host.spawn(
            [
                host.binary("tailscaled", self.installs),
                f"--tun={self.ifname(host)}",
                f"--statedir={d / 'state'}",
                f"--socket={sock}",
                f"--port={TS_PORT}",
                "--no-logs-no-support",
            ],
            label="tailscaled",
            log_path=d / "tailscaled.log",
            env=env,
        )
        self.procs[host.name].append(proc)
        self.wait_for("tailscaled socket", lambda: host.exists(sock) or not proc.alive(), timeout=20)
        if not proc.alive():
            raise RuntimeError(f"tailscaled exited: {proc.log_tail()}")
        ts = [host.binary("tailscale", self.installs), f"--socket={sock}"]
        host.run(
            [
                *ts,
                "up",
                f"--login-server=http://{self.infra.public_ip}:{HS_PORT}",
                f"--auth-key=file:{d / 'authkey'}",
                f"--hostname={host.name}",
                "--accept-dns=false",
                "--netfilter-mode=off",
                "--timeout=60s",
            ],
            timeout=75,
        )
        self.addrs[host.name] = host.run([*ts, "ip", "-4"]).stdout.strip().splitlines()[0]
        state = d / "state" / "tailscaled.state"
        if host.exists(state):
            host.run(["chmod", "600", str(state)])

    def after_stop(self, host: Host) -> None:
        super().after_stop(host)
        for sock in (self._sock(host), *([self._hs_sock()] if host is self.infra else [])):
            host.remove(sock)
            if host.journal:
                host.journal.release({"kind": "path", "path": str(sock)})

    def leftovers(self, host: Host) -> list[str]:
        found = super().leftovers(host)
        rules = host.run(["ip", "rule", "show"], check=False).stdout
        found += [f"ip rule {r.strip()}" for r in rules.splitlines() if "lookup 52" in r]
        t52 = host.run(["ip", "route", "show", "table", "52"], check=False).stdout.strip()
        if t52:
            found.append(f"routes in table 52: {t52[:200]}")
        return found
