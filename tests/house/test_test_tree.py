"""The tests mirror the rooms (docs/testing.md): every test file sits in the folder of the product room its
subject lives in (or `house/`, the repository's own rules), its name unique across folders, and every folder is
on pytest's path (pyproject's `pythonpath`), since a test imports another's helpers by module name."""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path

from test_layering import FLOORS
from tree import ROOT, TESTS


def folders(tests: Path = TESTS) -> list[str]:
    """Every folder of tests/ holding test files, by name."""
    return sorted(d.name for d in tests.iterdir() if d.is_dir() and any(d.glob("test_*.py")))


def tree_problems(tests: Path, pythonpath: list[str]) -> list[str]:
    rooms = {r for floor in FLOORS for r in floor} | {"house"}
    bad = [f"tests/{f.name}: a test file outside a room's folder" for f in sorted(tests.glob("test_*.py"))]
    for d in folders(tests):
        if d not in rooms:
            bad.append(
                f"tests/{d}/: not a room of the product (tests/house/test_layering.py FLOORS) nor house"
            )
        if f"tests/{d}" not in pythonpath:
            bad.append(f"tests/{d}/: not on pytest's path: add it to pythonpath in pyproject.toml")
    names = Counter(f.name for f in tests.glob("*/test_*.py"))
    bad += [
        f"{n}: {k} test files of this name (pytest imports them by name)" for n, k in names.items() if k > 1
    ]
    return bad


def _pythonpath() -> list[str]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(cfg["tool"]["pytest"]["ini_options"]["pythonpath"])


def test_every_test_sits_in_its_rooms_folder_on_the_path() -> None:
    assert len(folders()) >= 15
    bad = tree_problems(TESTS, _pythonpath())
    assert not bad, "\n".join(bad)


def test_a_stray_file_an_unknown_folder_and_a_missing_path_are_named(tmp_path: Path) -> None:
    for rel in ("test_loose.py", "lab/test_a.py", "vpns/test_a.py", "widgets/test_b.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    bad = tree_problems(tmp_path, ["tests/lab", "tests/vpns"])
    assert bad == [
        "tests/test_loose.py: a test file outside a room's folder",
        "tests/widgets/: not a room of the product (tests/house/test_layering.py FLOORS) nor house",
        "tests/widgets/: not on pytest's path: add it to pythonpath in pyproject.toml",
        "test_a.py: 2 test files of this name (pytest imports them by name)",
    ]
