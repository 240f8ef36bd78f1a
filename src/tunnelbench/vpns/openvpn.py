"""OpenVPN 2.6 (Debian `openvpn`, OpenSSL): a real full mesh of point-to-point TLS tunnels.

For every unordered pair of hosts (i < j, pair index k) there is one tunnel on UDP port 1194+k: host i runs
an openvpn process with --tls-server, host j one with --tls-client, each with its own tun device
(<ifname>p<peer index>). Every host uses its one tunnel address on all its tunnels
(`--ifconfig <mine> <peer's>`), so the kernel has a /32 peer route per tunnel and traffic to 10.77.0.j
leaves through the tun of the tunnel to host j: no hub, no relaying through a third host.

Data channel: AES-256-GCM (--cipher and --data-ciphers AES-256-GCM, so that is what every tunnel
negotiates; vpn_options.openvpn.cipher picks another AEAD cipher). Data path: `openvpn` keeps it in userspace
(--disable-dco: a kernel with ovpn-dco does not change what is measured); `openvpn-dco` (vpns/openvpn_dco.py)
is the same tunnels with the data channel in the kernel's ovpn-dco module, as OpenVPN 2.6 runs by default
where the module is loaded. Which path each tunnel took is read back, never assumed (`data_path`): the
device's kind as the kernel reports it (`ip -d link`: ovpn-dco or tun) and OpenVPN's own line for it ("DCO
device X opened" / "TUN/TAP device X opened"); a tunnel on the other path fails start(). Control channel: TLS
with ECDSA P-256 certificates from a per-run CA (made with openssl on host 1, ca.key 0600); every
host's key is made on that host, only its CSR goes to the CA. Each end checks the other's certificate
(--remote-cert-tls, --verify-x509-name). A full mesh of N hosts runs N-1 openvpn processes per host.

Star (many-clients, Goethals et al.): OpenVPN's own client/server mode. The hub runs one `--mode server` process
(UDP 1194, `--topology subnet`), every spoke one `--client`; each spoke's tunnel address is pushed from a
client-config-dir file named by its certificate's CN (`ifconfig-push`), and `--ccd-exclusive` refuses a
certificate with no such file. One server process serves every client, as a real OpenVPN access server does."""

from __future__ import annotations

import ipaddress
import itertools
import json
import re
import secrets
from pathlib import Path
from typing import Any, ClassVar, Final, Literal

from pydantic import Field

from tunnelbench.lab.host import Host, Process
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver, udp_socket_buffer
from tunnelbench.vpns.features import one_source
from tunnelbench.vpns.install import Apt

# documentation pages the feature record cites
OPENVPN_MANUAL = "https://openvpn.net/community-resources/reference-manual-for-openvpn-2-6/"

BASE_PORT = 1194
# what the kernel calls each data path's device (`ip -d link`: linkinfo.info_kind), and what OpenVPN logs when
# it opens one (tun.c: "DCO device %s opened" / "TUN/TAP device %s opened")
DCO_KIND, TUN_KIND = "ovpn-dco", "tun"
OPENED = {DCO_KIND: "DCO device {} opened", TUN_KIND: "TUN/TAP device {} opened"}
# OpenVPN's own words about DCO (why it is off: "Note: Kernel support for ovpn-dco missing, ...", an option
# DCO does not support), quoted when a tunnel is not on the path asked for
DCO_WORDS = re.compile(r"^.*\b(?:DCO|dco|data channel offload)\b.*$", re.M)
# the loaded module's version (ovpn-dco-v2, the module OpenVPN 2.6 drives)
DCO_MODULE_VERSION = "/sys/module/ovpn_dco_v2/version"
CIPHER: Final = "AES-256-GCM"
CERT_DAYS = 30
CERT_EXT = """basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyAgreement
extendedKeyUsage = serverAuth, clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


def device_kinds(ip_json: str) -> dict[str, str]:
    """{interface: its kind} from `ip -d -j link show` ("" for a device with no linkinfo, e.g. lo)."""
    return {
        link["ifname"]: (link.get("linkinfo") or {}).get("info_kind", "")
        for link in json.loads(ip_json or "[]")
    }


def data_path_problem(ifname: str, kind: str, log: str, dco: bool) -> str | None:
    """Why the tunnel device `ifname` is not on the data path asked for (dco: the kernel's ovpn-dco, else
    userspace tun), from its kind as the kernel reports it and its openvpn's log; None when it is."""
    want = DCO_KIND if dco else TUN_KIND
    if kind == want and OPENED[want].format(ifname) in log:
        return None
    said = "; ".join(m.strip() for m in DCO_WORDS.findall(log)[-4:]) or "nothing about DCO"
    return f"{ifname} is a {kind or 'missing'} device, not {want} (OpenVPN said: {said})"


