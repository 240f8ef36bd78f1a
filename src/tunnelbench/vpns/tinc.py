"""tinc 1.0 (Debian `tinc`, tincd): full mesh in router mode over a tun device.

Data plane: a full mesh. tinc 1.0 sends every UDP packet straight to the destination node's underlay
address (learned from the edges), whatever the meta connections are, so h2 -> h3 never passes h1.

Control plane (meta connections, TCP 655): a star by default, h1 (a star topology's hub) <-> every other host. A full mesh of
ConnectTo lines (vpn_options.tinc.tinc_meta = "full") is racy in tinc 1.0.36: when a third node joins,
it learns about a peer through h1 first and sends that peer its UDP key via h1 (ANS_KEY), then the
direct meta connection comes up and the peer's REQ_KEY is answered directly with a *new* key. The two
ANS_KEYs travel different TCP paths; if the one via h1 arrives last, the peer keeps the stale key and
every UDP packet it sends is dropped as "unauthenticated" until KeyExpire (3600 s): seen in ~1 of 35
three-host starts, that pair never came up within 30 s. With a tree of meta connections there is one
path between any two nodes, so key messages cannot overtake each other. Packets: UDP 655, tinc 1.0's default blowfish-CBC + HMAC-SHA1 (4-byte MAC), set
explicitly in every host file so that the recorded cipher is what ran; vpn_options.tinc.cipher = "aes"
switches to AES-256-CBC + HMAC-SHA256, any other OpenSSL cipher name (and `digest`) is used as given.

Keys: `tincd -K 2048` on each host (RSA, rsa_key.priv 0600, the public key is appended to the host's own
hosts/<name> file, which is then copied to the other hosts). A tinc-up script sets the address and MTU.
tincd runs in the foreground (-D), with --pidfile inside the run folder (else /var/run/tinc.NET.pid)
and --logfile to the daemon log."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver, udp_socket_buffer
from tunnelbench.vpns.features import one_source
from tunnelbench.vpns.install import Apt

# documentation pages the feature record cites
TINC_DOC = "https://www.tinc-vpn.org/documentation-1.0/"

PORT = 655
RSA_BITS = 2048
DEFAULT_CIPHER, DEFAULT_DIGEST = "blowfish", "sha1"  # tinc 1.0 defaults (bf-cbc, HMAC-SHA1)
STRONG_CIPHER, STRONG_DIGEST = "aes-256-cbc", "sha256"
MAC_LENGTH = 4  # tinc 1.0 default
# tinc 1.0 takes its ciphers from OpenSSL's EVP by name. OpenSSL 3 moved blowfish to the "legacy" provider,
# which is not loaded by default: tincd then logs "Error during initialisation of key ...: unsupported",
# never gets a UDP key and silently carries all traffic over its TCP meta connections (pings still work).
# So tincd runs with an OPENSSL_CONF that activates the default and legacy providers.
OPENSSL_CONF = """openssl_conf = openssl_init
[openssl_init]
providers = provider_sect
[provider_sect]
default = default_sect
legacy = legacy_sect
[default_sect]
activate = 1
[legacy_sect]
activate = 1
"""


# a node line of tincd's SIGUSR2 dump (tinc 1.0 graph.c dump_nodes):
# " h2 at 10.0.0.2 port 655 cipher 91 digest 64 maclength 4 compression 0 options 0 status 0012 nexthop h2
#   via h2 pmtu 1459 (min 1459 max 1459)"
# (after the log file's "date time tinc.NET[pid]: " prefix)
NODE_LINE = re.compile(r"(\S+) at \S+(?: port \d+)? cipher .* pmtu (\d+) \(min (\d+) max (\d+)\)")


def node_pmtu(log: str) -> dict[str, tuple[int, int]]:
    """Each node's (min, max) PMTU from the last node dump in a tincd log."""
    start = log.rfind("Nodes:")
    if start < 0:
        return {}
    end = log.find("End of nodes.", start)
    if end < 0:  # still being written
        return {}
    block = log[start:end]
    return {m[1]: (int(m[3]), int(m[4])) for m in NODE_LINE.finditer(block)}


