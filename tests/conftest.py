from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# the strict-skip guard's hooks (tests/skipguard.py)
from skipguard import (  # noqa: F401
    pytest_collectreport,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

from tunnelbench.lab import tools
from tunnelbench.lab.journal import Journal
from tunnelbench.lab.netns import NetnsLab
from tunnelbench.lab.tags import new_run_id, new_tag

LAB_TOOLS = tools.LAB_TOOLS  # one list: lab/tools.py


def emulated_cpu() -> bool:
    """True under QEMU's TCG (the full-kernel lane on a machine without usable KVM): every instruction is
    emulated, so timers fire late; timing tolerances get an explicit allowance there, nothing else does."""
    try:
        return "QEMU TCG" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def lab_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    missing = [t for t in LAB_TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing tools: {', '.join(missing)}"
    return None


@pytest.fixture
def lab_factory(tmp_path: Path):
    why = lab_missing()
    if why:
        pytest.skip(why)
    made: list[NetnsLab] = []

    def make(n_hosts: int = 3, path: str = "direct", relay: str | None = None,
             nat_type: str = "port-restricted", nat_types: dict[str, str] | None = None) -> NetnsLab:  # fmt: skip
        tag = new_tag()
        run_dir = tmp_path / new_run_id(tag)
        journal = Journal(run_dir, run_dir.name)
        lab = NetnsLab(tag, n_hosts, run_dir, journal, path, relay, nat_type, nat_types)
        made.append(lab)
        lab.build()
        lab.wait_links()
        return lab

    yield make
    for lab in made:
        lab.destroy()
        lab.journal.end()
