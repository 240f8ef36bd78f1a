"""The real hosts of the SSH lab, from an Ansible inventory read by Ansible itself (INI or YAML, host
ranges such as edge-[1:3], group_vars/ and host_vars/ beside the file; a templated value is refused), so one file
serves both tools:

    [peers]                       # VPN peers; the scenario's h1, h2, ... in this order
    edge-[1:2] ansible_user=root
    [routers]                     # optional: the box every underlay packet crosses (impairment, policies)
    wan-box ansible_host=192.0.2.1
    [all:vars]
    ansible_ssh_private_key_file=~/.ssh/tunnelbench_ed25519
    ansible_ssh_common_args='-o UserKnownHostsFile=~/.ssh/lab_known_hosts'

Ansible's variables understood: ansible_host, ansible_port, ansible_user, ansible_ssh_private_key_file,
ansible_host_key_checking (and ansible.cfg's host_key_checking as the default), ansible_ssh_timeout,
ansible_connection (ssh only), and in ansible_ssh_common_args / ansible_ssh_extra_args the OpenSSH options
Port, User, IdentityFile, UserKnownHostsFile, StrictHostKeyChecking and ConnectTimeout (a jump host or proxy
is refused: it would send the connection where tunnelbench does not look). tunnelbench's own:
  tunnelbench_known_hosts (known_hosts file; default ~/.ssh/known_hosts),
  tunnelbench_underlay_ip (address VPN peers use to reach this host; default ansible_host),
  tunnelbench_workdir_root (default /var/tmp/tunnelbench), tunnelbench_connect_timeout_s (default 10),
  tunnelbench_impair (where impairment goes: "router" or "egress"),
  tunnelbench_bin_dir (where `install --inventory` copies binaries, first on PATH; default /usr/local/bin),
  tunnelbench_role (peer, router, relay, control: for a host outside the groups named below).
Peers are named h1..hN for the scenario: inventory names already of that form keep their number, any
other names are numbered in file order."""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from tunnelbench.core.userfile import KEY_LIMIT, TEXT_LIMIT, UserFileError, read_bytes, read_text

ROLE_GROUPS = {
    "peer": ("peers", "peer"),
    "router": ("routers", "router"),
    "relay": ("relays", "relay"),
    "control": ("control", "controls", "control_servers", "controllers"),
}
DEFAULT_WORKDIR_ROOT = "/var/tmp/tunnelbench"
_FALSE = {"false", "no", "0", "off"}
_TRUE = {"true", "yes", "1", "on"}


class InventoryError(ValueError):
    pass


def _bool(v: Any, where: str) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in _FALSE:
        return False
    if s in _TRUE:
        return True
    raise InventoryError(f"{where}: expected true/false, got {v!r}")


@dataclass
class InvHost:
    """One machine of the inventory and how to reach it."""

    name: str  # the inventory's name for it
    address: str  # where SSH connects
    port: int = 22
    user: str = "root"
    key_file: str | None = None  # None: keys from the agent and ~/.ssh
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts
    host_key_check: bool = True
    underlay_ip: str = ""
    workdir_root: str = DEFAULT_WORKDIR_ROOT
    connect_timeout_s: float = 10.0
    roles: set[str] = field(default_factory=set)
    vars: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.name} ({self.user}@{self.address}:{self.port})"


@dataclass
class Inventory:
    path: Path | None
    hosts: dict[str, InvHost]
    order: list[str]  # host names in file order

    def with_role(self, role: str) -> list[InvHost]:
        return [self.hosts[n] for n in self.order if role in self.hosts[n].roles]

    def peers(self) -> list[InvHost]:
        """Peers in the order they play h1, h2, ...: h<N> names by number, others in file order."""
        peers = self.with_role("peer")
        if peers and all(re.fullmatch(r"h\d+", p.name) for p in peers):
            peers.sort(key=lambda p: int(p.name[1:]))
        return peers

    def router(self) -> InvHost | None:
        routers = self.with_role("router")
        if len(routers) > 1:
            raise InventoryError(
                f"{self.path}: more than one router host ({', '.join(r.name for r in routers)})"
            )
        return routers[0] if routers else None

    def insecure(self) -> None:
        """--insecure-no-host-key-check: do not verify any host key (lab networks you fully control only)."""
        for h in self.hosts.values():
            h.host_key_check = False


def parse_inventory(data: Any, where: str = "inventory") -> Inventory:
    """An inventory given as data (YAML's shape), read by Ansible exactly as a file of it would be."""
    with tempfile.TemporaryDirectory(prefix="tb-inventory-") as d:
        f = Path(d) / "inventory.yml"
        f.write_text(yaml.safe_dump(data), encoding="utf-8")
        return _read(f, where)