class Tinc(VpnDriver):
    name = "tinc"
    summary = "tinc 1.0 full mesh (direct UDP 655, meta star via h1), router mode, blowfish-CBC + HMAC-SHA1 (default)"
    # the feature record (vpns/features.py): each fact with its source
    features = one_source(
        TINC_DOC,
        protocol="tinc 1.0 meta protocol (TCP) + UDP data",
        ciphers="OpenSSL EVP (default Blowfish-CBC + HMAC-SHA1)",
        data_plane="userspace (C), TUN/TAP",
        topology="full mesh data, meta connections as configured",
        nat_traversal="relays via meta connections when UDP fails",
        relay="forwarding through other nodes (TCP/UDP)",
        acl="host files per node",
        unattended_join="exchange of host files",
        self_hosted_control="no control plane",
        platforms="Linux, BSD, macOS, Windows",
        license="GPL-2.0+",
    )
    binaries = ("tincd",)
    installs = (Apt(("tinc",)),)
    paths_why = {
        "relay": "not modelled yet: tinc would fall back to its TCP meta connections (not a relay host)",
        "nat": "not modelled yet: the driver gives every node every other node's address",
    }
    # tinc does not set an MTU: the tun device keeps the kernel's 1500 and tinc relies on its PMTU
    # discovery (ICMP frag-needed to the sender, TCP fallback for oversize packets)
    default_mtu = 1500
    # star (many-clients): the meta star's centre is the hub instead of h1, spokes hold only their own and
    # the hub's host file. The data plane stays tinc's: a spoke could still reach another one directly.
    topologies = frozenset({"mesh", "star"})
    # PMTU discovery finishes a few seconds after start; until then big packets ride the TCP meta link.
    # warmed_up() asks the daemons (their node dump) instead of waiting this out (at most twice this)
    settle_s = 6.0

    class Options(TunnelOptions):
        cipher: str = Field(
            DEFAULT_CIPHER,
            pattern=r"^[A-Za-z0-9-]+$",
            description="OpenSSL cipher of the UDP packets (tinc 1.0's default blowfish = bf-cbc); "
            f"aes = {STRONG_CIPHER} with digest {STRONG_DIGEST} unless digest is given",
        )
        digest: str = Field(
            DEFAULT_DIGEST,
            pattern=r"^[A-Za-z0-9-]+$",
            description="OpenSSL digest of the packets' HMAC (truncated to MACLength = 4 bytes)",
        )
        tinc_meta: Literal["star", "full"] = Field(
            "star", description="meta (TCP) connections: star around h1, or full mesh (racy in tinc 1.0.36)"
        )
        udp_socket_buffer: int | None = udp_socket_buffer("UDPRcvBuf and UDPSndBuf in tinc.conf")

        @model_validator(mode="after")
        def _aes(self) -> Tinc.Options:
            if self.cipher.lower() in ("aes", "strong"):
                self.cipher = STRONG_CIPHER
                if "digest" not in self.model_fields_set:
                    self.digest = STRONG_DIGEST
            return self

    options: Options

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        cipher, digest = self.options.cipher, self.options.digest
        # a star topology keeps the meta connections a star too (around the hub)
        self.meta = "star" if spec.topology == "star" else self.options.tinc_meta
        self.settings: dict[str, Any] = {
            "mode": "full mesh data plane (direct UDP), router mode (Mode = router, tun)",
            "meta_connections": f"star around {self._centre().name}" if self.meta == "star" else "full mesh",
            "cipher": cipher,
            "digest": digest,
            "mac_length": MAC_LENGTH,
            "rsa_bits": RSA_BITS,
            "mtu": self.mtu,
            "port": PORT,
            "compression": 0,
            "udp_socket_buffer": self.options.udp_socket_buffer or "OS default",
        }

    @classmethod
    def version(cls, host: Host) -> str:
        # "tinc version 1.0.36 (built ...)"
        line = cls._first_line(host, [host.binary("tincd", cls.installs), "--version"], "tinc version")
        return line.split("version", 1)[1].split()[0]

    # -- paths -------------------------------------------------------------------------------------
    def confdir(self, host: Host) -> Path:
        return self.host_dir(host) / "conf"

    def openssl_conf(self, host: Host) -> Path:
        return self.host_dir(host) / "openssl-legacy.cnf"

    def _env(self, host: Host) -> dict[str, str]:
        return {"OPENSSL_CONF": str(self.openssl_conf(host))}

    def pidfile(self, host: Host) -> Path:
        return self.host_dir(host) / "tincd.pid"

    @property
    def netname(self) -> str:
        return self.spec.tag

    # -- configure ---------------------------------------------------------------------------------
    def configure(self) -> None:
        host_files: dict[str, bytes] = {}
        for h in self.spec.hosts:
            conf = self.confdir(h)
            h.write_file(self.openssl_conf(h), OPENSSL_CONF, 0o644)
            # fail here, not with a silent TCP fallback later, if this OpenSSL lacks the cipher or digest
            probe = h.run(["openssl", "enc", "-e", f"-{self.settings['cipher']}", "-md", self.settings["digest"],
                           "-pbkdf2", "-pass", "pass:probe", "-out", "/dev/null"], input="probe", env=self._env(h), check=False)  # fmt: skip
            if probe.returncode != 0:
                raise RuntimeError(
                    f"tinc: OpenSSL here cannot do {self.settings['cipher']}/{self.settings['digest']} "
                    f"(even with the legacy provider): {probe.stderr.strip()[-300:]}"
                )
            tinc_conf = [
                f"Name = {h.name}",
                "Mode = router",
                "DeviceType = tun",
                "Device = /dev/net/tun",
                f"Interface = {self.ifname(h)}",
                "AddressFamily = ipv4",
                *(f"{k} = {self.options.udp_socket_buffer}" for k in self._buffer_keys()),
                *(f"ConnectTo = {p.name}" for p in self._connect_to(h)),
            ]
            h.write_file(conf / "tinc.conf", "\n".join(tinc_conf) + "\n", 0o644)
            host_conf = [
                f"Address = {h.underlay_ip}",
                f"Port = {PORT}",
                f"Subnet = {self.tunnel_ip(h)}/32",
                f"Cipher = {self.settings['cipher']}",
                f"Digest = {self.settings['digest']}",
                f"MACLength = {MAC_LENGTH}",
                "Compression = 0",
            ]
            own = conf / "hosts" / h.name
            h.write_file(own, "\n".join(host_conf) + "\n", 0o644)
            # appends the public key to hosts/<name>, writes rsa_key.priv (0600); stdin is a pipe: no prompts
            h.run(
                [h.binary("tincd", self.installs), "-c", str(conf), f"--generate-keys={RSA_BITS}"], input=""
            )
            priv = conf / "rsa_key.priv"
            h.run(["chmod", "600", str(priv)])
            host_files[h.name] = h.read_file(own)
            if b"BEGIN RSA PUBLIC KEY" not in host_files[h.name]:
                raise RuntimeError(f"tinc: no public key in {own}")
            up = (
                "#!/bin/sh\n"
                f'ip addr add {self.tunnel_ip(h)}/{self.tunnel_prefixlen} dev "$INTERFACE"\n'
                f'ip link set "$INTERFACE" mtu {self.mtu} up\n'
            )
            h.write_file(conf / "tinc-up", up, 0o755)
            down = '#!/bin/sh\nip link set "$INTERFACE" down\n'
            h.write_file(conf / "tinc-down", down, 0o755)
        for h in self.spec.hosts:
            # a star's spoke needs the hub's file only (its one meta connection): N files, not N^2
            for p in (
                self.spec.hosts if self.spec.topology == "mesh" or h is self._centre() else [self._centre()]
            ):
                if p is not h:
                    h.write_file(self.confdir(h) / "hosts" / p.name, host_files[p.name], 0o644)

    def _buffer_keys(self) -> tuple[str, ...]:
        return ("UDPRcvBuf", "UDPSndBuf") if self.options.udp_socket_buffer else ()

    def _centre(self) -> Host:
        """The meta star's centre: the hub in a star topology, else h1."""
        if self.spec.topology == "star" and self.spec.hub is not None:
            return self.spec.hub
        return self.spec.hosts[0]

    def _connect_to(self, host: Host) -> list[Host]:
        hosts, centre = self.spec.hosts, self._centre()
        if self.meta == "full" or host is centre:
            return [p for p in hosts if p is not host]
        return [centre]  # star: the centre also dials everyone, so start order does not matter

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, host: Host) -> None:
        d = self.host_dir(host)
        log = d / "daemon.log"
        argv = [host.binary("tincd", self.installs), f"--net={self.netname}", "-c", str(self.confdir(host)), "-D", "--debug=1",
                f"--pidfile={self.pidfile(host)}", f"--logfile={log}"]  # fmt: skip
        # -D keeps stdout/stderr open: spawn sends them to the same log (both append)
        proc = host.spawn(argv, label="tincd", log_path=log, env=self._env(host))
        self.procs[host.name].append(proc)
        ifname = self.ifname(host)

        # tinc-up runs once the device exists; wait for the address so the host is usable when we return
        def addressed() -> bool:
            if not proc.alive():
                return True
            out = host.run(["ip", "-o", "-4", "addr", "show", "dev", ifname], check=False).stdout
            return f" {self.tunnel_ip(host)}/" in out

        self.wait_for("tinc tun address (tinc-up)", addressed, timeout=10)
        if not proc.alive():
            raise RuntimeError(f"tincd exited: {proc.log_tail()}")

    def warmed_up(self) -> bool:
        """Every tincd has fixed the path MTU to every other node (PMTU discovery over UDP done, so large
        packets go by UDP, not the TCP meta link): SIGUSR2 makes tincd log its node list, whose entries end
        in "pmtu N (min A max B)"; discovery is done when min == max > 0 (net_packet.c: "Fixing MTU")."""
        for h in self.spec.hosts:
            procs = self.procs[h.name]
            if not procs or not procs[-1].alive():
                return False
            h.signal(procs[-1].pid, signal.SIGUSR2)
        time.sleep(0.05)  # the signal is handled in tincd's event loop
        for h in self.spec.hosts:
            pmtu = node_pmtu(self.procs[h.name][-1].log_text())
            for p in self.spec.hosts:
                lo, hi = pmtu.get(p.name, (0, 0))
                if p is not h and not 0 < lo == hi:
                    return False
        return True

    def after_stop(self, host: Host) -> None:
        super().after_stop(host)
        host.run(["rm", "-f", str(self.pidfile(host))], check=False)

    def leftovers(self, host: Host) -> list[str]:
        found = super().leftovers(host)
        # tincd's default pid file, should --pidfile ever be lost
        default_pid = Path(f"/var/run/tinc.{self.netname}.pid")
        if host.run(["test", "-e", str(default_pid)], check=False).returncode == 0:
            found.append(f"file {default_pid}")
        return found
