"""The VPN driver interface. One file per VPN under vpns/ holds everything about that VPN.

A driver never knows what will be measured: the orchestrator builds a `Mesh` from a driver and hosts and
hands the mesh (hosts + tunnel addresses) to workloads."""

from __future__ import annotations

import difflib
import fnmatch
import os
import platform
import re
import time
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tunnelbench.lab.host import THIS_MACHINE, Host, Process
from tunnelbench.lab.kernel import FALLBACK_LINKS
from tunnelbench.lab.kernel import missing as kernel_missing
from tunnelbench.vpns.install import (
    Source,
    debian_package_of,
    debian_version,
    registry,
    source_label,
    upstream_version,
)
from tunnelbench.vpns.podclients import PodClients


@dataclass
class Availability:
    ok: bool
    reason: str = ""
    version: str | None = None
    installable: bool = False  # not ok, but `tunnelbench install NAME` can fix it here

    @property
    def state(self) -> str:
        return "available" if self.ok else "installable" if self.installable else "impossible here"


@dataclass
class MeshSpec:
    """What a driver gets to build a mesh: the hosts, a run-unique tag for global names, options."""

    hosts: list[Host]
    tag: str
    workdir: Path
    mtu: int | None = None  # common tunnel MTU when the scenario levels the field; None = the VPN's default
    options: dict[str, Any] = field(default_factory=dict)
    # underlay path scenario (lab/netns.py PATHS): "direct" | "relay" | "nat"; relay = the host carrying relayed
    # traffic (and any control server), public = hosts not behind NAT (their underlay_ip is reachable)
    path: str = "direct"
    relay: Host | None = None
    # "mesh": every host peers with every other; "star": hosts peer only with the hub (the server host),
    # for many-client scenarios (Goethals et al.) where N^2 peerings would not fit. Drivers list theirs in topologies
    topology: str = "mesh"
    hub: Host | None = None
    # interleaved rounds bring a VPN's mesh up once per round: each bring-up gets fresh config and key
    # folders (a suffix of the per-host folder), so no VPN meets the state of its previous round
    session: str = ""


class DriverOptions(BaseModel):
    """A driver's tunables, `vpn_options.<vpn>` in a scenario: typed fields with defaults, unknown keys refused.
    A driver declares them as a nested `class Options(DriverOptions)` (the default: no options)."""

    model_config = ConfigDict(extra="forbid")


class TunnelOptions(DriverOptions):
    """Options of every driver that sets a tunnel MTU (`default_mtu`)."""

    mtu: int | None = Field(
        None,
        ge=1280,
        le=65535,
        description="tunnel MTU of this VPN; overrides fairness.tunnel_mtu and the driver's default",
    )


def udp_socket_buffer(where: str) -> Any:
    """The common `udp_socket_buffer` option (bytes, send and receive) of a VPN that exposes one."""
    return Field(
        None,
        ge=4096,
        le=1 << 30,
        description=f"UDP socket send/receive buffer, bytes: {where}; unset = the VPN's own default",
    )


class OptionsError(ValueError):
    """Invalid driver options; `problems` are "field: what is wrong" lines."""

    def __init__(self, vpn: str, problems: list[str]):
        self.vpn, self.problems = vpn, problems
        super().__init__(f"{vpn}: invalid options: " + "; ".join(problems))


def option_problems(model: type[DriverOptions], data: Any, vpn: str) -> list[str]:
    """Why `data` is not valid for `model`, one "field: message" line per problem (empty when valid)."""
    try:
        model.model_validate(data)
    except ValidationError as e:
        allowed = list(model.model_fields)
        out = []
        for err in e.errors():
            key = ".".join(str(x) for x in err["loc"])
            if err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                if key == "acl":  # vpns/acl.py: only drivers with acl_support declare it
                    hint = f" ({vpn} has no access control in this lab: acl is not supported)"
                out.append(
                    f"{key}: unknown option{hint}; allowed: "
                    + (", ".join(allowed) if allowed else f"none ({vpn} has no options)")
                )
            else:
                msg = err["msg"].removeprefix("Value error, ")
                shown = "input" in err and not isinstance(err["input"], dict)
                got = f" (got {err['input']!r})" if shown else ""
                out.append(f"{key}: {msg}{got}" if key else msg)
        return out
    return []


