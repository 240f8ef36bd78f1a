"""What a test session must not leave behind (scripts/test's lanes check it at the end of the session): lab
namespaces (the product's tag prefix), run registrations (clean's list), and processes that live in a
network namespace other than this machine's own (a VPN daemon outliving its lab)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tunnelbench.lab.journal import REGISTRY
from tunnelbench.lab.tags import TAG_PREFIX

LAB_NETNS = re.compile(rf"^{TAG_PREFIX}[0-9a-f]{{4}}-")


def lab_state() -> dict[str, set[str]]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    own = os.stat("/proc/self/ns/net").st_ino  # the session runs in the machine's own
    procs = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.stat(d / "ns" / "net").st_ino != own:
                    cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                    procs.add(f"{d.name}: {cmd[:120]}")
            except OSError:
                continue
    return {
        "namespaces": {n.split()[0] for n in names if n and LAB_NETNS.match(n)},
        "registrations": {p.name for p in REGISTRY.iterdir()} if REGISTRY.is_dir() else set(),
        "processes in another network namespace": procs,
    }


def left_behind(before: dict[str, set[str]], after: dict[str, set[str]]) -> dict[str, list[str]]:
    """What `after` has that `before` had not, per kind (empty: nothing left)."""
    return {k: sorted(after[k] - before.get(k, set())) for k in after if after[k] - before.get(k, set())}