class OpenVpn(VpnDriver):
    name = "openvpn"
    summary = (
        "OpenVPN 2.6 full mesh of p2p TLS tunnels (one per pair, UDP 1194+k), AES-256-GCM, userspace (no DCO)"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = one_source(
        OPENVPN_MANUAL,
        protocol="OpenVPN (TLS control channel, custom data channel) over UDP/TCP",
        ciphers="negotiated data ciphers (here AES-256-GCM)",
        data_plane="userspace (--disable-dco; with the data channel offload in the kernel: openvpn-dco)",
        topology="client-server or point-to-point; full mesh of p2p tunnels by the driver",
        nat_traversal="client behind NAT to a reachable server",
        relay="server-side client-to-client forwarding",
        acl="per-client config (CCD), packet filter plugins",
        unattended_join="certificates",
        self_hosted_control="yes (the server)",
        platforms="Linux, BSD, macOS, Windows, Android, iOS",
        license="GPL-2.0",
    )
    binaries = ("openvpn", "openssl")
    installs = (Apt(("openvpn", "openssl")),)
    paths_why = {
        "relay": "the driver builds direct p2p tunnels (a client-to-client server would be a hub, not modelled)",
        "nat": "p2p tunnels need each peer's address: not modelled behind NAT",
    }
    default_mtu = 1500  # openvpn's default --tun-mtu
    topologies = frozenset({"mesh", "star"})
    wire = f"udp dport {BASE_PORT}-65535"  # p2p tunnels: both ends on 1194 + pair index; star: the server's
    # the data path asked for: userspace here (--disable-dco), the kernel's ovpn-dco in OpenVpnDco
    dco: ClassVar[bool] = False

    class Options(TunnelOptions):
        cipher: Literal["AES-256-GCM", "AES-128-GCM", "CHACHA20-POLY1305"] = Field(
            CIPHER, description="data-channel cipher (--cipher and --data-ciphers: the only one offered)"
        )
        udp_socket_buffer: int | None = udp_socket_buffer(
            "--sndbuf and --rcvbuf (SO_SNDBUF/SO_RCVBUF: the kernel caps them at net.core.wmem_max/rmem_max)"
        )

    options: Options

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        hosts = spec.hosts
        # pair index k -> (server host, client host); port BASE_PORT + k
        self.star = spec.topology == "star"
        self.pairs: list[tuple[Host, Host]] = [] if self.star else list(itertools.combinations(hosts, 2))
        hub = spec.hub.name if spec.hub is not None else ""  # __init__ refused a star without a hub
        self.settings: dict[str, Any] = {
            "mode": (
                f"client/server: one --mode server process on {hub}, --client on every other host"
                if self.star
                else "full mesh of point-to-point TLS tunnels (one openvpn process per host per peer)"
            ),
            "cipher": self.options.cipher,
            "control_channel": "TLS (OpenSSL), ECDSA P-256 certificates",
            "dco": self.dco,  # asked for; what ran is "data_path", read back in start()
            "data_path": {"in_use": "not started", "devices": {}, "openvpn": {}},
            "proto": "udp",
            "topology": "subnet (ifconfig-push per client CN)" if self.star else "p2p",
            "mtu": self.mtu,
            "ports": (
                f"{BASE_PORT} (the server's)"
                if self.star
                else f"{BASE_PORT}..{BASE_PORT + max(len(self.pairs) - 1, 0)} (1194 + pair index)"
            ),
            "compression": "none",
            "udp_socket_buffer": self.options.udp_socket_buffer or "OS default",
        }

    @classmethod
    def version(cls, host: Host) -> str:
        # "OpenVPN 2.6.14 x86_64-pc-linux-gnu [SSL (OpenSSL)] ..."
        return cls._first_line(host, [host.binary("openvpn", cls.installs), "--version"], "openvpn ").split()[
            1
        ]

    # -- names -------------------------------------------------------------------------------------
    def peer_ifname(self, host: Host, peer: Host) -> str:
        name = f"{self.ifname(host)}p{self.index(peer)}"
        if len(name) > 15:
            raise ValueError(f"openvpn: interface name {name} longer than 15 characters")
        return name

    def _ca_dir(self) -> Path:
        return self.host_dir(self.spec.hosts[0]) / "ca"

    # -- configure ---------------------------------------------------------------------------------
    def configure(self) -> None:
        ca_host = self.spec.hosts[0]
        ca = self._ca_dir()
        ca_key, ca_crt = ca / "ca.key", ca / "ca.crt"
        ca_host.write_file(ca_key, self._genkey(ca_host), 0o600)
        ca_host.run(["openssl", "req", "-x509", "-new", "-key", str(ca_key), "-sha256", "-days", str(CERT_DAYS),
                     "-subj", f"/CN=tunnelbench CA {self.spec.tag}",
                     "-addext", "keyUsage = critical, keyCertSign, cRLSign", "-out", str(ca_crt)])  # fmt: skip
        ext = ca / "host-ext.cnf"
        ca_host.write_file(ext, CERT_EXT, 0o644)
        ca_pem = ca_host.read_file(ca_crt)
        for h in self.spec.hosts:
            d = self.host_dir(h)
            key = d / "host.key"
            h.write_file(key, self._genkey(h), 0o600)
            csr = h.run(
                ["openssl", "req", "-new", "-key", str(key), "-sha256", "-subj", f"/CN={h.name}"]
            ).stdout
            csr_at_ca, crt_at_ca = ca / f"{h.name}.csr", ca / f"{h.name}.crt"
            ca_host.write_file(csr_at_ca, csr, 0o644)
            ca_host.run(["openssl", "x509", "-req", "-in", str(csr_at_ca), "-CA", str(ca_crt), "-CAkey", str(ca_key),
                         "-set_serial", "0x" + secrets.token_hex(8), "-days", str(CERT_DAYS), "-sha256",
                         "-extfile", str(ext), "-out", str(crt_at_ca)])  # fmt: skip
            h.write_file(d / "host.crt", ca_host.read_file(crt_at_ca), 0o600)
            h.write_file(d / "ca.crt", ca_pem, 0o644)
        if self.star:  # the server pushes each client the address the lab gave its host (CN = host name)
            hub = self.spec.hub
            assert hub is not None
            for h in self.spec.hosts:
                if h is not hub:
                    hub.write_file(
                        self._ccd() / h.name, f"ifconfig-push {self.tunnel_ip(h)} {self._netmask()}\n", 0o644
                    )

    def _ccd(self) -> Path:
        assert self.spec.hub is not None
        return self.host_dir(self.spec.hub) / "ccd"

    def _netmask(self) -> str:
        return str(ipaddress.ip_network(f"0.0.0.0/{self.tunnel_prefixlen}").netmask)

    @staticmethod
    def _genkey(host: Host) -> str:
        # the key goes from openssl's stdout straight into a 0600 file; it is never printed
        return host.run(
            ["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
        ).stdout

    def _argv(self, host: Host, peer: Host, k: int, server: bool) -> list[str]:
        d = self.host_dir(host)
        argv = [
            host.binary("openvpn", self.installs),
            "--dev", self.peer_ifname(host, peer), "--dev-type", "tun", "--topology", "p2p",
            "--proto", "udp", "--port", str(BASE_PORT + k), "--remote", peer.underlay_ip,
            "--ifconfig", self.tunnel_ip(host), self.tunnel_ip(peer),
            "--tun-mtu", str(self.mtu),
            "--ca", str(d / "ca.crt"), "--cert", str(d / "host.crt"), "--key", str(d / "host.key"),
            "--verify-x509-name", peer.name, "name",
            "--cipher", self.options.cipher, "--data-ciphers", self.options.cipher,
            *self._dco_args(),
            "--keepalive", "10", "60",
            "--verb", "3",
        ]  # fmt: skip
        if self.options.udp_socket_buffer:
            size = str(self.options.udp_socket_buffer)
            argv += ["--sndbuf", size, "--rcvbuf", size]
        if server:
            argv += ["--tls-server", "--dh", "none", "--remote-cert-tls", "client"]
        else:
            argv += ["--tls-client", "--remote-cert-tls", "server"]
        return argv

    def _dco_args(self) -> list[str]:
        # OpenVPN 2.6 uses DCO by itself where the module is loaded (and nothing in the config rules it out):
        # the userspace path has to be asked for
        return [] if self.dco else ["--disable-dco"]

    def _star_argv(self, host: Host) -> list[str]:
        d, hub = self.host_dir(host), self.spec.hub
        assert hub is not None
        argv = [
            host.binary("openvpn", self.installs),
            "--dev", self.ifname(host), "--dev-type", "tun", "--proto", "udp",
            "--tun-mtu", str(self.mtu),
            "--ca", str(d / "ca.crt"), "--cert", str(d / "host.crt"), "--key", str(d / "host.key"),
            "--cipher", self.options.cipher, "--data-ciphers", self.options.cipher,
            *self._dco_args(),
            "--verb", "3",
        ]  # fmt: skip
        if self.options.udp_socket_buffer:
            size = str(self.options.udp_socket_buffer)
            argv += ["--sndbuf", size, "--rcvbuf", size]
        if host is hub:
            return argv + [
                "--mode", "server", "--tls-server", "--dh", "none", "--port", str(BASE_PORT),
                "--topology", "subnet", "--ifconfig", self.tunnel_ip(hub), self._netmask(),
                "--push", "topology subnet",
                "--client-config-dir", str(self._ccd()), "--ccd-exclusive",
                "--remote-cert-tls", "client",
                "--max-clients", str(len(self.spec.hosts)),
                "--keepalive", "10", "60",
            ]  # fmt: skip
        return argv + [
            "--client", "--nobind", "--remote", hub.underlay_ip, str(BASE_PORT),
            "--verify-x509-name", hub.name, "name", "--remote-cert-tls", "server",
        ]  # fmt: skip

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, host: Host) -> None:
        d = self.host_dir(host)
        if self.star:
            # the server opens its tun at once; a client only once the server pushed its address (after TLS)
            proc = host.spawn(self._star_argv(host), label="openvpn", log_path=d / "daemon.log")
            self.procs[host.name].append(proc)
            ifname = self.ifname(host)
            self.wait_for(
                f"openvpn tun {ifname}",
                lambda: self.link_exists(host, ifname) or not proc.alive(),
                timeout=30,
            )
            if not proc.alive():
                raise RuntimeError(f"openvpn ({ifname}) exited: {proc.log_tail()}")
            self._read_data_path(host, [(proc, ifname)])
            return
        started = []
        for k, (srv, cli) in enumerate(self.pairs):
            if host is srv:
                peer, server = cli, True
            elif host is cli:
                peer, server = srv, False
            else:
                continue
            proc = host.spawn(
                self._argv(host, peer, k, server),
                label=f"openvpn-{peer.name}",
                log_path=d / f"daemon-{peer.name}.log",
            )
            self.procs[host.name].append(proc)
            started.append((proc, self.peer_ifname(host, peer)))
        # in p2p mode openvpn opens the tun and sets --ifconfig before TLS: wait for the devices only
        for proc, ifname in started:

            def up(p: Process = proc, i: str = ifname) -> bool:
                return self.link_exists(host, i) or not p.alive()

            self.wait_for(f"openvpn tun {ifname}", up, timeout=10)
            if not proc.alive():
                raise RuntimeError(f"openvpn ({ifname}) exited: {proc.log_tail()}")
        self._read_data_path(host, started)

    def _read_data_path(self, host: Host, tunnels: list[tuple[Process, str]]) -> None:
        """Which data path each of `host`'s tunnels took, as the kernel and OpenVPN tell it, into the settings
        record; a tunnel on the other path than the one asked for fails the start, with OpenVPN's words."""
        for proc, ifname in tunnels:  # OpenVPN logs the device's opening just after it creates it

            def logged(p: Process = proc, i: str = ifname) -> bool:
                return any(o.format(i) in p.log_text() for o in OPENED.values()) or not p.alive()

            self.wait_for(f"openvpn's log of opening {ifname}", logged, timeout=5)
        kinds = device_kinds(host.run(["ip", "-d", "-j", "link", "show"]).stdout)
        # counts, not one entry per tunnel (a 20-host mesh has 380): a tunnel that differs fails the start
        record = self.settings["data_path"]
        for proc, ifname in tunnels:
            log = proc.log_text()
            why = data_path_problem(ifname, kinds.get(ifname, ""), log, self.dco)
            if why:
                raise RuntimeError(f"{self.key} on {host.name}: {why}")
            kind = kinds[ifname]
            said = OPENED[kind].format("<dev>")
            record["devices"][kind] = record["devices"].get(kind, 0) + 1
            record["openvpn"][said] = record["openvpn"].get(said, 0) + 1
        if self.dco:  # the module that carries it, on each machine (namespaces share this one's)
            v = host.run(["cat", DCO_MODULE_VERSION], check=False).stdout.strip()
            seen = {*record.get("module", "").split(", "), f"ovpn_dco_v2 {v or 'built-in'}"} - {""}
            record["module"] = ", ".join(sorted(seen))
        record["in_use"] = "kernel (ovpn-dco)" if self.dco else "userspace (tun)"

    def stop_links(self, host: Host) -> list[str]:
        if self.star:  # one tun per host
            return [self.ifname(host)]
        return [self.peer_ifname(host, peer) for peer in self.spec.hosts if peer is not host]
