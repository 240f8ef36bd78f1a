"""The UDP ceiling search (issue 19): the pure search against synthetic probes with a known ceiling, the
workload's declarations, and a lab run over the no-VPN path shaped to a known rate by the impairment
backend's rate limit (TBF on the router), where the true ceiling is the configured rate."""

from __future__ import annotations

import json
import math
import random
import time

import pytest

from tunnelbench.catalog import WORKLOADS
from tunnelbench.workloads.base import CaseContext, WorkloadError
from tunnelbench.workloads.udp_ceiling import (
    MAX_MTU_RETRIES,
    PROBE_OVERHEAD_S,
    ProbeResult,
    UdpCeiling,
    UdpCeilingParams,
    search_ceiling,
)


class Path_:
    """A synthetic path: loss 0 up to `ceiling` Mbit/s, `above` % beyond it; every probe is counted."""

    def __init__(self, ceiling: float, above: float = 5.0):
        self.ceiling, self.above = ceiling, above
        self.rates: list[float] = []

    def __call__(self, rate: float) -> ProbeResult:
        self.rates.append(rate)
        loss = 0.0 if rate <= self.ceiling else self.above
        return ProbeResult(loss, rate * (1 - loss / 100), rate)


def probes_bound(start: float, ceiling: float, res_pct: float, repeats: int) -> int:
    """Rates a doubling/halving bracket then log bisection needs, each at most `repeats` probes."""
    bracket = math.ceil(abs(math.log2(ceiling / start))) + 2
    bisect = math.ceil(math.log2(math.log(2) / math.log(1 + res_pct / 100))) + 1
    return (bracket + bisect) * repeats


@pytest.mark.parametrize("ceiling", [437.0, 3.3, 100.0, 99.9, 2900.0])
def test_search_finds_a_known_ceiling_within_the_resolution(ceiling):
    path = Path_(ceiling)
    r = search_ceiling(path, repeats=3, start_mbit=100, resolution_pct=5, max_probes=200)
    assert r.stop == "resolution" and r.complete
    # the answer passed and lies under the true ceiling; the failing rate above it, within 5%
    assert r.rate_mbit <= ceiling < r.fail_mbit <= r.rate_mbit * 1.05 + 1e-9
    assert 0 < r.bracket_pct <= 5
    # every repeat of the answer ran and passed; the failing rate failed once and was not repeated
    assert [p.repeat for p in r.at(r.rate_mbit)] == [0, 1, 2] and all(p.passed for p in r.at(r.rate_mbit))
    assert len(r.at(r.fail_mbit)) == 1 and r.at(r.fail_mbit)[0].why == "loss"
    assert len(path.rates) == len(r.probes) <= probes_bound(100, ceiling, 5, 3)


def test_every_repeat_must_pass():
    """One noisy repeat in three fails a rate: the ceiling found is below the rates where that happens."""
    calls: dict[float, int] = {}

    def noisy(rate: float) -> ProbeResult:
        calls[rate] = calls.get(rate, 0) + 1
        if rate <= 200:
            return ProbeResult(0.0)
        # above 200 Mbit/s the first two repeats are clean and the third loses 3%
        return ProbeResult(3.0 if calls[rate] == 3 else 0.2)

    r = search_ceiling(noisy, repeats=3, start_mbit=100, resolution_pct=5)
    assert 200 / 1.05 <= r.rate_mbit <= 200 < r.fail_mbit
    failing = r.at(r.fail_mbit)
    assert [p.passed for p in failing] == [True, True, False]


def test_loss_exactly_at_the_target_passes_and_nan_fails():
    r = search_ceiling(lambda rate: ProbeResult(1.0), repeats=2, start_mbit=10, hi_mbit=40)
    assert r.rate_mbit == 40 and r.stop == "hi_mbit" and r.fail_mbit is None and r.complete
    r = search_ceiling(lambda rate: ProbeResult(math.nan), repeats=2, start_mbit=10, lo_mbit=5)
    assert r.rate_mbit == 0 and r.fail_mbit == 5


def test_a_sender_that_cannot_offer_the_rate_fails_it():
    # the path never loses, but the sender tops out at 300 Mbit/s: rates it cannot offer are not passes
    r = search_ceiling(lambda rate: ProbeResult(0.0, min(rate, 300), min(rate, 300)), start_mbit=100)
    assert 300 / 1.05 <= r.rate_mbit <= 300 / 0.9 and r.stop == "resolution"
    assert r.at(r.fail_mbit)[-1].why == "sender"


