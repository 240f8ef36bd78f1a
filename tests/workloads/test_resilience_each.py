"""resilience restart_each (issue 15 item 10, the ten-VPN thesis's per-node reboot): the per-node computation on
hand-made reply timestamps with known answers, and a real 3-host wireguard-go mesh whose daemons are
restarted one by one, checked against what the kernel says (new PIDs, their start times)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tunnelbench.catalog import WORKLOADS
from tunnelbench.workloads.resilience import node_result, summarise_each

T = 1000.0  # the restart, in the probes' clock


def every(start: float, end: float, step: float = 0.01) -> list[float]:
    n = round((end - start) / step)
    return [start + i * step for i in range(n + 1)]


def test_node_result_known_answers():
    # h2 answers every 10 ms until T+0.2, silent, back at T+1.5; h3 silent after T-0.1, back at T+2.0
    replies = {
        "h2": every(T - 1, T + 0.2) + every(T + 1.5, T + 3),
        "h3": every(T - 1, T - 0.1) + every(T + 2.0, T + 3),
    }
    r = node_result("h1", replies, T, cap_s=60, before_s=1.0, after_s=1.0)
    assert r.back and r.missing == []
    assert r.probe_reconnect_s["h2"] == pytest.approx(
        0.01
    )  # the first reply after the restart, not the return
    assert r.probe_reconnect_s["h3"] == pytest.approx(2.0)
    assert r.reconnect_s == pytest.approx(2.0)  # the slowest prober: every other host reaches h1 again
    assert r.probe_gap_s["h2"] == pytest.approx(1.3)  # T+0.2 .. T+1.5
    assert r.probe_gap_s["h3"] == pytest.approx(2.1)  # T-0.1 .. T+2.0
    assert r.gap_s == pytest.approx(2.1)

    # a reply exactly at T is not after the restart; replies out of order are sorted
    r = node_result("h1", {"h2": [T + 0.5, T - 0.3, T, T + 0.6]}, T, cap_s=60, before_s=1.0, after_s=0.2)
    assert r.reconnect_s == pytest.approx(0.5)
    assert r.probe_gap_s["h2"] == pytest.approx(0.5)  # T .. T+0.5: a reply at T ends a gap, not the outage

    # replies until the old daemon is gone (its stop returned at T+0.1) are not a reconnect: h3 never
    # answers again: not back, no reconnect number, its gap runs to the cap
    replies = {"h1": every(T - 1, T + 0.05) + every(T + 0.5, T + 11), "h3": every(T - 1, T + 0.05)}
    r = node_result("h2", replies, T, cap_s=10, before_s=1.0, after_s=1.0, t_stopped=T + 0.1)
    assert not r.back and r.missing == ["h3"] and r.reconnect_s is None
    assert r.probe_reconnect_s == {"h1": pytest.approx(0.5), "h3": None}
    assert r.probe_gap_s == {"h1": pytest.approx(0.45), "h3": pytest.approx(9.95)}  # T+0.05 .. T+10
    # h1 alone came back: its reconnect counts from the restart command, not from the stop's return
    assert node_result("h2", {"h1": replies["h1"]}, T, 10, 1.0, 1.0, T + 0.1).reconnect_s == pytest.approx(
        0.5
    )
    # without t_stopped the old daemon's last replies would count (the restart command's time)
    assert node_result("h2", replies, T, 10, 1.0, 1.0).probe_reconnect_s["h3"] == pytest.approx(0.01)
    r = node_result(
        "h2", {"h1": every(T - 1, T) + every(T + 0.5, T + 11), "h3": every(T - 1, T)}, T, 10, 1.0, 1.0
    )
    assert not r.back and r.missing == ["h3"] and r.probe_reconnect_s["h3"] is None
    assert r.probe_gap_s["h3"] == pytest.approx(10.0)  # T .. T + cap
    assert r.probe_gap_s["h1"] == pytest.approx(0.5)
    # a reply after the cap does not count
    r = node_result("h2", {"h1": every(T - 1, T) + [T + 10.5]}, T, 10, 1.0, 1.0)
    assert not r.back and r.probe_gap_s["h1"] == pytest.approx(10.0)


def test_summarise_each_known_answers():
    a = node_result(
        "h1", {"h2": [T - 0.5, *every(T + 1.0, T + 4)], "h3": [T - 0.5, T + 3.0]}, T, 60, 1.0, 1.0
    )
    b = node_result("h2", {"h1": [T + 9.5, T + 11.0], "h3": [T + 9.5, T + 10.5]}, T + 10, 60, 1.0, 1.0)
    got = {(n, h): (v, u) for n, v, u, h in summarise_each([a, b])}
    assert got[("node_reconnect_s", "h1")] == (pytest.approx(3.0), "s")
    assert got[("node_reconnect_s", "h2")] == (pytest.approx(1.0), "s")
    assert got[("node_gap_s", "h1")][0] == pytest.approx(3.5)  # h3: T-0.5 .. T+3
    assert got[("node_probe_gap_s", "h1<-h2")][0] == pytest.approx(1.5)
    assert got[("node_probe_gap_s", "h2<-h3")][0] == pytest.approx(1.0)
    assert got[("node_back", "h1")][0] == got[("node_back", "h2")][0] == 1
    assert got[("reconnect_each_max_s", None)][0] == pytest.approx(3.0)
    assert got[("reconnect_each_mean_s", None)][0] == pytest.approx(2.0)
    assert got[("outage_each_max_s", None)][0] == pytest.approx(3.5)
    assert got[("reconnect_each_failed", None)][0] == 0
    assert got[("reconnect_each_nodes", None)][0] == 2
    # a node that never came back: node_back 0, no reconnect for it, no max / mean (they would flatter)
    c = node_result("h3", {"h1": [T + 19.5], "h2": [T + 19.5]}, T + 20, 30, 1.0, 1.0)
    got = {(n, h): v for n, v, u, h in summarise_each([a, b, c])}
    assert got[("node_back", "h3")] == 0 and ("node_reconnect_s", "h3") not in got
    assert got[("reconnect_each_failed", None)] == 1
    assert ("reconnect_each_max_s", None) not in got and ("reconnect_each_mean_s", None) not in got
    assert got[("node_gap_s", "h3")] == pytest.approx(30.5)  # T+19.5 .. T+20+30
    names = {s.name for s in WORKLOADS["resilience"].metrics}
    assert {n for n, _ in got} <= names, "every metric declared"


PING_OUT = """\
PING 10.9.0.3 (10.9.0.3) 56(84) bytes of data.
[1000.100000] 64 bytes from 10.9.0.3: icmp_seq=1 ttl=64 time=0.50 ms
[1000.110000] From 10.9.0.1 icmp_seq=2 Destination Host Unreachable
[1000.120000] 64 bytes from 10.9.0.3: icmp_seq=1 ttl=64 time=20.5 ms (DUP!)
[1000.130000] 64 bytes from 10.9.0.3: icmp_seq=3 ttl=64 time=1 ms
"""


def test_probe_uses_the_shared_ping_parser(tmp_path):
    """resilience's probe reads replies with ping.py's parser: echo replies only, no ICMP errors, no DUP!."""
    from tunnelbench.instruments.ping import echo_replies
    from tunnelbench.workloads.resilience import Probe

    assert echo_replies(PING_OUT) == [(1000.1, 1, 0.5), (1000.13, 3, 1.0)]
    probe = Probe.__new__(Probe)
    probe.path = tmp_path / "probe.txt"
    probe.proc = SimpleNamespace(log_text=probe.path.read_text)  # ping's log, as a local process reads it
    probe.path.write_text(PING_OUT)
    assert probe.replies_seq() == [(1000.1, 1), (1000.13, 3)]
    assert probe.replies() == [1000.1, 1000.13]


def test_expected_seconds_covers_each_host():
    P = WORKLOADS["resilience"].Params
    W = WORKLOADS["resilience"]
    one = W(P(events=["restart_each"], each_hosts=1)).expected_seconds()
    five = W(P(events=["restart_each"], each_hosts=5)).expected_seconds()
    assert five - one >= 4 * (1.0 + 1.0 + 20)  # per extra node: before, after, a restart's reconnect


# -- a real mesh -------------------------------------------------------------------------------------------
CLK_TCK = os.sysconf("SC_CLK_TCK")


def start_epoch(pid: int) -> float:
    """The process's start (time.time() clock) from /proc/<pid>/stat field 22 (ticks since boot)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    since_boot = int(fields[19]) / CLK_TCK  # field 22; fields[0] is field 3 (state)
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) + since_boot


