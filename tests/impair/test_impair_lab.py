"""Known-answer tests of the impaired path, the same ones for both backends: the native engine (here) and
the kernel's netem (in the full-kernel lane, scripts/kernel-lane, where the kernel has netem); and
fail-closed behaviour when the engine dies."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from conftest import emulated_cpu, tb, timer_lateness
from scipy import stats as sst

from tunnelbench.impair.backend import NativeBackend, impaird_binary
from tunnelbench.impair.calibrate import calibrate, measure_base, tcp_rate
from tunnelbench.impair.profiles import GilbertElliott, Profile
from tunnelbench.impair.session import impair_lab
from tunnelbench.lab.journaling import process_alive

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture(scope="module", params=["native", pytest.param("netem", marks=pytest.mark.kernel)])
def path(request, tmp_path_factory):
    from conftest import lab_missing

    why = lab_missing()
    if why:
        pytest.skip(why)
    if request.param == "native" and impaird_binary() is None:
        pytest.fail(
            "native engine not built: cargo build --release in native/impaird (scripts/setup.sh does it)"
        )
    with impair_lab(tmp_path_factory.mktemp("impair"), backend=request.param) as (lab, be):
        assert be.name == request.param
        if isinstance(be, NativeBackend):
            be.seed = 20261122  # reproducible draws: a 95% interval misses 1 time in 20 by design
        h1, h2 = lab.hosts
        base = measure_base(h1, h2, lab.run_dir)
        yield lab, be, base


def check(path, profile: Profile, quantity: str, probes: int = 4000, interval_us: int = 500):
    lab, be, base = path
    h1, h2 = lab.hosts
    be.apply(profile)
    try:
        cal = calibrate(be, profile, h1, h2, lab.run_dir, base, count=probes, interval_us=interval_us)
    finally:
        be.clear()
    (c,) = [c for c in cal.checks if c.quantity == quantity]
    return c, cal


def z_of(path) -> float:
    """How many standard errors a reference interval spans. Only the native engine's draws are seeded, so only
    there is a 95% interval (1.96) reproducible; netem's unseeded draws miss one 1 time in 20 (CI saw a
    Gilbert-Elliott run at 4.62% against 3.85%, 2.2 s.d.), so there the bar is 99.9% (3.29)."""
    return 1.959964 if isinstance(path[1], NativeBackend) else 3.290527


def share_within(c, expected: float, n: int, z: float, lag1: float = 0.0) -> bool:
    """The measured share (c.measured, %) is within z standard errors of `expected` (a fraction) over n draws
    whose 0/1 series has lag-1 correlation `lag1` (variance times (1 + lag1) / (1 - lag1), worked out by hand
    for a two-state chain): a reference the product's own interval (c.ci_low, c.ci_high, c.ok) is not."""
    se = math.sqrt(expected * (1 - expected) / n * (1 + lag1) / (1 - lag1))
    return abs(c.measured / 100 - expected) <= z * se


def _p50(cal) -> float:
    (d,) = [x for x in cal.checks if x.quantity == "one-way delay mean"]
    return float(d.detail.split("p50 ")[1].split(",")[0])