def describe_options(model: type[DriverOptions]) -> list[tuple[str, str, str, str]]:
    """(name, type, default, description) of every option, for `tunnelbench list`."""
    out = []
    for name, f in model.model_fields.items():
        out.append((name, _type_name(f.annotation, f.metadata), repr(f.default), f.description or ""))
    return out


def _type_name(ann: Any, metadata: list[Any]) -> str:
    if typing.get_origin(ann) is typing.Literal:
        return "|".join(str(a) for a in typing.get_args(ann))
    args = typing.get_args(ann)
    if typing.get_origin(ann) in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return _type_name(inner[0], metadata) if len(inner) == 1 else str(ann)  # unset = the VPN's own
    name = getattr(ann, "__name__", str(ann))
    lo = next((m.ge for m in metadata if getattr(m, "ge", None) is not None), None)
    hi = next((m.le for m in metadata if getattr(m, "le", None) is not None), None)
    if lo is not None and hi is not None:
        return f"{name} {lo}..{hi}"
    return f"{name} >= {lo}" if lo is not None else f"{name} <= {hi}" if hi is not None else name


# names (fnmatch, case-insensitive) of files that hold a secret, in every driver's host folders: private keys
# (WireGuard private.key, nebula/openvpn/openconnect host.key and ca.key, tinc rsa_key.priv, n2n community.key,
# fastd secret.key.conf, tailscale/headscale *.key, authkey and tailscaled.state, macsec-keys.batch) and
# innernet's invite.toml (it carries the peer's WireGuard private key). Public halves never match
SECRET_PATTERNS = ("*.key", "*key*", "*.priv", "*secret*", "*private*", "*.state", "invite*.toml", "*psk*")
PUBLIC_PATTERNS = ("*.pub", "*pub*", "*.crt", "*.csr", "*.log")


def secret_name(name: str, secret_patterns: tuple[str, ...] = ()) -> bool:
    """Whether a file of this name holds a secret: SECRET_PATTERNS or a driver's own `secret_patterns`, and
    not a public half (unless the driver names that pattern secret)."""
    name = name.lower()
    return any(fnmatch.fnmatch(name, p) for p in (*SECRET_PATTERNS, *secret_patterns)) and not any(
        fnmatch.fnmatch(name, p) for p in PUBLIC_PATTERNS if p not in secret_patterns
    )