@pytest.mark.lab
@pytest.mark.long  # 50 s; restarts themselves are checked by test_resilience_restart_one_and_all, the per-node
# computation by the known answers above
def test_restart_each_wireguard_go(lab_factory):
    from test_workloads_more import make_mesh, run

    mesh = make_mesh(lab_factory, "wireguard-go", 3)
    try:
        names = [h.name for h in mesh.hosts]
        driver = mesh.driver
        stops: dict[str, float] = {}  # host -> time.time() when its daemon's stop returned (old one gone)
        starts: dict[str, float] = {}  # host -> time.time() just before its daemon's start was called
        real_stop, real_start = driver.stop, driver.start

        def stop(host):
            real_stop(host)
            stops[host.name] = time.time()

        def start(host):
            starts[host.name] = time.time()
            real_start(host)

        driver.stop, driver.start = stop, start  # type: ignore[method-assign]
        before = {h: {p.pid for p in ps} for h, ps in mesh.daemons().items()}
        cap = 30
        m, out = run(
            mesh,
            "resilience",
            timeout=150,
            events=["restart_each"],
            before_s=0.5,
            after_s=0.5,
            each_timeout_s=cap,
        )
        after = {h: {p.pid for p in ps} for h, ps in mesh.daemons().items()}
        print("restart_each", {k: round(v, 3) for k, v in m.items()})
        names_declared = {s.name for s in WORKLOADS["resilience"].metrics}
        assert {k.split("@")[0] for k in m} <= names_declared
        assert m["reconnect_each_nodes"] == 3 and m["reconnect_each_failed"] == 0
        for h in names:
            # the product: a reconnect time for every node, > 0 and under the cap
            assert m[f"node_back@{h}"] == 1
            assert 0 < m[f"node_reconnect_s@{h}"] < cap, h
            # the kernel: each daemon was replaced (new PIDs, none of the old ones still running)
            assert before[h] and after[h] and not before[h] & after[h], (h, before, after)
            assert not any(Path(f"/proc/{pid}").exists() for pid in before[h] - after[h]), h
            # the new daemon began after the old one was gone (/proc/<pid>/stat's start time, 1/CLK_TCK
            # resolution, truncated); no prober can have had a reply while no daemon ran on h: from the old
            # one's end (its stop returned) to the new one's start
            born = max(start_epoch(pid) for pid in after[h])
            assert stops[h] <= starts[h] and born >= starts[h] - 2 / CLK_TCK, (h, stops[h], starts[h], born)
            down = max(born, starts[h]) - stops[h]
            for a in names:
                if a != h:
                    assert m[f"node_probe_gap_s@{h}<-{a}"] >= down, (h, a, down, m)
            # and every prober's reply that ended the node's outage came after the new daemon existed
            t_restart = next(r["t_restart"] for r in _each_json(mesh) if r["node"] == h)
            assert t_restart + m[f"node_reconnect_s@{h}"] >= born, (h, born - t_restart)
            assert m[f"node_gap_s@{h}"] == max(m[f"node_probe_gap_s@{h}<-{a}"] for a in names if a != h)
        assert m["reconnect_each_max_s"] == max(m[f"node_reconnect_s@{h}"] for h in names)
        assert min(m[f"node_reconnect_s@{h}"] for h in names) <= m["reconnect_each_mean_s"]
        mesh.wait_ready(30)
    finally:
        mesh.stop()
    assert mesh.leftovers() == []