def test_delay_25ms_each_way_gives_rtt_within_2pct(path):
    # Two references, both measured here: this machine's timer lateness (tests/conftest.py), and the same
    # path under a 1 ms profile just before. A release is a timer, so a loaded host or the kernel lane's TCG
    # is late by about the same for 1 ms as for 25 ms (seen under TCG: one-way p50 27.54 ms for 25 while
    # userspace sleeps were late by only 0.49 ms: netem's own hrtimer is later than a nanosleep there); the
    # 24 ms between the two is what the delay itself adds, whatever the machine's stalls
    late = timer_lateness()
    ref_rtt, ref = check(path, Profile(name="d1", delay_ms=1), "ping RTT median", probes=1000)
    c, cal = check(path, Profile(name="d25", delay_ms=25), "ping RTT median", probes=1000)
    assert c.configured == pytest.approx(50 + path[2].rtt_ms)
    p50, p50_ref = _p50(cal), _p50(ref)
    # the delay added between 1 ms and 25 ms: 24 ms each way, 48 ms a round trip. Within 2% on a real CPU.
    # Under TCG a 25 ms release is later than a 1 ms one by more than the userspace lateness says, and by an
    # amount the emulator decides, not netem (kernel lane, machine idle: one-way p50 26.64 vs 1.42 ms, 1.2 ms
    # beyond the 24; 27.96 vs 1.66 ms, 2.3 ms beyond, in the third of three runs on one commit). So there the
    # lane checks netem's semantics, which no emulator stall can fake: the delay applied once per direction
    # (24, not 0 and not 48: 25% either side), never early (below)
    rel = 0.25 if emulated_cpu() else 0.02
    assert abs((p50 - p50_ref) - 24.0) <= rel * 24 + late.p50, (p50, p50_ref, late, cal, ref)
    assert abs((c.measured - ref_rtt.measured) - 48.0) <= rel * 48 + 2 * late.p50, (c, ref_rtt, late)
    # never early, on any machine: a release before its time is a bug no load explains
    assert p50 >= 25.0 - 0.5, cal
    if not emulated_cpu():
        # on a real CPU the absolute figures hold too, within the measured lateness
        assert abs(c.measured - c.configured) <= 0.02 * c.configured + 2 * late.p50, (cal, late)
        assert abs(p50 - 25.0) <= 0.5 + late.p50, (cal, late)
        # the mean carries the scheduling tail (stalls), which the median does not: its allowance is the tail's
        (d,) = [x for x in cal.checks if x.quantity == "one-way delay mean"]
        if late.p95 < 1.0:
            assert abs(d.measured - 25.0) <= 1.0 + late.mean, (d, late)


def test_random_loss_5pct_ci_covers_5pct(path):
    c, cal = check(path, Profile(name="l5", loss_pct=5), "loss", probes=8000, interval_us=250)
    assert c.configured == 5.0
    # independent losses: the count is binomial (scipy's interval of 8000 draws at 5%)
    level = 0.95 if isinstance(path[1], NativeBackend) else 0.999
    lo, hi = sst.binom.interval(level, 8000, 0.05)
    assert lo / 80 <= c.measured <= hi / 80, (c, lo / 80, hi / 80)
    assert c.ok, c


def test_gilbert_elliott_loss_and_burst_length(path):
    p = Profile(name="ge", gemodel=GilbertElliott(p_pct=1, r_pct=25))
    loss, cal = check(path, p, "loss", probes=20000, interval_us=100)
    # the chain's stationary loss 0.01 / 0.26, its loss series' lag-1 correlation 1 - 0.01 - 0.25
    assert share_within(loss, 0.01 / 0.26, 20000, z_of(path), lag1=0.74), loss
    assert loss.ok, loss
    (burst,) = [x for x in cal.checks if x.quantity == "mean loss burst"]
    assert burst.configured == pytest.approx(4.0)
    # k bursts of the model are geometric (r = 25%): their sum is k + a negative binomial (k, r) (scipy)
    k = int(burst.detail.split(" bursts")[0])
    tail = (1 - (0.95 if isinstance(path[1], NativeBackend) else 0.999)) / 2
    lo, hi = (k + sst.nbinom.ppf([tail, 1 - tail], k, 0.25)) / k
    assert lo <= burst.measured <= hi, (burst, lo, hi)
    assert burst.ok, burst


def test_reorder_25pct(path):
    c, cal = check(path, Profile(name="r25", delay_ms=10, reorder_pct=25), "reorder share", probes=4000)
    assert c.ok, c
    assert 22 < c.measured < 28


def test_correlated_reorder_keeps_its_rate(path):
    # The ten-VPN thesis's Medium reorder: 2.5% at 50% correlation. netem's correlated draw, passed through as is,
    # reordered 0 of 3000 probes on Debian's 6.1 kernel
    p = Profile(name="rc", delay_ms=4, reorder_pct=2.5, reorder_correlation_pct=50)
    c, cal = check(path, p, "reorder share", probes=4000)
    assert share_within(c, 0.025, 4000, z_of(path), lag1=0.5), c  # no loss: every probe is a draw
    assert c.ok, c


def test_correlated_loss_keeps_its_rate(path):
    # The ten-VPN thesis's Medium loss: 1% at 50% correlation. netem's own correlation would drop far fewer
    p = Profile(name="corr", loss_pct=1, loss_correlation_pct=50)
    c, cal = check(path, p, "loss", probes=20000, interval_us=100)
    assert c.configured == 1.0
    assert share_within(c, 0.01, 20000, z_of(path), lag1=0.5), c
    assert c.ok, c