def test_nothing_passes_gives_zero_not_an_exception():
    path = Path_(0.5)
    r = search_ceiling(path, start_mbit=100, lo_mbit=1, repeats=3)
    assert r.rate_mbit == 0 and r.fail_mbit == 1 and r.stop == "lo_mbit" and r.complete
    assert r.bracket_pct is None
    # 100, 50, 25, 12.5, 6.25, 3.125, 1.562, 1: one failing probe each
    assert len(r.probes) == 8 and not any(p.passed for p in r.probes)
    # bounds that are not round numbers still end the search (rates are rounded to 4 digits)
    r = search_ceiling(Path_(0.1), start_mbit=9.87654, lo_mbit=1.23456, hi_mbit=9.87654, max_probes=100)
    assert r.stop == "lo_mbit" and r.fail_mbit == 1.235 and len(r.probes) == 4
    r = search_ceiling(Path_(1e9), start_mbit=1.23456, lo_mbit=1.23456, hi_mbit=9.87654, max_probes=100)
    assert r.stop == "hi_mbit" and r.rate_mbit == 9.877


def test_max_probes_and_deadline_stop_the_search():
    path = Path_(437)
    r = search_ceiling(path, start_mbit=100, max_probes=7)
    assert len(path.rates) == 7 and r.stop == "max_probes" and not r.complete
    assert r.rate_mbit == 200  # 100 x3, 200 x3 passed; 400 was started but not decided
    # a fake clock: every probe takes 2 s; the deadline at 11 s leaves room for 5 probes (0-2, ..., 8-10)
    now = [0.0]

    def slow(rate: float) -> ProbeResult:
        now[0] += 2.0
        return path(rate)

    path.rates.clear()
    r = search_ceiling(slow, start_mbit=100, deadline=11.0, probe_s=0.5, clock=lambda: now[0])
    assert r.stop == "deadline" and len(path.rates) == 5 and now[0] <= 11.0
    assert r.rate_mbit == 100 and not r.complete
    # the estimate is the longest probe seen: with probe_s 0.5 it would have started a 6th at 10 s
    assert [p.t_s for p in r.probes] == [0, 2, 4, 6, 8]


def test_random_noise_never_gives_a_rate_that_failed_a_repeat():
    rng = random.Random(19)

    def noisy(rate: float) -> ProbeResult:
        base = 0.0 if rate < 437 else 4.0
        return ProbeResult(max(0.0, base + rng.gauss(0.5, 0.4)))

    for _ in range(50):
        r = search_ceiling(noisy, start_mbit=100, resolution_pct=5)
        assert r.rate_mbit < r.fail_mbit
        assert all(p.passed for p in r.at(r.rate_mbit)) and len(r.at(r.rate_mbit)) == 3
        assert not all(p.passed for p in r.at(r.fail_mbit))
        assert r.rate_mbit < 437


def test_params_label_and_honest_expected_seconds():
    assert WORKLOADS["udp_ceiling"] is UdpCeiling
    wl = UdpCeiling(UdpCeilingParams())
    assert wl.label() == "udp-ceiling"
    assert wl.headline == ("udp_ceiling_mbps", "udp_ceiling_loss_pct")
    assert UdpCeiling(UdpCeilingParams(loss_target_pct=0.1, length=256)).label() == "udp-ceiling-0.1pct-l256"
    # the time budget bounds the case (+ one probe run again after EMSGSIZE), and so does the probe count
    one = 2 + PROBE_OVERHEAD_S
    assert wl.expected_seconds() == 90 + one + PROBE_OVERHEAD_S
    few = UdpCeiling(UdpCeilingParams(max_probes=6, step_s=1))
    assert few.expected_seconds() == (6 + MAX_MTU_RETRIES) * (1 + PROBE_OVERHEAD_S) + PROBE_OVERHEAD_S
    with pytest.raises(ValueError, match="start_mbit"):
        UdpCeilingParams(start_mbit=0.5, lo_mbit=1)
    with pytest.raises(ValueError, match="repeats"):
        UdpCeilingParams(max_probes=2, repeats=3)


