"""`tunnelbench plan`: a scenario's wall time from earlier runs' case times (medians per VPN, label and
parameters; other parameters scaled), else each workload's typical time from its parameters, on hand-made
stores; the references are times written into those stores and totals worked out by hand below."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tunnelbench.core.results import Outcome
from tunnelbench.plan import MESH_START_S, make_plan
from tunnelbench.scenario import load_scenario, parse_scenario
from tunnelbench.store import DB_NAME, Store

SC = {
    "vpns": ["internal", "nebula"],
    "run": {"repetitions": 4, "order": "interleaved", "drift_check_s": 0},
    "profiles": ["baseline", "lossy-edge"],
    "workloads": [{"name": "ping", "count": 10}, {"name": "connect"}],
    "impair": {"profiles": {"lossy-edge": {"loss_pct": 1}}},
}


def _params(sc_data: dict[str, Any], label: str) -> dict[str, Any]:
    """The parameters a run of this scenario stores with a case of `label` (what the runner writes)."""
    wls = parse_scenario(sc_data, "t").build_workloads()
    return next(w.params.model_dump() for w in wls if w.label() == label)


def _store(
    results: Path,
    run: str,
    cases: list[tuple[str, str, float, dict[str, Any]]],
    sessions: dict[str, list[float]] | None = None,
) -> None:
    d = results / run
    d.mkdir(parents=True)
    st = Store(d / DB_NAME)
    st.begin_run(run, "tbplan", 'name = "x"\n', "0")
    for i, (vpn, label, secs, params) in enumerate(cases):
        cid = st.start_case(run, vpn, "baseline", label.split("-")[0], label, params, i, 0, "h1", "h2", d)
        st.finish_case(cid, "ok", Outcome())
        st.db.execute('UPDATE "case" SET started = 100, ended = ? WHERE id = ?', (100 + secs, cid))
    for vpn, secs in (sessions or {}).items():
        for s in secs:  # per session: set-up, wait, teardown split in three
            for phase in ("vpn_setup", "tunnel_wait", "teardown"):
                st.add_phase(run, vpn, phase, s / 3)
    st.db.commit()
    st.end_run(run, "ok")
    st.close()


def test_measured_medians_of_the_same_parameters(tmp_path):
    results = tmp_path / "results"
    ping = _params(SC, "ping")
    _store(
        results,
        "r1",
        [("nebula", "ping", 2.0, ping), ("nebula", "ping", 3.0, ping), ("nebula", "ping", 10.0, ping)],
        {"nebula": [6.0, 6.0]},
    )
    _store(
        results,
        "r2",
        [("nebula", "ping", 2.5, ping), ("internal", "connect", 0.5, _params(SC, "connect"))],
        {"nebula": [3.0]},
    )
    sc = parse_scenario(SC, "t")
    p = make_plan(sc, results, lambda v: None)
    by = {(x.vpn, x.label): x for x in p.lines}
    assert by[("nebula", "ping")].per_case_s == 2.75 and by[("nebula", "ping")].source == "measured (n=4)"
    assert by[("internal", "connect")].per_case_s == 0.5
    assert by[("nebula", "connect")].source == "expected"  # never measured
    assert all(x.cases == 4 * 2 for x in p.lines) and p.cases == 4 * 8  # reps x profiles, 2 VPNs x 2 labels
    # interleaved: a session per round and profile; nebula's runs: 6 s and 3 s a session -> median 4.5
    assert p.sessions_from == {"nebula": "measured (n=2)", "internal": "expected"}
    assert p.sessions_s == 8 * 4.5 + 8 * MESH_START_S  # internal settles in no time
    assert p.seconds == sum(x.cases * x.per_case_s for x in p.lines) + p.sessions_s
    # an unavailable VPN is named and not counted
    q = make_plan(sc, results, lambda v: "not installed" if v == "nebula" else None)
    assert q.unavailable == {"nebula": "not installed"} and {x.vpn for x in q.lines} == {"internal"}


def test_earlier_cases_of_other_parameters_are_scaled_not_reused(tmp_path):
    # earlier runs measured tcp for 3 s (omit 1 s): 4.1 s a case, 0.1 s beyond its 4 s of iperf3
    short = {"workloads": [{"name": "tcp", "duration_s": 3, "omit_s": 1}]}
    results = tmp_path / "results"
    _store(results, "r1", [("internal", "tcp", 4.1, _params(short, "tcp"))] * 3)
    sc = parse_scenario({"workloads": [{"name": "tcp", "duration_s": 8, "omit_s": 1}]}, "t")
    (line,) = make_plan(sc, results, lambda v: None).lines
    assert line.per_case_s != 4.1, "an 8 s case planned at a 3 s case's time"
    # by hand: iperf3 runs 1 + 8 = 9 s, plus the 0.1 s the earlier cases spent beyond theirs
    assert abs(line.per_case_s - 9.1) < 0.1 * 9.1, line
    assert line.source.startswith("scaled (n=3"), line.source
    # the same parameters: the measured time as it is
    same = parse_scenario(short, "t")
    assert [(round(x.per_case_s, 6), x.source) for x in make_plan(same, results).lines] == [
        (4.1, "measured (n=3)")
    ]


def test_the_default_scenario_on_a_fresh_machine_is_planned_near_its_hand_worked_time(tmp_path):
    sc, _ = load_scenario(None)  # src/tunnelbench/scenarios/default.toml
    p = make_plan(sc, tmp_path / "empty", lambda v: None)
    # by hand from default.toml's parameters, per VPN and round:
    tcp = 1 + 3  # iperf3 for omit_s + duration_s
    # udp_ceiling: from 400 Mbit/s a cold search brackets the ceiling within a factor of 2 in two rates and
    # bisects it to 5% in 4 (ln 2 / 2^4 < ln 1.05), 6 rates; half pass (2 repeats of 1 s), half fail at their
    # first: 3 x 2 + 3 = 9 probes of 1 s (later rounds start at the last ceiling: fewer)
    udp = 9 * 1
    ping = 50 * 0.02  # count x interval_s
    connect = 1  # the mesh stopped, started and one echo answered
    session = 1  # a mesh up and torn down
    per_round = 5 * (tcp + udp + ping + connect + session)
    tinc_settle = 6 + 6  # tinc settles 6 s after its start and after the connect case restarts it
    drift = 1  # drift_check_s: iperf3 on the raw path at every round's start
    hand = 6 * (per_round + tinc_settle + drift)  # 6 rounds: 558 s
    assert hand / 1.5 <= p.seconds <= hand * 1.5, f"plan {p.seconds:.0f} s vs {hand:.0f} s by hand"
    assert {x.source for x in p.lines} == {"expected"} and set(p.sessions_from.values()) == {"expected"}


def test_a_workload_without_a_typical_model_is_planned_at_its_upper_bound_and_says_so(tmp_path):
    sc = parse_scenario({"workloads": [{"name": "tcp", "engine": "iperf2", "bytes": "100M"}]}, "t")
    (line,) = make_plan(sc, tmp_path / "none", lambda v: None).lines
    assert line.source == "upper bound (no typical model)"
    assert line.per_case_s >= sc.build_workloads()[0].expected_seconds()


def _pythonpath() -> dict[str, str]:
    """These sources in the subprocess too, when the tests run them from the path."""
    return {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}


@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
def test_the_command_prints_the_total(tmp_path):
    scen = tmp_path / "s.toml"
    scen.write_text('vpns = ["internal"]\n[run]\nrepetitions = 3\n[[workloads]]\nname = "connect"\n')
    res = subprocess.run([sys.executable, "-m", "tunnelbench.cli", "plan", str(scen), "-n", "5", "--results",
                          str(tmp_path / "none")], capture_output=True, text=True, timeout=120,
                         env={"COLUMNS": "150", "PATH": "/usr/bin:/bin", **_pythonpath()})  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "5 cases;" in res.stdout and "expected" in res.stdout


def test_cases_beyond_a_vpns_hosts_per_vpn_count_as_skipped(tmp_path):
    lab = {"hosts": 11, "topology": "star", "hosts_per_vpn": {"wireguard-go": 6}}
    wls = [{"name": "many_clients", "clients": n} for n in (5, 10)]
    sc = parse_scenario(
        {"vpns": ["internal", "wireguard-go"], "run": {"repetitions": 2}, "lab": lab, "workloads": wls}
    )
    p = make_plan(sc, tmp_path / "none", lambda v: None)
    by = {(x.vpn, x.label): x for x in p.lines}
    assert by[("wireguard-go", "many-clients-n10")].cases == 0
    assert by[("wireguard-go", "many-clients-n10")].source == "skipped: lab.hosts_per_vpn = 6"
    assert (
        by[("wireguard-go", "many-clients-n5")].cases == 2 and by[("internal", "many-clients-n10")].cases == 2
    )
    assert p.cases == 6


@pytest.fixture
def probes(tmp_path, monkeypatch):
    """The kernel probe as plan runs it, recorded (a one-line stand-in script: no namespace is made), with
    the lab lock and the probe record in this test's folder."""
    from tunnelbench.lab import journal, kernel
    from tunnelbench.lab.lock import LabBusy, LabLock

    monkeypatch.setattr(journal, "REGISTRY", tmp_path / "registry")
    monkeypatch.setattr(kernel, "_CACHE", {})
    monkeypatch.setattr(kernel, "_held", [])
    seen: list[str] = []

    def probe_script(ns: str) -> str:
        try:  # who holds the lab while the probe runs
            LabLock("probe-check").acquire().release()
            seen.append("lab free")
        except LabBusy as e:
            seen.append(str(e))
        return "printf 'vxlan\\tok\\n'"

    monkeypatch.setattr(kernel, "probe_script", probe_script)
    return seen