def test_rate_limit_gives_90_to_100pct_goodput(path):
    # The limit must sit well below what the shaped path itself carries on this machine, measured here just
    # before: a shaper at the raw path's own rate (it never binds) costs per-packet work the raw path does not
    # (TBF segments every GSO super-packet; the engine queues each), and under TCG that work caps TCP below
    # the raw rate (kernel lane: raw >= 400 Mbit/s, yet 89.8 through TBF at 100). At a quarter of the shaped
    # path's capacity the limit is measured, not the CPU (same 90-100% bound, any machine)
    lab, be, _ = path
    raw = tcp_rate(*lab.hosts, seconds=2.0)
    be.apply(Profile(name="cap", rate_mbit=max(1, int(raw))))
    try:
        shaped = tcp_rate(*lab.hosts, seconds=2.0)
    finally:
        be.clear()
    rate = 100 if shaped >= 400 else max(5, int(shaped / 4))
    c, cal = check(path, Profile(name="rate", rate_mbit=rate), "TCP goodput at the rate limit")
    assert 0.9 * rate <= c.measured <= rate, (c, raw, shaped)


def test_engine_death_stops_traffic(tmp_path):
    if impaird_binary() is None:
        pytest.fail(
            "native engine not built: cargo build --release in native/impaird (scripts/setup.sh does it)"
        )
    with impair_lab(tmp_path, backend="native") as (lab, be):
        _engine_death_stops_traffic(lab, be)


def _engine_death_stops_traffic(lab, be):
    h1, h2 = lab.hosts
    be.apply(Profile(name="d5", delay_ms=5))
    try:
        assert h1.run(["ping", "-c3", "-i0.05", "-W1", h2.underlay_ip], check=False).returncode == 0
        assert be.health() is None
        os.kill(be.proc.pid, signal.SIGKILL)
        be.proc.wait(5)
        r = h1.run(["ping", "-c10", "-i0.05", "-W1", h2.underlay_ip], check=False)
        assert "10 packets transmitted, 0 received" in r.stdout, r.stdout
        assert "not running" in be.health()
    finally:
        be.clear()
    # cleared: the raw path works again
    assert h1.run(["ping", "-c2", "-i0.05", "-W1", h2.underlay_ip], check=False).returncode == 0


SCENARIO = """
name = "killengine"
vpns = ["internal"]
profiles = ["slow"]
[run]
repetitions = 2
retries = 1
drift_check_s = 0  # nor the path's drift (2 s a round)
[lab]
hosts = 2
[impair]
calibrate = false
tax_check_s = 0  # the engine's death is what is measured here, not its tax (9 s)
[impair.profiles.slow]
delay_ms = 5
[[workloads]]
name = "tcp"
duration_s = 4
omit_s = 0
"""


