"""The map matches the house: CONTRIBUTING.md's layout describes every room of the floor table (FLOORS) and no
room the table lacks; every file the source, CONTRIBUTING, README and docs/ name by path exists; and no "issue N"
tag sits in src/, where a reader has no tracker to look it up. The reference is the text of those files and the
tree on disk; each checker is also run on a planted tree or text."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from test_layering import FLOORS
from tree import ROOT

LAYOUT_HEAD = "## The layout"
# a bullet of the layout names its rooms before its first colon: "- `store.py`: ...", "- `core/` is ...: ..."
ROOM_NAME = re.compile(r"`(\w+)(?:/|\.py)`")


def described_rooms(contributing: str) -> list[str]:
    """The rooms the layout section's bullets name, in order."""
    section = contributing.split(LAYOUT_HEAD, 1)[1].split("\n## ", 1)[0]
    out: list[str] = []
    for line in section.splitlines():
        if line.startswith("- "):
            out += ROOM_NAME.findall(line.split(":", 1)[0])
    return out


def layout_problems(floors: list[tuple[str, ...]], contributing: str) -> list[str]:
    described = set(described_rooms(contributing))
    bad = [
        f"room {room!r} (floor {i}) is not described in CONTRIBUTING.md's layout: add a bullet naming it"
        for i, rooms in enumerate(floors)
        for room in rooms
        if room not in described
    ]
    rooms = {r for f in floors for r in f}
    bad += [
        f"CONTRIBUTING.md's layout describes {room!r}, which FLOORS (tests/house/test_layering.py) lacks"
        for room in sorted(described - rooms)
    ]
    return bad


def test_contributing_describes_every_room_of_the_floor_table():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert len(described_rooms(text)) >= 20, "the layout's bullets are really read"
    bad = layout_problems(FLOORS, text)
    assert not bad, "\n".join(bad)


def test_the_layout_check_names_a_planted_room_and_a_stale_bullet():
    text = "# x\n\n## The layout\n\n- `core/` is the ground floor: x (`core/metrics.py`).\n- `gone.py`: y\n\n## Next\n"
    assert layout_problems([("core",), ("lab", "sweeps")], text) == [
        "room 'lab' (floor 1) is not described in CONTRIBUTING.md's layout: add a bullet naming it",
        "room 'sweeps' (floor 1) is not described in CONTRIBUTING.md's layout: add a bullet naming it",
        "CONTRIBUTING.md's layout describes 'gone', which FLOORS (tests/house/test_layering.py) lacks",
    ]


# -- files named by path ---------------------------------------------------------------------------------
NAMED_FILE = re.compile(r"(?<![\w./-])((?:[A-Za-z_][\w-]*/)*[A-Za-z_][\w-]*\.(?:py|md))\b")
# files a run or a tool writes, named in the source as outputs: not files of the repository
OUTPUTS = {"report.md", "matrix.md", "tbcrragent.py", "tbleakpeer.py", "tbprobe.py", "tbstreamagent.py"}


def texts(root: Path) -> Iterable[Path]:
    pkg = root / "src" / "tunnelbench"
    yield from sorted(pkg.rglob("*.py"))
    yield from sorted(pkg.rglob("*.toml"))
    yield from (p for p in (root / "CONTRIBUTING.md", root / "README.md") if p.exists())
    yield from sorted((root / "docs").glob("*.md"))


def missing_files(root: Path) -> list[str]:
    """`file: name` for every name of a .py or .md file that resolves nowhere: against the package, src/, the
    repository, tests/, docs/, scripts/ or the naming file's folder; a bare name anywhere in the tree."""
    places = [
        root / "src" / "tunnelbench",
        root / "src",
        root,
        root / "tests",
        root / "docs",
        root / "scripts",
    ]
    everywhere = {
        p.name for d in ("src", "tests", "docs", "scripts", "native") for p in (root / d).rglob("*")
    }
    everywhere |= {p.name for p in root.glob("*")}
    bad = []
    for f in texts(root):
        for name in dict.fromkeys(NAMED_FILE.findall(f.read_text())):
            if name in OUTPUTS or any((d / name).exists() for d in [*places, f.parent]):
                continue
            if "/" not in name and name in everywhere:
                continue
            bad.append(f"{f.relative_to(root)}: {name}")
    return bad


def test_every_file_named_by_path_exists():
    bad = missing_files(ROOT)
    assert not bad, "names of files the repository does not have:\n" + "\n".join(bad)


def test_the_file_check_names_a_planted_stale_path(tmp_path):
    (tmp_path / "src" / "tunnelbench" / "lab").mkdir(parents=True)
    (tmp_path / "src" / "tunnelbench" / "lab" / "netns.py").write_text('"""Paths: see lab/netns.py."""\n')
    (tmp_path / "src" / "tunnelbench" / "vpns.py").write_text(
        "# the path scenario (lab/paths.py), the rooms (DESIGN.md), the report (report.md)\n"
    )
    assert missing_files(tmp_path) == [
        "src/tunnelbench/vpns.py: lab/paths.py",
        "src/tunnelbench/vpns.py: DESIGN.md",
    ]


# -- issue tags ------------------------------------------------------------------------------------------
ISSUE_TAG = re.compile(r"\bissues? #?\d+", re.I)


def issue_tags(src: Path) -> list[str]:
    """`file:line: text` for every "issue N" in the package's source and scenario files."""
    out = []
    for f in sorted([*src.rglob("*.py"), *src.rglob("*.toml")]):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if ISSUE_TAG.search(line):
                out.append(f"{f.relative_to(src.parent)}:{n}: {line.strip()}")
    return out


def test_no_issue_tags_in_the_source():
    """A docstring or comment says what a thing is or why, not which tracker entry asked for it."""
    bad = issue_tags(ROOT / "src" / "tunnelbench")
    assert not bad, "say what the tag means instead:\n" + "\n".join(bad)


def test_the_tag_check_names_a_planted_tag(tmp_path):
    pkg = tmp_path / "tunnelbench"
    pkg.mkdir()
    (pkg / "natmatrix.py").write_text('"""The NAT matrix (Issue 19 item 1): cells."""\n# issues are not #5\n')
    (pkg / "s.toml").write_text("# issue #14: the security suite\n")
    assert issue_tags(pkg) == [
        'tunnelbench/natmatrix.py:1: """The NAT matrix (Issue 19 item 1): cells."""',
        "tunnelbench/s.toml:1: # issue #14: the security suite",
    ]
