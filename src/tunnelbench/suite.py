"""Suites: one command for checks that each need their own lab (`tunnelbench run security`).

A suite file is a scenario file whose top level is `name`, `description` and `suite = [PART, ...]`, each part a
built-in scenario name or a scenario file (relative to the suite file). `tunnelbench run SUITE` runs every part
as its own run (its own folder, report and store: a part's lab, e.g. the relay path, differs from another's),
then prints one matrix merged from the parts' Security rows and writes it next to them.

`--vpn` applies to every part, narrowed to the VPNs that can take the part's check: an `acl` part runs only
drivers with access control, a `revoke` part only drivers with a revocation action, a relay/NAT part only
drivers with that path. The others are not run there; the matrix says "not supported" for them from the
driver class, as a single run's Security table does."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tunnelbench.analysis.analyze import RunData
from tunnelbench.catalog import DRIVERS
from tunnelbench.core.files import write_atomic
from tunnelbench.core.userfile import UserFileError, parse_toml, read_text
from tunnelbench.report.fmt import code, md
from tunnelbench.report.security import COLUMNS, NOT_RUN, NOT_SUPPORTED, security_rows, tone
from tunnelbench.scenario import (
    Scenario,
    ScenarioError,
    builtin_scenarios,
    load_scenario,
    override_note,
    plain_name,
    with_overrides,
)

SUITE_KEYS = {"name", "description", "suite"}


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    parts: list[str]
    source: str
    base: Path | None  # the folder part paths are relative to (None for a built-in suite)

    def part_path(self, part: str) -> Path:
        """The file or built-in name load_scenario takes for `part`."""
        if self.base is not None and (self.base / part).exists():
            return self.base / part
        if part in builtin_scenarios():
            return Path(part)
        raise ScenarioError(
            f"{self.source}: suite part {part!r} is neither a file next to the suite nor a "
            f"built-in scenario ({', '.join(builtin_scenarios())})"
        )


def load_suite(path: Path | None) -> Suite | None:
    """The suite at `path` (a file or a built-in name), or None when it is a plain scenario."""
    if path is None:
        return None
    if not Path(path).exists() and str(path) in builtin_scenarios():
        text = resources.files("tunnelbench").joinpath(f"scenarios/{path}.toml").read_text()
        source, base = f"built-in scenario {path}", None
    else:
        try:
            text = read_text(path, "scenario")
        except UserFileError:
            return None  # load_scenario says what is wrong with the path or the text
        source, base = str(path), Path(path).resolve().parent
    try:
        data = parse_toml(text, source)
    except UserFileError:
        return None  # load_scenario says what is wrong with the text
    if "suite" not in data:
        return None
    extra = sorted(set(data) - SUITE_KEYS)
    if extra:
        raise ScenarioError(
            f"{source}: a suite holds only {', '.join(sorted(SUITE_KEYS))}; "
            f"move {', '.join(extra)} into its parts"
        )
    parts = data["suite"]
    if not isinstance(parts, list) or not parts or not all(isinstance(p, str) and p for p in parts):
        raise ScenarioError(
            f"{source}: suite: a non-empty list of scenario names or files, e.g. "
            '["security-leak", "security-acl"]'
        )
    name = data.get("name", Path(str(path)).stem)
    try:  # it names the merged matrix's folder beside the runs
        if not isinstance(name, str):
            raise ValueError(f'suite name {name!r}: a string, e.g. "security"')
        plain_name(name, "suite", "it names the folder of the merged matrix beside the runs")
    except ValueError as e:
        raise ScenarioError(f"{source}: name: {e}") from None
    return Suite(name, str(data.get("description", "")), parts, source, base)


def capable(vpn: str, sc: Scenario) -> str | None:
    """Why `vpn` cannot take the part `sc`'s check (None: it can)."""
    cls = DRIVERS.get(vpn.split("@")[0])
    if cls is None:
        return None  # the scenario's own validation names it
    names = {w.name for w in sc.workloads}
    if "acl" in names and not cls.acl_support:
        return "no access control"
    if "revoke" in names and cls.revocation is None:
        return "no revocation action"
    if sc.lab.path != "direct" and sc.lab.path not in cls.paths:
        return f"no {sc.lab.path} path"
    return None


