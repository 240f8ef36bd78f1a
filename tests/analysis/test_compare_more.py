"""`compare` on lower-is-better metrics (ping RTT) and on VPN names: an RTT increase beyond the threshold is a
REGRESSION (exit 1), a decrease an "improvement" (exit 0), a significant increase within the threshold only
"worse"; a VPN renamed between runs is listed as only in A / only in B, never compared with another VPN's
numbers, unless the caller maps the names (vpn_map).

Synthetic runs (no lab) with RTTs drawn here; the reference is numpy on the same drawn values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tb

from tunnelbench.analysis.analyze import load_run
from tunnelbench.analysis.compare import compare_runs
from tunnelbench.core.results import Outcome, Sample
from tunnelbench.store import DB_NAME, Store


def ping_run(root: Path, run_id: str, rtts: dict[str, list[float]]) -> Path:
    """A run folder with one ping case per repetition and VPN: rtt_p50_ms = the given value, rtt_p99_ms 1.5x."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    st = Store(run_dir / DB_NAME)
    st.begin_run(run_id, run_id[-6:], 'name = "rtt"\n', "0.1.0")
    for vpn, values in rtts.items():
        st.set_vpn(run_id, vpn, "1.0", "ok")
        for rep, v in enumerate(values, start=1):
            adir = run_dir / "cases" / vpn / "baseline" / "ping" / f"r{rep}a0"
            adir.mkdir(parents=True)
            cid = st.start_case(run_id, vpn, "baseline", "ping", "ping", {}, rep, 0, "h1", "h2", adir)
            st.finish_case(
                cid,
                "ok",
                Outcome(samples=[Sample("rtt_p50_ms", v, "ms"), Sample("rtt_p99_ms", 1.5 * v, "ms")]),
            )
    st.end_run(run_id, "ok")
    st.close()
    return run_dir


def draw(mean: float, sd: float, seed: int, n: int = 8) -> list[float]:
    return [float(x) for x in np.random.default_rng(seed).normal(mean, sd, n)]


@pytest.mark.slow  # 4-8 s (the CLI or a report in a subprocess): out of the fast lane
def test_rtt_up_is_a_regression_and_down_an_improvement(tmp_path):
    a_vals = {
        "upvpn": draw(10, 0.3, 1),
        "downvpn": draw(10, 0.3, 2),
        "samevpn": draw(10, 0.3, 3),
        "nudgevpn": draw(10, 0.05, 4),
    }
    b_vals = {
        "upvpn": draw(13, 0.4, 11),
        "downvpn": draw(7, 0.2, 12),
        "samevpn": draw(10, 0.3, 13),
        "nudgevpn": draw(10.5, 0.05, 14),
    }
    a = ping_run(tmp_path, "20260101-000000-tbaaaa", a_vals)
    b = ping_run(tmp_path, "20260101-000001-tbbbbb", b_vals)
    cmp = compare_runs(load_run(a), load_run(b))
    got = {(c.vpn, c.metric): c for c in cmp.changes}
    assert len(got) == 8 and all(c.gated and c.better == "lower" for c in cmp.changes)
    for (vpn, metric), c in got.items():
        scale = 1.5 if metric == "rtt_p99_ms" else 1.0
        ma, mb = np.median(a_vals[vpn]) * scale, np.median(b_vals[vpn]) * scale
        assert (c.median_a, c.median_b) == (pytest.approx(ma), pytest.approx(mb))
        assert c.change_pct == pytest.approx((mb / ma - 1) * 100)
        assert c.ci_lo_pct <= c.change_pct <= c.ci_hi_pct
    verdicts = {k: c.verdict for k, c in got.items()}
    assert verdicts == {
        **{("upvpn", m): "REGRESSION" for m in ("rtt_p50_ms", "rtt_p99_ms")},  # ~+30%: worse for RTT
        **{("downvpn", m): "improvement" for m in ("rtt_p50_ms", "rtt_p99_ms")},  # ~-30%
        **{("samevpn", m): "no significant change" for m in ("rtt_p50_ms", "rtt_p99_ms")},
        **{("nudgevpn", m): "worse (within threshold)" for m in ("rtt_p50_ms", "rtt_p99_ms")},  # +5% < 10%
    }, verdicts
    assert got[("upvpn", "rtt_p50_ms")].ci_lo_pct > 10 and got[("downvpn", "rtt_p50_ms")].ci_hi_pct < -10
    assert {(c.vpn, c.metric) for c in cmp.regressions} == {("upvpn", "rtt_p50_ms"), ("upvpn", "rtt_p99_ms")}
    # A <-> B swapped: the same data read the other way round
    back = {(c.vpn, c.metric): c.verdict for c in compare_runs(load_run(b), load_run(a)).changes}
    assert back[("upvpn", "rtt_p50_ms")] == "improvement" and back[("downvpn", "rtt_p50_ms")] == "REGRESSION"
    # the CLI: exit 1 on the RTT regression; a run with only the improvement passes the gate
    res = tb("compare", str(a), str(b))
    assert res.returncode == 1, res.stdout + res.stderr
    rows = {line.split("│")[1].strip(): line for line in res.stdout.splitlines() if "rtt_p50_ms" in line}
    assert "REGRESSION" in rows["upvpn"] and "improvement" in rows["downvpn"], res.stdout
    assert "2 significant regression(s) beyond 10%" in res.stdout
    only_down_a = ping_run(tmp_path, "20260101-000002-tbcccc", {"downvpn": a_vals["downvpn"]})
    only_down_b = ping_run(tmp_path, "20260101-000003-tbdddd", {"downvpn": b_vals["downvpn"]})
    res = tb("compare", str(only_down_a), str(only_down_b), "--json", str(tmp_path / "c.json"))
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["regressions"] == 0 and {c["verdict"] for c in doc["changes"]} == {"improvement"}
    assert "no significant regression beyond 10%" in res.stdout