def fake_iperf3(monkeypatch, ceiling: float, emsgsize: int = 0) -> list[list[str]]:
    """Replace iperf3 by a path that loses 4% above `ceiling` Mbit/s; the first `emsgsize` runs fail as iperf3
    does when the path MTU drops under it. Returns the argument lists it was called with."""
    calls: list[list[str]] = []

    def run_client(ctx, args, duration_s, omit_s, tag):
        calls.append(list(args))
        if len(calls) <= emsgsize:
            raise WorkloadError("iperf3: unable to write to stream socket: Message too long")
        rate = int(args[args.index("-b") + 1]) / 1e6
        loss = 0.0 if rate <= ceiling else 4.0
        s = {
            "bits_per_second": rate * 1e6 * (1 - loss / 100),
            "lost_percent": loss,
            "jitter_ms": 0.1,
            "packets": 1000,
            "lost_packets": int(10 * loss),
        }
        sent = {**s, "bits_per_second": rate * 1e6}
        end = {"sum": s, "sum_sent": sent, "sum_received": s, "cpu_utilization_percent": {"host_total": 5.0}}
        return {"end": end, "intervals": []}, float(duration_s)

    monkeypatch.setattr("tunnelbench.workloads.udp_ceiling.run_client", run_client)
    return calls


def run_fake(tmp_path, **params):
    wl = UdpCeiling(UdpCeilingParams(**params))
    ctx = CaseContext(None, None, None, tmp_path, time.monotonic() + wl.expected_seconds(), {"mss": None})
    out = wl.run(ctx)
    return {s.name: s.value for s in out.samples}, out


def test_workload_metrics_series_and_an_mtu_retry(tmp_path, monkeypatch):
    calls = fake_iperf3(monkeypatch, 437, emsgsize=1)
    m, out = run_fake(tmp_path, step_s=1)
    assert m["udp_ceiling_mbps"] <= 437 < m["udp_ceiling_fail_mbps"] <= m["udp_ceiling_mbps"] * 1.05
    assert (
        m["udp_ceiling_loss_pct"] == m["udp_ceiling_loss_max_pct"] == 0
        and m["udp_ceiling_fail_loss_pct"] == 4
    )
    assert m["udp_ceiling_goodput_mbps"] == pytest.approx(m["udp_ceiling_mbps"])
    assert m["udp_ceiling_complete"] == 1 and m["udp_ceiling_sender_limited"] == 0
    assert m["udp_ceiling_mtu_retries"] == 1 and len(calls) == m["udp_ceiling_probes"] + 1
    assert calls[0] == calls[1] == ["-u", "-b", "100000000"]  # the probe that hit EMSGSIZE ran again
    assert out.measure_s == m["udp_ceiling_probes"]  # 1 s each, the failed run not counted
    rates = {sr.name: sr.points for sr in out.series}["udp_ceiling_probe_rate_mbps"]
    assert [r for _, r in rates][:4] == [100, 100, 100, 200] and len(rates) == m["udp_ceiling_probes"]
    assert set(m) <= {x.name for x in UdpCeiling.metrics}
    search = json.loads((tmp_path / "udp-ceiling-search.json").read_text())
    assert search["mtu_retries"] == 1 and search["stop"] == "resolution"


def test_workload_reports_zero_when_nothing_passes_and_fails_when_cut_short(tmp_path, monkeypatch):
    fake_iperf3(monkeypatch, 0.1)
    m, _ = run_fake(tmp_path, start_mbit=4, lo_mbit=1)
    assert m["udp_ceiling_mbps"] == 0 and m["udp_ceiling_fail_mbps"] == 1 and m["udp_ceiling_complete"] == 1
    assert "udp_ceiling_loss_pct" not in m  # no rate passed: no loss at the ceiling to report
    # cut by max_probes before any rate passed or lo_mbit failed: no answer, so the case fails
    with pytest.raises(WorkloadError, match="before any rate passed"):
        run_fake(tmp_path, start_mbit=1000, lo_mbit=1, max_probes=3)
    # EMSGSIZE again and again is not retried forever
    fake_iperf3(monkeypatch, 437, emsgsize=10)
    with pytest.raises(WorkloadError, match="Message too long"):
        run_fake(tmp_path)