def _port(value: Any, at: str) -> int:
    """A TCP port, 1 to 65535 (a larger one overflows the socket call at connect time, after the lab began)."""
    text = str(value).strip()
    if isinstance(value, bool) or not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise InventoryError(f"{at}: ansible_port must be a TCP port from 1 to 65535 (got {value!r})")
    return int(text)


def _workdir_root(value: Any, at: str) -> str:
    """The folder under which every run's work folders go on the host: absolute, below the root (a run's
    teardown removes what it made there), no '..' and no control characters."""
    root = str(value).rstrip("/")
    parts = PurePosixPath(root).parts
    if not root.startswith("/") or len(parts) < 2 or ".." in parts or not root.isprintable():
        raise InventoryError(
            f"{at}: tunnelbench_workdir_root must be an absolute folder below / without '..', e.g. "
            f"{DEFAULT_WORKDIR_ROOT} (got {value!r})"
        )
    return root


def _seconds(value: Any, at: str) -> float:
    try:
        s = float(value)
    except (TypeError, ValueError):
        raise InventoryError(f"{at} must be a number of seconds, e.g. 10 (got {value!r})") from None
    if not 0 < s <= 3600:
        raise InventoryError(f"{at} must be between 0 and 3600 seconds (got {value!r})")
    return s


def _read(path: Path, where: str) -> Inventory:
    from tunnelbench.lab.ansible_inventory import AnsibleInventoryError, host_key_checking_default, read

    try:
        found, _ = read(path)
    except AnsibleInventoryError as e:
        raise InventoryError(f"{where}: {e}") from None
    except RecursionError:
        raise InventoryError(f"{where}: nested too deeply (groups or values inside each other)") from None
    check_default = host_key_checking_default()
    hosts = {h.name: _make_host(h.name, h.vars, h.groups, where, check_default) for h in found}
    inv = Inventory(Path(where), hosts, [h.name for h in found])
    if len(inv.peers()) < 2:
        raise InventoryError(
            f"{where}: needs at least two hosts in a 'peers' group (found {len(inv.peers())})"
        )
    inv.router()  # validates there is at most one
    return inv


# OpenSSH -o options in ansible_ssh_common_args / ansible_ssh_extra_args: the ones that say where and how to
# connect are taken over; connection sharing and keep-alives (OpenSSH's own speed-ups) change nothing here
_SSH_TAKEN = {"port", "user", "identityfile", "userknownhostsfile", "stricthostkeychecking", "connecttimeout"}
_SSH_NO_EFFECT = {
    "controlmaster", "controlpath", "controlpersist", "serveraliveinterval", "serveralivecountmax",
    "compression", "loglevel", "tcpkeepalive", "forwardagent", "identitiesonly",
}  # fmt: skip
_SSH_FLAGS = {"-p": "port", "-l": "user", "-i": "identityfile"}


def ssh_options(args: str, at: str) -> dict[str, str]:
    """The OpenSSH options of Ansible's SSH-argument variables that tunnelbench's runtime (asyncssh) takes
    over, keys lower-cased; the first value of an option wins, as in ssh. Anything that would send the
    connection elsewhere or that asyncssh cannot apply is an error naming it."""
    try:
        words = shlex.split(args)
    except ValueError as e:
        raise InventoryError(f"{at}: cannot split {args!r}: {e}") from None
    found: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word in _SSH_FLAGS and i + 1 < len(words):
            found.setdefault(_SSH_FLAGS[word], words[i + 1])
            i += 2
            continue
        if word == "-o" and i + 1 < len(words):
            option, i = words[i + 1], i + 2
        elif word.startswith("-o") and len(word) > 2:
            option, i = word[2:], i + 1
        elif word in ("-C", "-q", "-v", "-4", "-6"):  # compression, quiet, verbose, address family
            i += 1
            continue
        else:
            raise InventoryError(
                f"{at}: ssh argument {word!r} is not one tunnelbench can apply (it takes -o Port/User/"
                "IdentityFile/UserKnownHostsFile/StrictHostKeyChecking/ConnectTimeout, -p, -l, -i); "
                "remove it or set it for Ansible only"
            )
        key, _, value = option.replace("=", " ", 1).partition(" ")
        key, value = key.strip().lower(), value.strip()
        if key in _SSH_TAKEN:
            found.setdefault(key, value)
        elif key not in _SSH_NO_EFFECT:
            raise InventoryError(
                f"{at}: ssh option {option!r} is not one tunnelbench can apply (a jump host, proxy or "
                "config file would send the connection where tunnelbench does not); remove it or set it "
                "for Ansible only"
            )
    return found


