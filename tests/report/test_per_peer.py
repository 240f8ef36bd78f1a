"""Multi-host per-peer plots (issue 15 item 9, Nebula's benchmark blog): the report draws, per VPN, each peer's goodput over
time in each direction from the series the multihost workload stores (host = the peer), titled with that case's
Jain fairness index. Known answers: a hand-made store with distinct per-peer values, read back from the SVG."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from synthetic_runs import hand_store

from tunnelbench.analysis.analyze import analyze, load_run
from tunnelbench.core.results import Outcome, Sample, Series
from tunnelbench.report import full, plots
from tunnelbench.report.reading import Reading


def make_store(root: Path) -> Path:
    run = "r1"
    with hand_store(root) as (st, run_dir):
        for rep, fair in ((1, 0.875), (2, 0.5)):
            adir = run_dir / "cases" / "vpnA" / f"r{rep}"
            adir.mkdir(parents=True)
            cid = st.start_case(
                run, "vpnA", "baseline", "multihost", "multihost-bidir", {}, rep, 0, "h1", "h2", adir
            )
            out = Outcome(
                samples=[
                    Sample("stream_fairness", fair, "ratio"),
                    Sample("aggregate_goodput_mbps", 600, "Mbit/s"),
                ]
            )
            for d, base in (("tx", 100.0), ("rx", 50.0)):
                for k, peer in enumerate(("h2", "h3", "h4")):
                    out.series.append(
                        Series(
                            f"{d}_goodput_mbps",
                            "Mbit/s",
                            [(t, base * (k + 1)) for t in (1.0, 2.0, 3.0)],
                            peer,
                        )
                    )
            st.finish_case(cid, "ok", out)
    return run_dir


@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
def test_report_draws_each_peer_per_direction_with_the_cases_fairness(tmp_path):
    a = analyze([load_run(make_store(tmp_path))])
    (svg,) = full._per_peer_plots(a, "baseline", "multihost-bidir")
    # the first repetition's case, with its own fairness (0.875, not repetition 2's 0.5)
    assert "repetition 1" in svg and "Jain fairness 0.875" in svg
    assert "from the one host to each peer" in svg and "from each peer into the one host" in svg
    for peer in ("h2", "h3", "h4"):
        assert re.search(rf">\s*{peer}\s*<|{peer}</", svg) or f"<!-- {peer} -->" in svg
    ctx = full.build_context(Reading.of(a))
    assert any("Jain fairness 0.875" in s for s in ctx["tseries"])


def test_per_peer_plot_skips_empty_directions():
    assert plots.per_peer({}, "t") is None
    svg = plots.per_peer({"tx": {"h2": [(1.0, 5.0), (2.0, 6.0)]}}, "only tx")
    assert svg is not None and "from the one host to each peer" in svg and "into the one host" not in svg
