from __future__ import annotations

import sqlite3

import tunnelbench.catalog  # noqa: F401 - declares every workload's metrics, which the store checks
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


def test_the_per_metric_table_medians_ratios_cpu_and_failures(tmp_path):
    """`report --full`'s table, from the run's one analysis: the numbers fill() stored by hand."""
    import io

    from rich.console import Console

    from tunnelbench.analysis.analyze import analyze, load_run
    from tunnelbench.report.terminal import summary_table

    s = Store(tmp_path / "results.sqlite")
    fill(s)
    s.close()
    run = load_run(tmp_path, "r1")
    a = analyze([run])
    assert run.failures() == {("wireguard-go", "baseline", "tcp"): 1}
    buf = io.StringIO()
    Console(file=buf, width=200).print(summary_table(a, run))
    rows = [
        [c.strip() for c in line.split("│")[1:-1]]
        for line in buf.getvalue().splitlines()
        if "goodput" in line
    ]
    # VPN, workload, metric, median, min–max, n, × internal, CPU% cli/srv (medians of 51-53 and 40), RSS MiB (max)
    assert rows == [
        ["internal 1.0", "tcp", "goodput_mbps", "1,000", "900–1,100", "3", "", "–", "–"],
        [
            "wireguard-go 1.0",
            "tcp (1 failed)",
            "goodput_mbps",
            "450",
            "400–500",
            "3",
            "0.450",
            "52.0/40.0",
            "23.0",
        ],
    ], buf.getvalue()
    run.store.close()


def test_a_run_is_judged_by_the_metric_definitions_it_stored(tmp_path):
    """A run stores what each metric meant when it ran (direction, description, the workload's headline
    choice in order); reports read those, so a later release that redefines a metric does not rejudge an old
    run. A run from before specs were stored is read with today's definitions."""
    from tunnelbench.analysis.analyze import analyze, load_run, metric_spec
    from tunnelbench.core.metrics import MetricSpec

    s = Store(tmp_path / "results.sqlite")
    fill(s)
    s.close()
    old = load_run(tmp_path, "r1")  # nothing stored: today's tcp workload decides
    assert old.specs == {} and metric_spec("tcp", "goodput_mbps", old)[0] == "higher"
    assert old.is_headline("tcp", "goodput_mbps")
    old.store.close()
    s = Store(tmp_path / "results.sqlite")
    s.set_metric_specs("r1", [("tcp", MetricSpec("goodput_mbps", "Mbit/s", "lower", "as then defined"), 0),
                              ("tcp", MetricSpec("tb_then_b", "ms", "lower", ""), 2),
                              ("tcp", MetricSpec("tb_then_a", "ms", "lower", ""), 1),
                              ("", MetricSpec("daemon_cpu_pct", "%", "none", "then"), 0)])  # fmt: skip
    s.set_metric_specs(
        "r1", [("tcp", MetricSpec("goodput_mbps", "Mbit/s", "higher", "now"), 1)]
    )  # kept: first
    s.close()
    run = load_run(tmp_path, "r1")
    assert metric_spec("tcp", "goodput_mbps", run) == ("lower", "as then defined")
    assert metric_spec("tcp", "daemon_cpu_pct", run) == ("none", "then")  # the runner's own, for any workload
    assert run.headline("tcp") == ("tb_then_a", "tb_then_b") and not run.is_headline("tcp", "goodput_mbps")
    a = analyze([run])
    assert a.groups[("wireguard-go", "baseline", "tcp", "goodput_mbps")].better == "lower"
    assert a.headline_families() == []  # the stored headline metrics have no values here
    run.store.close()
