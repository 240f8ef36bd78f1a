"""Exit codes a CI job can gate on (analysis/outcome.py): 0 every planned case measured, 1 some not measured
for a reason the user did not ask for, 3 nothing measured; suites combine their parts'. The unit tests
judge hand-made case lists; the lab tests run the CLI as a user does, piped, and read its exit status and
its log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import lab_missing, ping_scenario, tb

from tunnelbench.analysis.outcome import CaseStatus, judge, suite_code


def c(vpn: str, status: str, rep: int = 1, label: str = "tcp", profile: str = "baseline") -> CaseStatus:
    return CaseStatus(vpn, profile, label, rep, status)


OK_VPNS = {"a": ("ok", None), "b": ("ok", None)}


def test_every_case_measured_is_0_and_a_retry_supersedes_its_failed_attempt():
    out = judge(
        [c("a", "ok"), c("b", "failed"), c("b", "ok"), c("a", "ok", rep=2), c("b", "ok", rep=2)], OK_VPNS
    )
    assert (out.code, out.measured, out.planned) == (0, 4, 4)
    assert out.line() == "exit 0: all 4 planned case(s) measured"


def test_a_case_that_does_not_apply_is_answered_not_missing():
    out = judge([c("a", "ok"), c("b", "ok"), c("b", "n/a", label="control_loss")], OK_VPNS)
    assert out.code == 0


def test_a_case_whose_every_attempt_failed_is_1_and_named():
    out = judge([c("a", "ok"), c("b", "failed"), c("b", "failed"), c("b", "ok", rep=2)], OK_VPNS)
    assert (out.code, out.missing) == (1, {"b": 1})
    assert out.line() == "exit 1: 1 of 3 planned case(s) not measured: b: 1 case(s)"


def test_a_vpn_out_of_the_run_is_1_with_its_reason_even_without_cases():
    vpns = {
        "a": ("ok", None),
        "b": ("failed", "mesh did not come up: b: pairs not answering after 1 s\nmore"),
    }
    out = judge([c("a", "ok"), c("b", "skipped"), c("b", "skipped", rep=2)], vpns)
    assert out.code == 1
    assert out.line() == (
        "exit 1: 2 of 3 planned case(s) not measured: "
        "b: 2 case(s) (failed: mesh did not come up: b: pairs not answering after 1 s)"
    )
    out = judge([c("a", "ok")], {**vpns, "b": ("unavailable", "missing binaries: b")})
    assert out.code == 1 and out.line().endswith("b: no case (unavailable: missing binaries: b)")


def test_a_skip_record_stands_for_every_repetition_of_the_plan():
    # the runner records one skip per (profile, workload) for a VPN out of the run, with repetition 0
    vpns = {"a": ("ok", None), "b": ("unavailable", "missing binaries: b")}
    cases = [c("a", "ok", rep=1), c("a", "ok", rep=2), c("a", "ok", rep=3), c("b", "skipped", rep=0)]
    out = judge(cases, vpns, per_vpn=3)
    assert (out.code, out.planned, out.missing) == (1, 6, {"b": 3})
    # a VPN that measured only some of its planned repetitions (a later round's mesh did not come up)
    out = judge([c("a", "ok", rep=1), c("a", "skipped", rep=0)], {"a": ("ok", None)}, per_vpn=3)
    assert (out.code, out.missing) == (1, {"a": 2})
    # adaptive repetitions beyond the plan are measured cases, not a negative shortfall
    out = judge([c("a", "ok", rep=r) for r in (1, 2, 3, 4)], {"a": ("ok", None)}, per_vpn=3)
    assert (out.code, out.planned, out.missing) == (0, 4, {})


def test_nothing_measured_is_3():
    assert judge([c("a", "failed"), c("b", "skipped")], OK_VPNS).code == 3
    assert judge([], {"b": ("unavailable", "x")}).code == 3
    assert judge([c("a", "n/a")], OK_VPNS).code == 3  # answered, but not one measurement


@pytest.mark.parametrize(
    "codes, want",
    [([0, 0], 0), ([0, 1], 1), ([0, 3], 1), ([3, 3], 3), ([1, 3], 1), ([0, 130, 1], 130), ([0, 2], 2)],
)
def test_a_suite_combines_its_parts(codes, want):
    assert suite_code(codes) == want


# a VPN at a version nobody installs, run with --no-build: unavailable on every machine (missing binaries)
ABSENT = "nebula@1.0.0"


@pytest.mark.lab
@pytest.mark.slow
@pytest.mark.parametrize("vpns, code", [(["internal", ABSENT], 1), ([ABSENT], 3), (["internal"], 0)])
def test_run_exit_code_and_the_log_of_a_piped_run(tmp_path: Path, vpns: list[str], code: int):
    why = lab_missing()
    if why:
        pytest.skip(why)
    scen = tmp_path / "s.toml"
    scen.write_text(ping_scenario("exit-codes", vpns, repetitions=2))
    # --no-build: the absent version stays absent (the run would otherwise build it on first use)
    res = tb("run", str(scen), "--results", str(tmp_path / "r"), "--no-html", "--no-build", timeout=300)
    assert res.returncode == code, res.stdout[-2000:] + res.stderr[-3000:]
    log = res.stdout + res.stderr
    if ABSENT in vpns:
        assert f"{ABSENT}: unavailable: missing binaries" in res.stdout  # the headline names it
        assert re.search(
            rf"exit {code}: .*{re.escape(ABSENT)}: 2 case\(s\) \(unavailable: missing binaries", log
        )
    # piped (no terminal): a line per finished case, counted against the plan, skipped cases included
    done = re.findall(r"^\[(\d+)/(\d+)\] internal · baseline · ping · rep (\d): ok \(\d+\.\d s\)", log, re.M)
    total = str(2 * len(vpns))
    if "internal" in vpns:
        assert [(t, r) for _, t, r in done] == [(total, "1"), (total, "2")], log[-3000:]
        assert int(done[0][0]) < int(done[1][0]) <= int(total)
    else:
        assert not done


def test_the_stores_judgement_counts_labels_profiles_and_the_plan(tmp_path):
    """judge_store reads a case's VPN, profile, label and repetition apart (a failed tcp case is missing even
    though the same repetition's ping was ok), the runner's recorded plan per VPN (a VPN that recorded fewer
    cases than planned misses the rest), and a VPN's reason as its first line, cut at 160 characters."""
    from synthetic_runs import hand_store

    from tunnelbench.analysis.outcome import PLANNED_KEY, judge_store
    from tunnelbench.core.results import Outcome, Sample
    from tunnelbench.store import Store

    why = "mesh did not come up: " + "x" * 200 + "\ntraceback line 2"
    with hand_store(tmp_path, ("a", "b")) as (st, run_dir):
        st.set_vpn("r1", "c", "1", "unavailable", why)
        st.set_env("r1", {PLANNED_KEY: 3})
        statuses = {
            ("a", "p1", "tcp"): "ok",
            ("a", "p1", "ping"): "ok",
            ("a", "p2", "tcp"): "failed",
            ("b", "p1", "tcp"): "ok",
        }
        for (vpn, profile, label), status in statuses.items():
            adir = run_dir / vpn / profile / label
            adir.mkdir(parents=True)
            cid = st.start_case("r1", vpn, profile, label, label, {}, 1, 0, "h1", "h2", adir)
            st.finish_case(
                cid, status, Outcome(samples=[Sample("connect_s", 0.1, "s")]) if status == "ok" else None
            )
    st = Store.open_run_dir(run_dir)
    out = judge_store(st, "r1")
    st.close()
    assert (out.code, out.measured, out.planned) == (1, 3, 9)
    assert out.missing == {"a": 1, "b": 2, "c": 3}
    short = ("unavailable: " + why)[:159] + "…"
    assert out.reasons == {"c": short} and len(short) == 160
    assert (
        out.line()
        == f"exit 1: 6 of 9 planned case(s) not measured: a: 1 case(s); b: 2 case(s); c: 3 case(s) ({short})"
    )
