"""Inventory values checked where they are read (lab/inventory.py), each against hand-written bounds: a TCP
port from 1 to 65535 (99999 overflowed the socket call once the lab had begun), a work folder that is absolute
and below / (a run's teardown removes what it made there), and a key or known_hosts file that is a small
regular file (the SSH library reads it whole: /dev/zero never ends)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tunnelbench.lab.inventory import InventoryError, load_inventory


def inventory(tmp_path: Path, h1: str) -> Path:
    f = tmp_path / "inv.yml"
    f.write_text(
        "all:\n  children:\n    peers:\n      hosts:\n"
        f"        h1: {{ansible_host: 192.0.2.1, {h1}}}\n        h2: {{ansible_host: 192.0.2.2}}\n"
    )
    return f


@pytest.mark.parametrize("port, ok", [(1, True), (65535, True), ("2222", True), (0, False), (65536, False)])
def test_a_port_is_1_to_65535(tmp_path, port, ok):
    f = inventory(tmp_path, f"ansible_port: {port!r}")
    if ok:
        assert load_inventory(f).hosts["h1"].port == int(port)
    else:
        with pytest.raises(
            InventoryError, match=rf"host h1: ansible_port must be a TCP port from 1 to 65535 \(got {port}\)"
        ):
            load_inventory(f)


@pytest.mark.parametrize(
    "root, kept",
    [("/srv/tb/", "/srv/tb"), ("/var/tmp/tunnelbench", "/var/tmp/tunnelbench"), ("/", None), ("srv", None),
     ("/srv/../", None), ("/srv/a\tb", None)],
)  # fmt: skip
def test_a_work_folder_is_absolute_and_below_the_root(tmp_path, root, kept):
    f = inventory(tmp_path, f"tunnelbench_workdir_root: {json.dumps(root)}")
    if kept:
        assert load_inventory(f).hosts["h1"].workdir_root == kept
    else:
        with pytest.raises(
            InventoryError, match=r"host h1: tunnelbench_workdir_root must be an absolute folder"
        ):
            load_inventory(f)


def test_a_key_file_is_a_small_regular_file(tmp_path):
    key = tmp_path / "id"
    key.write_bytes(b"k" * (64 << 10))  # 64 KiB: the most read
    assert load_inventory(inventory(tmp_path, "ansible_ssh_private_key_file: id")).hosts[
        "h1"
    ].key_file == str(key)
    key.write_bytes(b"k" * ((64 << 10) + 1))
    with pytest.raises(
        InventoryError, match=r"ansible_ssh_private_key_file: file .*/id is larger than 64 KiB"
    ):
        load_inventory(inventory(tmp_path, "ansible_ssh_private_key_file: id"))
    key.unlink()
    os.mkfifo(key)  # read whole, a FIFO would wait for a writer forever
    with pytest.raises(InventoryError, match=r"file .*/id is a named pipe \(FIFO\)"):
        load_inventory(inventory(tmp_path, "ansible_ssh_private_key_file: id"))
    with pytest.raises(InventoryError, match=r"tunnelbench_known_hosts: file /dev/zero is a device"):
        load_inventory(inventory(tmp_path, "tunnelbench_known_hosts: /dev/zero"))
