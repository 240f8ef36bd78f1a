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
The configs hold the WireGuard private keys (0600, written by innernet)."""

from __future__ import annotations

import shutil
from pathlib import Path as Path

from tunnelbench.lab.host import Host, Process
from tunnelbench.vpns.base import TunnelOptions, VpnDriver
from tunnelbench.vpns.install import Apt, Crate

VERSION = "2.0.0"
PORT = 51820


class Innernet(VpnDriver):
    name = "innernet"
    summary = f"innernet {VERSION} WireGuard mesh with a coordination server (userspace wireguard-go)"
    binaries = ("innernet", "innernet-server", "wireguard-go")
    installs = (Crate("innernet", VERSION, ("innernet",)), Crate("innernet-server", VERSION, ("innernet-server",)),
                Apt(("wireguard-go", "wireguard-tools")))  # fmt: skip
    versioned_sources = ("innernet", "innernet-server")  # innernet@X.Y.Z pins both crates (vpns.resolve)
    default_mtu = 1280  # innernet's default (`innernet --mtu`, "default: 1280")
    Options = TunnelOptions  # vpn_options: mtu
    settle_s = 1.0
    paths = frozenset({"direct"})
    # the WireGuard private key lives in the interface config innernet writes (etc/<network>.conf)
    secret_patterns = ("*.conf",)
    paths_why = {"relay": "innernet has no relay: peers need direct UDP to each other",
                 "nat": "not probed here yet: NAT traversal needs the server to learn endpoints (innernet >= 1.5)"}  # fmt: skip

    def __init__(self, spec):
        super().__init__(spec)
        self.server = self.control_host(spec)
        self.settings = {"mode": "WireGuard full mesh, peers from the innernet server", "server": self.server.name,
                         "backend": "userspace (wireguard-go)", "cipher": "ChaCha20-Poly1305 (WireGuard)",
                         "mtu": self.mtu, "port": PORT}  # fmt: skip

    @classmethod
    def control_host(cls, spec) -> Host:
        """The innernet server: the relay host when the lab has one, else the last host."""
        return spec.relay or spec.hosts[-1]

    @classmethod
    def version(cls) -> str:
        return cls._first_line([cls.bin("innernet"), "--version"], "innernet").split()[-1]

    def tunnel_ip(self, host: Host) -> str:
        return "10.77.0.1" if host is self.server else f"10.77.0.{128 + self.index(host)}"

    def _dirs(self, host: Host) -> list[str]:
        d = self.host_dir(host)
        return ["--config-dir", str(d / "etc"), "--data-dir", str(d / "data")]

    def _env(self) -> dict[str, str]:
        return {
            "WG_USERSPACE_IMPLEMENTATION": shutil.which("wireguard-go") or "wireguard-go",
            "WG_LOG_LEVEL": "error",
        }

    def configure(self) -> None:
        s = self.server
        net = self.ifname(s)
        srv = [self.bin("innernet-server"), *self._dirs(s)]
        s.run([*srv, "new", "--network-name", net, "--network-cidr", "10.77.0.0/24",
               "--external-endpoint", f"{s.public_ip}:{PORT}", "--listen-port", str(PORT)], env=self._env())  # fmt: skip
        s.run(
            [*srv, "add-cidr", net, "--name", "peers", "--cidr", "10.77.0.128/25", "--parent", net, "--yes"]
        )
        for h in self.spec.hosts:
            if h is s:
                continue
            invite = self.host_dir(s) / f"invite-{h.name}.toml"
            s.run([*srv, "add-peer", net, "--name", h.name, "--cidr", "peers", "--ip", self.tunnel_ip(h),
                   "--admin", "false", "--save-config", str(invite), "--invite-expires", "1h", "--yes"])  # fmt: skip
            h.write_file(self.host_dir(h) / "invite.toml", s.read_file(invite), 0o600)
            s.remove(invite)

    def start(self, host: Host) -> None:
        if any(p.alive() for p in self.procs[host.name]):
            return
        d = self.host_dir(host)
        ifname = self.ifname(host)
        if host is self.server:
            argv = [self.bin("innernet-server"), *self._dirs(host), "serve", ifname, "--backend", "userspace",
                    "--mtu", str(self.mtu), "--no-write-hosts"]  # fmt: skip
            proc = host.spawn(argv, label="innernet-server", log_path=d / "daemon.log", env=self._env())
            self.procs[host.name].append(proc)
            self.wait_for("innernet-server API", lambda: not proc.alive() or bool(host.run(
                ["ss", "-Hltn", f"sport = :{PORT}"], check=False).stdout.strip()), timeout=20)  # fmt: skip
        else:
            self.start(self.server)
            cli = [self.bin("innernet"), "--backend", "userspace", "--mtu", str(self.mtu), *self._dirs(host)]
            if host.exists(d / "invite.toml"):
                host.run([*cli, "install", str(d / "invite.toml"), "--name", ifname, "--delete-invite",
                          "--no-write-hosts"], env=self._env(), timeout=60)  # fmt: skip
            argv = [*cli, "up", ifname, "--daemon", "--interval", "2", "--no-write-hosts"]
            proc = host.spawn(argv, label="innernet", log_path=d / "daemon.log", env=self._env())
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
        ifname = self.ifname(host)
        if self.link_exists(host, ifname):  # wireguard-go (forked by innernet) exits with its device
            host.run(["ip", "link", "del", ifname], check=False)
        host.remove(Path("/var/run/wireguard") / f"{ifname}.sock")
