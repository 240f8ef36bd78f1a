"""Interleaved seeded rounds, CPU placement, the engine's tax and GSO mode, the drift reference.

Unit tests check the plans and the read-back against hand-made inputs; lab tests check what the kernel
reports (a process's allowed CPUs in /proc, the engine's own log), and a real run's stored order."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import tb

from tunnelbench.analysis.emulator import emulator_facts, facts_lines
from tunnelbench.impair import tax
from tunnelbench.impair.profiles import Profile
from tunnelbench.lab.cpus import cpu_list, plan
from tunnelbench.runner.schedule import round_orders
from tunnelbench.scenario import ScenarioError, parse_scenario

# -- round plans -------------------------------------------------------------------------------------


def test_round_orders_are_seeded_permutations():
    vpns = ["internal", "nebula", "tinc", "openvpn", "wireguard-go"]
    a = round_orders(vpns, 6, seed=42)
    assert a == round_orders(vpns, 6, seed=42)  # same seed, same plan (a repeated or resumed run)
    assert all(sorted(r) == sorted(vpns) for r in a)  # every VPN exactly once per round
    assert len({tuple(r) for r in a}) > 1  # the order changes between rounds
    assert a != round_orders(vpns, 6, seed=43)
    # the documented contract: one random.Random(seed) shuffling a fresh copy per round
    rng = random.Random(42)
    expect = []
    for _ in range(6):
        o = list(vpns)
        rng.shuffle(o)
        expect.append(o)
    assert a == expect


def test_scenario_order_and_cpu_fields_are_validated():
    base = {"workloads": [{"name": "ping"}]}
    sc = parse_scenario(base)
    assert sc.run.order == "interleaved" and sc.cpu.placement == "auto" and sc.impair.gso == "auto"
    with pytest.raises(ScenarioError, match=r"run\.order"):
        parse_scenario({**base, "run": {"order": "random"}})
    with pytest.raises(ScenarioError, match=r"cpu\.placement"):
        parse_scenario({**base, "cpu": {"placement": "everywhere"}})
    with pytest.raises(ScenarioError, match=r"cpu\.engine_cpus"):
        parse_scenario({**base, "cpu": {"engine_cpus": "one"}})
    with pytest.raises(ScenarioError, match=r"impair\.gso"):
        parse_scenario({**base, "impair": {"gso": "always"}})


# -- CPU placement -----------------------------------------------------------------------------------


def test_cpu_list_parses_ranges():
    assert cpu_list("0-2,5") == [0, 1, 2, 5]
    assert cpu_list("3") == [3]


def test_placement_plans():
    hosts = ["h1", "h2", "h3"]
    noeng = plan("auto", engine_used=False, hosts=hosts, cpus=[0, 1])
    assert (
        noeng.mode == "pinned" and noeng.engine is None and noeng.hosts == {"h1": "0", "h2": "1", "h3": "0"}
    )
    many = plan("auto", engine_used=False, hosts=[f"h{i}" for i in range(1, 101)], cpus=[0, 1])
    assert many.mode == "off" and many.hosts == {}
    off = plan("off", engine_used=True, hosts=hosts, cpus=[0, 1])
    assert off.mode == "off" and off.hosts == {}
    auto = plan("auto", engine_used=True, hosts=hosts, cpus=[0, 1])
    assert (auto.mode, auto.engine, auto.sut) == ("engine-apart", "1", "0")
    assert auto.hosts == {"h1": "0", "h2": "0", "h3": "0"}
    assert plan("auto", engine_used=True, hosts=hosts, cpus=list(range(8))).mode == "off"  # enough cores
    pinned = plan("pinned", engine_used=True, hosts=hosts, cpus=[0, 1, 2, 3])
    assert pinned.engine == "3" and pinned.hosts == {"h1": "0", "h2": "1", "h3": "2"}
    nobody = plan("pinned", engine_used=False, hosts=hosts, cpus=[0, 1])
    assert nobody.engine is None and nobody.hosts == {"h1": "0", "h2": "1", "h3": "0"}
    forced = plan("engine-apart", engine_used=False, hosts=hosts, engine_cpus="0", cpus=[0, 1, 2])
    assert (forced.engine, forced.sut) == ("0", "1,2")
    with pytest.raises(ValueError, match="CPU 7 is not available"):
        plan("engine-apart", engine_used=True, hosts=hosts, engine_cpus="7", cpus=[0, 1])
    with pytest.raises(ValueError, match="no CPU left"):
        plan("engine-apart", engine_used=True, hosts=hosts, engine_cpus="0,1", cpus=[0, 1])


# -- engine modes and the tax ---------------------------------------------------------------------


def test_engine_mode_per_profile():
    d = Profile(name="d", delay_ms=5, jitter_ms=1)
    lossy = Profile(name="l", delay_ms=5, loss_pct=1)
    reord = Profile(name="r", delay_ms=5, reorder_pct=5)
    assert tax.mode_of(d, "auto") == "gso" and tax.mode_of(d, "segment") == "segment"
    # per-wire profiles too: the engine decides per wire packet inside the super-packets it takes whole
    assert tax.mode_of(lossy, "auto") == "gso" and tax.mode_of(reord, "auto") == "gso"
    assert tax.mode_of(lossy, "segment") == "segment"
    assert tax.mode_of(Profile(name="b"), "auto") is None
    assert tax.modes_for([Profile(name="b"), d, lossy], "auto") == ["gso"]
    assert tax.modes_for([Profile(name="b"), d], "segment") == ["segment"]


def test_tax_check_numbers():
    """The tax is 1 - the geometric mean of on/off over the rounds, with Student's t interval of the log
    ratios (scipy's, here: the reference); only an interval wholly above 10% flags. Three noisy rounds of a
    13.8% point estimate do not decide it (the coin flip of a median of 2-3 legs against a 10% line)."""
    from scipy import stats as sst

    off, on = [100, 120, 110], [99, 90, 95]
    c = tax.TaxCheck("x", "gso", off_mbps=off, on_mbps=on)
    logs = np.log(np.array(on) / np.array(off))
    lo_log, hi_log = sst.t.interval(0.95, len(logs) - 1, loc=logs.mean(), scale=sst.sem(logs))
    t, lo, hi = c.interval
    assert t == pytest.approx(100 * (1 - np.exp(logs.mean())))  # 13.77%
    assert (lo, hi) == (pytest.approx(100 * (1 - np.exp(hi_log))), pytest.approx(100 * (1 - np.exp(lo_log))))
    assert t > 10 and lo < 10 < hi and not c.flagged and c.undecided
    clear = tax.TaxCheck("x", "gso", off_mbps=[100, 101, 99, 100], on_mbps=[80, 81, 79, 80])
    assert clear.flagged and clear.interval[1] > 18 and not clear.undecided
    assert not tax.TaxCheck("x", "gso", off_mbps=[100], on_mbps=[95]).flagged
    assert clear.to_json()["tax_lo"] == pytest.approx(clear.interval[1])


class _Engine:
    """What measure_tax asks of the native backend, without an engine: legs are read from a script."""

    def __init__(self) -> None:
        self.gso_mode, self.on = "auto", False

    def clear(self) -> None:
        self.on = False

    def apply(self, _p: object, force_engine: bool = False) -> None:
        self.on = True

    def stats(self) -> dict[str, float]:
        return {}

    def health(self) -> None:
        return None


@pytest.mark.parametrize(
    ("legs", "rounds"),
    [
        # every round the same 20% tax: decided (interval above the line) after the first three rounds
        ([(100.0, 80.0)], tax.MIN_ROUNDS),
        # 12% +- a lot: the interval keeps the 10% line, so rounds are added up to the cap
        ([(100.0, 60.0), (100.0, 116.0)], tax.MAX_ROUNDS),
    ],
)
def test_tax_check_adds_rounds_while_undecided(monkeypatch, legs, rounds):
    engine = _Engine()
    seq = iter(x for _ in range(20) for pair in legs for x in pair)
    monkeypatch.setattr(tax, "iperf3_tcp", lambda *a, **k: next(seq))
    monkeypatch.setattr(tax, "goodput_mbps", lambda x: x)
    (c,) = tax.measure_tax(engine, "x", None, None, "10.0.0.2", 1, ["gso"])  # type: ignore[arg-type]
    assert len(c.off_mbps) == len(c.on_mbps) == rounds
    assert not engine.on


def test_emulator_facts_from_hand_made_rows():
    env = {
        "impair.modes": json.dumps({"baseline": None, "d1": "gso", "l1": "segment"}),
        "engine_tax.nebula": json.dumps({"gso": {"tax_pct": 4.0}, "segment": {"tax_pct": 22.5}}),
        "engine_tax.tinc": json.dumps({"error": "iperf3: boom"}),
        "cpu.placement": json.dumps({"mode": "engine-apart", "reason": "r", "engine": "1", "sut": "0"}),
        "drift.reference": json.dumps([{"goodput_mbps": 100}, {"goodput_mbps": 110}, {"goodput_mbps": 90}]),
    }
    row = {"vpn": "nebula", "label": "tcp", "host": "router"}
    metrics = [
        {**row, "profile": "d1", "name": "engine_cpu_pct", "value": 40.0},
        {**row, "profile": "d1", "name": "engine_cpu_pct", "value": 60.0},
        {**row, "profile": "d1", "name": "engine_cpu_pct", "value": 50.0},
        {**row, "profile": "l1", "name": "engine_bound", "value": 1.0},
        {**row, "profile": "l1", "name": "engine_bound", "value": 0.0},
        {**row, "profile": "l1", "host": None, "name": "engine_cpu_pct", "value": 99.0},  # not the router's
    ]
    f = emulator_facts(env, metrics)
    by = {p.profile: p for p in f.profiles}
    assert by["d1"].engine_cpu_median == 50.0 and by["d1"].engine_cpu_max == 60.0
    assert by["d1"].tax_pct == {"nebula": 4.0} and by["d1"].flagged == []
    assert by["l1"].tax_pct == {"nebula": 22.5} and by["l1"].flagged == [
        "nebula"
    ]  # a point: a run from before
    assert by["l1"].bound == {("nebula", "tcp"): (1, 2)}
    assert by["l1"].engine_cpu_median is None
    assert f.drift.values == [100, 110, 90]
    text = "\n".join(facts_lines(f))
    assert "nebula +22% (clearly >10%)" in text and "nebula tcp (1 of 2)" in text
    # a tax whose interval holds the line is not flagged, however high its point
    env["engine_tax.nebula"] = json.dumps({"segment": {"tax_pct": 22.5, "tax_lo": -3.0, "tax_hi": 41.0}})
    f = emulator_facts(env, metrics)
    l1 = next(p for p in f.profiles if p.profile == "l1")
    assert l1.tax_ci == {"nebula": (22.5, -3.0, 41.0)} and l1.flagged == []
    assert "nebula +22% [-3, +41]" in "\n".join(facts_lines(f))
    assert "engine-tax check for tinc failed: iperf3: boom" in text
    assert "range 90–110 (20% of the median)" in text


# -- the kernel's view: affinity of what the lab starts ----------------------------------------------


def allowed_cpus(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split()[1]
    raise AssertionError("no Cpus_allowed_list")


@pytest.mark.lab
def test_host_pinning_reaches_the_process_and_keeps_its_pid(lab_factory):
    lab = lab_factory(2)
    h1 = lab.hosts[0]
    h1.cpus = "0"
    p = h1.spawn(["sleep", "30"], label="sleeper", log_path=None)
    try:
        time.sleep(0.3)
        assert allowed_cpus(p.pid) == "0"  # the kernel's own record
        assert Path(f"/proc/{p.pid}/comm").read_text().strip() == "sleep"  # taskset exec'd: same PID
    finally:
        p.stop(grace=1)
    h1.cpus = None
    out = h1.run(["sh", "-c", "grep Cpus_allowed_list /proc/self/status"]).stdout
    assert out.split()[-1] == allowed_cpus(1)  # unpinned again: what init may use


@pytest.mark.lab
def test_engine_pinned_and_gso_for_every_profile(tmp_path):
    from conftest import lab_missing

    from tunnelbench.impair.backend import NativeBackend
    from tunnelbench.impair.session import impair_lab

    if lab_missing():
        pytest.skip(lab_missing())
    with impair_lab(tmp_path) as (lab, be):
        if not isinstance(be, NativeBackend):
            pytest.skip("this kernel has netem: the native engine is not used (kernel lane covers netem)")
        be.cpus, be.busy_poll_us, be.realtime = "1", 500, False
        be.apply(Profile(name="d", delay_ms=1))
        try:
            assert be.proc is not None
            assert allowed_cpus(be.proc.pid) == "1"
            cfg = json.loads((be.workdir / "impaird.json").read_text())
            assert cfg["gso"] is True and cfg["busy_poll_us"] == 500 and cfg["realtime"] is False
            time.sleep(0.2)
            assert "GSO packets whole" in be.proc.log_tail()  # what the engine itself says it does
            h1, h2 = lab.hosts
            assert (
                h1.run(["ping", "-c", "3", "-i", "0.05", "-W", "1", h2.underlay_ip], check=False).returncode
                == 0
            )
        finally:
            be.clear()
        be.apply(Profile(name="l", delay_ms=1, loss_pct=1))
        try:
            assert json.loads((be.workdir / "impaird.json").read_text())["gso"] is True
            time.sleep(0.2)
            assert be.proc is not None and "decided per wire packet" in be.proc.log_tail()
        finally:
            be.clear()


# -- a real run: interleaved, seeded, taxed, drift-referenced ---------------------------------------


def run_scenario(tmp_path: Path, text: str) -> tuple[subprocess.CompletedProcess, sqlite3.Connection]:
    """`tunnelbench run` of a scenario text; returns the finished process and its store."""
    from conftest import lab_missing

    if lab_missing():
        pytest.skip(lab_missing())
    (tmp_path / "s.toml").write_text(text)
    p = tb("run", str(tmp_path / "s.toml"), "--results", str(tmp_path / "r"), "--no-html", timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (db,) = (tmp_path / "r").glob("*/results.sqlite")
    return p, sqlite3.connect(db)


RUN = """
name = "fidelity"
vpns = ["internal", "vxlan"]
profiles = ["baseline", "d1"]
[run]
repetitions = 2
seed = 7
drift_check_s = 1
[impair]
calibrate = false
tax_check_s = 1
[impair.profiles.d1]
delay_ms = 0.5
[[workloads]]
name = "tcp"
duration_s = 1
omit_s = 0
[[workloads]]
name = "ping"
count = 5
interval_s = 0.01
"""


@pytest.mark.lab
@pytest.mark.slow
def test_run_is_interleaved_seeded_and_stores_tax_and_drift(tmp_path):
    from tunnelbench.impair.backend import impaird_binary
    from tunnelbench.impair.tax import MAX_ROUNDS, MIN_ROUNDS

    p, c = run_scenario(tmp_path, RUN)
    rows = c.execute(
        "SELECT vpn, profile, repetition, started FROM \"case\" WHERE status = 'ok' ORDER BY started"
    ).fetchall()
    assert len(rows) == 2 * 2 * 2 * 2  # vpns x profiles x reps x workloads, all ok
    reps = [r[2] for r in rows]
    assert reps == sorted(reps), "a case of round 2 started before a case of round 1"
    # each round runs one VPN after the other, in the order random.Random(7) gives
    rng = random.Random(7)
    for rnd in (1, 2):
        expect = ["internal", "vxlan"]
        rng.shuffle(expect)
        seen = [r[0] for r in rows if r[2] == rnd]
        assert [v for i, v in enumerate(seen) if i == 0 or seen[i - 1] != v] == expect
    env = dict(c.execute("SELECT key, value FROM environment").fetchall())
    assert int(env["run.seed"]) == 7 and env["run.order"] == "interleaved"
    drift = json.loads(env["drift.reference"])
    assert len(drift) == 2 and all(d["goodput_mbps"] > 100 for d in drift)
    if impaird_binary() is not None and "native" in env.get("impair.backend", ""):
        for vpn in ("internal", "vxlan"):  # the tax check ran for every VPN, in the mode d1 uses
            t = json.loads(env[f"engine_tax.{vpn}"])
            assert set(t) == {"gso"}, t
            # paired rounds, at least MIN_ROUNDS (an interval needs them), more only while it straddles the line
            n = len(t["gso"]["off_mbps"])
            assert MIN_ROUNDS <= n <= MAX_ROUNDS and len(t["gso"]["on_mbps"]) == n, t
            assert all(x > 100 for x in t["gso"]["off_mbps"] + t["gso"]["on_mbps"])
        pl = json.loads(env["cpu.placement"])
        assert pl["mode"] in ("engine-apart", "off")
        cpu = c.execute(
            'SELECT COUNT(*) FROM metric m JOIN "case" k ON k.id = m.case_id '
            "WHERE m.name = 'engine_cpu_pct' AND k.profile = 'd1'"
        ).fetchone()[0]
        assert cpu == 2 * 2 * 2  # one per impaired case
        assert "engine tax" in p.stdout + p.stderr


TUNED = """
name = "tunings"
vpns = ["internal"]
profiles = ["baseline"]
tunings = ["default", "r10"]
[run]
repetitions = 2
drift_check_s = 0
[hosts.tunings.r10]
"net.ipv4.tcp_reordering" = 10
[lab]
hosts = 2
[[workloads]]
name = "tcp"
duration_s = 1
omit_s = 0
"""


@pytest.mark.lab
@pytest.mark.slow
def test_tunings_are_a_dimension_applied_in_every_host(tmp_path):
    _, c = run_scenario(tmp_path, TUNED)
    profiles = sorted(r for (r,) in c.execute("SELECT DISTINCT profile FROM \"case\" WHERE status = 'ok'"))
    assert profiles == ["baseline", "baseline+r10"]
    env = dict(c.execute("SELECT key, value FROM environment").fetchall())
    tuned = json.loads(env["sysctl.tuning.r10"])["read_back"]
    plain = json.loads(env["sysctl.tuning.default"])["read_back"]
    # read back from /proc/sys inside each namespace while the tuning was applied, and the kernel default
    assert {h: v["net.ipv4.tcp_reordering"] for h, v in tuned.items()} == {"h1": "10", "h2": "10"}
    assert {h: v["net.ipv4.tcp_reordering"] for h, v in plain.items()} == {"h1": "3", "h2": "3"}
    assert (
        Path("/proc/sys/net/ipv4/tcp_reordering").read_text().strip() == "3"
    )  # the machine's own: untouched
