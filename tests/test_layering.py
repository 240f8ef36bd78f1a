"""`lab/` is the ground floor (DESIGN.md): no module under src/tunnelbench/lab/ imports a room above it.

Every import statement of every lab module is read with `ast` (the ones inside functions too; only those
under `if TYPE_CHECKING:` are exempt: they never run), relative imports resolved, and so are
`importlib.import_module("...")` / `__import__("...")` calls with a literal name. What the lab may import
of tunnelbench: its own modules (tunnelbench.lab.*) and nothing else. The reference is the source text
itself, not anything the product computes."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LAB = SRC / "tunnelbench" / "lab"
# the rooms above the lab, named in the failure; anything else of tunnelbench outside lab/ is refused too
ABOVE = ("vpns", "workloads", "impair", "analysis", "report", "doctor", "runner", "security", "monitor")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, package: str):
    """(line, absolute module name) of every import that can run: TYPE_CHECKING blocks are skipped."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)  # the `else:` of `if TYPE_CHECKING` does run
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                up = parts[: len(parts) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if base == "tunnelbench":  # `from tunnelbench import impair` imports tunnelbench.impair
                for a in node.names:
                    yield node.lineno, f"{base}.{a.name}"
            else:
                yield node.lineno, base
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value
        todo.extend(ast.iter_child_nodes(node))


def violations(source: str, filename: str, package: str = "tunnelbench.lab") -> list[str]:
    """One "file:line: imports module" per import of tunnelbench outside lab/, in line order."""
    found = set()
    for line, mod in _imports(ast.parse(source, filename), package):
        if mod.startswith("tunnelbench.") and mod.split(".")[1] != "lab":
            room = mod.split(".")[1]
            found.add((line, mod + (f" (the {room} room is above the lab)" if room in ABOVE else "")))
    return [f"{filename}:{line}: imports {what}" for line, what in sorted(found)]


def test_lab_imports_nothing_above_it():
    files = sorted(LAB.rglob("*.py"))
    assert len(files) >= 10, files  # the lab is really there
    bad = []
    for f in files:
        package = ".".join(f.relative_to(SRC).parent.parts)
        bad += violations(f.read_text(), str(f.relative_to(SRC.parent)), package)
    assert not bad, "lab/ must not import the rooms above it:\n" + "\n".join(bad)


def test_the_checker_sees_every_form_of_import():
    """The checker itself, on planted sources: each forbidden form is named with its line; the lab's own
    modules, the standard library and TYPE_CHECKING-only imports pass."""
    src = """\
from __future__ import annotations
import json
from typing import TYPE_CHECKING
from tunnelbench.lab.host import Host
from . import journal
if TYPE_CHECKING:
    from tunnelbench.scenario import LabCfg
    from tunnelbench.vpns import DRIVERS
else:
    import tunnelbench.monitor
def f():
    from tunnelbench.impair.backend import make_backend
    import tunnelbench.doctor
    from ..workloads import WORKLOADS
    from tunnelbench import report
    import importlib
    importlib.import_module("tunnelbench.runner")
"""
    got = violations(src, "x.py", "tunnelbench.lab")
    assert got == [
        "x.py:10: imports tunnelbench.monitor (the monitor room is above the lab)",
        "x.py:12: imports tunnelbench.impair.backend (the impair room is above the lab)",
        "x.py:13: imports tunnelbench.doctor (the doctor room is above the lab)",
        "x.py:14: imports tunnelbench.workloads (the workloads room is above the lab)",
        "x.py:15: imports tunnelbench.report (the report room is above the lab)",
        "x.py:17: imports tunnelbench.runner (the runner room is above the lab)",
    ], got


def test_both_labs_declare_every_member_of_the_lab_protocol_and_the_runner_duck_types_neither():
    """The runner and the workloads use a lab only through `Lab` (lab/__init__.py): every member it declares
    exists on NetnsLab and SshLab (read from the protocol's own text), and runner.py holds no getattr/hasattr
    on the lab or a driver. The SSH lab's path policies refuse with LabError instead of being absent."""
    import inspect
    import re

    import pytest

    from tunnelbench.lab import Lab, LabError
    from tunnelbench.lab.journal import Journal
    from tunnelbench.lab.netns import NetnsLab
    from tunnelbench.lab.ssh import SshLab

    text = inspect.getsource(Lab)
    declared = set(re.findall(r"^    (\w+):", text, re.M)) | set(re.findall(r"^    def (\w+)\(", text, re.M))
    assert {"relay", "router", "path_policies", "all_hosts", "mapping", "offlab_destinations"} <= declared
    netns = NetnsLab("tbzz00", 3, Path("/nonexistent"), Journal.__new__(Journal), "relay")
    assert netns.path_policies and netns.relay is netns.hosts[2] and netns.mapping() is None
    ssh = SshLab.__new__(SshLab)
    for name in sorted(declared):
        assert hasattr(netns, name), f"NetnsLab lacks Lab.{name}"
        assert hasattr(SshLab, name) or name in ("tag", "run_dir", "journal", "hosts", "router"), (
            f"SshLab lacks Lab.{name}"
        )
    assert SshLab.path_policies is False and SshLab.relay is None
    with pytest.raises(LabError, match="needs the namespace lab's path policies"):
        ssh.block_udp_between_peers()
    runner = (SRC / "tunnelbench" / "runner.py").read_text()
    duck = re.findall(r"(?:getattr|hasattr)\((?:self\.lab|lab|driver|mesh\.driver)\b", runner)
    assert not duck, duck
