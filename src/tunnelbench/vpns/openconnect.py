"""OpenConnect: Debian's ocserv (server) + openconnect (client), the AnyConnect-compatible SSL VPN: a real full
mesh of client-to-server tunnels, userspace on both ends.

For every unordered pair of hosts (i < j, pair index k) host i runs one ocserv instance listening on TCP and
UDP port 8443+k of its underlay address, and host j one openconnect that connects to it. Each host uses its
one tunnel address 10.77.0.i on all its tun devices, as a point-to-point address towards the peer's, so the
kernel has a /32 peer route per tunnel and traffic to 10.77.0.j leaves through the tun of the tunnel to host j.

Addressing: ocserv leases the client address from its pool; the client's per-user config (config-per-user,
the user being the CN of the client certificate) has `explicit-ipv4 = 10.77.0.j`, inside the pool, so the
client gets exactly its tunnel address. ocserv gives its own end of the tun the pool's first address
(network + 1), so the pool is the smallest network around 10.77.0.0/24 whose first address is no host's
(10.76.0.0/15: 10.76.0.1), and the server's connect-script (run by ocserv once it has set up the tun, before
the client is told its lease) checks user and lease and re-addresses the server's tun to 10.77.0.i peer
10.77.0.j. The client's script (`--script`, instead of vpnc-script) only checks the lease and sets address,
peer route and MTU on its tun: nothing touches other routes, resolv.conf or any other file of the host.

MTU: ocserv's `mtu` is the link MTU (the DTLS datagrams on the underlay); ocserv and openconnect both set
the tun MTU to the link MTU minus DTLS's overhead (66 bytes with AES-GCM over IPv4), so the driver sets
`mtu` = tunnel MTU + that overhead and both ends' tuns get the tunnel MTU. openconnect reports a 1500-byte
link, so the largest tunnel MTU here is 1434 (the default, what ocserv and openconnect pick themselves).

Authentication: certificates only (`auth = "certificate"`, the user is the certificate's CN) from a per-run
CA made with openssl on host 1 (ca.key 0600); every host's ECDSA P-256 key is made on that host, only its
CSR goes to the CA. The client checks the server's certificate against the run's CA only (--cafile,
--no-system-trust; the certificate names the server's underlay address).

Data channel: DTLS 1.2 over UDP (DTLS-PSK negotiation, keyed from the TLS session; `cisco-client-compat` and
`dtls-legacy` off), with the TLS (CSTP) connection as fallback when the DTLS handshake fails or DTLS goes
down (switch-to-tcp-timeout is unset: it is for NATs that forget idle UDP, and would send a server's first
packets after an idle pause over TCP). One cipher is offered on both channels (`vpn_options.openconnect.cipher`,
AES-256-GCM by default). What each client ran (DTLS or TLS, both cipher suites) is read back from its log
into `settings`. No compression.

ocserv writes pid and unix socket files (and its sockets would exceed the 108-byte limit of unix socket
paths in the run folder), so each instance runs in a private mount namespace with a per-pair directory
of the run folder over /run (lab/mountns.py); occtl and utmp are off. Its workers drop to Debian's `ocserv`
user (or nobody), one per connected client: `daemons()` lists them with their ocserv, so the monitor counts
the server end's CPU where it is spent. Nothing phones out: no OCSP, no DNS, no proxy (--no-proxy)."""

from __future__ import annotations

import ipaddress
import itertools
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import Field

from tunnelbench.lab.host import CommandError, Host, Process
from tunnelbench.lab.mountns import private_mounts
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver
from tunnelbench.vpns.features import one_source
from tunnelbench.vpns.install import Apt, debian_version

# documentation pages the feature record cites
OCSERV = "https://www.infradead.org/ocserv/manual.html"
OCSERV_TECH = "https://ocserv.gitlab.io/www/technical.html"
OPENCONNECT = "https://en.wikipedia.org/wiki/OpenConnect"