# -- the lab: a rate-limited no-VPN path ------------------------------------------------------------------


@pytest.mark.lab
def test_ceiling_of_a_rate_limited_path_is_the_configured_rate(lab_factory):
    from tunnelbench.catalog import DRIVERS
    from tunnelbench.impair.backend import make_backend
    from tunnelbench.impair.profiles import Profile
    from tunnelbench.vpns.base import MeshSpec
    from tunnelbench.vpns.mesh import Mesh

    rate = 50
    lab = lab_factory(2)
    driver = DRIVERS["internal"](MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir))
    driver.configure()
    mesh = Mesh(driver)
    mesh.start()
    mesh.wait_ready(30)
    be = make_backend("auto", lab.router, lab.hosts, lab.run_dir / "impair")
    be.apply(Profile(name="rate50", rate_mbit=rate))

    def case(wl: UdpCeiling, name: str):
        adir = lab.run_dir / "cases" / name
        adir.mkdir(parents=True)
        t0 = time.monotonic()
        deadline = t0 + wl.expected_seconds() * 2 + 30  # the runner's case timeout: the budget must bind
        ctx = CaseContext(mesh, lab.hosts[0], lab.hosts[1], adir, deadline, {"mss": None})
        out = wl.run(ctx)
        took = time.monotonic() - t0
        search = json.loads((adir / f"{wl.label()}-search.json").read_text())
        return {s.name: s.value for s in out.samples}, out, took, search

    try:
        wl = UdpCeiling(UdpCeilingParams(step_s=1, start_mbit=20, resolution_pct=5, budget_s=60))
        m, out, took, search = case(wl, "full")
        # two iperf3 pairs at once, each offered half the rate: the same path, the same ceiling (started where
        # the single stream's search ended, as a later round starts: it must pass there and fail above)
        start = m["udp_ceiling_mbps"]
        two = UdpCeiling(
            UdpCeilingParams(step_s=1, start_mbit=start, resolution_pct=5, budget_s=60, streams=2)
        )
        m2, _, _, search2 = case(two, "two")
        # a 5 s budget: 20 Mbit/s x 3 (about 1.05 s each), one probe at 40, then no room for another
        short = UdpCeiling(UdpCeilingParams(step_s=1, start_mbit=20, budget_s=5))
        ms, _, took_short, _ = case(short, "short")
    finally:
        be.clear()
        mesh.stop()
    # the TBF counts IP and Ethernet headers, iperf3 -b the payload: 1448 of 1490 bytes = 97% of the rate
    assert 0.8 * rate <= m["udp_ceiling_mbps"] <= 1.02 * rate, m
    assert m["udp_ceiling_fail_mbps"] > m["udp_ceiling_mbps"] and m["udp_ceiling_fail_loss_pct"] > 1
    assert m["udp_ceiling_loss_max_pct"] <= 1 and m["udp_ceiling_complete"] == 1
    assert m["udp_ceiling_goodput_mbps"] == pytest.approx(m["udp_ceiling_mbps"], rel=0.05)
    assert took <= wl.expected_seconds()
    assert two.label() == "udp-ceiling-p2" and 0.8 * rate <= m2["udp_ceiling_mbps"] <= 1.02 * rate, m2
    assert len(list((lab.run_dir / "cases" / "two").glob("*-s1-client.json"))) == len(search2["probes"])
    # every repeat of the ceiling ran (3 iperf3 runs) and passed
    at = [p for p in search["probes"] if p["rate_mbit"] == m["udp_ceiling_mbps"]]
    assert [p["passed"] for p in at] == [True, True, True]
    assert len(search["probes"]) == m["udp_ceiling_probes"] == len(out.series[0].points)
    assert ms["udp_ceiling_complete"] == 0 and ms["udp_ceiling_mbps"] == 20 and took_short <= 5.5
    assert {s.name for s in out.series} == {
        "udp_ceiling_probe_rate_mbps",
        "udp_ceiling_probe_loss_pct",
        "udp_ceiling_probe_goodput_mbps",
    }


