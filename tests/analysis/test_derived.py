"""What the analysis derives from a run's samples beyond one metric (analysis/analyze.py): parallel scaling
(goodput of N streams over one), CPU efficiency (goodput per daemon CPU-core, client + server), the daemons'
CPU and memory per role, and the order a metric's rows are shown in. The reference is the store read with
sqlite3 and worked through with numpy and scipy's bootstrap (drawn as the analysis draws: its seed and
resample count), not the analysis' own grouping."""

from __future__ import annotations

import sqlite3
from collections import defaultdict

import numpy as np
import pytest
from scipy import stats as sst
from stat_refs import ratio_ref
from synthetic_runs import make_run

from tunnelbench.analysis.analyze import Analysis, analyze, load_run
from tunnelbench.analysis.stats import N_RESAMPLES, SEED
from tunnelbench.store import DB_NAME

RUN = "20260101-000000-tbderi"
N = 5


@pytest.fixture
def run(tmp_path) -> tuple[Analysis, dict]:
    """Per test, not per module: a mutation tool maps the analysis to the tests that call it."""
    d = make_run(
        tmp_path,
        RUN,
        {"internal": (2000, 40), "fastvpn": (900, 20), "slowvpn": (300, 10)},
        n=N,
    )
    con = sqlite3.connect(f"file:{d / DB_NAME}?mode=ro", uri=True)
    rows = con.execute(
        'SELECT c.id, c.vpn, c.label, c.client, c.server, m.name, m.host, m.value FROM metric m JOIN "case" c '
        "ON c.id = m.case_id WHERE c.status = 'ok' ORDER BY c.id"
    ).fetchall()
    con.close()
    cases: dict[int, dict] = defaultdict(dict)
    for cid, vpn, label, client, server, name, host, value in rows:
        c = cases[cid]
        c.update(vpn=vpn, label=label, client=client, server=server)
        c[(name, host)] = value
    return analyze([load_run(d)]), cases


def bca(x: list[float], stat=np.median) -> tuple[float, float]:
    r = sst.bootstrap(
        (np.asarray(x),), stat, method="BCa", n_resamples=N_RESAMPLES, rng=np.random.default_rng(SEED)
    )
    return float(r.confidence_interval.low), float(r.confidence_interval.high)


def values(cases: dict, vpn: str, label: str, key: tuple) -> list[float]:
    return [c[key] for c in cases.values() if c["vpn"] == vpn and c["label"] == label and key in c]


def test_parallel_scaling_is_the_ratio_of_medians_with_its_interval(run):
    a, cases = run
    got = {(s.variant, s.label): s for s in a.scaling}
    assert set(got) == {(v, "tcp-p4") for v in ("internal", "fastvpn", "slowvpn")}
    for (vpn, _label), s in got.items():
        p4 = values(cases, vpn, "tcp-p4", ("goodput_mbps", None))
        one = values(cases, vpn, "tcp", ("goodput_mbps", None))

        value, lo, hi = ratio_ref(p4, one)
        assert s.value == pytest.approx(value, rel=1e-12)
        assert (s.lo, s.hi) == pytest.approx((lo, hi), rel=1e-9)
        assert (s.profile, s.n, s.unit, s.note) == ("baseline", N, "×", "4 streams / 1 stream")


def test_cpu_efficiency_is_goodput_per_daemon_core_of_client_and_server(run):
    a, cases = run
    got = {(e.variant, e.label): e for e in a.efficiency}
    # internal runs no daemon: no CPU, no efficiency; the ping cases have no goodput
    assert set(got) == {(v, lb) for v in ("fastvpn", "slowvpn") for lb in ("tcp", "tcp-p4")}
    for (vpn, label), e in got.items():
        per_case = [
            c[("goodput_mbps", None)]
            / ((c[("daemon_cpu_pct", c["client"])] + c[("daemon_cpu_pct", c["server"])]) / 100)
            for c in cases.values()
            if c["vpn"] == vpn and c["label"] == label
        ]
        assert len(per_case) == N and e.n == N
        assert e.value == pytest.approx(np.median(per_case), rel=1e-12)
        assert (e.lo, e.hi) == pytest.approx(bca(per_case), rel=1e-9)
        assert (e.unit, e.note) == ("Mbit/s per core", "client + server daemon CPU")


def test_daemon_cpu_and_memory_per_role(run):
    a, cases = run
    got = {(u.variant, u.label): u for u in a.usage}
    assert set(got) == {(v, lb) for v in ("fastvpn", "slowvpn") for lb in ("tcp", "tcp-p4")}
    for (vpn, label), u in got.items():
        mine = [c for c in cases.values() if c["vpn"] == vpn and c["label"] == label]
        for desc, role in ((u.cpu_client, "client"), (u.cpu_server, "server")):
            cpu = [c[("daemon_cpu_pct", c[role])] for c in mine]
            assert desc is not None and desc.n == N and desc.median == pytest.approx(np.median(cpu))
            assert (desc.ci_lo, desc.ci_hi) == pytest.approx(bca(cpu), rel=1e-9)
        assert u.rss_client_mb == max(c[("daemon_rss_mb", c["client"])] for c in mine) == 20.0
        assert u.rss_server_mb == max(c[("daemon_rss_mb", c["server"])] for c in mine) == 22.0


def test_a_metrics_rows_are_the_baseline_then_the_ranking_then_the_rest(run):
    a, cases = run
    f = a.family("baseline", "tcp", "goodput_mbps")
    assert f is not None and f.tiering is not None
    # higher is better: fastvpn (900) before slowvpn (300); the baseline leads as the reference, untiered
    assert f.order() == ["internal", "fastvpn", "slowvpn"] and f.tier_of("internal") is None
    rtt = a.family("baseline", "ping", "rtt_p50_ms")
    assert rtt is not None
    med = {
        v: float(np.median(values(cases, v, "ping", ("rtt_p50_ms", None)))) for v in ("fastvpn", "slowvpn")
    }
    assert rtt.order()[0] == "internal" and rtt.order()[1:] == sorted(med, key=med.get)  # lower is better
