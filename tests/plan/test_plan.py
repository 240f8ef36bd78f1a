"""`tunnelbench plan`: a scenario's wall time from earlier runs' measured case times (medians per VPN and
label, a session's start-up and teardown), else the workloads' declared bounds, on hand-made stores."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tunnelbench.core.results import Outcome
from tunnelbench.plan import CASE_OVERHEAD_S, MESH_START_S, make_plan
from tunnelbench.scenario import parse_scenario
from tunnelbench.store import DB_NAME, Store

SC = {
    "vpns": ["internal", "nebula"],
    "run": {"repetitions": 4, "order": "interleaved"},
    "profiles": ["baseline", "lossy-edge"],
    "workloads": [{"name": "ping", "count": 10}, {"name": "connect"}],
    "impair": {"profiles": {"lossy-edge": {"loss_pct": 1}}},
}


def _store(
    results: Path, run: str, cases: list[tuple[str, str, float]], sessions: dict[str, list[float]]
) -> None:
    d = results / run
    d.mkdir(parents=True)
    st = Store(d / DB_NAME)
    st.begin_run(run, "tbplan", 'name = "x"\n', "0")
    for i, (vpn, label, secs) in enumerate(cases):
        cid = st.start_case(run, vpn, "baseline", label.split("-")[0], label, {}, i, 0, "h1", "h2", d)
        st.finish_case(cid, "ok", Outcome())
        st.db.execute('UPDATE "case" SET started = 100, ended = ? WHERE id = ?', (100 + secs, cid))
    for vpn, secs in sessions.items():
        for s in secs:  # per session: set-up, wait, teardown split in three
            for phase in ("vpn_setup", "tunnel_wait", "teardown"):
                st.add_phase(run, vpn, phase, s / 3)
    st.db.commit()
    st.end_run(run, "ok")
    st.close()


def test_measured_medians_and_declared_bounds(tmp_path):
    results = tmp_path / "results"
    _store(
        results,
        "r1",
        [("nebula", "ping", 2.0), ("nebula", "ping", 3.0), ("nebula", "ping", 10.0)],
        {"nebula": [6.0, 6.0]},
    )
    _store(results, "r2", [("nebula", "ping", 2.5), ("internal", "connect", 0.5)], {"nebula": [3.0]})
    sc = parse_scenario(SC, "t")
    p = make_plan(sc, results, lambda v: None)
    by = {(x.vpn, x.label): x for x in p.lines}
    assert by[("nebula", "ping")].per_case_s == 2.75 and by[("nebula", "ping")].source == "measured (n=4)"
    assert by[("internal", "connect")].per_case_s == 0.5
    declared = sc.build_workloads()[1].expected_seconds() + CASE_OVERHEAD_S  # nebula connect: never measured
    assert by[("nebula", "connect")].per_case_s == declared and by[("nebula", "connect")].source == "declared"
    assert all(x.cases == 4 * 2 for x in p.lines) and p.cases == 4 * 8  # reps x profiles, 2 VPNs x 2 labels
    # interleaved: a session per round and profile; nebula's runs: 6 s and 3 s a session -> median 4.5
    assert p.sessions_s == 8 * 4.5 + 8 * MESH_START_S
    assert p.seconds == sum(x.cases * x.per_case_s for x in p.lines) + p.sessions_s
    # an unavailable VPN is named and not counted
    q = make_plan(sc, results, lambda v: "not installed" if v == "nebula" else None)
    assert q.unavailable == {"nebula": "not installed"} and {x.vpn for x in q.lines} == {"internal"}


@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
def test_the_command_prints_the_total(tmp_path):
    scen = tmp_path / "s.toml"
    scen.write_text('vpns = ["internal"]\n[run]\nrepetitions = 3\n[[workloads]]\nname = "connect"\n')
    res = subprocess.run([sys.executable, "-m", "tunnelbench.cli", "plan", str(scen), "-n", "5", "--results",
                          str(tmp_path / "none")], capture_output=True, text=True, timeout=120,
                         env={"COLUMNS": "150", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "5 cases;" in res.stdout and "declared" in res.stdout


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
