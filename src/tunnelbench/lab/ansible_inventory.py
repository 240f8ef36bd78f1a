"""An inventory read by Ansible itself: its inventory plugins (INI, YAML, host ranges, scripts), its
variable manager (group_vars/ and host_vars/ beside the file, Ansible's precedence) and its templating.

Ansible is imported here only, on first use (it costs ~1 s), and what it prints is collected instead: a
source no plugin could parse becomes one error naming the plugin that fits the file and its reason."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class AnsibleInventoryError(ValueError):
    pass


@dataclass
class AnsibleHost:
    name: str
    vars: dict[str, Any]  # the inventory's ansible_* and tunnelbench_* variables, templated
    groups: set[str]  # every group the host is in, parents included


def _wanted(key: str) -> bool:
    return key.startswith(("ansible_", "tunnelbench_")) and key not in _MAGIC


# variables Ansible sets itself for every host (not the inventory's)
_MAGIC = {
    "ansible_version", "ansible_playbook_python", "ansible_config_file", "ansible_facts", "ansible_check_mode",
    "ansible_diff_mode", "ansible_forks", "ansible_inventory_sources", "ansible_verbosity", "ansible_run_tags",
    "ansible_skip_tags", "ansible_dependent_role_names", "ansible_role_names", "ansible_play_role_names",
    "ansible_play_hosts", "ansible_play_hosts_all", "ansible_play_batch", "ansible_limit", "ansible_search_path",
}  # fmt: skip


@contextlib.contextmanager
def _collected_warnings(into: list[tuple[str, str]]) -> Iterator[None]:
    """Ansible's display prints plugin failures to stderr; keep them (message, cause) for our one error."""
    from ansible.utils.display import Display

    display = Display()
    saved = display.error_as_warning, display.warning

    def error_as_warning(msg: str | None, exception: BaseException, *a: Any, **k: Any) -> None:
        into.append((str(msg or ""), str(exception).strip()))

    def warning(msg: str, *a: Any, **k: Any) -> None:
        into.append((str(msg), ""))

    display.error_as_warning, display.warning = error_as_warning, warning
    try:
        yield
    finally:
        display.error_as_warning, display.warning = saved


def _plain(text: str) -> str:
    """Ansible 2.19 names its tagged containers in messages ("<class '..._AnsibleTaggedList'>"): say 'a list'."""
    return re.sub(
        r"\"?<class '(?:[\w.]*\.)?_?(?:AnsibleTagged)?(\w+)'>\"?", lambda m: f"a {m[1].lower()}", text
    )


def _failure(path: Path, notes: list[tuple[str, str]]) -> str:
    """The parse failure of the plugin this file was meant for: YAML's if it is a YAML mapping, else INI's."""
    try:
        mapping = isinstance(yaml.safe_load(path.read_text(encoding="utf-8")), dict)
    except (OSError, ValueError, yaml.YAMLError):
        mapping = False
    fits = "'yaml'" if mapping else "'ini'"
    for msg, cause in notes:
        if fits in msg and cause:
            return f"Ansible's {fits.strip(chr(39))} inventory plugin: {_plain(cause.splitlines()[0])}"
    causes = [_plain(f"{m} {c.splitlines()[0] if c else ''}".strip()) for m, c in notes]
    return "; ".join(causes) or "no inventory plugin could read it"


def read(path: Path) -> tuple[list[AnsibleHost], list[str]]:
    """The hosts of an inventory file in Ansible's order, and its warnings that were not failures."""
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    source = str(path.resolve())  # Ansible records the sources it parsed by absolute path
    notes: list[tuple[str, str]] = []
    with _collected_warnings(notes):
        loader = DataLoader()
        try:
            inventory = InventoryManager(loader=loader, sources=[source])
        except AnsibleError as e:
            raise AnsibleInventoryError(str(e).splitlines()[0]) from None
        # the sources a plugin parsed (a private list: the manager only warns about the others)
        if source not in inventory._inventory.processed_sources:
            raise AnsibleInventoryError(_failure(path, notes))
        manager = VariableManager(loader=loader, inventory=inventory)
        hosts = []
        for host in inventory.get_hosts():
            every = manager.get_vars(host=host, include_hostvars=False)
            templar = Templar(loader=loader, variables=every)
            values: dict[str, Any] = {}
            for key in filter(_wanted, every):
                try:
                    values[key] = templar.template(every[key])
                except AnsibleError as e:
                    first = str(e).splitlines()[0]
                    raise AnsibleInventoryError(f"host {host.name}: {key}: {first}") from None
            hosts.append(AnsibleHost(str(host.name), values, {str(g.name) for g in host.get_groups()}))
    return hosts, [m for m, c in notes if not c]


def host_key_checking_default() -> bool:
    """Ansible's own setting (ansible.cfg's host_key_checking, ANSIBLE_HOST_KEY_CHECKING): the default
    for hosts whose inventory variables do not say."""
    from ansible import constants

    return bool(constants.config.get_config_value("HOST_KEY_CHECKING"))
