"""Ansible-style YAML inventory of real hosts for the SSH lab.

    all:
      vars:
        ansible_user: root
        ansible_ssh_private_key_file: ~/.ssh/tunnelbench_ed25519
      children:
        peers:                       # VPN peers; the scenario's h1, h2, ... in this order
          hosts:
            edge-a: {ansible_host: 192.0.2.10}
            edge-b: {ansible_host: 192.0.2.11, tunnelbench_underlay_ip: 10.0.0.11}
        routers:                     # optional: the box every underlay packet crosses (impairment, policies)
          hosts:
            wan-box: {ansible_host: 192.0.2.1}

Variables follow Ansible's precedence (host > child group > parent group > all). Understood:
  ansible_host, ansible_port, ansible_user, ansible_ssh_private_key_file,
  ansible_host_key_checking / ansible_ssh_host_key_checking (false = do not check host keys),
  tunnelbench_known_hosts (known_hosts file; default ~/.ssh/known_hosts),
  tunnelbench_underlay_ip (address VPN peers use to reach this host; default ansible_host),
  tunnelbench_workdir_root (default /var/tmp/tunnelbench), tunnelbench_connect_timeout_s (default 10),
  tunnelbench_impair (where impairment goes: "router" or "egress"),
  tunnelbench_bin_dir (where `install --inventory` copies binaries, first on PATH; default /usr/local/bin).
Peers are named h1..hN for the scenario: inventory names already of that form keep their number, any
other names are numbered in file order."""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

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


def _walk(
    name: str,
    group: dict[str, Any] | None,
    inherited: dict[str, Any],
    ancestry: tuple[str, ...],
    hostvars: dict[str, list[tuple[int, dict[str, Any]]]],
    groups_of: dict[str, set[str]],
    order: list[str],
    where: str,
) -> None:
    group = group or {}
    if not isinstance(group, dict):
        raise InventoryError(f"{where}: group {name!r} must be a mapping with hosts/vars/children")
    unknown = set(group) - {"hosts", "vars", "children"}
    if unknown:
        raise InventoryError(f"{where}: group {name!r} has unknown keys {sorted(unknown)}")
    for key in ("hosts", "vars", "children"):  # Ansible's YAML inventory: each a mapping, never a list
        if group.get(key) is not None and not isinstance(group[key], dict):
            example = {
                "hosts": "h1: {ansible_host: 192.0.2.1}",
                "vars": "ansible_user: root",
                "children": "peers: {hosts: ...}",
            }
            raise InventoryError(
                f"{where}: group {name!r}: {key} must be a mapping ({key}:\n  {example[key]}), not a "
                f"{type(group[key]).__name__}"
            )
    gvars = {**inherited, **(group.get("vars") or {})}
    depth = len(ancestry)
    path = (*ancestry, name)
    for hname, hv in (group.get("hosts") or {}).items():
        hname = str(hname)
        if hv is not None and not isinstance(hv, dict):
            raise InventoryError(f"{where}: host {hname!r} in group {name!r}: variables must be a mapping")
        if hname not in hostvars:
            hostvars[hname] = []
            order.append(hname)
        # group vars at this depth, then host vars on top
        hostvars[hname].append((depth, gvars))
        hostvars[hname].append((1000, hv or {}))
        groups_of.setdefault(hname, set()).update(path)
    for cname, child in (group.get("children") or {}).items():
        _walk(str(cname), child, gvars, path, hostvars, groups_of, order, where)


def parse_inventory(data: Any, where: str = "inventory") -> Inventory:
    if not isinstance(data, dict) or "all" not in data:
        raise InventoryError(f"{where}: expected a YAML inventory with a top-level 'all:' group")
    hostvars: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    groups_of: dict[str, set[str]] = {}
    order: list[str] = []
    _walk("all", data["all"], {}, (), hostvars, groups_of, order, where)
    hosts: dict[str, InvHost] = {}
    for hname in order:
        merged: dict[str, Any] = {}
        for _, v in sorted(hostvars[hname], key=lambda x: x[0]):
            merged.update(v)
        hosts[hname] = _make_host(hname, merged, groups_of[hname], where)
    inv = Inventory(None, hosts, order)
    if len(inv.peers()) < 2:
        raise InventoryError(
            f"{where}: needs at least two hosts in a 'peers' group (found {len(inv.peers())})"
        )
    inv.router()  # validates there is at most one
    return inv


def _seconds(value: Any, at: str) -> float:
    try:
        s = float(value)
    except (TypeError, ValueError):
        raise InventoryError(f"{at} must be a number of seconds, e.g. 10 (got {value!r})") from None
    if not 0 < s <= 3600:
        raise InventoryError(f"{at} must be between 0 and 3600 seconds (got {value!r})")
    return s


def _make_host(name: str, v: dict[str, Any], groups: set[str], where: str) -> InvHost:
    at = f"{where}: host {name}"
    address = str(v.get("ansible_host", name))
    try:
        port = int(v.get("ansible_port", v.get("ansible_ssh_port", 22)))
    except (TypeError, ValueError):
        raise InventoryError(f"{at}: ansible_port must be a number") from None
    check = True
    for k in ("ansible_host_key_checking", "ansible_ssh_host_key_checking", "tunnelbench_host_key_check"):
        if k in v:
            check = _bool(v[k], f"{at}: {k}")
    key = v.get("ansible_ssh_private_key_file", v.get("ansible_private_key_file"))
    known = v.get("tunnelbench_known_hosts")
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
    return InvHost(
        name=name,
        address=address,
        port=port,
        user=str(v.get("ansible_user", v.get("ansible_ssh_user", "root"))),
        key_file=str(Path(str(key)).expanduser()) if key else None,
        known_hosts=str(Path(str(known)).expanduser()) if known else None,
        host_key_check=check,
        underlay_ip=underlay,
        workdir_root=str(v.get("tunnelbench_workdir_root", DEFAULT_WORKDIR_ROOT)).rstrip("/"),
        connect_timeout_s=_seconds(
            v.get("tunnelbench_connect_timeout_s", 10), f"{at}: tunnelbench_connect_timeout_s"
        ),
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
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InventoryError(f"cannot read inventory {path}: {e}") from None
    except UnicodeDecodeError as e:
        raise InventoryError(
            f"{path}: not UTF-8 text (byte {e.start}); an inventory is a YAML file"
        ) from None
    except yaml.YAMLError as e:
        raise InventoryError(f"{path}: not valid YAML: {e}") from None
    inv = parse_inventory(data, str(path))
    inv.path = path
    # relative key and known_hosts paths are relative to the inventory file, as a user would expect
    for h in inv.hosts.values():
        for attr in ("key_file", "known_hosts"):
            val = getattr(h, attr)
            if val and not Path(val).is_absolute():
                setattr(h, attr, str((path.parent / val).resolve()))
    return inv