BASE_PORT = 8443
CERT_DAYS = 30
CERT_EXT = """basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyAgreement
extendedKeyUsage = serverAuth, clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = IP:{ip}
"""
CIPHER: Final = "AES-256-GCM"
# Debian's packaged default (ocserv.conf: TLS 1.2, no TLS 1.3 for old AnyConnect clients) with one cipher: the
# DTLS-PSK channel is offered the same priorities (ocserv adds +PSK and the DTLS versions), so both run it
TLS_PRIORITIES = "NORMAL:%SERVER_PRECEDENCE:%COMPAT:-VERS-SSL3.0:-VERS-TLS1.0:-VERS-TLS1.1:-VERS-TLS1.3"
# what a DTLS 1.2 data packet adds to the tunnel packet, over IPv4 (ocserv's calc_mtu_values): IPv4 20 + UDP 8 +
# the CSTP type byte 1 + DTLS record header 13 + the cipher's explicit nonce and tag. ocserv's `mtu` is the link
# MTU; the tun MTU (ocserv's "data MTU", and openconnect's) is the link MTU minus this
DTLS_OVERHEAD = {
    "AES-256-GCM": 20 + 8 + 1 + 13 + 8 + 16,
    "AES-128-GCM": 20 + 8 + 1 + 13 + 8 + 16,
    "CHACHA20-POLY1305": 20 + 8 + 1 + 13 + 16,
}

SERVER_SCRIPT = """#!/bin/sh
# ocserv connect-script: the server's end of the tun carries this host's tunnel address, peer the client's
[ "$REASON" = connect ] || exit 0
if [ "$USERNAME" != "{peer}" ] || [ "$IP_REMOTE" != "{peer_ip}" ]; then
  echo "tunnelbench: unexpected client $USERNAME with $IP_REMOTE (want {peer} with {peer_ip})" >&2
  exit 1
fi
ip -4 addr flush dev "$DEVICE" || exit 1
ip addr add {mine}/32 peer {peer_ip}/32 dev "$DEVICE" || exit 1
ip link set dev "$DEVICE" up || exit 1
"""

# openconnect's log lines (its messages at the default verbosity)
TLS_UP = re.compile(r"Connected to HTTPS on \S+ with ciphersuite (\S+)")
DTLS_UP = re.compile(r"Established DTLS connection \(using \S+\)\. Ciphersuite (\S+?)\.?$")
DTLS_DOWN = re.compile(
    r"DTLS handshake failed|DTLS handshake timed out|DTLS Dead Peer Detection detected dead peer"
)

CLIENT_SCRIPT = """#!/bin/sh
# openconnect --script (instead of vpnc-script): address, peer route and MTU on the tun, nothing else
case "$reason" in
  connect|reconnect) ;;
  *) exit 0 ;;
esac
if [ "$INTERNAL_IP4_ADDRESS" != "{mine}" ]; then
  echo "tunnelbench: server leased $INTERNAL_IP4_ADDRESS, not {mine}" >&2
  exit 1
fi
ip link set dev "$TUNDEV" up mtu "${{INTERNAL_IP4_MTU:-{mtu}}}" || exit 1
ip addr replace {mine}/32 peer {peer_ip}/32 dev "$TUNDEV" || exit 1
"""


