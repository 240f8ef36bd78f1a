"""The house's floors (CONTRIBUTING.md, "The layout"): every room imports only rooms below it, and no import circle exists anywhere.

Every import statement of every module under src/tunnelbench/ is read with `ast`: inside functions too, under
`if TYPE_CHECKING:` too (a circle that only the type checker walks is still a circle a reader walks), relative
imports resolved, and `importlib.import_module("...")` / `__import__("...")` with a literal name. `from P import
N` is an import of the submodule P.N when that file exists, else of P. The reference is the source text itself,
not anything the product computes."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tree import SRC

PKG = SRC / "tunnelbench"

# The floors, lowest first: a room (a folder under tunnelbench/, or a top-level module) imports only rooms on
# lower floors (and itself). Rooms on one floor do not import each other. `tunnelbench` itself
# (__init__.py: the version) is below everything.
FLOORS: list[tuple[str, ...]] = [
    ("core",),  # the results model and the metric registry; imports nothing of the product
    ("lab",),  # hosts, topology, process supervision, teardown, the lab's spec
    ("case_metrics", "monitor", "store", "diagnostics", "environment", "instruments"),
    ("impair",),  # WAN impairment: profiles, backends, calibration (ping's parser is an instrument)
    ("vpns",),  # one driver per VPN, the Mesh a workload gets
    ("kube",),  # the Kubernetes build and a cluster on top of a VPN's mesh (its workloads are workloads')
    ("workloads",),  # one file per workload
    ("catalog",),  # the only module that imports every driver and workload
    ("analysis", "scenario"),
    ("report", "plan", "builds"),  # builds: the built tools (hey, quicperf, inferno) on first use
    ("security", "sweeps", "doctor", "suite"),  # suite: a plan of runs, merged; sweeps: labs of their own
    ("runner", "interactive"),
    ("cli",),
]


def floor_of(room: str) -> int:
    if room == "tunnelbench":
        return -1
    for i, rooms in enumerate(FLOORS):
        if room in rooms:
            return i
    raise KeyError(room)


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def modules(src: Path = SRC) -> dict[str, Path]:
    """Every module under src/tunnelbench by its dotted name (a package by its own name)."""
    out = {}
    for f in sorted((src / "tunnelbench").rglob("*.py")):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import of tunnelbench in the tree, TYPE_CHECKING blocks included."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            names = subs + ([base] if len(subs) < len(node.names) else [])
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        for n in names:
            if n == "tunnelbench" or n.startswith("tunnelbench."):
                while (
                    n not in known and "." in n
                ):  # `import tunnelbench.lab.host.X` -> the module that exists
                    n = n.rpartition(".")[0]
                if n != module:
                    yield node.lineno, n


def graph(src: Path = SRC) -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}."""
    mods = modules(src)
    known = set(mods)
    g: dict[str, dict[str, int]] = {}
    for m, f in mods.items():
        edges: dict[str, int] = {}
        for line, target in imports(ast.parse(f.read_text(), str(f)), m, f.name == "__init__.py", known):
            edges.setdefault(target, line)
        g[m] = edges
    return g


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted; a self-import too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def cycle_report(g: dict[str, dict[str, int]]) -> list[str]:
    out = []
    for comp in cycles(g):
        inside = set(comp)
        out.append(f"an import circle of {len(comp)} modules:")
        out += [f"  {a} -> {b} (line {g[a][b]})" for a in comp for b in sorted(g[a]) if b in inside]
    return out


def floor_violations(g: dict[str, dict[str, int]]) -> list[str]:
    """One line per import of a room on the same or a higher floor, and per module of an undeclared room."""
    bad = []
    for m, edges in sorted(g.items()):
        room = room_of(m)
        try:
            mine = floor_of(room)
        except KeyError:
            bad.append(f"{m}: room {room!r} has no floor: add it to FLOORS in tests/house/test_layering.py")
            continue
        for target, line in sorted(edges.items()):
            other = room_of(target)
            if other == room:
                continue
            theirs = floor_of(other) if other in {r for f in FLOORS for r in f} | {"tunnelbench"} else 99
            if theirs >= mine:
                where = "the same floor as" if theirs == mine else "above"
                bad.append(f"{m} (line {line}) imports {target}: the {other} room is {where} the {room} room")
    return bad


def test_no_import_circle_anywhere():
    g = graph()
    assert len(g) > 100 and sum(len(e) for e in g.values()) > 300, "the graph is really read"
    report = cycle_report(g)
    assert not report, "\n".join(report)


def test_every_room_imports_only_rooms_below_it():
    bad = floor_violations(graph())
    assert not bad, "imports that go up or sideways:\n" + "\n".join(bad)


def test_core_imports_nothing_of_the_product_and_packages_hold_no_imports():
    """core/ is the ground floor; a package's __init__ imports none of its children (the circle this house had:
    the registries in vpns/__init__ and workloads/__init__ imported every plugin, and each plugin its package)."""
    g = graph()
    assert all(room_of(t) == "core" for m, e in g.items() if room_of(m) == "core" for t in e), g[
        "tunnelbench.core"
    ]
    for m, f in modules().items():
        if f.name == "__init__.py":
            assert not g[m], f"{f.relative_to(SRC)} imports {sorted(g[m])}"