def test_killing_the_engine_mid_case_fails_the_case(tmp_path):
    if impaird_binary() is None:
        pytest.skip("native engine not built")
    scen = tmp_path / "s.toml"
    scen.write_text(SCENARIO)
    results = tmp_path / "results"
    p = subprocess.Popen([sys.executable, "-m", "tunnelbench.cli", "run", str(scen), "--results", str(results)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        run_dir = None
        while time.monotonic() < deadline:
            dbs = list(results.glob("*/results.sqlite"))
            if dbs:
                try:  # the file exists a moment before the store has created its tables
                    c = sqlite3.connect(dbs[0], timeout=5)
                    running = c.execute("SELECT COUNT(*) FROM \"case\" WHERE status='running'").fetchone()[0]
                    c.close()
                except sqlite3.Error:
                    running = 0
                if running:
                    run_dir = dbs[0].parent
                    break
            time.sleep(0.1)
        assert run_dir is not None, "no case started"
        time.sleep(1.0)  # mid-transfer
        entries = [json.loads(x) for x in (run_dir / "journal.jsonl").read_text().splitlines()]
        # argv may start with `taskset -c CPU` (CPU placement): the engine is the argument that names impaird
        (eng,) = [
            e
            for e in entries
            if e["kind"] == "process"
            and any(a.endswith("impaird") for a in e["argv"])
            and process_alive(e["pid"], e["start"])
        ]
        t_kill = time.monotonic()
        os.kill(eng["pid"], signal.SIGKILL)
        out, _ = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
    db = sqlite3.connect(run_dir / "results.sqlite")
    rows = db.execute(  # not the attempts set aside because the machine was busy (runner/guard.py)
        "SELECT repetition, attempt, status, error, ended FROM \"case\" WHERE status != 'disturbed' ORDER BY id"
    ).fetchall()
    failed = [r for r in rows if r[2] == "failed"]
    assert failed, rows
    assert "impaird" in failed[0][3] or "impairment engine" in failed[0][3]
    # the watchdog aborts the case within about a second, not at the tool's own timeout
    assert failed[0][4] - (time.time() - (time.monotonic() - t_kill)) < 10
    # the engine is restarted for the retry (repetition 1's second attempt), and the later case measures again
    assert sum(r[2] == "ok" for r in rows) == 2 and len(rows) == 3, rows
    assert "impaird" in out or "impairment engine" in out


MEDIUM = """
name = "medium-every-driver"
vpns = ["internal"]
[run]
repetitions = 1
[lab]
hosts = 2
[[workloads]]
name = "tcp"
duration_s = 3
omit_s = 0
[[workloads]]
name = "ping"
count = 50
interval_s = 0.02
"""


@pytest.mark.long  # 88 s: four VPNs under medium; test_ssh and the loss/delay tests here cover the parts
def test_run_profile_medium_with_every_first_issue_driver(tmp_path):
    """`tunnelbench run --profile medium` with internal and the four first-issue VPNs: the profile is
    calibrated on the raw path and stored, the backend recorded, and every case of every VPN measures."""
    from conftest import lab_missing

    from tunnelbench.catalog import DRIVERS

    if lab_missing():
        pytest.skip(lab_missing())
    if impaird_binary() is None:
        pytest.skip("native engine not built")
    vpns = ["internal", "wireguard-go", "nebula", "tinc", "openvpn"]
    missing = [v for v in vpns if not DRIVERS[v].availability().ok]
    assert not missing, f"scripts/setup.sh installs these from Debian: {missing}"
    scen = tmp_path / "s.toml"
    scen.write_text(MEDIUM)
    results = tmp_path / "results"
    r = tb("run", str(scen), "--profile", "medium", "--vpn", ",".join(vpns), "--results", str(results), "--no-html",
           timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run_dir,) = results.iterdir()
    db = sqlite3.connect(run_dir / "results.sqlite")
    rows = db.execute('SELECT vpn, label, profile, status FROM "case" WHERE attempt = 0').fetchall()
    assert sorted(rows) == sorted((v, lbl, "medium", "ok") for v in vpns for lbl in ("tcp", "ping")), rows
    env = dict(db.execute("SELECT key, value FROM environment").fetchall())
    assert env["impair.backend"] in ("native", "netem")
    cal = json.loads(env["calibration.medium"])
    assert cal["profile"] == "medium" and cal["checks"], cal
    (loss,) = [c for c in cal["checks"] if c["quantity"] == "loss"]
    assert loss["configured"] == pytest.approx(1.0), cal  # medium: 1% loss
    # the loss measured on the raw path: within the test's own bound around 1%, a two-sided 99.9% binomial
    # interval (z = 3.29) over the probes, widened by sqrt((1 + rho) / (1 - rho)) = sqrt(3) because medium's
    # losses are 50% correlated (fewer independent draws): 4000 probes give 1 +- 0.9%
    import math
    import re

    n = int(re.search(r"over (\d+) probes", loss["detail"])[1])
    assert n == 4000, loss  # [impair] calibration_probes' default
    half = 100 * 3.29 * math.sqrt(0.01 * 0.99 / n) * math.sqrt(3)
    assert abs(loss["measured"] - 1.0) <= half, (loss, half)
    # ... and the verdict: the loss check passed, and what the run printed agrees with the stored verdict
    assert loss["ok"] is True, loss
    assert ("OUT OF TOLERANCE" in r.stdout + r.stderr) == (cal["ok"] is False), (cal, r.stdout[-2000:])
    # the 4 ms each way is on every tunnel's path: the idle RTT of each VPN is at least 8 ms
    rtt = db.execute(
        "SELECT c.vpn, m.value FROM metric m JOIN \"case\" c ON c.id = m.case_id WHERE m.name = 'rtt_p50_ms'"
    ).fetchall()
    assert len(rtt) == len(vpns) and all(v >= 7.5 for _, v in rtt), rtt
    assert "profile medium" in r.stdout + r.stderr  # the calibration verdict is in the summary