class OpenConnect(VpnDriver):
    name = "openconnect"
    summary = (
        "OpenConnect (ocserv + openconnect, Debian) full mesh of client-server tunnels (one per pair, TCP/UDP "
        "8443+k), DTLS data channel with TLS fallback, certificate auth, userspace"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = one_source(
        OCSERV,
        protocol="AnyConnect-compatible SSL VPN: control and backup data channel over HTTPS (TLS/TCP), "
        "data over DTLS/UDP, TLS fallback when UDP fails",
        ciphers="negotiated TLS/DTLS cipher suites (GnuTLS priorities; here AES-256-GCM, DTLS 1.2 with PSK "
        "from the TLS session)",
        data_plane="userspace (C, GnuTLS), TUN; one unprivileged worker process per client",
        topology=(
            "client-server (the server is the hub); full mesh of per-pair servers by the driver",
            "driver: one ocserv per pair",
        ),
        nat_traversal="clients dial out over TCP/UDP (443 by default) to a reachable server",
        relay=("the server routes between its clients (kernel forwarding, not ocserv)", OCSERV_TECH),
        acl="per-user/group config: routes, restrict-user-to-routes/ports (firewall script)",
        unattended_join="client certificates (or passwords, PAM, RADIUS); openconnect --non-inter",
        self_hosted_control="yes (the server)",
        platforms=(
            "server: Linux, BSD; openconnect client: Linux, BSD, macOS, Solaris, Windows, Android",
            OPENCONNECT,
        ),
        license=("GPL-2.0+ (ocserv), LGPL-2.1 (openconnect)", "https://gitlab.com/openconnect/ocserv"),
    )
    binaries = ("ocserv", "openconnect", "openssl")
    installs = (Apt(("ocserv", "openconnect")),)
    paths_why = {
        "relay": "the driver builds direct client-server tunnels per pair (a hub server relaying "
        "between clients is not modelled)",
        "nat": "every pair's client must reach its server's address: not modelled behind NAT",
    }
    default_mtu = 1434

    class Options(TunnelOptions):
        cipher: Literal["AES-256-GCM", "AES-128-GCM", "CHACHA20-POLY1305"] = Field(
            CIPHER, description="the one cipher offered on the TLS (CSTP) and DTLS channels (tls-priorities)"
        )

    options: Options

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        # pair index k -> (server host, client host); TCP and UDP port BASE_PORT + k
        self.pairs: list[tuple[Host, Host]] = list(itertools.combinations(spec.hosts, 2))
        cipher = self.options.cipher
        self.priorities = f"{TLS_PRIORITIES}:-CIPHER-ALL:+{cipher}"
        # ocserv's `mtu` is the link MTU (UDP datagrams on the underlay): the tun MTU plus DTLS's overhead
        assert self.mtu is not None  # default_mtu is set
        self.link_mtu = self.mtu + DTLS_OVERHEAD[cipher]
        self.settings = {
            "mode": "full mesh of client-server tunnels (per pair one ocserv on the lower-numbered host, "
            "one openconnect on the other)",
            "protocol": "AnyConnect/openconnect: CSTP over TLS 1.2, data over DTLS 1.2 (DTLS-PSK), TLS fallback",
            "auth": "certificate (ECDSA P-256, per-run CA)",
            "cipher": cipher,
            "tls_priorities": self.priorities,
            "compression": "none",
            "mtu": self.mtu,
            "link_mtu": self.link_mtu,
            "ports": f"{BASE_PORT}..{BASE_PORT + max(len(self.pairs) - 1, 0)} (TCP and UDP, 8443 + pair index)",
        }

    @classmethod
    def version(cls, host: Host) -> str:
        # "ocserv 1.1.6", "OpenConnect version v9.01-3"
        v = cls._first_line(host, [host.binary("ocserv", cls.installs), "--version"], "ocserv ").split()[1]
        c = (
            cls._first_line(
                host, [host.binary("openconnect", cls.installs), "--version"], "openconnect version"
            )
            .split()[2]
            .lstrip("v")
        )
        deb, cdeb = debian_version("ocserv"), debian_version("openconnect")
        return f"{v} (debian {deb}), openconnect {c.split('-')[0]} (debian {cdeb})"

    # -- names -------------------------------------------------------------------------------------
    def peer_ifname(self, host: Host, peer: Host) -> str:
        """The client's tun towards `peer`; a server's tun is this name + "s" + the kernel's number."""
        name = f"{self.ifname(host)}p{self.index(peer)}"
        if len(name) > 13:
            raise ValueError(
                f"openconnect: interface name {name} too long (15 characters with a server suffix)"
            )
        return name

    def _ca_dir(self) -> Path:
        return self.host_dir(self.spec.hosts[0]) / "ca"

    def pool(self) -> str:
        """ocserv's address pool: the smallest network around the tunnel network whose first address (which
        ocserv puts on its end of the tun until the connect-script replaces it) is no host's tunnel address,
        so no host ever has another's address, not even for that moment: 10.76.0.0/15 for 10.77.0.0/24."""
        tunnel = ipaddress.ip_network(
            f"{self.tunnel_ip(self.spec.hosts[0])}/{self.tunnel_prefixlen}", strict=False
        )
        net = tunnel
        while net.network_address == tunnel.network_address:
            net = net.supernet()
        return str(net)

    def _pair_dir(self, host: Host, peer: Host) -> Path:
        return self.host_dir(host) / f"ocserv-{peer.name}"

    # -- configure ---------------------------------------------------------------------------------
    def configure(self) -> None:
        self._make_certs()
        for k, (srv, cli) in enumerate(self.pairs):
            self._configure_server(srv, cli, k, _worker_user(srv))
            d = self.host_dir(cli)
            script = CLIENT_SCRIPT.format(mine=self.tunnel_ip(cli), peer_ip=self.tunnel_ip(srv), mtu=self.mtu)
            cli.write_file(d / f"client-{srv.name}.sh", script, 0o755)

    def _make_certs(self) -> None:
        ca_host = self.spec.hosts[0]
        ca = self._ca_dir()
        ca_key, ca_crt = ca / "ca.key", ca / "ca.crt"
        ca_host.write_file(ca_key, self._genkey(ca_host), 0o600)
        ca_host.run(["openssl", "req", "-x509", "-new", "-key", str(ca_key), "-sha256", "-days", str(CERT_DAYS),
                     "-subj", f"/CN=tunnelbench CA {self.spec.tag}",
                     "-addext", "keyUsage = critical, keyCertSign, cRLSign", "-out", str(ca_crt)])  # fmt: skip
        ca_pem = ca_host.read_file(ca_crt)
        for h in self.spec.hosts:
            d = self.host_dir(h)
            key = d / "host.key"
            h.write_file(key, self._genkey(h), 0o600)
            csr = h.run(
                ["openssl", "req", "-new", "-key", str(key), "-sha256", "-subj", f"/CN={h.name}"]
            ).stdout
            csr_at_ca, crt_at_ca, ext = ca / f"{h.name}.csr", ca / f"{h.name}.crt", ca / f"{h.name}-ext.cnf"
            ca_host.write_file(csr_at_ca, csr, 0o644)
            ca_host.write_file(ext, CERT_EXT.format(ip=h.underlay_ip), 0o644)
            ca_host.run(["openssl", "x509", "-req", "-in", str(csr_at_ca), "-CA", str(ca_crt), "-CAkey", str(ca_key),
                         "-set_serial", "0x" + secrets.token_hex(8), "-days", str(CERT_DAYS), "-sha256",
                         "-extfile", str(ext), "-out", str(crt_at_ca)])  # fmt: skip
            h.write_file(d / "host.crt", ca_host.read_file(crt_at_ca), 0o644)
            h.write_file(d / "ca.crt", ca_pem, 0o644)

    @staticmethod
    def _genkey(host: Host) -> str:
        # the key goes from openssl's stdout straight into a 0600 file; it is never printed
        return host.run(
            ["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
        ).stdout

    def _configure_server(self, srv: Host, cli: Host, k: int, user: tuple[str, str]) -> None:
        d, pd = self.host_dir(srv), self._pair_dir(srv, cli)
        srv.mkdir(pd / "run")
        srv.mkdir(pd / "users")
        srv.write_file(pd / "users" / cli.name, f"explicit-ipv4 = {self.tunnel_ip(cli)}\n", 0o644)
        script = SERVER_SCRIPT.format(peer=cli.name, peer_ip=self.tunnel_ip(cli), mine=self.tunnel_ip(srv))
        srv.write_file(pd / "connect.sh", script, 0o755)
        conf = f"""# tunnelbench: ocserv for the tunnel {srv.name} (server) <- {cli.name} (client)
auth = "certificate"
listen-host = {srv.underlay_ip}
tcp-port = {BASE_PORT + k}
udp-port = {BASE_PORT + k}
run-as-user = {user[0]}
run-as-group = {user[1]}
socket-file = /run/ocserv-socket
pid-file = /run/ocserv.pid
use-occtl = false
server-cert = {d / "host.crt"}
server-key = {d / "host.key"}
ca-cert = {d / "ca.crt"}
cert-user-oid = 2.5.4.3
isolate-workers = true
max-clients = 4
max-same-clients = 2
rate-limit-ms = 0
keepalive = 32400
dpd = 90
mobile-dpd = 1800
try-mtu-discovery = false
tls-priorities = "{self.priorities}"
auth-timeout = 240
min-reauth-time = 0
max-ban-score = 0
cookie-timeout = 300
deny-roaming = false
rekey-time = 172800
rekey-method = ssl
use-utmp = false
log-level = 2
device = {self.peer_ifname(srv, cli)}s
ipv4-network = {self.pool()}
ping-leases = false
mtu = {self.link_mtu}
config-per-user = {pd / "users"}
connect-script = {pd / "connect.sh"}
cisco-client-compat = false
dtls-legacy = false
compression = false
"""
        srv.write_file(pd / "ocserv.conf", conf, 0o644)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, host: Host) -> None:
        started = []
        for k, (srv, cli) in enumerate(self.pairs):
            if host is srv:
                started.append(self._start_server(host, cli))
            elif host is cli:
                started.append(self._start_client(host, srv, k))
        for proc in started:
            if not proc.alive():
                raise RuntimeError(f"{proc.label} exited: {proc.log_tail()}")

    def _start_server(self, host: Host, cli: Host) -> Process:
        pd = self._pair_dir(host, cli)
        argv = private_mounts(
            {"/run": pd / "run"},
            [host.binary("ocserv", self.installs), "--foreground", "--config", str(pd / "ocserv.conf")],
        )
        proc = host.spawn(argv, label=f"ocserv-{cli.name}", log_path=pd / "daemon.log")
        self.procs[host.name].append(proc)
        # ready for its client once the main process has written its pid file (after binding its sockets)
        self.wait_for(
            f"ocserv for {cli.name}",
            lambda: host.exists(pd / "run" / "ocserv.pid") or not proc.alive(),
            timeout=15,
        )
        return proc

    def _start_client(self, host: Host, srv: Host, k: int) -> Process:
        d = self.host_dir(host)
        argv = [
            host.binary("openconnect", self.installs), "--protocol=anyconnect", "--non-inter", "--no-passwd", "--no-proxy",
            "--no-system-trust", f"--cafile={d / 'ca.crt'}",
            f"--certificate={d / 'host.crt'}", f"--sslkey={d / 'host.key'}",
            f"--interface={self.peer_ifname(host, srv)}", "--disable-ipv6", "--no-deflate",
            f"--script=/bin/sh {d / f'client-{srv.name}.sh'}",
            "--timestamp",
            f"https://{srv.underlay_ip}:{BASE_PORT + k}/",
        ]  # fmt: skip
        proc = host.spawn(argv, label=f"openconnect-{srv.name}", log_path=d / f"client-{srv.name}.log")
        self.procs[host.name].append(proc)
        return proc

    # -- what ran ----------------------------------------------------------------------------------
    @property
    def settings(self) -> dict[str, Any]:
        s = super().settings
        seen = {}
        for srv, cli in self.pairs:
            log = self.host_dir(cli) / f"client-{srv.name}.log"
            try:
                text = cli.read_file(log).decode(errors="replace")
            except (OSError, CommandError):  # not started yet
                continue
            seen[f"{cli.name}->{srv.name}"] = _channel(text)
        if seen:  # what every client's log says ran (after the mesh is up)
            s["channels"] = seen
            kinds = {v["data_channel"] for v in seen.values()}
            s["data_channel"] = kinds.pop() if len(kinds) == 1 else "mixed: " + ", ".join(sorted(kinds))
        return s

    @settings.setter
    def settings(self, value: dict[str, Any]) -> None:
        self.__dict__["_settings"] = dict(value)

    def daemons(self, host: Host) -> list[Process]:
        """The processes started here plus every ocserv's children: its sec-mod and its per-client workers,
        where the server's end of the tunnel runs (TLS, DTLS, tun), so the monitor counts their CPU and memory.
        A child is alive as long as its ocserv is (ocserv runs a short-lived worker per HTTPS request, and its
        connect-script in a child; they are not daemons dying)."""
        out = list(self.procs[host.name])
        for p in self.procs[host.name]:
            if p.label.startswith("ocserv-"):
                out += self._children(host, p)
        return out

    def _children(self, host: Host, proc: Process) -> list[Process]:
        if host.remote:
            text = host.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], check=False).stdout
        else:
            try:
                text = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
            except OSError:
                return []
        known = self.__dict__.setdefault("_child_procs", {})
        kids = []
        for pid in map(int, text.split()):
            if (host.name, pid) not in known:
                known[(host.name, pid)] = _Child(host, f"{proc.label}/{pid}", [], pid, None, parent=proc)
            kids.append(known[(host.name, pid)])
        return kids

    def after_stop(self, host: Host) -> None:
        prefix = self.ifname(host) + "p"
        for line in host.run(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name.startswith(prefix):
                host.run(["ip", "link", "del", name], check=False)


@dataclass
class _Child(Process):
    """A child of an ocserv main process (sec-mod, a worker), alive while its parent is."""

    parent: Process | None = None

    def alive(self) -> bool:
        return self.parent is not None and self.parent.alive()


def _channel(log: str) -> dict[str, Any]:
    """What an openconnect log says ran last: the data channel (DTLS, or TLS when DTLS failed or went down)
    and the cipher suites of both channels."""
    out: dict[str, Any] = {"data_channel": "TLS (CSTP; DTLS not established)"}
    for line in log.splitlines():
        if m := TLS_UP.search(line):
            out["tls_ciphersuite"] = m.group(1)
        elif m := DTLS_UP.search(line):
            out["data_channel"], out["dtls_ciphersuite"] = "DTLS", m.group(1)
        elif m := DTLS_DOWN.search(line):
            out["data_channel"] = f"TLS (CSTP; {m.group(0)})"
            out.pop("dtls_ciphersuite", None)
    return out


def _worker_user(host: Host) -> tuple[str, str]:
    """User and group ocserv's workers drop to: Debian's `ocserv` (made by the package), else nobody."""
    for user in ("ocserv", "nobody"):
        p = host.run(["id", "-gn", user], check=False)
        if p.returncode == 0:
            return user, p.stdout.strip()
    raise RuntimeError(
        f"openconnect: {host.name} has neither an ocserv nor a nobody user for ocserv's workers"
    )
