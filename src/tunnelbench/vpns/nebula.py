"""Nebula (`nebula` / `nebula-cert`): Noise IX handshakes, AES-256-GCM data path, one UDP port.

Builds: by default v1.11.1 from the Go module proxy, built into the install cache with go1.27.3 (1.12.0 and
1.11.2 need dependencies the proxy refuses: 1.12.0 `github.com/DefinedNet/dnsconfig`, `gvisor.dev/gvisor` and
`github.com/DefinedNet/netlink` v1.3.2-dn.1, 1.11.2 the latter); `nebula@debian` runs Debian 12's 1.6.1;
`nebula@X.Y.Z` any other release (`tunnelbench install nebula@X.Y.Z`). The one difference the driver handles
between them: since 1.10 `nebula-cert sign` takes the certificate's address as `-networks` (`-ip` is
deprecated); older ones only know `-ip`. Which flag a build takes is read from its `nebula-cert sign -h`. The
config below is accepted unchanged by 1.6 to 1.11.

Multi-core knobs, as the authors recommend (https://nebula.defined.net/docs/config/routines and 1.11.1's
examples/config.yml): `routines` (tun/UDP reader pairs; > 1 opens a multi-queue tun and SO_REUSEPORT
sockets) at most half the CPUs, so by default half of what the host's commands may use (`nproc`, inside its
CPU placement), at least 1: 1 on a 2-core machine; `listen.batch` 64 and `tun.tx_queue` 500, the release's
defaults; socket buffers the system's unless `udp_socket_buffer` is set. 1.12's new ones (`tun.pin_threads`,
`tun.use_offloads`, `listen.udp_offloads`) are not set: the pinned 1.11.1 does not know them.

Host 1 is the lighthouse; every host gets a static_host_map entry for every other host's underlay
address, so all tunnels are direct (a real full mesh: the lighthouse relays nothing). Nebula drops
all traffic by default: the config allows any inbound/outbound so the firewall does not skew results
(its conntrack still runs, as in every real deployment).

ACL (vpn_options.nebula.acl, vpns/acl.py): each certificate carries its policy role as a group (`nebula-cert sign
-groups tb-client|tb-server|tb-isolated`); under "isolate" only the server's `firewall.inbound` has a rule
(from group tb-client, any port and proto), so the client gets replies through conntrack and the isolated
hosts are dropped everywhere; the test-only control keeps the groups and allows any inbound.

PKI: the CA lives on host 1 (ca.key 0600). Each host makes its own key pair with `nebula-cert keygen`
(the private key never leaves its host); host 1 signs the public key with the host's 10.77.0.i/24.
Nebula assigns the address from the certificate and the MTU from the config to the tun device itself.
The config is written as JSON, which is valid YAML.

Revocation: the operator puts the revoked host's certificate fingerprint (`nebula-cert print -json`) into
`pki.blocklist` of every other host and sends their nebula a SIGHUP. The reload rebuilds the CA pool with the
blocklist (pki.go reloadCAPool); the connection manager re-verifies each tunnel's remote certificate on its
traffic check (`timers.connection_alive_interval`, 5 s) and closes one that is blocklisted, and handshakes
with that certificate are refused from then on. Configs are rendered at start; a start of the whole mesh (no
nebula running anywhere) forgets the blocklist, so the revoked host rejoins."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from tunnelbench.lab.host import Host
from tunnelbench.vpns.acl import NOT_APPLIED, OFF, AclMode, acl_option, acl_policy, may_open
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver, udp_socket_buffer
from tunnelbench.vpns.features import fact
from tunnelbench.vpns.install import Apt, GoModule
from tunnelbench.vpns.podclients import FILES_DIR, POD_LOG, PodClient, PodClients, pod_addresses, wait_for

# documentation pages the feature record cites
NEBULA_PUNCHY = "https://nebula.defined.net/docs/config/punchy"
NEBULA_RELAY = "https://nebula.defined.net/docs/config/relay/"

LISTEN_PORT = 4242
# multi-core knobs the authors recommend (https://nebula.defined.net/docs/config/routines: routines at most half
# the CPUs; 1.11.1 examples/config.yml: listen.batch 64, tun.tx_queue 500, both the defaults)
LISTEN_BATCH = 64
TX_QUEUE = 500
ROUTINES_RULE = "half the host's CPUs (nproc), at least 1 (nebula docs: at most half the CPU cores)"
CIPHERS = {"aes": "AES-256-GCM", "chachapoly": "ChaCha20-Poly1305"}
GO = GoModule(
    "nebula",
    "github.com/slackhq/nebula",
    "v1.11.1",
    ("github.com/slackhq/nebula/cmd/nebula", "github.com/slackhq/nebula/cmd/nebula-cert"),
    ("nebula", "nebula-cert"),
)


class Nebula(VpnDriver):
    name = "nebula"
    summary = "Nebula full mesh (lighthouse h1, static host map), Noise IX + AES-256-GCM over UDP 4242"
    # the feature record (vpns/features.py): each fact with its source
    features = {
        "protocol": fact("Noise IX handshakes over UDP", "https://nebula.defined.net/docs/"),
        "ciphers": fact(
            "AES-256-GCM or ChaCha20-Poly1305 (network-wide choice)",
            "https://nebula.defined.net/docs/config/cipher/",
        ),
        "data_plane": fact("userspace (Go), TUN", "https://github.com/slackhq/nebula"),
        "topology": fact(
            "full mesh with lighthouses for discovery",
            "https://manpages.ubuntu.com/manpages/lunar/man5/nebula.yml.5.html",
        ),
        "nat_traversal": fact("lighthouse-coordinated UDP hole punching (punchy)", NEBULA_PUNCHY),
        "relay": fact("relay hosts over UDP (since 1.6.0)", NEBULA_RELAY),
        "acl": fact(
            "built-in stateful firewall by certificate name/group, port, proto",
            "https://nebula.defined.net/docs/config/firewall/",
        ),
        "unattended_join": fact(
            "per-host certificates signed by the CA (offline)", "https://nebula.defined.net/docs/"
        ),
        "self_hosted_control": fact(
            "yes (lighthouses are ordinary nodes)", "https://nebula.defined.net/docs/"
        ),
        "platforms": fact(
            "Linux, macOS, Windows, iOS, Android, FreeBSD", "https://github.com/slackhq/nebula"
        ),
        "license": fact("MIT", "https://github.com/slackhq/nebula"),
    }
    binaries = ("nebula", "nebula-cert")
    installs = (GO,)
    debian_installs = (Apt(("nebula",), ("nebula", "nebula-cert")),)
    default_mtu = 1300  # nebula's own default tun.mtu
    # relay / nat paths: the relay host is lighthouse and relay (am_relay); the others use it as their
    # relay when no direct tunnel can be made (UDP blocked, or NATs that do not punch)
    paths = frozenset({"direct", "relay", "nat"})
    # star (many-clients): the hub is the lighthouse and every spoke's only static_host_map entry, so a spoke
    # holds one tunnel, to the hub, as the seeds' clients-to-server deployments do
    topologies = frozenset({"mesh", "star"})
    acl_support = True
    revocation = "certificate fingerprint into `pki.blocklist` on every other host, then SIGHUP their nebula"

    class Options(TunnelOptions):
        routines: int | None = Field(
            None,
            ge=1,
            le=256,
            description="top-level `routines`: tun/UDP reader pairs "
            "(> 1: a multi-queue tun and SO_REUSEPORT sockets; Linux only); "
            "default: half the host's CPUs (nproc), at least 1, the authors' recommended maximum",
        )
        cipher: Literal["aes", "chachapoly"] = Field(
            "aes", description="top-level `cipher`: aes = AES-256-GCM, chachapoly = ChaCha20-Poly1305"
        )
        udp_socket_buffer: int | None = udp_socket_buffer(
            "listen.read_buffer and listen.write_buffer (set with SO_RCVBUFFORCE/SO_SNDBUFFORCE, "
            "so net.core.rmem_max/wmem_max do not cap them)"
        )
        acl: AclMode = acl_option()

    options: Options

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        cipher = self.options.cipher
        self.settings: dict[str, Any] = {
            "mode": f"star around {spec.hub.name} (the lighthouse; the spokes' only static host)"
            if spec.topology == "star" and spec.hub is not None
            else "full mesh, direct UDP tunnels (h1 is also lighthouse)",
            "cipher": CIPHERS[cipher],
            "nebula_cipher": cipher,
            "handshake": "Noise IX, Curve25519",
            "mtu": self.mtu,
            "port": LISTEN_PORT,
            "firewall": "allow any in/out (conntrack on)",
            # resolved per host at configure (half its CPUs) unless set
            "routines": self.options.routines or f"auto: {ROUTINES_RULE}",
            "listen_batch": LISTEN_BATCH,
            "tx_queue": TX_QUEUE,
            "udp_socket_buffer": self.options.udp_socket_buffer or "OS default",
        }
        self._routines: dict[str, int] = {}  # host name -> routines in its config
        self.blocked: dict[str, str] = {}  # revoked host name -> its certificate fingerprint
        acl = self.options.acl
        self.acl = None if acl == OFF else acl_policy(spec, acl)
        if self.acl is not None:
            self.settings["firewall"] = (
                "inbound on the server only from group tb-client (any port/proto), none elsewhere; conntrack "
                "passes replies"
                if self.acl.enforced
                else "allow any in/out (groups in the certificates: "
                f"{NOT_APPLIED}, the policy is not enforced)"
            )
            self.settings["acl"] = self.acl.record("certificate groups tb-<role> + firewall.inbound")

    @classmethod
    def control_host(cls, spec: MeshSpec) -> Host:
        """The lighthouse: the relay host in path relay/nat (lighthouse and relay), the hub in a star, else h1."""
        if spec.topology == "star" and spec.hub is not None:
            return spec.hub
        return spec.relay if spec.path != "direct" and spec.relay is not None else spec.hosts[0]

    def peers(self, host: Host) -> list[Host]:
        return may_open(self.acl, host, super().peers(host))

    @classmethod
    def version(cls, host: Host) -> str:
        # nebula -version prints "Version: 1.6.1"; a `go install` build of 1.9 and older prints "Version: " (its
        # version comes from release ldflags): "", and availability() takes the cache build's pinned version
        return (
            cls._first_line(host, [host.binary("nebula", cls.installs), "-version"], "version")
            .partition(":")[2]
            .strip()
        )

    def routines(self, host: Host) -> int:
        """`routines` for this host: the option, else half the CPUs its commands may use, at least 1."""
        if self.options.routines:
            return self.options.routines
        if host.name not in self._routines:
            out = host.run(["nproc"], check=False).stdout.strip()
            self._routines[host.name] = max(1, int(out) // 2) if out.isdigit() else 1
        return self._routines[host.name]

    # -- paths -------------------------------------------------------------------------------------
    def _ca_dir(self) -> Path:
        return self.host_dir(self.spec.hosts[0]) / "ca"

    def _config_path(self, host: Host) -> Path:
        return self.host_dir(host) / "config.yml"

    # -- configure ---------------------------------------------------------------------------------
    def configure(self) -> None:
        hosts = self.spec.hosts
        signer = hosts[0]
        ca = self._ca_dir()
        signer.mkdir(ca)
        cert = signer.binary("nebula-cert", self.installs)
        # the certificate's address: -networks since 1.10 (-ip deprecated there), -ip before
        sign_help = signer.run([cert, "sign", "-h"], check=False)
        ip_flag = "-networks" if "-networks" in sign_help.stdout + sign_help.stderr else "-ip"
        self.settings["cert_address_flag"] = ip_flag
        signer.run([cert, "ca", "-name", f"tunnelbench {self.spec.tag}", "-duration", "720h",
                    "-out-crt", str(ca / "ca.crt"), "-out-key", str(ca / "ca.key")])  # fmt: skip
        signer.run(["chmod", "600", str(ca / "ca.key")])
        ca_crt = signer.read_file(ca / "ca.crt")
        for h in hosts:
            d = self.host_dir(h)
            h.run([cert, "keygen", "-out-key", str(d / "host.key"), "-out-pub", str(d / "host.pub")])
            h.run(["chmod", "600", str(d / "host.key")])
            # the signer sees only the public key
            pub_at_ca = ca / f"{h.name}.pub"
            signer.write_file(pub_at_ca, h.read_file(d / "host.pub"), 0o644)
            crt_at_ca = ca / f"{h.name}.crt"
            signer.run([cert, "sign", "-ca-crt", str(ca / "ca.crt"), "-ca-key", str(ca / "ca.key"),
                        "-name", h.name, ip_flag, f"{self.tunnel_ip(h)}/{self.tunnel_prefixlen}", *self._groups(h),
                        "-in-pub", str(pub_at_ca), "-out-crt", str(crt_at_ca)])  # fmt: skip
            h.write_file(d / "host.crt", signer.read_file(crt_at_ca), 0o600)
            h.write_file(d / "ca.crt", ca_crt, 0o644)
            self._write_config(h)
        per_host = {h.name: self.routines(h) for h in hosts}
        self.settings["routines"] = (
            next(iter(per_host.values())) if len(set(per_host.values())) == 1 else per_host
        )
        if not self.options.routines:
            self.settings["routines_rule"] = ROUTINES_RULE

    def _groups(self, host: Host) -> list[str]:
        return ["-groups", f"tb-{self.acl.role(host)}"] if self.acl is not None else []

    def _inbound(self, host: Host) -> list[dict[str, Any]]:
        """firewall.inbound: any without an enforced policy; the server admits the client's group only, and every
        other host admits nothing (replies to its own flows pass through conntrack, not a rule)."""
        if self.acl is None or not self.acl.enforced:
            return [{"port": "any", "proto": "any", "host": "any"}]
        return [{"port": "any", "proto": "any", "group": "tb-client"}] if host is self.acl.server else []

    def _config(self, host: Host) -> dict[str, Any]:
        d = self.host_dir(host)
        relayed = self.spec.path != "direct" and self.spec.relay is not None
        lighthouse = self.control_host(self.spec)
        am_lighthouse = host is lighthouse
        anyrule = [{"port": "any", "proto": "any", "host": "any"}]
        blocklist = [fp for name, fp in self.blocked.items() if name != host.name]
        listen: dict[str, Any] = {"host": "0.0.0.0", "port": LISTEN_PORT, "batch": LISTEN_BATCH}
        if self.options.udp_socket_buffer:
            listen["read_buffer"] = listen["write_buffer"] = self.options.udp_socket_buffer
        return {
            "pki": {
                "ca": str(d / "ca.crt"),
                "cert": str(d / "host.crt"),
                "key": str(d / "host.key"),
                # only while a host is revoked: the config stays as before otherwise
                **({"blocklist": blocklist} if blocklist else {}),
            },
            "static_host_map": {
                self.tunnel_ip(p): [f"{p.public_ip}:{LISTEN_PORT}"]
                for p in (self.spec.hosts if self.spec.topology == "mesh" else VpnDriver.peers(self, host))
                if p is not host and not p.behind_nat
            },
            "lighthouse": {
                "am_lighthouse": am_lighthouse,
                "interval": 60,
                "hosts": [] if am_lighthouse else [self.tunnel_ip(lighthouse)],
            },
            "listen": listen,
            "routines": self.routines(host),
            "punchy": {"punch": True, "respond": True},
            "cipher": self.settings["nebula_cipher"],
            "relay": {
                "am_relay": relayed and am_lighthouse,
                "use_relays": relayed,
                "relays": [self.tunnel_ip(lighthouse)] if relayed and not am_lighthouse else [],
            },
            "tun": {
                "disabled": False,
                "dev": self.ifname(host),
                "drop_local_broadcast": False,
                "drop_multicast": False,
                "tx_queue": TX_QUEUE,
                "mtu": self.mtu,
            },
            "logging": {"level": "info", "format": "text"},
            "firewall": {
                "conntrack": {"tcp_timeout": "12m", "udp_timeout": "3m", "default_timeout": "10m"},
                "outbound": anyrule,
                "inbound": self._inbound(host),
            },
        }

    def _write_config(self, host: Host) -> None:
        host.write_file(self._config_path(host), json.dumps(self._config(host), indent=2) + "\n", 0o600)

    # -- clients in pods ---------------------------------------------------------------------------
    def pod_clients(self, server: Host, n: int, names: list[str]) -> PodClients:
        """Each pod its own certificate (name = the pod's, its own address), signed by the mesh's CA on the
        signer host (`nebula-cert sign` makes the key pair there; the key goes only into the pod's Secret);
        the server admits them unchanged. The pod's config: the server as its lighthouse and only static host.
        The server's peer count: the distinct pod certificates its log shows a handshake with."""
        if self.spec.topology != "star" or server is not self.spec.hub:
            raise NotImplementedError(
                'nebula: pod clients join a star around the server (lab.topology = "star")'
            )
        signer = self.spec.hosts[0]
        cert = signer.binary("nebula-cert", self.installs)
        ca = self._ca_dir()
        addrs = pod_addresses(self.tunnel_prefix, len(self.spec.hosts), n)
        flag = self.settings.get("cert_address_flag", "-networks")
        server_ip = self.tunnel_ip(server)
        tun = "tbneb"
        conf = self._config(server)
        conf["pki"] = {
            "ca": f"{FILES_DIR}/ca.crt",
            "cert": f"{FILES_DIR}/host.crt",
            "key": f"{FILES_DIR}/host.key",
        }
        conf["static_host_map"] = {server_ip: [f"{server.public_ip}:{LISTEN_PORT}"]}
        # the pod's own addresses (the pod network's) mean nothing outside its node: never offered to the server
        # (the server would probe them through the lab's router); it is reached at its node's masquerade
        local = {"0.0.0.0/0": False, "::/0": False}
        conf["lighthouse"] = {
            "am_lighthouse": False,
            "interval": 60,
            "hosts": [server_ip],
            "local_allow_list": local,
        }
        conf["listen"] = {"host": "0.0.0.0", "port": 0, "batch": LISTEN_BATCH}
        conf["routines"] = 1
        conf["relay"] = {"am_relay": False, "use_relays": False, "relays": []}
        conf["tun"] = {**conf["tun"], "dev": tun}
        conf["firewall"] = {**conf["firewall"], "inbound": [{"port": "any", "proto": "any", "host": "any"}]}
        config = json.dumps(conf, indent=1).encode()
        ca_crt = signer.read_file(ca / "ca.crt")
        work = ca / "pods"
        signer.mkdir(work)
        clients = []
        for name, ip in zip(names, addrs, strict=True):
            crt, key = work / f"{name}.crt", work / f"{name}.key"
            signer.run([cert, "sign", "-ca-crt", str(ca / "ca.crt"), "-ca-key", str(ca / "ca.key"), "-name", name,
                        flag, f"{ip}/{self.tunnel_prefixlen}", "-out-crt", str(crt), "-out-key", str(key)])  # fmt: skip
            files = {"ca.crt": ca_crt, "host.crt": signer.read_file(crt),
                     "host.key": signer.read_file(key), "config.yml": config}  # fmt: skip
            signer.run(["rm", "-f", str(key)])  # the key lives on in the pod's Secret only
            clients.append(PodClient(name, ip, files))
        log = self.host_dir(server) / "daemon.log"
        wanted = set(names)

        def peer_count() -> int:
            text = server.read_file(log).decode(errors="replace")
            return len({m for m in re.findall(r'certName="?([A-Za-z0-9._-]+)', text) if m in wanted})

        setup = "\n".join(
            [
                f"nebula -config {FILES_DIR}/config.yml >{POD_LOG} 2>&1 &",
                wait_for("nebula's tun device", f"ip link show {tun} >/dev/null 2>&1"),
            ]
        )
        return PodClients(self.key, clients, server_ip, setup, ("nebula",), peer_count, lambda: None)

    # -- revocation --------------------------------------------------------------------------------
    def fingerprint(self, host: Host) -> str:
        crt = self.host_dir(host) / "host.crt"
        certs = json.loads(
            host.run([host.binary("nebula-cert", self.installs), "print", "-json", "-path", str(crt)]).stdout
        )
        fingerprint: str = (certs[0] if isinstance(certs, list) else certs)[
            "fingerprint"
        ]  # 1.11 prints a list
        return fingerprint

    def revoke(self, host: Host) -> str:
        """Blocklist the host's certificate on every other host and SIGHUP their nebula: the reload takes the new
        blocklist, and the next tunnel check closes the tunnel to it. Its own nebula keeps running."""
        self.blocked[host.name] = fp = self.fingerprint(host)
        others = [h for h in self.spec.hosts if h is not host]
        for h in others:
            self._write_config(h)
            daemons = [p for p in self.procs[h.name] if p.label == "nebula" and p.alive()]
            if not daemons:
                raise RuntimeError(f"{self.name}: no running nebula on {h.name} to reload")
            for p in daemons:  # only the daemon we started, by its PID
                h.signal(p.pid, signal.SIGHUP)
        return f"pki.blocklist += {fp} ({host.name}), SIGHUP on {', '.join(h.name for h in others)}"

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, host: Host) -> None:
        d = self.host_dir(host)
        if not any(self.procs[h.name] for h in self.spec.hosts):
            self.blocked.clear()  # a start of the whole mesh: a revoked host is welcome again
        self._write_config(host)
        proc = host.spawn(
            [host.binary("nebula", self.installs), "-config", str(self._config_path(host))],
            label="nebula",
            log_path=d / "daemon.log",
        )
        self.procs[host.name].append(proc)
        ifname = self.ifname(host)
        # nebula creates the device and assigns the certificate's address and the MTU itself
        self.wait_for(
            "nebula tun device", lambda: self.link_exists(host, ifname) or not proc.alive(), timeout=10
        )
        if not proc.alive():
            raise RuntimeError(f"nebula exited: {proc.log_tail()}")
