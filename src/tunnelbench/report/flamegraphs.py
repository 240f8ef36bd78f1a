"""Flame graphs of a run taken with `run --flamegraph`: for each VPN x profile x workload, the folded CPU
profiles of its successful cases (diagnostics/cpuprofile.py) summed and drawn by `inferno-flamegraph` into
`<run>/flamegraphs/<vpn>.<profile>.<label>.svg`. The report embeds them; rendering again overwrites."""

from __future__ import annotations

import base64
import re
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tunnelbench.analysis.analyze import Analysis, RunData
from tunnelbench.diagnostics.cpuprofile import FOLDED, PERF_HZ, parse_folded, tool, write_folded
from tunnelbench.store import CaseRow

FOLDER = "flamegraphs"


@dataclass
class FlameGraph:
    run_id: str
    variant: str
    profile: str
    label: str
    cases: int  # successful cases whose profiles were summed
    samples: int
    svg: Path | None  # None: inferno-flamegraph is missing (why says so)
    folded: Path
    why: str = ""

    def data_uri(self) -> str:
        if self.svg is None:
            return ""
        return "data:image/svg+xml;base64," + base64.b64encode(self.svg.read_bytes()).decode()


def case_dir(r: RunData, c: CaseRow) -> Path | None:
    """A case's artifact folder, also when the run folder moved or the path was stored relative to another
    working directory (it is always <run>/cases/...)."""
    if not c.artifact_dir or c.artifact_dir in ("", "."):
        return None
    p = Path(c.artifact_dir)
    if p.is_dir():
        return p
    parts = p.parts
    if "cases" in parts:
        alt = r.run_dir.joinpath(*parts[parts.index("cases") :])
        if alt.is_dir():
            return alt
    return None


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", s)


def render(r: RunData, variant_of: dict[tuple[str, str], str]) -> list[FlameGraph]:
    groups: dict[tuple[str, str, str], tuple[Counter[str], int]] = {}
    for c in r.cases:
        d = case_dir(r, c) if c.status == "ok" else None
        if d is None or not (d / FOLDED).is_file():
            continue
        key = (variant_of.get((r.run_id, c.vpn), c.vpn), c.profile, c.label)
        stacks, n = groups.get(key, (Counter(), 0))
        stacks.update(parse_folded((d / FOLDED).read_text()))
        groups[key] = (stacks, n + 1)
    if not groups:
        return []
    out_dir = r.run_dir / FOLDER
    out_dir.mkdir(exist_ok=True)
    draw = tool("inferno-flamegraph")
    out = []
    for (variant, profile, label), (stacks, n) in sorted(groups.items()):
        stem = _slug(f"{variant}.{profile}.{label}")
        folded = out_dir / f"{stem}.folded"
        write_folded(stacks, folded)
        samples = sum(stacks.values())
        fg = FlameGraph(r.run_id, variant, profile, label, n, samples, None, folded)
        if draw is None:
            fg.why = "inferno-flamegraph is not installed (scripts/setup.sh builds it)"
        elif samples == 0:
            fg.why = "no samples (the daemons did not run on a CPU while perf watched)"
        else:
            title = f"{variant} · {label} · {profile}: {n} case(s), {samples} samples at {PERF_HZ} Hz"
            try:
                res = subprocess.run([draw, "--title", title, "--countname", "samples", "--width", "1100",
                                      str(folded)], capture_output=True, text=True, timeout=120)  # fmt: skip
            except (OSError, subprocess.TimeoutExpired) as e:
                fg.why = f"inferno-flamegraph failed: {e}"
            else:
                if res.returncode == 0:
                    svg = out_dir / f"{stem}.svg"
                    svg.write_text(res.stdout)
                    fg.svg = svg
                else:
                    fg.why = f"inferno-flamegraph failed: {res.stderr.strip()[-200:]}"
        out.append(fg)
    return out


def render_all(a: Analysis) -> list[FlameGraph]:
    return [fg for r in a.runs for fg in render(r, a.variant_of)]