@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
def test_a_renamed_vpn_is_only_in_a_and_only_in_b_not_compared(tmp_path):
    """A's "wg" is B's "wireguard" (B also 40% slower on RTT): without a mapping nothing of theirs is matched
    (no change row, no verdict, the gate passes on the VPN both runs share) and both are listed; mapped
    (vpn_map), they are compared under B's name and the RTT regression is found."""
    a = ping_run(tmp_path, "20260101-000000-tbaaaa", {"wg": draw(10, 0.3, 1), "internal": draw(1, 0.02, 2)})
    b = ping_run(
        tmp_path, "20260101-000001-tbbbbb", {"wireguard": draw(14, 0.3, 3), "internal": draw(1, 0.02, 4)}
    )
    cmp = compare_runs(load_run(a), load_run(b))
    assert {c.vpn for c in cmp.changes} == {"internal"}
    assert cmp.only_a == [("wg", "baseline", "ping")] and cmp.only_b == [("wireguard", "baseline", "ping")]
    assert not cmp.failed_b and not cmp.gate_failed
    res = tb("compare", str(a), str(b))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "only in A: wg · baseline · ping" in res.stdout
    assert "only in B: wireguard · baseline · ping" in res.stdout
    assert not any(
        line.split("│")[1].strip() in ("wg", "wireguard")
        for line in res.stdout.splitlines()
        if line.count("│") > 3
    )
    mapped = compare_runs(load_run(a), load_run(b), vpn_map={"wg": "wireguard"})
    assert mapped.only_a == [] and mapped.only_b == []
    assert {(c.vpn, c.metric) for c in mapped.regressions} == {
        ("wireguard", "rtt_p50_ms"),
        ("wireguard", "rtt_p99_ms"),
    }
    c = next(c for c in mapped.changes if (c.vpn, c.metric) == ("wireguard", "rtt_p50_ms"))
    assert c.median_a == pytest.approx(np.median(draw(10, 0.3, 1)))
    assert c.median_b == pytest.approx(np.median(draw(14, 0.3, 3)))