class VpnDriver(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]
    binaries: ClassVar[tuple[str, ...]] = ()
    # where the binaries come from (vpns/install.py): `tunnelbench install NAME` installs them
    installs: ClassVar[tuple[Source, ...]] = ()
    # Debian's build where the default is a registry build (`NAME@debian`, catalog.resolve): Apt sources that
    # declare the binaries they provide; read from the class that declares it only, never inherited
    debian_installs: ClassVar[tuple[Source, ...]] = ()
    # variants (catalog.resolve): `key` is what the user wrote ("nebula@1.9.0"), the run's name for the VPN (its
    # rows, folders); `variant` the version asked for ("debian", "1.9.0"), None for the driver's default
    key: ClassVar[str] = ""
    variant: ClassVar[str | None] = None
    # underlay path scenarios the driver supports (lab/netns.py PATHS); others are skipped with paths_why
    paths: ClassVar[frozenset[str]] = frozenset({"direct"})
    paths_why: ClassVar[dict[str, str]] = {}
    # the feature record (vpns/features.py): protocol, ciphers, data plane, ... each fact with its source
    features: ClassVar[dict[str, Any]] = {}
    default_mtu: ClassVar[int | None] = None
    # seconds the tunnel needs after every pair answers before it runs at full speed (e.g. tinc's PMTU
    # discovery sends large packets over its TCP meta connection for ~5 s): warm_up() waits this out, or, for
    # a driver that can tell (warmed_up()), until the daemons say so
    settle_s: ClassVar[float] = 0.0
    # revocation (the revoke workload's check): the operator action revoke() takes to cut one host off, for the feature
    # matrix; None = not implemented (the revoke workload reports the VPN as not supported)
    revocation: ClassVar[str | None] = None
    # tunnel addresses: host i (1-based) gets TUNNEL_NET.i; above 253 hosts the net widens to a /16
    # (10.77.0.0/16, host i at 10.77.((i-1)//254).((i-1)%254+1): the first 254 keep their addresses)
    tunnel_prefix: ClassVar[str] = "10.77.0"
    tunnel_prefixlen: int = 24  # __init__ widens it for one mesh
    topologies: ClassVar[frozenset[str]] = frozenset({"mesh"})
    # the VPN's packets on the underlay, as an nftables match ("udp dport 51820"); tests count it on the router
    wire: ClassVar[str] = ""
    # kernel features (lab/kernel.py FEATURES) every host running the VPN needs, probed there
    kernel_features: ClassVar[tuple[str, ...]] = ()
    # the driver's tunables (vpn_options.<name>), validated at scenario load and here; default: none
    Options: ClassVar[type[DriverOptions]] = DriverOptions
    # file names beyond SECRET_PATTERNS that hold a secret: configs that embed a key, password or PSK
    secret_patterns: ClassVar[tuple[str, ...]] = ()
    acl_support: ClassVar[bool] = False  # vpn_options.<vpn>.acl (vpns/acl.py); False: "not supported"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "key" not in cls.__dict__:  # a driver is keyed by its name; resolve() sets a variant's key
            cls.key = getattr(cls, "name", "")

    def __init__(self, spec: MeshSpec) -> None:
        self.spec = spec
        self.options = self.parse_options(spec.options)
        if spec.topology not in self.topologies:
            raise ValueError(
                f"{self.name} does not support topology {spec.topology!r} "
                f"(supported: {', '.join(sorted(self.topologies))})"
            )
        if spec.topology == "star" and spec.hub is None:
            raise ValueError("topology 'star' needs a hub host")
        if len(spec.hosts) > 253:
            self.tunnel_prefixlen = 16
        self._index = {h.name: i for i, h in enumerate(spec.hosts, start=1)}
        self.procs: dict[str, list[Process]] = {h.name: [] for h in spec.hosts}
        # stopped processes, kept so leftovers() can prove they are gone
        self.stopped: dict[str, list[Process]] = {h.name: [] for h in spec.hosts}

    # -- identity ----------------------------------------------------------------------------------
    @classmethod
    def capabilities(cls) -> dict[str, Any]:
        """What the security checks can ask of the driver, as a run records it with the VPN (the security
        table reads the run's record, not a later release's driver): ACLs, and how it revokes a host."""
        return {"acl": cls.acl_support, "revocation": cls.revocation}

    @classmethod
    def availability(cls, hosts: Sequence[Host] | None = None) -> Availability:
        """Binaries and version here, or on the hosts when they are remote (SSH lab: version from the first).
        Every binary is looked up the way a run will start it, `host.binary(name, installs)`."""
        remote = [h for h in hosts or [] if h.remote]
        why = cls.impossible_on(hosts)
        if why:
            return Availability(False, why)
        if remote and cls.variant is not None:
            return Availability(
                False,
                f"{cls.key}: versions (NAME@VERSION) run on the namespace lab only; SSH "
                f"hosts run the build on their own PATH (use {cls.name!r})",
            )
        machines = remote or [THIS_MACHINE]  # namespaces share this machine's files
        missing = [  # binary() gives the bare name when the host has no such binary
            f"{b} on {h.name}" if h.remote else b
            for h in machines
            for b in cls.binaries
            if h.binary(b, cls.installs) == b
        ]
        if missing:
            blocked = [w for s in cls.installs if (w := s.possible())]
            if cls.installs and not blocked and not remote:
                return Availability(
                    False,
                    f"missing binaries: {', '.join(missing)}; install with `tunnelbench install {cls.key}`",
                    installable=True,
                )
            return Availability(
                False,
                f"missing binaries: {', '.join(missing)}" + (f" ({'; '.join(blocked)})" if blocked else ""),
            )
        try:
            reported = cls.version(machines[0])
            version = f"{reported} (on {remote[0].name})" if remote else cls.version_label(reported)
            return Availability(True, version=version)
        except Exception as e:  # a binary that cannot report its version is broken
            return Availability(False, f"version check failed: {e}")

    @classmethod
    def version_label(cls, reported: str) -> str:
        """What the binary reported, with where its build comes from: "1.11.1 (go proxy)", "1.6.1 (debian
        1.6.1+dfsg-3+b4)", "0.0.20250522 (go proxy v0.0.0-20260522210424-ecfc5a8d5446)" (a build whose own
        version differs from the module version it was built from). "unknown" is never a version: a build
        that reports none gets its cache build's pinned version, or its Debian package's upstream version."""
        v = reported.strip()
        if not cls.binaries or v.startswith("linux ") or re.search(r"\((debian|go proxy|crates\.io)\b", v):
            return v  # the kernel's (internal, vxlan), or the driver already said where its build comes from
        if v.lower() in ("", "unknown", "(devel)", "devel"):
            v = ""
        path = THIS_MACHINE.binary(cls.binaries[0], cls.installs)
        for s in cls.installs:
            d = s.bin_dir()
            if d is not None and path == str(d / cls.binaries[0]):
                assert registry(s)  # only registry builds have a cache folder
                pinned = s.version.removeprefix("v")
                same = not v or v.split()[0] == pinned
                return f"{v or pinned} ({source_label(s)}{'' if same else ' ' + s.version})"
        pkg = debian_package_of(path) if os.path.isabs(path) else None
        deb = debian_version(pkg) if pkg else None
        if deb:
            return f"{v or upstream_version(deb)} (debian {deb})"
        if not v:
            raise RuntimeError(f"{path} reports no version and is neither a cache build nor Debian's")
        return f"{v} ({path})"

    @classmethod
    @abstractmethod
    def version(cls, host: Host) -> str:
        """What the VPN's build on `host` reports as its version (THIS_MACHINE for the namespace lab)."""

    @classmethod
    def impossible_here(cls) -> str | None:
        """Why the VPN cannot run on this machine whatever is installed (e.g. a missing kernel module)."""
        return cls.impossible_on(None)

    @classmethod
    def impossible_on(cls, hosts: Sequence[Host] | None = None) -> str | None:
        """Why the VPN cannot run on the machines that would run it: the SSH hosts among `hosts`, else this
        one. Each kernel feature in `kernel_features` is probed there for real (lab/kernel.py)."""
        if not cls.kernel_features:
            return None
        remote = [h for h in hosts or [] if h.remote]
        for h in remote:

            def run_there(argv: list[str], h: Host = h) -> str:
                return h.run(argv, check=False).stdout

            why = kernel_missing(cls.kernel_features, h.name, run_there)
            if why:
                return f"{h.name}'s kernel has no {why}"
        if not remote:
            why = kernel_missing(cls.kernel_features)
            if why:
                return f"this kernel ({platform.release()}) has no {why}"
        return None

    @classmethod
    def cached_version(cls, name: str) -> str | None:
        """The pinned version of the install-cache build that `name` resolves to, else None (builds made with
        `go install` often print "unknown" or a dev version: the cache key is the version that was built)."""
        path = THIS_MACHINE.binary(name, cls.installs)
        for s in cls.installs:
            d = s.bin_dir()
            if d is not None and path == str(d / name):
                assert registry(s)  # only registry builds have a cache folder
                return s.version.removeprefix("v")
        return None

    @staticmethod
    def _first_line(host: Host, argv: list[str], contains: str = "") -> str:
        """The first line `argv` prints on `host` that holds `contains` (a version check's answer)."""
        p = host.run(argv, check=False, timeout=10)
        for line in (p.stdout + p.stderr).splitlines():
            if contains.lower() in line.lower() and line.strip():
                return line.strip()
        raise RuntimeError(f"`{' '.join(argv)}` printed no version")

    # -- addressing --------------------------------------------------------------------------------
    def index(self, host: Host) -> int:
        return self._index[host.name]

    def tunnel_ip(self, host: Host) -> str:
        i = self.index(host)
        if i <= 254:
            return f"{self.tunnel_prefix}.{i}"
        a, b, _ = self.tunnel_prefix.split(".")
        return f"{a}.{b}.{(i - 1) // 254}.{(i - 1) % 254 + 1}"

    @classmethod
    def control_host(cls, spec: MeshSpec) -> Host | None:
        """The host running the VPN's central control / coordination service (Headscale, a lighthouse, a
        supernode, an innernet server) in this mesh; None = no central control plane (resilience
        control_loss reports the VPN as not applicable)."""
        return None

    def peers(self, host: Host) -> list[Host]:
        """The hosts `host` has a tunnel to: all others in a mesh; the hub, or (on the hub) all, in a star."""
        if self.spec.topology == "star" and host is not self.spec.hub:
            assert self.spec.hub is not None  # __init__ refuses a star without a hub
            return [self.spec.hub]
        return [h for h in self.spec.hosts if h is not host]

    @classmethod
    def parse_options(cls, data: Any) -> DriverOptions:
        """`data` (a scenario's vpn_options.<name>) as this driver's Options; OptionsError names each bad field."""
        problems = option_problems(cls.Options, data if data is not None else {}, cls.name)
        if problems:
            raise OptionsError(cls.name, problems)
        return cls.Options.model_validate(data or {})

    @property
    def settings(self) -> dict[str, Any]:
        """What ran, stored with the run: the driver's own record plus every option value (defaults included)
        under "options". Drivers assign `self.settings = {...}`; the options are added here."""
        s: dict[str, Any] = self.__dict__.setdefault("_settings", {})
        s["options"] = self.options.model_dump(mode="json")
        return s

    @settings.setter
    def settings(self, value: dict[str, Any]) -> None:
        self.__dict__["_settings"] = dict(value)

    @property
    def mtu(self) -> int | None:
        # the VPN's own option first, then the scenario's common tunnel MTU, then the driver's default
        return getattr(self.options, "mtu", None) or self.spec.mtu or self.default_mtu

    @classmethod
    def dirname(cls) -> str:
        """The VPN's folder name on every host: its key, filesystem-safe ("nebula@1.9.0" -> "nebula-1.9.0"),
        so two versions of one VPN in a run never share configs or keys."""
        return re.sub(r"[^A-Za-z0-9._+-]", "_", cls.key.replace("@", "-")) or cls.name

    def host_dir(self, host: Host) -> Path:
        d = host.workdir / (self.dirname() + (f"-{self.spec.session}" if self.spec.session else ""))
        made = self.__dict__.setdefault("_made_dirs", set())
        if (host.name, d) not in made:  # one round trip per host on an SSH host, not one per call
            host.mkdir(d)
            made.add((host.name, d))
        return d

    def host_dirs(self) -> list[tuple[Host, Path]]:
        """This session's folder of every host that has one (the mesh's hosts and a relay/infrastructure
        host), without creating any."""
        hosts = [*self.spec.hosts, *([self.spec.relay] if self.spec.relay is not None else [])]
        out, seen = [], set()
        for h in hosts:
            d = h.workdir / (self.dirname() + (f"-{self.spec.session}" if self.spec.session else ""))
            if h.name not in seen and h.exists(d):
                seen.add(h.name)
                out.append((h, d))
        return out

    def secret_files(self, host: Host) -> list[Path]:
        """The files of this session on `host` holding a private key or a shared secret (or a config that
        embeds one): SECRET_PATTERNS and the driver's `secret_patterns`, never a public half."""
        out: list[Path] = []
        for h, d in self.host_dirs():
            if h is not host:
                continue
            found = host.run(["find", str(d), "(", "-type", "f", "-o", "-type", "l", ")"], check=False)
            for line in found.stdout.splitlines():
                if secret_name(Path(line).name, self.secret_patterns):
                    out.append(Path(line))
        return sorted(out)

    def ifname(self, host: Host) -> str:
        """Tunnel interface name, unique on the whole machine (some VPNs keep sockets per name in /var/run)."""
        return f"{self.spec.tag}v{self.index(host)}"

    # -- lifecycle ---------------------------------------------------------------------------------
    @abstractmethod
    def configure(self) -> None:
        """Generate keys, certificates and configs for the full mesh (private keys 0600, never printed)."""

    @abstractmethod
    def start(self, host: Host) -> None:
        """Start the VPN on one host (do not wait for peers). Register processes in self.procs."""

    def stop(self, host: Host) -> None:
        for p in reversed(self.procs[host.name]):
            p.stop()
        self.stopped[host.name] += self.procs[host.name]
        self.procs[host.name] = []
        self.after_stop(host)

    def revoke(self, host: Host) -> str:
        """Cut `host` off the running mesh the way the VPN's operator would (`revocation`), leaving its
        daemons running; returns what was done. Restarting the mesh (stop, start every host) undoes it."""
        raise NotImplementedError(f"{self.name}: revocation not supported")

    def pod_clients(self, server: Host, n: int, names: list[str]) -> PodClients:
        """`n` clients of the running mesh that are Kubernetes pods, not lab hosts (vpns/podclients.py): one
        identity each, joined through `server`. Drivers without a recipe for it say so here."""
        raise NotImplementedError(
            f"{self.name}: no recipe for VPN clients in pods (wireguard-go and nebula have one)"
        )

    def stop_links(self, host: Host) -> list[str]:
        """The interfaces the daemon may leave behind on `host`, deleted after stop (default: its tunnel
        interface, `ifname`)."""
        return [self.ifname(host)]

    def after_mesh(self) -> list[str]:
        """After every host stopped: put back what the driver changed for the whole machine (a raised limit);
        what could not be (default: nothing changed)."""
        return []

    def after_stop(self, host: Host) -> None:
        """Remove what the daemon leaves behind on exit: the interfaces `stop_links` names that are still
        there. A driver with more to remove (sockets, pid files) extends this and calls super() first."""
        for name in self.stop_links(host):
            if self.link_exists(host, name):
                host.run(["ip", "link", "del", name], check=False)

    def leftovers(self, host: Host) -> list[str]:
        """What of this VPN is still on the host after stop: processes, interfaces, routes, files."""
        stopped = self.stopped[host.name]
        found = [f"process {p.label} pid {p.pid}" for p in [*self.procs[host.name], *stopped] if p.alive()]
        # anything else still running in the host's namespace (a child the daemon forked, a helper it
        # spawned): after stop nothing of the run may live there
        known = {p.pid for p in [*self.procs[host.name], *stopped]}
        for pid in getattr(host, "pids", lambda: [])():
            if pid not in known:
                found.append(f"process {_comm(pid)} pid {pid} (in the host's namespace)")
        links = host.run(["ip", "-o", "link", "show"]).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if (
                name not in ("lo", "eth0")
                and name not in host.preexisting_links
                and name not in FALLBACK_LINKS
            ):
                found.append(f"interface {name}")
        routes = host.run(["ip", "-o", "route", "show", "table", "all"]).stdout
        for line in routes.splitlines():
            if self.tunnel_prefix in line and "eth0" not in line:
                found.append(f"route {line.strip()}")
        return found

    def daemons(self, host: Host) -> list[Process]:
        return [p for p in self.procs[host.name]]

    def log_tails(self, chars: int = 1500) -> dict[str, str]:
        return {f"{h}/{p.label}": p.log_tail(chars) for h, ps in self.procs.items() for p in ps}

    # -- shared helpers for drivers ----------------------------------------------------------------
    def unsettled(self) -> list[str]:
        """Why the data path is not yet the one the scenario declares although every pair answers (e.g. a
        mesh routing through a third node while its direct link comes up); [] when settled. Mesh.wait_ready
        waits for []: a case must not measure a transient relay (the path check would fail it)."""
        return []

    def warmed_up(self) -> bool | None:
        """Whether the tunnel runs at full speed yet (once every pair answers and the path is the declared
        one, unsettled() == []), as the daemons report it; None: this driver cannot tell."""
        return None

    def warm_up(self) -> float:
        """Wait until the tunnel runs at full speed: until warmed_up() says so (polled; at most twice
        settle_s, then on regardless: a tunnel that never warms up is measured as it is), or settle_s when
        the driver cannot tell. Returns the seconds waited."""
        t0 = time.monotonic()
        if not self.settle_s:
            return 0.0
        if self.warmed_up() is None:
            time.sleep(self.settle_s)
            return self.settle_s
        end = t0 + 2 * self.settle_s
        while not self.warmed_up() and time.monotonic() < end:
            time.sleep(0.2)
        return time.monotonic() - t0

    def wait_for(
        self, what: str, check: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02
    ) -> None:
        end = time.monotonic() + timeout
        while True:
            if check():
                return
            if time.monotonic() > end:
                raise TimeoutError(f"{self.name}: {what} not ready after {timeout:.0f} s")
            time.sleep(interval)

    def link_exists(self, host: Host, ifname: str) -> bool:
        return host.run(["ip", "link", "show", ifname], check=False).returncode == 0


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