def _plan_vxlan(tmp_path) -> str:
    from click.testing import CliRunner

    from tunnelbench.cli.app import main

    scen = tmp_path / "s.toml"
    scen.write_text('vpns = ["vxlan", "internal"]\n[[workloads]]\nname = "connect"\n')
    res = CliRunner().invoke(
        main, ["plan", str(scen), "--results", str(tmp_path / "none")], env={"COLUMNS": "250"}
    )
    assert res.exit_code == 0, res.output
    return res.output


def test_plan_probes_the_kernel_under_the_lab_lock(tmp_path, probes):
    _plan_vxlan(tmp_path)
    assert len(probes) == 1 and "`tunnelbench plan`" in probes[0], probes


def test_plan_never_probes_the_kernel_while_another_process_holds_the_lab(tmp_path, probes):
    from tunnelbench.lab.lock import LabLock

    held = LabLock("run").acquire()  # another holder: an open file of its own
    try:
        out = _plan_vxlan(tmp_path)
    finally:
        held.release()
    assert probes == [], "plan probed the kernel while a run held the lab"
    assert "the kernel is not probed now" in out and "vxlan" in out, out


@pytest.mark.slow  # doctor reads every VPN's availability (~5 s)
def test_doctor_never_probes_the_kernel_while_another_process_holds_the_lab(tmp_path, probes, monkeypatch):
    """doctor's own probe (a scratch namespace, tunnel devices) waits for the lab as plan's does: with the
    lab held, no namespace is made and the table says the kernel was not probed now."""
    from click.testing import CliRunner

    from tunnelbench import doctor
    from tunnelbench.cli.app import main
    from tunnelbench.lab.lock import LabLock

    made: list[str] = []
    monkeypatch.setattr(doctor, "_probe_kernel", lambda *a, **k: made.append("namespace") or [])
    held = LabLock("run").acquire()
    try:
        res = CliRunner().invoke(main, ["doctor"], env={"COLUMNS": "250"})
    finally:
        held.release()
    assert made == [] and probes == [], "doctor probed the kernel while a run held the lab"
    assert "not probed now: the lab is busy" in res.output, res.output
    from tunnelbench.lab import kernel

    kernel._held.clear()  # a new command, as a new process would be
    res = CliRunner().invoke(main, ["doctor"], env={"COLUMNS": "250"})
    assert made == ["namespace"], "doctor did not probe with the lab free"