def merged_rows(runs: list[RunData]) -> list[dict[str, Any]]:
    """One Security row per VPN over all parts: each column from the part whose check ran (a verdict over
    "not run"); ACL, revocation and relay "not supported" from the driver class for VPNs a part left out."""
    by_vpn: dict[str, dict[str, Any]] = {}
    for run in runs:
        for row in security_rows(run):
            cur = by_vpn.setdefault(
                row["vpn"],
                {"vpn": row["vpn"], "version": row["version"], "cells": dict.fromkeys(COLUMNS, NOT_RUN)},
            )
            for col, cell in row["cells"].items():
                if cell == NOT_RUN:
                    continue
                old = cur["cells"][col]
                if (
                    old in (NOT_RUN, NOT_SUPPORTED)
                    or col in ("off-lab drops", "key hygiene")
                    and tone(cell[0]) == "bad"
                ):  # every part's drops and key record count: a failure anywhere shows
                    verdict, evidence = cell
                    cur["cells"][col] = (
                        cell if cell == NOT_SUPPORTED else (verdict, f"{run.run_id}: {evidence}".rstrip(": "))
                    )
    for row in by_vpn.values():
        cls = DRIVERS.get(row["vpn"].split("@")[0])
        if cls is None:
            continue
        fill = {
            "ACL": not cls.acl_support,
            "revocation": cls.revocation is None,
            "relay": "relay" not in cls.paths,
        }
        for col, unsupported in fill.items():
            if unsupported and row["cells"][col] == NOT_RUN:
                row["cells"][col] = NOT_SUPPORTED
        row["tones"] = {col: tone(v) for col, (v, _) in row["cells"].items()}
    order = {name: i for i, name in enumerate(DRIVERS)}  # the registry's order, as `list` shows it
    return sorted(by_vpn.values(), key=lambda r: (order.get(r["vpn"].split("@")[0], len(order)), r["vpn"]))


def matrix_markdown(suite: Suite, runs: list[RunData], rows: list[dict[str, Any]], notes: list[str]) -> str:
    lines = [
        f"# {md(suite.name)}: security matrix",
        "",
        md(suite.description),
        "",
        "Parts (each its own run folder):",
        "",
    ]
    lines += [f"- {code(r.run_id)}: {md(_scenario_name(r))} ({md(r.run_dir)})" for r in runs]
    lines += [f"- {md(n)}" for n in notes]
    lines += ["", "| VPN | version | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    for r in rows:  # the stored verdicts and evidence are text; the line break between them is the matrix's
        cells = [md(v) + (f" <br><sub>{md(e)}</sub>" if e else "") for v, e in r["cells"].values()]
        lines.append(f"| {md(r['vpn'])} | {md(r['version'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _scenario_name(run: RunData) -> str:
    try:
        return str(parse_toml(run.run.get("scenario") or "", run.run_id).get("name", ""))
    except UserFileError:
        return ""


def write_matrix(
    suite: Suite, runs: list[RunData], rows: list[dict[str, Any]], notes: list[str], folder: Path
) -> Path:
    """matrix.md and matrix.json in `folder` (the suite's own folder beside the part runs)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "matrix.md", matrix_markdown(suite, runs, rows, notes))
    write_atomic(
        folder / "matrix.json",
        json.dumps(
            {
                "suite": suite.name,
                "runs": [{"id": r.run_id, "dir": str(r.run_dir)} for r in runs],
                "notes": notes,
                "rows": [
                    {
                        "vpn": r["vpn"],
                        "version": r["version"],
                        "cells": {c: {"verdict": v, "evidence": e} for c, (v, e) in r["cells"].items()},
                    }
                    for r in rows
                ],
            },
            indent=1,
        ),
    )
    return folder / "matrix.md"


def suite_parts(
    suite: Suite, vpns: tuple[str, ...], common: dict[str, Any]
) -> tuple[list[tuple[str, Scenario, str, dict[str, Any]]], list[str]]:
    """Each part's (name, scenario, text, overrides) with the command line applied, `--vpn` narrowed to the
    VPNs that can take the part's check; and notes on what was left out. Raises ScenarioError."""
    requested = [v for arg in vpns for v in arg.split(",")]
    parts, notes = [], []
    for part in suite.parts:
        sc, text = load_scenario(suite.part_path(part))
        over = dict(common)
        if requested:
            every = with_overrides(text, {**over, "vpns": requested}, f"suite part {part} with --vpn")
            why = {v: capable(v, every) for v in every.vpns}
            keep = [v for v, w in why.items() if w is None]
            for w in sorted({w for w in why.values() if w}):
                notes.append(f"{part}: not run for {', '.join(v for v in why if why[v] == w)} ({w})")
            if not keep:
                notes.append(f"{part}: skipped, none of the requested VPNs can take its check")
                continue
            over["vpns"] = keep
        if over:
            sc = with_overrides(text, over, f"suite part {part} with command-line overrides")
            text = override_note(
                text,
                tuple(over.get("vpns", [])),
                over.get("repetitions"),
                tuple(over.get("profiles", [])),
                bool(over.get("flamegraph")),
                over.get("capture"),
            )
        parts.append((part, sc, text, over))
    return parts, notes
