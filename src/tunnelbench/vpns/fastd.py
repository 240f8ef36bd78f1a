"""fastd (Debian `fastd` v22): a small userspace VPN daemon, here as a full mesh in TAP mode.

One fastd per host, in `mode tap` with every other host as a peer: fastd learns the MACs behind each
peer and sends unicast frames straight to that peer (broadcasts to all), so h2 -> h3 never passes h1.
Handshakes collide when both sides of a pair have `remote` (seen by hand: 18 s to connect), so for
every pair only the higher-numbered host dials (`remote`) and the lower one just accepts the key.
Method: salsa2012+umac (fastd's recommended fast method); keys are Curve25519 pairs made with
`fastd --generate-key` on each host, the secret in its own 0600 file included by the config. fastd
runs in the foreground (no --daemon) and sets the address and MTU with its `on up` hook."""

from __future__ import annotations

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver
from tunnelbench.vpns.features import fact
from tunnelbench.vpns.install import Apt

PORT = 10000
METHOD = "salsa2012+umac"


class Fastd(VpnDriver):
    name = "fastd"
    summary = f"fastd full mesh in TAP mode (one daemon per host, UDP {PORT}), {METHOD}"
    # the feature record (vpns/features.py): each fact with its source
    features = {
        "protocol": fact("fastd over UDP (tun or tap)", "https://fastd.readthedocs.io/"),
        "ciphers": fact(
            "salsa2012+umac (used), chacha20-poly1305, aes128-gcm, null",
            "https://fastd.readthedocs.io/en/stable/crypto/methods.html",
        ),
        "data_plane": fact("userspace (C)", "https://fastd.readthedocs.io/"),
        "topology": fact("peer lists; TAP mode switches between peers", "https://fastd.readthedocs.io/"),
        "nat_traversal": fact(
            "one side behind NAT (the other must be reachable)", "https://fastd.readthedocs.io/"
        ),
        "relay": fact("none (a node may forward with `forward yes`)", "https://fastd.readthedocs.io/"),
        "acl": fact("per-peer public keys or on-verify hook", "https://fastd.readthedocs.io/"),
        "unattended_join": fact("static configs", "https://fastd.readthedocs.io/"),
        "self_hosted_control": fact("no control plane", "https://fastd.readthedocs.io/"),
        "platforms": fact("Linux, BSD, macOS", "https://fastd.readthedocs.io/"),
        "license": fact("BSD-2-Clause", "https://github.com/NeoRaider/fastd"),
    }
    binaries = ("fastd",)
    installs = (Apt(("fastd",)),)
    default_mtu = 1406  # fastd's documented recommendation for IPv4 underlays (its built-in default is 1500)
    Options = TunnelOptions  # vpn_options: mtu
    paths = frozenset({"direct"})
    paths_why = {
        "relay": "fastd has no relay: every peer pair needs direct UDP",
        "nat": "fastd peers behind different NATs cannot reach each other (no rendezvous or hole punching)",
    }

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.settings = {
            "mode": "full mesh, tap, one daemon per host",
            "method": METHOD,
            "port": PORT,
            "mtu": self.mtu,
            "secure_handshakes": True,
        }

    @classmethod
    def version(cls, host: Host) -> str:
        return cls._first_line(host, [host.binary("fastd", cls.installs), "--version"], "fastd").split()[-1]

    def configure(self) -> None:
        pubs: dict[str, str] = {}
        for h in self.spec.hosts:
            d = self.host_dir(h)
            secret = h.run(
                [h.binary("fastd", self.installs), "--generate-key", "--machine-readable"]
            ).stdout.strip()
            h.write_file(d / "secret.key.conf", f'secret "{secret}";\n', 0o600)
            pub = h.run(
                [
                    h.binary("fastd", self.installs),
                    "--show-key",
                    "--machine-readable",
                    "--config",
                    str(d / "secret.key.conf"),
                ]
            )
            pubs[h.name] = pub.stdout.strip()
        for h in self.spec.hosts:
            d = self.host_dir(h)
            up = (
                f"ip addr add {self.tunnel_ip(h)}/{self.tunnel_prefixlen} dev $INTERFACE && "
                f"ip link set $INTERFACE mtu {self.mtu} up"
            )
            conf = [
                "log to stderr level warn;",
                f'interface "{self.ifname(h)}";',
                "mode tap;",
                f'method "{METHOD}";',
                "secure handshakes yes;",
                f"bind {h.underlay_ip}:{PORT};",
                f'include "{d / "secret.key.conf"}";',
                f"mtu {self.mtu};",
                f'on up "{up}";',
            ]
            for p in self.spec.hosts:
                if p is h:
                    continue
                remote = f" remote {p.public_ip}:{PORT};" if self.index(h) > self.index(p) else ""
                conf.append(f'peer "{p.name}" {{ key "{pubs[p.name]}";{remote} }}')
            h.write_file(d / "fastd.conf", "\n".join(conf) + "\n", 0o600)

    def start(self, host: Host) -> None:
        d = self.host_dir(host)
        proc = host.spawn(
            [host.binary("fastd", self.installs), "--config", str(d / "fastd.conf")],
            label="fastd",
            log_path=d / "daemon.log",
        )
        self.procs[host.name].append(proc)
        ifname = self.ifname(host)

        def addressed() -> bool:
            out = host.run(["ip", "-o", "-4", "addr", "show", "dev", ifname], check=False).stdout
            return not proc.alive() or f" {self.tunnel_ip(host)}/" in out

        self.wait_for("fastd tap address (on up)", addressed, timeout=10)
        if not proc.alive():
            raise RuntimeError(f"fastd exited: {proc.log_tail()}")
