"""Daemon memory over time (issue 15 item 8, Nebula's benchmark blog): the monitor stores each host's daemon RSS as a series
with its mean and peak as metrics (and declares every metric it adds); the report pools those series per
workload label and VPN into a "memory over time" plot; CPU efficiency of the multihost workload divides the
sum over every stream by the daemon CPU of every host, not only of the client and the server.

Known answers: scripted RSS/CPU readings fed to the monitor, hand-made stores (Store/start_case/finish_case),
and one real process grown by a known amount, checked against the kernel's own VmRSS."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from tunnelbench.analysis.analyze import analyze, load_run, metric_spec
from tunnelbench.case_metrics import MONITOR_METRICS
from tunnelbench.core.results import Outcome, Sample, Series
from tunnelbench.lab.host import Process
from tunnelbench.monitor import Monitor, _Track
from tunnelbench.report import full, plots
from tunnelbench.report.reading import Reading
from tunnelbench.store import DB_NAME, Store

MiB = 2**20


class ScriptedProc:
    """A psutil.Process stand-in whose RSS follows a script (one reading per sample) and whose CPU time
    grows by `cpu_step` seconds per reading."""

    def __init__(self, rss_mib: list[float], cpu_step: float = 0.0):
        self.rss, self.k, self.cpu_step, self.cpu = list(rss_mib), 0, cpu_step, 0.0

    def cpu_times(self):
        self.cpu += self.cpu_step
        return SimpleNamespace(user=self.cpu, system=0.0)

    def memory_info(self):
        v = self.rss[min(self.k, len(self.rss) - 1)]
        self.k += 1
        return SimpleNamespace(rss=int(v * MiB))


def scripted_monitor(procs: dict[str, list[ScriptedProc]], samples: int) -> Outcome:
    mon = Monitor({}, interval_s=0.01)
    mon._t0 = time.monotonic()
    for host, ps in procs.items():
        mon._tracks += [_Track(host, p, 0.0, mon._t0) for p in ps]  # type: ignore[arg-type]
    for _ in range(samples):
        time.sleep(0.01)
        mon._sample()
    mon._elapsed = time.monotonic() - mon._t0
    out = Outcome()
    mon.add_to(out)
    return out


def metric(out: Outcome, name: str, host: str | None) -> float:
    (v,) = [s.value for s in out.samples if s.name == name and s.host == host]
    return v


def series(out: Outcome, name: str, host: str) -> Series:
    (s,) = [s for s in out.series if s.name == name and s.host == host]
    return s


def test_rss_series_in_mean_and_peak_out():
    # h1: two daemons, summed per sample: 15, 25, 35, 45 MiB; h2: one daemon flat at 100 MiB
    out = scripted_monitor(
        {
            "h1": [ScriptedProc([10, 20, 30, 40], 0.001), ScriptedProc([5, 5, 5, 5])],
            "h2": [ScriptedProc([100] * 4)],
        },
        samples=4,
    )
    s1 = series(out, "daemon_rss_mb", "h1")
    assert s1.unit == "MiB"
    assert [round(v, 6) for _, v in s1.points] == [15, 25, 35, 45]
    assert [t for t, _ in s1.points] == sorted(t for t, _ in s1.points)
    assert metric(out, "daemon_rss_mb", "h1") == pytest.approx(45)  # the peak keeps its name
    assert metric(out, "daemon_rss_mean_mb", "h1") == pytest.approx(30)
    assert [round(v, 6) for _, v in series(out, "daemon_rss_mb", "h2").points] == [100] * 4
    assert metric(out, "daemon_rss_mean_mb", "h2") == pytest.approx(100)
    assert metric(out, "daemon_rss_mb", "h2") == pytest.approx(100)
    # CPU stays a series with its mean and peak metrics
    assert series(out, "daemon_cpu_pct", "h1").unit == "%"
    for name in ("daemon_cpu_pct", "daemon_cpu_peak_pct"):
        assert metric(out, name, "h1") > 0


def test_every_monitor_metric_is_declared_with_its_unit():
    out = scripted_monitor({"h1": [ScriptedProc([10, 20], 0.001)]}, samples=2)
    out.add("machine_cpu_pct", 1.0)  # what add_to adds from psutil when sampled in its thread
    declared = {m.name: m for m in MONITOR_METRICS}
    for s in out.samples + [Sample(se.name, 0, se.unit) for se in out.series]:
        assert s.name in declared, s.name
        assert declared[s.name].unit == s.unit, s
    assert {"daemon_rss_mb", "daemon_rss_mean_mb", "daemon_cpu_pct", "daemon_cpu_peak_pct"} <= set(declared)
    assert metric_spec("tcp", "daemon_rss_mean_mb") == ("lower", declared["daemon_rss_mean_mb"].description)
    assert metric_spec("tcp", "machine_cpu_pct")[0] == "none"


def test_rss_of_a_process_grown_by_150_mib_rises_in_the_series():
    """A real python process allocates and touches 150 MiB mid-case; the stored series starts at its VmRSS
    before and ends at its VmRSS after (as the kernel reports them to this test), so it rises by ~150 MiB."""
    code = (
        "import sys, time\nprint('ready', flush=True)\nsys.stdin.readline()\n"
        "b = b'\\x01' * (150 << 20)\nprint('grown', flush=True)\ntime.sleep(60)"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline().strip() == "ready"
        host = SimpleNamespace(name="h1", ps_process=psutil.Process)
        daemon = Process(host, "daemon", [], p.pid, None, p)  # type: ignore[arg-type]
        mon = Monitor({"h1": [daemon]}, interval_s=0.1)
        before = vmrss_mib(p.pid)
        with mon:
            time.sleep(0.6)
            p.stdin.write("go\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "grown"
            after = vmrss_mib(p.pid)
            time.sleep(0.6)
        out = Outcome()
        mon.add_to(out)
    finally:
        p.kill()
        p.wait()
    pts = [v for _, v in series(out, "daemon_rss_mb", "h1").points]
    assert len(pts) >= 8
    assert abs(pts[0] - before) <= 0.02 * before + 0.5, (pts[0], before)
    assert abs(pts[-1] - after) <= 0.02 * after, (pts[-1], after)
    assert abs((pts[-1] - pts[0]) - 150) <= 15, (pts[0], pts[-1])  # the 150 MiB, within 10%
    assert metric(out, "daemon_rss_mb", "h1") == pytest.approx(max(pts))
    assert metric(out, "daemon_rss_mean_mb", "h1") == pytest.approx(sum(pts) / len(pts))
    assert pts[0] < metric(out, "daemon_rss_mean_mb", "h1") < pts[-1]


def vmrss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# -- the plot helper ---------------------------------------------------------------------------------------
def test_rss_lines_pools_per_label_and_vpn_with_host_roles():
    cases = {
        1: ("vpnA", "tcp", "h1", "h2"),
        2: ("vpnA", "tcp", "h1", "h2"),
        3: ("vpnB", "multihost-tx", "h1", "h2"),
    }
    rows = [
        {"case_id": 1, "host": "h2", "t": 0.5, "value": 20.0},
        {"case_id": 1, "host": "h1", "t": 1.0, "value": 11.0},
        {"case_id": 1, "host": "h1", "t": 0.5, "value": 10.0},  # out of order: sorted by time
        {"case_id": 2, "host": "h1", "t": 0.5, "value": 12.0},
        {"case_id": 3, "host": "h3", "t": 0.5, "value": 30.0},
        {"case_id": 3, "host": "h1", "t": 0.5, "value": 31.0},
        {"case_id": 9, "host": "h1", "t": 0.5, "value": 99.0},  # a case not asked for
        {"case_id": 1, "host": None, "t": 0.5, "value": 99.0},  # not a host's series
    ]
    assert plots.rss_lines(rows, cases) == {
        "tcp": {
            "vpnA": [
                ("client", [(0.5, 10.0), (1.0, 11.0)]),
                ("server", [(0.5, 20.0)]),
                ("client", [(0.5, 12.0)]),
            ]
        },
        "multihost-tx": {"vpnB": [("client", [(0.5, 31.0)]), ("peer", [(0.5, 30.0)])]},
    }


# -- hand-made stores: the report's plot and the efficiency --------------------------------------------------
RUN = "20260101-000000-tbmem"
# workload, label, goodput metric, goodput of repetition k = base + step * k, daemon CPU % of h1, h2, h3
CASES = (
    ("tcp", "tcp", "goodput_mbps", 200, 10, (40, 60, 100)),
    ("multihost", "multihost-tx", "aggregate_goodput_mbps", 300, 30, (50, 30, 20)),
)


def make_store(root: Path, run: str = RUN) -> Path:
    """vpnA and vpnB, 3 repetitions each of tcp (client h1, server h2; h3 a third host) and multihost-tx (h1
    to h2 and h3), the no-VPN baseline (no daemons) and one failed vpnA tcp case whose series must not show.

    tcp: goodput 200 + 10 k, CPU h1 40 %, h2 60 %, h3 100 % -> (200 + 10 k) / 1.0 per core (h3 not counted).
    multihost: aggregate 300 + 30 k, CPU h1 50 %, h2 30 %, h3 20 % -> (300 + 30 k) / 1.0 per core; client +
    server alone would read (300 + 30 k) / 0.8. vpnB uses twice the CPU of vpnA: half the efficiency."""
    run_dir = root / run
    run_dir.mkdir(parents=True)
    st = Store(run_dir / DB_NAME)
    st.begin_run(run, "tbmem", 'name = "hand-made"\n', "0.1.0")
    for vpn, scale in (("internal", 0), ("vpnA", 1), ("vpnB", 2)):
        st.set_vpn(run, vpn, "1", "ok")
        for wl, label, metric_name, base, step, cpu in CASES:
            for k in range(3):
                adir = run_dir / "cases" / vpn / label / f"r{k}"
                adir.mkdir(parents=True)
                cid = st.start_case(run, vpn, "baseline", wl, label, {}, k + 1, 0, "h1", "h2", adir)
                out = Outcome(samples=[Sample(metric_name, base + step * k, "Mbit/s")])
                if scale:
                    for h, c in zip(("h1", "h2", "h3"), cpu, strict=True):
                        out.add("daemon_cpu_pct", c * scale, h)
                        rss = [(0.5 * i, 10.0 * scale + i + k) for i in range(4)]  # grows 1 MiB per sample
                        out.add("daemon_rss_mb", max(v for _, v in rss), h)
                        out.series.append(Series("daemon_rss_mb", "MiB", rss, h))
                st.finish_case(cid, "ok", out)
    adir = run_dir / "cases" / "vpnA" / "tcp" / "failed"
    adir.mkdir(parents=True)
    cid = st.start_case(run, "vpnA", "baseline", "tcp", "tcp", {}, 4, 0, "h1", "h2", adir)
    st.finish_case(
        cid, "failed", Outcome(series=[Series("daemon_rss_mb", "MiB", [(0.0, 999.0)], "h1")]), "boom"
    )
    st.end_run(run, "ok")
    st.close()
    return run_dir


@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
def test_multihost_efficiency_counts_every_hosts_daemon_cpu(tmp_path):
    a = analyze([load_run(make_store(tmp_path))])
    eff = {(d.variant, d.label): d for d in a.efficiency}
    assert ("internal", "tcp") not in eff and ("internal", "multihost-tx") not in eff  # no daemons, no CPU
    # medians of 3 repetitions: 300, 330, 360 Mbit/s over 1.0 core (50 + 30 + 20 %) -> 330
    assert eff[("vpnA", "multihost-tx")].value == pytest.approx(330)
    assert eff[("vpnB", "multihost-tx")].value == pytest.approx(165)  # twice the CPU
    assert eff[("vpnA", "multihost-tx")].n == 3
    assert "every host (3)" in eff[("vpnA", "multihost-tx")].note
    # tcp keeps client + server only: 200, 210, 220 over (40 + 60) % -> 210, h3's 100 % not counted
    assert eff[("vpnA", "tcp")].value == pytest.approx(210)
    assert eff[("vpnB", "tcp")].value == pytest.approx(105)
    assert eff[("vpnA", "tcp")].note == "client + server daemon CPU"
    ctx = full.build_context(Reading.of(a))
    rows = {(d["variant"], d["label"]): d for d in ctx["efficiency"]}
    assert rows[("vpnA", "multihost-tx")]["value"] == "330"


@pytest.mark.slow  # 3-4 s: out of the fast lane
def test_report_pools_rss_series_and_draws_memory_over_time(tmp_path):
    a = analyze([load_run(make_store(tmp_path))])
    lines = full._rss_lines(a, "baseline")
    assert set(lines) == {"tcp", "multihost-tx"}
    assert "internal" not in lines["tcp"]  # the baseline has no daemons
    tcp_a = lines["tcp"]["vpnA"]
    # 3 ok repetitions x 3 hosts; the failed case's 999 MiB is not drawn
    assert len(tcp_a) == 9 and all(v < 999 for _, pts in tcp_a for _, v in pts)
    assert [r for r, _ in tcp_a[:3]] == ["client", "server", "peer"]
    assert tcp_a[0][1] == [(0.0, 10.0), (0.5, 11.0), (1.0, 12.0), (1.5, 13.0)]  # repetition 1, h1
    assert lines["multihost-tx"]["vpnB"][3][1] == [(0.0, 21.0), (0.5, 22.0), (1.0, 23.0), (1.5, 24.0)]
    svg = plots.memory_over_time(a, "baseline", lines)
    assert svg is not None and svg.startswith("<svg")
    words = (
        "memory over time",
        "daemon RSS [MiB]",
        "vpnA",
        "vpnB",
        "client",
        "server",
        "peer",
        "multihost-tx",
    )
    for text in words:
        assert text in svg, text
    assert plots.memory_over_time(a, "baseline", {}) is None
    html = full.render_report(Reading.of(a))
    cpu = html[html.index('<section id="cpu">') : html.index('<section id="derived">')]
    # one plot for the one profile, after the CPU and memory bars, in their section
    assert cpu.count("memory over time of the VPN daemons") == 1
    assert cpu.index("CPU and memory of the VPN daemons") < cpu.index("memory over time of the VPN daemons")
    assert "every host (3)" in html  # the efficiency table says whose CPU


def test_two_runs_keep_their_cases_apart(tmp_path):
    """Case ids restart in every run: the report keys series by (run, case), so two runs' cases never mix."""
    r1 = load_run(make_store(tmp_path / "a", "20260101-000000-tbmem1"))
    r2 = load_run(make_store(tmp_path / "b", "20260102-000000-tbmem2"))
    a = analyze([r1, r2])
    lines = full._rss_lines(a, "baseline")
    assert len(lines["tcp"]) == 4  # vpnA and vpnB of each run, as variants
    assert all(len(reps) == 9 for reps in lines["tcp"].values())
