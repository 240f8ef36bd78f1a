"""Suites (tunnelbench/suite.py): `tunnelbench run security` runs each check in the lab it needs and merges one
matrix. Hand-made runs give known merged cells; a small suite runs end to end through the CLI."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from conftest import lab_missing, tb
from test_security_table import hand_made_run

from tunnelbench.report.security import NOT_RUN, NOT_SUPPORTED
from tunnelbench.scenario import ScenarioError, load_scenario, parse_scenario
from tunnelbench.suite import capable, load_suite, merged_rows


def test_the_security_suite_lists_its_four_parts_and_load_scenario_refuses_it():
    s = load_suite(Path("security"))
    assert s is not None and s.parts == ["security-leak", "security-relay", "security-acl", "security-revoke"]
    for part in s.parts:
        load_scenario(s.part_path(part))  # every part is a valid built-in scenario
    with pytest.raises(ScenarioError, match=r"is a suite of 4 scenarios .*`tunnelbench run`"):
        load_scenario(Path("security"))
    assert load_suite(Path("security-leak")) is None and load_suite(None) is None


def test_a_bad_suite_names_the_field(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('name = "x"\nsuite = ["security-leak"]\nvpns = ["nebula"]\n')
    with pytest.raises(ScenarioError, match=r"a suite holds only description, name, suite; move vpns"):
        load_suite(f)
    f.write_text('suite = ["nope"]\n')
    with pytest.raises(ScenarioError, match=r"suite part 'nope' is neither a file next to the suite"):
        load_suite(f).part_path("nope")  # type: ignore[union-attr]
    f.write_text("suite = []\n")
    with pytest.raises(ScenarioError, match=r"suite: a non-empty list"):
        load_suite(f)


def test_capable_narrows_each_part_to_the_vpns_that_can_take_its_check():
    def sc(workload: str, path: str = "direct"):
        return parse_scenario(
            {
                "vpns": ["nebula"],
                "lab": {"hosts": 3, "path": path, "relay": "h3"} if path != "direct" else {"hosts": 3},
                "workloads": [{"name": workload}],
            },
            "t",
        )

    assert capable("nebula", sc("acl")) is None and capable("wireguard-go", sc("acl")) == "no access control"
    assert (
        capable("wireguard-go", sc("revoke")) is None
        and capable("tinc", sc("revoke")) == "no revocation action"
    )
    assert capable("nebula", sc("leak", "relay")) is None
    assert capable("wireguard-go", sc("leak", "relay")) == "no relay path"
    assert capable("nebula@1.6.1", sc("acl")) is None  # a variant is judged by its driver


def test_merged_rows_take_each_column_from_the_part_that_ran_it(tmp_path):
    leak = hand_made_run(
        tmp_path / "a",
        {
            "nebula": [("leak", "ok", None, {"leak_pass": 1})],
            "tinc": [("leak", "ok", None, {"leak_pass": 1})],
        },
    )
    leak = dataclasses.replace(leak, run_id="A", env={"offlab_drops.nebula": "0", "offlab_drops.tinc": "0"})
    acl = hand_made_run(
        tmp_path / "b",
        {"nebula": [("acl", "ok", None, {"acl_enforced": 1, "acl_denied_blocked": 1, "acl_allowed_ok": 1})]},
    )
    acl = dataclasses.replace(acl, run_id="B", env={"offlab_drops.nebula": "5"})
    rows = {r["vpn"]: r["cells"] for r in merged_rows([leak, acl])}
    assert list(rows) == ["nebula", "tinc"]
    neb, tinc = rows["nebula"], rows["tinc"]
    assert neb["plaintext leak"][0] == "pass (1/1)" and neb["plaintext leak"][1].startswith("A: ")
    assert neb["ACL"][0] == "enforced (1/1)" and neb["ACL"][1].startswith("B: ")
    # off-lab drops: a failure in any part shows, with the part it came from
    assert neb["off-lab drops"] == ("fail", "B: 5 packet(s) dropped at the router")
    assert tinc["off-lab drops"] == ("pass", "A: 0 packet(s) dropped at the router")
    # not in a part: "not supported" from the driver class, else "not run"
    assert tinc["ACL"] == tinc["revocation"] == tinc["relay"] == NOT_SUPPORTED
    assert neb["relay"] == NOT_RUN and neb["revocation"] == NOT_RUN


SUITE = 'name = "mini"\ndescription = "two parts"\nsuite = ["leak.toml", "acl.toml"]\n'
LEAK = """
name = "mini-leak"
vpns = ["internal"]
[run]
repetitions = 1
drift_check_s = 0
[lab]
hosts = 3
[[workloads]]
name = "leak"
"""
ACL = """
name = "mini-acl"
vpns = ["nebula"]
[run]
repetitions = 1
drift_check_s = 0
[lab]
hosts = 3
[vpn_options.nebula]
acl = "isolate"
[[workloads]]
name = "acl"
"""


@pytest.mark.lab
@pytest.mark.slow
def test_a_suite_runs_each_part_narrowed_to_capable_vpns_and_writes_one_matrix(tmp_path):
    why = lab_missing()
    if why:
        pytest.skip(why)
    for name, text in (("suite.toml", SUITE), ("leak.toml", LEAK), ("acl.toml", ACL)):
        (tmp_path / name).write_text(text)
    res = tb("run", str(tmp_path / "suite.toml"), "--vpn", "internal,nebula", "--results", str(tmp_path / "r"),
             "--no-html", timeout=900, columns=200)  # fmt: skip
    out = res.stdout + res.stderr
    runs = sorted(p for p in (tmp_path / "r").iterdir() if (p / "results.sqlite").exists())
    assert len(runs) == 2, out  # one run per part
    (folder,) = [p for p in (tmp_path / "r").iterdir() if p.name.startswith("mini-suite-")]
    m = json.loads((folder / "matrix.json").read_text())
    assert [r["id"] for r in m["runs"]] == [p.name for p in runs]
    assert m["notes"] == ["acl.toml: not run for internal (no access control)"], m["notes"]
    cells = {r["vpn"]: r["cells"] for r in m["rows"]}
    # internal leaks (the positive control), nebula does not; nebula's ACL came from the second part
    assert cells["internal"]["plaintext leak"]["verdict"].startswith("fail"), cells
    assert cells["nebula"]["plaintext leak"]["verdict"].startswith("pass"), cells
    assert cells["nebula"]["ACL"]["verdict"] == "enforced (1/1)", cells
    assert cells["nebula"]["ACL"]["evidence"].startswith(runs[1].name)
    assert cells["internal"]["ACL"]["verdict"] == "not supported"
    # key hygiene ran in the first part while nebula's mesh was up (its keys checked, then removed)
    assert cells["nebula"]["key hygiene"]["verdict"] == "pass", cells["nebula"]["key hygiene"]
    assert cells["nebula"]["key hygiene"]["evidence"].startswith(f"{runs[0].name}: ")
    # the positive control's leak is a finding in the matrix, not a failed run (as in a single run)
    assert "mini: merged from 2 run(s)" in res.stdout and res.returncode == 0, out


@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
def test_a_suite_none_of_whose_parts_can_take_the_requested_vpns_says_so_and_runs_nothing(tmp_path):
    (tmp_path / "suite.toml").write_text('name = "mini"\nsuite = ["acl.toml"]\n')
    (tmp_path / "acl.toml").write_text(ACL)
    res = tb("run", str(tmp_path / "suite.toml"), "--vpn", "internal", "--results", str(tmp_path / "r"),
             "--no-html", timeout=120, columns=200)  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert "acl.toml: skipped, none of the requested VPNs can take its check" in res.stderr, res.stderr
    assert "--vpn: no part of suite mini can take internal" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "name, said",
    [
        ('"../../outside"', "name: suite name '../../outside': use a plain name"),
        ('"a/b"', "name: suite name 'a/b': use a plain name"),
        ("7", "name: suite name 7: a string"),
    ],
)
def test_a_suite_name_that_would_put_the_matrix_outside_the_results_is_refused(tmp_path, name, said):
    """The merged matrix goes to RESULTS/<name>-suite-<first run>: a name with '../' put it elsewhere."""
    f = tmp_path / "s.toml"
    f.write_text(f'name = {name}\nsuite = ["security-leak"]\n')
    with pytest.raises(ScenarioError, match=re.escape(said)):
        load_suite(f)
    f.write_text('name = "security-2"\nsuite = ["security-leak"]\n')
    assert load_suite(f).name == "security-2"  # type: ignore[union-attr]


def test_the_matrix_markdown_holds_stored_text_as_text():
    from tunnelbench.report.security import COLUMNS
    from tunnelbench.suite import Suite, matrix_markdown

    suite = Suite("s", "<script>alert(1)</script>", ["security-leak"], "s.toml", None)
    cells = dict.fromkeys(COLUMNS, ("blocked", "<img src=x onerror=alert(1)> | 2"))
    text = matrix_markdown(suite, [], [{"vpn": "<b>vpn", "version": "1|2", "cells": cells}], ["note *x*"])
    assert "<script>" not in text and "<img" not in text and "<b>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "- note \\*x\\*" in text
    row = next(x for x in text.splitlines() if x.startswith("| &lt;b&gt;vpn"))
    header = next(x for x in text.splitlines() if x.startswith("| VPN |"))
    assert row.count("<br><sub>") == len(COLUMNS)  # the matrix's own line break, one per cell
    assert len(re.findall(r"(?<!\\)\|", row)) == len(re.findall(r"(?<!\\)\|", header))
