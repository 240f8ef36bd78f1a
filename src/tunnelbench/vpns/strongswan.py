"""strongSwan 5.9 (Debian charon + swanctl) IKEv2/IPsec, full mesh of tunnel-mode CHILD_SAs, with ESP in
userspace (the kernel-libipsec plugin) because this kernel has XFRM but no ESP; where the kernel has
ESP, `vpn_options.strongswan.esp = "kernel"` leaves kernel-libipsec out and the kernel does ESP.

Addressing: each host puts its tunnel address 10.77.0.i/32 on lo (no dummy interfaces in this kernel); for every other host j
there is one IKE_SA + CHILD_SA with local_ts 10.77.0.i/32, remote_ts 10.77.0.j/32 (tunnel mode), so
packets between tunnel addresses are ESP between the two underlay addresses (direct, full mesh). The
higher-numbered host initiates (hosts start in order, so the responder is already up). Authentication:
one random 256-bit PSK per pair (swanctl.conf 0600). Proposals: IKE aes256gcm16-prfsha256-x25519,
ESP aes256gcm16 (AES-256-GCM), fixed so the recorded cipher is what ran.

charon is configured only through a per-host strongswan.conf (STRONGSWAN_CONF): explicit plugin list,
vici socket in its private /run (swanctl enters charon's mount namespace to reach it), log to a file. charon still writes its
pid file to /run (compiled in), which every namespace shares, so each charon runs in a private mount
namespace with a per-host directory over /run (lab/mountns.py). kernel-libipsec only does UDP-encapsulated ESP (it makes charon
believe there is a NAT, so ESP goes in UDP 4500) and makes a tun device (ipsec0) and routes through it (routing table 220), both removed when charon exits."""

from __future__ import annotations

import itertools
import secrets
from typing import ClassVar, Literal

from pydantic import Field

from tunnelbench.lab.host import Host, Result
from tunnelbench.lab.mountns import in_mounts_of, private_mounts
from tunnelbench.vpns.base import MeshSpec, TunnelOptions, VpnDriver
from tunnelbench.vpns.features import one_source
from tunnelbench.vpns.install import Apt, Source, debian_version

_VERSIONS: dict[tuple[str, str], str] = {}  # (machine, swanctl) -> version

# documentation pages the feature record cites
KERNEL_LIBIPSEC_DOC = "https://docs.strongswan.org/docs/5.9/plugins/kernel-libipsec.html"

IKE_PROPOSAL = "aes256gcm16-prfsha256-x25519"
ESP_PROPOSAL = "aes256gcm16"
PLUGINS_USERSPACE = "kernel-libipsec"
PLUGINS = (
    "random nonce openssl aes sha1 sha2 hmac kdf gcm pem pkcs1 pubkey x509 kernel-netlink socket-default "
    "vici updown"
)