@pytest.mark.parametrize("prev, ceiling", [(430.0, 437.0), (437.0, 400.0), (100.0, 2900.0), (2900.0, 3.3)])
def test_a_warm_start_finds_the_same_ceiling_with_fewer_probes_near_the_last_one(prev, ceiling):
    cold_path, warm_path = Path_(ceiling), Path_(ceiling)
    cold = search_ceiling(cold_path, repeats=3, start_mbit=100, resolution_pct=5, max_probes=200)
    warm = search_ceiling(warm_path, repeats=3, start_mbit=prev, step=1.1, resolution_pct=5, max_probes=200)
    assert warm.stop == "resolution"
    assert (
        warm.rate_mbit <= ceiling < warm.fail_mbit <= warm.rate_mbit * 1.05 + 1e-9
    )  # same rule, same answer
    assert warm_path.rates[0] == prev
    # far from the last one: the factor gallops back to 2, at most three rates more than a cold bracket
    assert len(warm.probes) <= probes_bound(prev, ceiling, 5, 3) + 3 * 3
    if abs(math.log(ceiling / prev)) < 0.1:  # a ceiling near the last one: two rates bracket it
        assert len(warm.probes) < len(cold.probes), (warm_path.rates, cold_path.rates)
        assert len({p.rate_mbit for p in warm.probes}) <= 3
    with pytest.raises(ValueError, match="step"):
        search_ceiling(warm_path, start_mbit=prev, step=1.0)


def test_the_workload_warm_starts_per_vpn_and_profile(tmp_path, monkeypatch):
    calls = fake_iperf3(monkeypatch, 437)
    wl = UdpCeiling(UdpCeilingParams(step_s=1))
    dirs = [tmp_path / v / "baseline" / "udp-ceiling" / f"r{i}a0" for v, i in (("a", 1), ("a", 2), ("b", 1))]
    found, n = [], []
    for d in dirs:
        d.mkdir(parents=True)
        before = len(calls)
        ctx = CaseContext(None, None, None, d, time.monotonic() + wl.expected_seconds(), {"mss": None})
        m = {s.name: s.value for s in wl.run(ctx).samples}
        found.append(m["udp_ceiling_mbps"])
        n.append(len(calls) - before)
        first_rate = int(calls[before][calls[before].index("-b") + 1]) / 1e6
        search = json.loads((d / "udp-ceiling-search.json").read_text())
        assert search["start_mbit"] == first_rate and search["warm"] == (d == dirs[1])
    assert all(f <= 437 < f * 1.05 for f in found)
    assert json.loads((dirs[1] / "udp-ceiling-search.json").read_text())["start_mbit"] == found[0]
    assert n[1] < n[0] and n[2] == n[0]  # VPN b starts cold, like a's first repetition
    cold = UdpCeiling(UdpCeilingParams(step_s=1, warm_start=False))
    for d in dirs[:2]:
        ctx = CaseContext(None, None, None, d, time.monotonic() + cold.expected_seconds(), {"mss": None})
        cold.run(ctx)
        assert json.loads((d / "udp-ceiling-search.json").read_text())["start_mbit"] == 100


def test_parallel_streams_combine_as_one_probe():
    """Two iperf3 UDP results (hand-made): 1000 datagrams 10 lost and 3000 datagrams 30 lost = 40 of 4000 =
    1.0% lost; rates add up; the busier process's CPU is the one that would limit."""
    from tunnelbench.core.results import Outcome
    from tunnelbench.workloads.udp_ceiling import combine_udp

    def res(packets: int, lost: int, recv: float, sent: float, cpu: float) -> dict:
        return {
            "end": {
                "sum": {"packets": packets, "lost_packets": lost, "bits_per_second": recv},
                "sum_received": {"packets": packets, "lost_packets": lost, "bits_per_second": recv},
                "sum_sent": {"bits_per_second": sent},
                "cpu_utilization_percent": {"host_total": cpu, "remote_total": cpu / 2},
            }
        }

    out = Outcome()
    combine_udp([res(1000, 10, 100e6, 101e6, 30.0), res(3000, 30, 300e6, 303e6, 55.0)], out)
    m = {s.name: s.value for s in out.samples}
    assert m["udp_loss_pct"] == pytest.approx(1.0)
    assert m["goodput_mbps"] == pytest.approx(400.0) and m["goodput_sender_mbps"] == pytest.approx(404.0)
    assert m["iperf_cpu_client_pct"] == 55.0 and m["iperf_cpu_server_pct"] == 27.5