def _tree(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp / "tunnelbench" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp


def test_the_checkers_see_a_planted_back_import_and_a_planted_circle(tmp_path):
    """On a planted tree: a lab module importing the runner under TYPE_CHECKING, inside a function, is a floor
    violation; core importing lab is one too; a two-module circle through a package __init__ is named with
    both edges and their lines; every import form (relative, `from tunnelbench import X`, import_module)."""
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/metrics.py": "from tunnelbench.lab import host\n",
            "lab/__init__.py": "from . import host\n",
            "lab/host.py": (
                "from typing import TYPE_CHECKING\n"
                "import tunnelbench.lab\n"
                "if TYPE_CHECKING:\n"
                "    from tunnelbench.runner import Runner\n"
                "def f():\n"
                "    import importlib\n"
                "    importlib.import_module('tunnelbench.cli')\n"
                "    from tunnelbench import vpns\n"
            ),
            "runner.py": "",
            "cli.py": "from .runner import f\n",
            "vpns/__init__.py": "",
        },
    )
    g = graph(src)
    assert g["tunnelbench.lab.host"] == {
        "tunnelbench.lab": 2,
        "tunnelbench.runner": 4,
        "tunnelbench.cli": 7,
        "tunnelbench.vpns": 8,
    }, g
    assert g["tunnelbench.cli"] == {"tunnelbench.runner": 1}
    assert cycle_report(g) == [
        "an import circle of 2 modules:",
        "  tunnelbench.lab -> tunnelbench.lab.host (line 1)",
        "  tunnelbench.lab.host -> tunnelbench.lab (line 2)",
    ]
    bad = floor_violations(g)
    assert bad == [
        "tunnelbench.core.metrics (line 1) imports tunnelbench.lab.host: the lab room is above the core room",
        "tunnelbench.lab.host (line 7) imports tunnelbench.cli: the cli room is above the lab room",
        "tunnelbench.lab.host (line 4) imports tunnelbench.runner: the runner room is above the lab room",
        "tunnelbench.lab.host (line 8) imports tunnelbench.vpns: the vpns room is above the lab room",
    ], bad


def test_both_labs_declare_every_member_of_the_lab_protocol_and_the_runner_duck_types_neither():
    """The runner and the workloads use a lab only through `Lab` (lab/base.py): every member it declares
    exists on NetnsLab and SshLab (read from the protocol's own text), and the runner's modules hold no getattr/hasattr
    on the lab or a driver. The SSH lab's path policies refuse with LabError instead of being absent."""
    import inspect
    import re

    import pytest

    from tunnelbench.lab.base import Lab, LabError
    from tunnelbench.lab.journal import Journal
    from tunnelbench.lab.netns import NetnsLab
    from tunnelbench.lab.ssh_lab import SshLab

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
    runner = "".join(f.read_text() for f in sorted((SRC / "tunnelbench" / "runner").glob("*.py")))
    duck = re.findall(r"(?:getattr|hasattr)\((?:self\.lab|lab|driver|mesh\.driver)\b", runner)
    assert not duck, duck


def lab_constructions(src: Path = SRC) -> list[str]:
    """Where a lab is made: every call of NetnsLab(...) or SshLab(...) in the source, as `module:line`."""
    found = []
    for mod, path in modules(src).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in ("NetnsLab", "SshLab"):
                    found.append(f"{mod}:{node.lineno}")
    return found


def test_one_place_makes_a_lab(tmp_path):
    """Every lab is made by lab/make.py's make_lab (the run, up/down, and lab_session for sweeps, calibrate and
    bench-engine); a module that builds a NetnsLab of its own is named. Checked on a planted tree too."""
    assert {x.split(":")[0] for x in lab_constructions()} == {"tunnelbench.lab.make"}, lab_constructions()
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "lab/__init__.py": "",
            "lab/make.py": "def make_lab():\n    return NetnsLab(1)\n",
            "natmatrix.py": "from tunnelbench.lab import netns\n\nlab = netns.NetnsLab('t', 3)\n",
        },
    )
    assert lab_constructions(src) == ["tunnelbench.lab.make:2", "tunnelbench.natmatrix:3"]


def mesh_constructions(src: Path = SRC) -> list[str]:
    """Where a mesh is made: every call of Mesh(...) or MeshSpec(...) in the source, as `module:line` (a driver
    is built from a MeshSpec, and a workload gets a Mesh)."""
    found = []
    for mod, path in modules(src).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in ("Mesh", "MeshSpec"):
                    found.append(f"{mod}:{node.lineno}")
    return found


def test_one_place_makes_a_mesh(tmp_path):
    """Every mesh is made by vpns/session.py's make_mesh (the run and `up` call it, mesh_session wraps it for
    mesh-scale, nat-matrix and bench-engine), with the one merge of vpn_options; a module that builds a
    MeshSpec or a Mesh of its own is named. Checked on a planted tree too."""
    assert {x.split(":")[0] for x in mesh_constructions()} == {"tunnelbench.vpns.session"}, (
        mesh_constructions()
    )
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "vpns/__init__.py": "",
            "vpns/session.py": "def make_mesh(cls, lab):\n    return Mesh(cls(MeshSpec(lab.hosts)))\n",
            "natmatrix.py": (
                "from tunnelbench.vpns import mesh\n\n"
                "def cell(cls, lab):\n    return mesh.Mesh(cls(MeshSpec(hosts=lab.hosts)))\n"
            ),
        },
    )
    assert mesh_constructions(src) == [
        "tunnelbench.natmatrix:4",
        "tunnelbench.natmatrix:4",
        "tunnelbench.vpns.session:2",
        "tunnelbench.vpns.session:2",
    ]