def _each_json(mesh) -> list[dict]:
    import json

    (path,) = list((mesh.run_dir / "cases").glob("resilience-each-*/restart-each.json"))
    return json.loads(path.read_text())


@pytest.mark.lab
def test_restart_each_node_not_back_fails_within_the_cap(lab_factory):
    """h1's daemon is stopped and never started again: the case fails after each_timeout_s (no hang) with
    node_back@h1 = 0 and no reconnect number for it or the mesh."""
    from test_workloads_more import make_mesh, run

    from tunnelbench.workloads.base import WorkloadError

    mesh = make_mesh(lab_factory, "wireguard-go", 3)
    try:
        real_start = mesh.driver.start
        mesh.driver.start = lambda host: None if host.name == "h1" else real_start(host)  # type: ignore[method-assign]
        t0 = time.monotonic()
        with pytest.raises(WorkloadError, match="h1 not answering h2, h3 within 3 s") as e:
            run(
                mesh,
                "resilience",
                timeout=60,
                events=["restart_each"],
                before_s=0.2,
                after_s=0.2,
                each_timeout_s=3,
            )
        took = time.monotonic() - t0
        assert took < 3 + 15, took  # the cap, the probes' start and the stop: not another node's restart
        m = {(s.name, s.host): s.value for s in e.value.outcome.samples}  # type: ignore[attr-defined]
        assert m[("node_back", "h1")] == 0 and ("node_reconnect_s", "h1") not in m
        assert m[("reconnect_each_failed", None)] == 1 and m[("reconnect_each_nodes", None)] == 1
        assert ("reconnect_each_max_s", None) not in m
        assert m[("node_gap_s", "h1")] >= 3  # silent from the stop to the cap
        assert not mesh.daemons()["h1"]
    finally:
        mesh.stop()
    assert mesh.leftovers() == []