class StrongSwan(VpnDriver):
    name = "strongswan"
    summary = "strongSwan IKEv2/IPsec full mesh (tunnel mode per pair, PSK), AES-256-GCM, ESP in userspace (kernel-libipsec)"
    # the feature record (vpns/features.py): each fact with its source
    features = one_source(
        "https://docs.strongswan.org/docs/5.9/swanctl/swanctlConf.html",
        protocol="IKEv2 + ESP (IPsec)",
        ciphers="negotiated IKE/ESP proposals (here AES-256-GCM, X25519)",
        data_plane=(
            "kernel XFRM, or userspace ESP-in-UDP with kernel-libipsec (used here)",
            KERNEL_LIBIPSEC_DOC,
        ),
        topology="site-to-site SAs; full mesh as configured by the driver",
        nat_traversal=(
            "NAT-T (ESP in UDP 4500) to a reachable responder",
            "https://docs.strongswan.org/docs/5.9/features/natTraversal.html",
        ),
        relay="none",
        acl="traffic selectors per CHILD_SA",
        unattended_join="static configs, PSK or certificates",
        self_hosted_control="no control plane",
        platforms="Linux, BSD, macOS, Android, Windows (client)",
        license=("GPL-2.0", "https://github.com/strongswan/strongswan"),
    )
    # annotated: vpns/ipsec.py's drivers replace them
    binaries: ClassVar[tuple[str, ...]] = ("swanctl", "charon")
    installs: ClassVar[tuple[Source, ...]] = (
        Apt(
            (
                "strongswan-swanctl",
                "strongswan-charon",
                "libcharon-extra-plugins",
                "libstrongswan-standard-plugins",
            ),
            ("swanctl", "charon"),
            libexec=("/usr/lib/ipsec",),  # Debian keeps charon off PATH
        ),
    )
    secret_patterns = ("swanctl.conf",)  # its secrets section holds the PSKs
    default_mtu: ClassVar[int | None] = (
        1400  # kernel-libipsec's tun device MTU (charon.plugins.kernel-libipsec.mtu default)
    )
    paths = frozenset({"direct"})
    paths_why = {
        "relay": "IPsec has no relay: every pair needs direct UDP 500/4500",
        "nat": "NAT-T works only with a reachable responder; peers behind different NATs cannot set up SAs",
    }

    class Options(TunnelOptions):
        esp: Literal["userspace", "kernel"] = Field(
            "userspace", description="ESP in charon (kernel-libipsec: kernels without ESP) or in the kernel"
        )

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.esp = getattr(self.options, "esp", "kernel")  # vpns/ipsec.py's drivers: always the kernel
        self.settings = {
            "mode": "full mesh of IKEv2 tunnel-mode SAs (one per pair)",
            "ike": IKE_PROPOSAL,
            "cipher": "AES-256-GCM (ESP aes256gcm16)",
            "esp": self.esp,
            "auth": "PSK per pair",
            "encapsulation": "ESP in UDP 4500 (kernel-libipsec always encapsulates)"
            if self.esp == "userspace"
            else "ESP",
            "mtu": self.mtu,
        }

    @classmethod
    def version(cls, host: Host) -> str:
        swanctl = host.binary("swanctl", cls.installs)
        # one answer per machine and binary for the eight IPsec drivers (under the kernel lane's TCG each
        # `swanctl --version` took 1.5-2.6 s)
        key = (host.name, swanctl)
        if key not in _VERSIONS:
            v = cls._first_line(host, [swanctl, "--version"], "strongSwan ").split()[
                1
            ]  # "strongSwan 5.9.8 swanctl"
            _VERSIONS[key] = f"{v} (debian {debian_version('strongswan-charon')})"
        return _VERSIONS[key]

    # inside charon's private /run; swanctl enters that mount namespace (a socket path in the run folder
    # can exceed the 108-byte limit of unix socket paths)
    VICI = "unix:///run/charon.vici"

    def swanctl(self, host: Host, *args: str) -> Result:
        charon = next(p for p in self.procs[host.name] if p.label == "charon")
        env = {"STRONGSWAN_CONF": str(self.host_dir(host) / "strongswan.conf")}
        return host.run(
            in_mounts_of(charon.pid, [host.binary("swanctl", self.installs), *args, "--uri", self.VICI]),
            env=env,
        )

    # -- configuration hooks (vpns/ipsec.py's kernel-ESP drivers override them) ---------------------------
    lo_address: ClassVar[bool] = True  # the tunnel address 10.77.0.i/32 lives on lo

    def plugins(self) -> str:
        return f"{PLUGINS_USERSPACE} {PLUGINS}" if self.esp == "userspace" else PLUGINS

    def charon_settings(self) -> dict[str, str]:
        """`charon { key = value }` lines of strongswan.conf (besides load, filelog and plugins)."""
        return {"install_virtual_ip": "no", "retransmit_timeout": "1.0", "retransmit_base": "1.4"}

    def plugin_settings(self) -> dict[str, dict[str, str]]:
        """`charon.plugins.<plugin> { key = value }` sections (besides vici's socket)."""
        return {"kernel-libipsec": {"mtu": str(self.mtu)}}

    def connection(self, host: Host, peer: Host) -> dict[str, str]:
        """The IKE connection from `host` to `peer` (swanctl.conf connections.<peer>), without auth/children."""
        return {
            "version": "2",
            "local_addrs": host.underlay_ip,
            "remote_addrs": peer.public_ip,
            "proposals": IKE_PROPOSAL,
        }

    def children(self, host: Host, peer: Host) -> dict[str, dict[str, str]]:
        """The CHILD_SAs of that connection: {name: {option: value}}."""
        start = "start" if self.index(host) > self.index(peer) else "none"
        return {
            peer.name: {
                "local_ts": f"{self.tunnel_ip(host)}/32",
                "remote_ts": f"{self.tunnel_ip(peer)}/32",
                "esp_proposals": ESP_PROPOSAL,
                "mode": "tunnel",
                "start_action": start,
            }
        }

    def charon_conf(self, host: Host) -> str:
        d = self.host_dir(host)
        settings = "".join(f"  {k} = {v}\n" for k, v in self.charon_settings().items())
        plugins = "".join(
            f"    {name} {{\n" + "".join(f"      {k} = {v}\n" for k, v in opts.items()) + "    }\n"
            for name, opts in self.plugin_settings().items()
        )
        return f"""charon {{
  load = {self.plugins()}
{settings}  filelog {{
    log {{
      path = {d / "charon.log"}
      default = 1
      ike = 1
      time_format = %b %e %T
      flush_line = yes
    }}
  }}
  plugins {{
    vici {{
      socket = {self.VICI}
    }}
{plugins}  }}
}}
"""

    def configure(self) -> None:
        psk = {
            frozenset((a.name, b.name)): secrets.token_hex(32)
            for a, b in itertools.combinations(self.spec.hosts, 2)
        }
        for h in self.spec.hosts:
            d = self.host_dir(h)
            h.mkdir(d / "run")
            h.write_file(d / "strongswan.conf", self.charon_conf(h), 0o644)
            conns, secs = [], []
            for p in self.spec.hosts:
                if p is h:
                    continue
                conn = "".join(f"    {k} = {v}\n" for k, v in self.connection(h, p).items())
                kids = "".join(
                    f"      {name} {{\n"
                    + "".join(f"        {k} = {v}\n" for k, v in opts.items())
                    + "      }\n"
                    for name, opts in self.children(h, p).items()
                )
                conns.append(f"""  {p.name} {{
{conn}    local {{
      auth = psk
      id = {h.name}
    }}
    remote {{
      auth = psk
      id = {p.name}
    }}
    children {{
{kids}    }}
  }}""")
                secs.append(f"""  ike-{p.name} {{
    id-1 = {h.name}
    id-2 = {p.name}
    secret = 0x{psk[frozenset((h.name, p.name))]}
  }}""")
            text = "connections {\n" + "\n".join(conns) + "\n}\nsecrets {\n" + "\n".join(secs) + "\n}\n"
            h.write_file(d / "swanctl.conf", text, 0o600)

    def start(self, host: Host) -> None:
        # the tunnel address lives on lo (this kernel has no dummy interfaces); removed in after_stop
        if self.lo_address:
            host.run(["ip", "addr", "add", f"{self.tunnel_ip(host)}/32", "dev", "lo"])
        self.start_charon(host)
        self.load(host)

    def start_charon(self, host: Host) -> None:
        d = self.host_dir(host)
        argv = private_mounts({"/run": d / "run"}, [host.binary("charon", self.installs)])
        proc = host.spawn(
            argv,
            label="charon",
            log_path=d / "daemon.log",
            env={"STRONGSWAN_CONF": str(d / "strongswan.conf")},
        )
        self.procs[host.name].append(proc)
        sock = d / "run" / "charon.vici"
        self.wait_for("charon vici socket", lambda: host.exists(sock) or not proc.alive(), timeout=15)
        if not proc.alive():
            raise RuntimeError(f"charon exited: {proc.log_tail()}")
        # kernel-libipsec's tun device: its mtu option is not honoured by 5.9, so set it here
        if self.esp == "userspace":
            self.wait_for("kernel-libipsec ipsec0", lambda: self.link_exists(host, "ipsec0"), timeout=10)
            host.run(["ip", "link", "set", "ipsec0", "mtu", str(self.mtu)])

    def load(self, host: Host) -> None:
        """Connections and secrets into charon (start_action runs from here: start, trap)."""
        self.swanctl(host, "--load-all", "--noprompt", "--file", str(self.host_dir(host) / "swanctl.conf"))

    def stop_links(self, host: Host) -> list[str]:
        return ["ipsec0"]  # kernel-libipsec's TUN device

    def after_stop(self, host: Host) -> None:
        if self.lo_address:
            host.run(["ip", "addr", "del", f"{self.tunnel_ip(host)}/32", "dev", "lo"], check=False)
        super().after_stop(host)
        host.remove(self.host_dir(host) / "run" / "charon.vici")

    def leftovers(self, host: Host) -> list[str]:
        found = super().leftovers(host)
        if self.lo_address and (
            f" {self.tunnel_ip(host)}/"
            in host.run(["ip", "-o", "addr", "show", "dev", "lo"], check=False).stdout
        ):
            found.append(f"address {self.tunnel_ip(host)} on lo")
        t220 = host.run(["ip", "route", "show", "table", "220"], check=False).stdout.strip()
        if t220:
            found.append(f"routes in table 220: {t220[:200]}")
        return found
