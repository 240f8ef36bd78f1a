"""A stored run is read by what it stored, not by today's code: a metric's definition keyed by (workload, name),
the stream count of a parallel TCP case from its stored parameters, and the order of a workload's headline
metrics. Hand-made stores; the reference is what each test wrote into them."""

from __future__ import annotations

from pathlib import Path

from synthetic_runs import hand_store

from tunnelbench.analysis.analyze import analyze, load_run, metric_spec
from tunnelbench.analysis.compare import compare_runs
from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome, Sample
from tunnelbench.report.history import build_history


def _cases(st, run_id: str, run_dir: Path, rows: list[tuple[str, str, dict, str, list[float]]]) -> None:
    """(workload, label, params, metric, values per repetition) as ok cases of vpnA under baseline."""
    for wl, label, params, metric, values in rows:
        for rep, v in enumerate(values, start=1):
            adir = run_dir / "cases" / label / f"r{rep}"
            adir.mkdir(parents=True, exist_ok=True)
            cid = st.start_case(run_id, "vpnA", "baseline", wl, label, params, rep, 0, "h1", "h2", adir)
            st.finish_case(cid, "ok", Outcome(samples=[Sample(metric, v, "Mbit/s")]))


def test_compare_takes_each_groups_direction_from_its_own_workload(tmp_path):
    """goodput_sender_mbps is two metrics: "higher" in tcp (the sender's goodput), "none" in udp (the offered
    rate). Both halve from A to B: tcp's is a change for the worse, udp's only "changed"."""
    runs = []
    for rid, scale in (("a", 1.0), ("b", 0.5)):
        with hand_store(tmp_path, run_id=rid) as (st, d):
            vals = [scale * x for x in (100.0, 101.0, 99.0, 100.5, 99.5, 100.2)]
            _cases(st, rid, d, [("tcp", "tcp", {}, "goodput_sender_mbps", vals),
                                ("udp", "udp", {}, "goodput_sender_mbps", vals)])  # fmt: skip
        runs.append(load_run(d))
    cmp = compare_runs(*runs, metrics=["goodput_sender_mbps"])
    by = {c.label: c for c in cmp.changes}
    assert (by["tcp"].better, by["udp"].better) == ("higher", "none"), cmp.changes
    assert by["tcp"].verdict == "REGRESSION" and by["udp"].verdict == "changed"
    for r in runs:
        r.store.close()


def test_a_stored_run_is_read_by_its_own_definitions_only(tmp_path):
    """A run that stored its definitions is not completed from today's code: a metric it did not define has no
    direction, whatever today's tcp says; a run from before definitions were stored reads today's."""
    with hand_store(tmp_path, run_id="r1") as (st, d):
        st.set_metric_specs("r1", [("tcp", MetricSpec("goodput_mbps", "Mbit/s", "higher", "then"), 1)])
    run = load_run(d)
    assert metric_spec("tcp", "goodput_mbps", run) == ("higher", "then")
    assert metric_spec("tcp", "retransmit_rate", run) == ("none", "")  # today: "lower"
    assert run.headline("tcp") == ("goodput_mbps",)
    run.store.close()
    with hand_store(tmp_path, run_id="r2") as (st, d2):
        pass
    old = load_run(d2)
    assert old.specs == {} and metric_spec("tcp", "retransmit_rate", old)[0] == "lower"
    assert metric_spec("udp", "goodput_sender_mbps", old)[0] == "none"
    assert metric_spec("tcp", "goodput_sender_mbps", old)[0] == "higher"
    old.store.close()


def test_parallel_scaling_reads_the_stream_count_from_the_stored_parameters(tmp_path):
    """The label says nothing the analysis parses: a case labelled "bulk" with streams = 8 scales against the
    one-stream case labelled "single" (goodput 800 over 100: 8x), and its note says 8 streams."""
    with hand_store(tmp_path) as (st, d):
        _cases(st, "r1", d, [("tcp", "single", {"streams": 1, "engine": "iperf3"}, "goodput_mbps", [100.0] * 4),
                             ("tcp", "bulk", {"streams": 8, "engine": "iperf3"}, "goodput_mbps", [800.0] * 4),
                             ("tcp", "tcp-p4", {"streams": 1, "engine": "iperf3", "x": 1}, "retransmit_rate",
                              [0.1] * 4)])  # fmt: skip
    run = load_run(d)
    (s,) = analyze([run]).scaling
    assert (s.label, s.value, s.note) == ("bulk", 8.0, "8 streams / 1 stream")
    run.store.close()


def test_history_orders_metrics_as_the_run_defined_the_headline(tmp_path):
    """The run stored retransmit_rate as tcp's first headline metric and goodput second: the history page
    lists them in that order (today's tcp has goodput first)."""
    with hand_store(tmp_path) as (st, d):
        st.set_metric_specs("r1", [("tcp", MetricSpec("goodput_mbps", "Mbit/s", "higher", ""), 2),
                                   ("tcp", MetricSpec("retransmit_rate", "ratio", "lower", ""), 1)])  # fmt: skip
        _cases(st, "r1", d, [("tcp", "tcp", {}, "goodput_mbps", [100.0, 101.0]),
                             ("tcp", "tcp", {}, "retransmit_rate", [0.1, 0.2])])  # fmt: skip
    run = load_run(d)
    h = build_history([run])
    assert [t.metric for t in h.trends] == ["retransmit_rate", "goodput_mbps"]
    run.store.close()