def _make_host(name: str, v: dict[str, Any], groups: set[str], where: str, check_default: bool) -> InvHost:
    at = f"{where}: host {name}"
    connection = str(v.get("ansible_connection", "ssh"))
    if connection not in ("ssh", "smart", "paramiko", "ansible.builtin.ssh", "ansible.builtin.paramiko"):
        raise InventoryError(
            f"{at}: ansible_connection is {connection!r}; tunnelbench reaches every host over SSH "
            "(remove the variable or make it ssh)"
        )
    args = " ".join(str(v[k]) for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args") if v.get(k))
    opts = ssh_options(args, at) if args else {}
    address = str(v.get("ansible_host", name))
    port = _port(v.get("ansible_port", v.get("ansible_ssh_port", opts.get("port", 22))), at)
    check = check_default
    if "stricthostkeychecking" in opts:
        strict = opts["stricthostkeychecking"].lower()
        if strict not in ("yes", "no", "off", "ask", "true", "false"):
            raise InventoryError(
                f"{at}: StrictHostKeyChecking={strict} is not supported (tunnelbench never adds keys to "
                "known_hosts): use yes, or no for lab networks you fully control"
            )
        check = strict in ("yes", "ask", "true")
    for k in ("ansible_host_key_checking", "ansible_ssh_host_key_checking", "tunnelbench_host_key_check"):
        if k in v:
            check = _bool(v[k], f"{at}: {k}")
    key = v.get("ansible_ssh_private_key_file", v.get("ansible_private_key_file", opts.get("identityfile")))
    known = v.get("tunnelbench_known_hosts", opts.get("userknownhostsfile"))
    roles = {role for role, names in ROLE_GROUPS.items() if groups & set(names)}
    if "tunnelbench_role" in v:
        role = str(v["tunnelbench_role"])
        if role not in ROLE_GROUPS:
            raise InventoryError(f"{at}: tunnelbench_role must be one of {sorted(ROLE_GROUPS)}")
        roles.add(role)
    underlay = str(v.get("tunnelbench_underlay_ip", "")) or _resolve(address, at)
    try:
        ipaddress.ip_address(underlay)
    except ValueError:
        raise InventoryError(f"{at}: tunnelbench_underlay_ip {underlay!r} is not an IP address") from None
    impair = v.get("tunnelbench_impair")
    if impair is not None and impair not in ("router", "egress"):
        raise InventoryError(f"{at}: tunnelbench_impair must be 'router' or 'egress'")
    timeout_key = next(
        (k for k in ("tunnelbench_connect_timeout_s", "ansible_ssh_timeout", "ansible_timeout") if k in v),
        None,
    )
    timeout = v[timeout_key] if timeout_key else opts.get("connecttimeout", 10)
    return InvHost(
        name=name,
        address=address,
        port=port,
        user=str(v.get("ansible_user", v.get("ansible_ssh_user", opts.get("user", "root")))),
        key_file=str(Path(str(key)).expanduser()) if key else None,
        known_hosts=str(Path(str(known)).expanduser()) if known else None,
        host_key_check=check,
        underlay_ip=underlay,
        workdir_root=_workdir_root(v.get("tunnelbench_workdir_root", DEFAULT_WORKDIR_ROOT), at),
        connect_timeout_s=_seconds(timeout, f"{at}: {timeout_key or 'ConnectTimeout'}"),
        roles=roles,
        vars=dict(v),
    )


def _resolve(address: str, at: str) -> str:
    try:
        ipaddress.ip_address(address)
        return address
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(address, None, proto=socket.IPPROTO_TCP)[0][4][0])
    except OSError as e:
        raise InventoryError(f"{at}: cannot resolve {address!r} ({e}); set tunnelbench_underlay_ip") from None


def load_inventory(path: Path | str) -> Inventory:
    """Read an Ansible inventory (INI or YAML, host ranges, group_vars/ and host_vars/ beside it) with
    Ansible's own inventory and variable managers, so one file serves both tools."""
    path = Path(path)
    try:  # a FIFO, a device or a huge file is refused before Ansible opens it
        read_text(path, "inventory", TEXT_LIMIT)
    except UserFileError as e:
        raise InventoryError(str(e)) from None
    inv = _read(path, str(path))
    inv.path = path
    # relative key and known_hosts paths are relative to the inventory file, as a user would expect
    for h in inv.hosts.values():
        for attr, var in (
            ("key_file", "ansible_ssh_private_key_file"),
            ("known_hosts", "tunnelbench_known_hosts"),
        ):
            val = getattr(h, attr)
            if val and not Path(val).is_absolute():
                setattr(h, attr, str((path.parent / val).resolve()))
            _small_file(getattr(h, attr), f"{path}: host {h.name}: {var}")
    return inv


def _small_file(path: str | None, at: str) -> None:
    """A key or known_hosts file that exists must be a regular file of at most 64 KiB: the SSH library reads
    it whole, and /dev/zero or a FIFO there would never end (a missing one is the connection's error)."""
    if path and os.path.lexists(path):
        try:
            read_bytes(path, "file", KEY_LIMIT)
        except UserFileError as e:
            raise InventoryError(f"{at}: {e}") from None
