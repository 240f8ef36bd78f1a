"""An inventory read by Ansible itself: its INI and YAML inventory plugins (host ranges included) and its
variable manager (group_vars/ and host_vars/ beside the file, Ansible's precedence).

An inventory is code to Ansible: an executable file is run (the 'script' plugin), a YAML file naming a plugin
loads it ('auto'), and a value such as "{{ lookup('pipe', CMD) }}" runs CMD when it is templated. So only
the two plugins the product documents are enabled, here and in every Ansible process it starts
(`ansible_env`), and values are read as written: one Ansible would template is refused, naming the host and
the variable, never rendered.

Ansible is imported here only, on first use (it costs ~1 s), and what it prints is collected instead: a
source no plugin could parse becomes one error naming the plugin that fits the file and its reason."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class AnsibleInventoryError(ValueError):
    pass


# Ansible's default list adds 'script' (runs an executable file), 'auto' (loads whatever plugin a YAML file
# names: 'constructed' templates), 'host_list' and 'toml'
ENABLED_PLUGINS = ("ini", "yaml")


def ansible_env() -> dict[str, str]:
    """The environment of an Ansible process the product starts: the same plugins, and a source none of
    them parses is an error (Ansible's default goes on with an empty inventory)."""
    return {
        "ANSIBLE_INVENTORY_ENABLED": ",".join(ENABLED_PLUGINS),
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
    }


@contextlib.contextmanager
def _documented_plugins_only() -> Iterator[None]:
    """Ansible reads its configuration into module constants once, at import; the manager looks this one
    up on every parse."""
    from ansible import constants

    saved = constants.INVENTORY_ENABLED
    constants.INVENTORY_ENABLED = list(ENABLED_PLUGINS)
    try:
        yield
    finally:
        constants.INVENTORY_ENABLED = saved


def _refuse_script(path: Path) -> None:
    """A file starting with #! is an inventory script: Ansible's default runs it, the ini plugin would
    fail on it with a line number; say what it is."""
    try:
        with path.open("rb") as f:
            script = f.read(2) == b"#!"
    except OSError:
        return  # Ansible names an unreadable source
    if script:
        raise AnsibleInventoryError(
            "an executable inventory (a script, it starts with #!) is never run by tunnelbench: only "
            f"Ansible's {' and '.join(p.upper() for p in ENABLED_PLUGINS)} inventory plugins are enabled; give an INI or "
            "YAML file (e.g. the hosts and variables the script prints, written as YAML)"
        )


def _native(value: Any) -> Any:
    """Ansible's tagged containers and strings as plain Python values."""
    if isinstance(value, bool | int | float) or value is None:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {_native(k): _native(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_native(v) for v in value]
    return value


@dataclass
class AnsibleHost:
    name: str
    vars: dict[str, Any]  # the inventory's ansible_* and tunnelbench_* variables, as written
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

    if path.is_file():
        _refuse_script(path)
    source = str(path.resolve())  # Ansible records the sources it parsed by absolute path
    notes: list[tuple[str, str]] = []
    with _collected_warnings(notes), _documented_plugins_only():
        loader = DataLoader()
        try:
            inventory = InventoryManager(loader=loader, sources=[source])
        except AnsibleError as e:
            raise AnsibleInventoryError(str(e).splitlines()[0]) from None
        # the sources a plugin parsed (a private list: the manager only warns about the others)
        if source not in inventory._inventory.processed_sources:
            raise AnsibleInventoryError(_failure(path, notes))
        manager = VariableManager(loader=loader, inventory=inventory)
        templar = Templar(loader=loader)
        hosts = []
        for host in inventory.get_hosts():
            every = manager.get_vars(host=host, include_hostvars=False)  # as written: nothing templated
            values: dict[str, Any] = {}
            for key in filter(_wanted, every):
                if templar.is_template(every[key]):  # Ansible's own test (a !unsafe value is not one)
                    raise AnsibleInventoryError(
                        f"host {host.name}: {key} is an Ansible template ({every[key]!r}): tunnelbench reads "
                        "inventory values as written and never renders one (a template can run commands on "
                        "this machine); write the value itself"
                    )
                values[key] = _native(every[key])
            hosts.append(AnsibleHost(str(host.name), values, {str(g.name) for g in host.get_groups()}))
    return hosts, [m for m, c in notes if not c]


def host_key_checking_default() -> bool:
    """Ansible's own setting (ansible.cfg's host_key_checking, ANSIBLE_HOST_KEY_CHECKING): the default
    for hosts whose inventory variables do not say."""
    from ansible import constants

    return bool(constants.config.get_config_value("HOST_KEY_CHECKING"))
