from __future__ import annotations

import sqlite3

import pytest

from tunnelbench.analysis.summary import Stat, summarize
from tunnelbench.core.results import Outcome, Series
from tunnelbench.store import Store


def fill(store: Store, run_id: str = "r1") -> None:
    store.begin_run(run_id, "tb0000", "name='t'", "test")
    for vpn, goodputs in (("internal", [1000, 1100, 900]), ("wireguard-go", [400, 500, 450])):
        store.set_vpn(run_id, vpn, "1.0", "ok")
        for rep, g in enumerate(goodputs, start=1):
            cid = store.start_case(
                run_id,
                vpn,
                "baseline",
                "tcp",
                "tcp",
                {"duration_s": 5},
                rep,
                0,
                "h1",
                "h2",
                store.path.parent,
            )
            out = Outcome()
            out.add("goodput_mbps", g)
            if vpn != "internal":
                out.add("daemon_cpu_pct", 50 + rep, "h1")
                out.add("daemon_cpu_pct", 40, "h2")
                out.add("daemon_rss_mb", 20 + rep, "h1")
            out.series.append(Series("goodput_mbps", "Mbit/s", [(1.0, g), (2.0, g)]))
            store.finish_case(cid, "ok", out)
    cid = store.start_case(
        run_id, "wireguard-go", "baseline", "tcp", "tcp", {}, 4, 0, "h1", "h2", store.path.parent
    )
    store.finish_case(cid, "failed", error="iperf3: boom")


def test_finished_cases_survive_without_clean_close(tmp_path):
    path = tmp_path / "results.sqlite"
    s = Store(path)
    fill(s)
    # no close(): a crash right after finish_case must keep the case (committed at once)
    other = sqlite3.connect(path)
    n_ok = other.execute("SELECT COUNT(*) FROM \"case\" WHERE status='ok'").fetchone()[0]
    n_metric = other.execute("SELECT COUNT(*) FROM metric").fetchone()[0]
    assert n_ok == 6 and n_metric == 3 + 3 * 4
    assert other.execute("SELECT COUNT(*) FROM series").fetchone()[0] == 12


def test_summary_medians_ratios_cpu_and_failures(tmp_path):
    s = Store(tmp_path / "results.sqlite")
    fill(s)
    summ = summarize(s, "r1")
    rows = {(r.vpn, r.metric): r for r in summ.rows}
    wg = rows[("wireguard-go", "goodput_mbps")]
    assert wg.stat.median == 450 and wg.stat.n == 3 and (wg.stat.lo, wg.stat.hi) == (400, 500)
    assert wg.ratio == pytest.approx(450 / 1000)
    assert rows[("internal", "goodput_mbps")].ratio is None
    assert wg.cpu_client.median == 52 and wg.cpu_server.median == 40
    assert wg.rss_max_mb == 23
    assert summ.failures == {("wireguard-go", "baseline", "tcp"): 1}


def test_stat_of_values():
    st = Stat.of([1.0, 2.0, 3.0, 4.0])
    assert st.median == 2.5 and st.mean == 2.5 and st.sd == pytest.approx(1.2909944)
    assert st.cv == pytest.approx(1.2909944 / 2.5)
