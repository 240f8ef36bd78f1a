"""Issue 5's workloads against the baseline and a VPN, in a real lab: metrics present, in range, consistent."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import through_a_tunnel_long

from tunnelbench.catalog import DRIVERS, WORKLOADS
from tunnelbench.monitor import Monitor
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.mesh import Mesh
from tunnelbench.workloads.base import CaseContext

pytestmark = pytest.mark.lab

VPNS = ["internal", "wireguard-go"]


def make_mesh(lab_factory, vpn: str, n_hosts: int, star: bool = False) -> Mesh:
    cls = DRIVERS[vpn]
    a = cls.availability()
    if not a.ok:
        pytest.skip(f"{vpn}: {a.reason}")
    lab = lab_factory(n_hosts)
    star_spec = {"topology": "star", "hub": lab.hosts[1]} if star else {}
    driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir, **star_spec))
    driver.configure()
    m = Mesh(driver)
    m.start()
    m.wait_ready(60)
    m.run_dir = lab.run_dir
    m.lab = lab
    return m


@pytest.fixture(params=VPNS)
def mesh(request, lab_factory):
    m = make_mesh(lab_factory, request.param, 2)
    yield m
    m.stop()
    assert m.leftovers() == []


@pytest.fixture(params=VPNS)
def mesh4(request, lab_factory):
    m = make_mesh(lab_factory, request.param, 4)
    yield m
    m.stop()
    assert m.leftovers() == []


TUNNEL_LONG = through_a_tunnel_long("mesh")  # through wireguard-go: 7-13 s more each
TUNNEL_LONG4 = through_a_tunnel_long("mesh4")


def run(mesh, name: str, server: int = 1, timeout: float = 120, **params):
    wl = WORKLOADS[name](WORKLOADS[name].Params(**params))
    adir = mesh.run_dir / "cases" / f"{wl.label()}-{time.monotonic_ns()}"
    adir.mkdir(parents=True, exist_ok=True)
    ctx = CaseContext(
        mesh, mesh.hosts[0], mesh.hosts[server], adir, time.monotonic() + timeout, {"mss": None}
    )
    out = wl.run(ctx)
    return {(s.name if s.host is None else f"{s.name}@{s.host}"): s.value for s in out.samples}, out


def declared(name: str, m: dict) -> None:
    names = {s.name for s in WORKLOADS[name].metrics}
    for k in m:
        assert k.split("@")[0] in names, f"{k} not declared by {name}"
    for h in WORKLOADS[name].headline:
        assert h in m, f"headline {h} missing"


def no_nginx_left(mesh) -> None:
    """nginx (master and workers) is gone from every host's namespace after the case."""
    from pathlib import Path

    for h in mesh.hosts:
        comms = []
        for pid in h.pids():
            try:
                comms.append(Path(f"/proc/{pid}/comm").read_text().strip())
            except OSError:
                continue
        assert "nginx" not in comms, f"nginx left on {h.name}"


@TUNNEL_LONG4
def test_multihost_tx_rx_bidir(mesh4):
    peers = [h.name for h in mesh4.hosts[1:]]
    for mode in ("tx", "rx", "bidir"):
        daemons = mesh4.daemons()
        with Monitor(daemons, 0.2) as mon:
            m, out = run(mesh4, "multihost", mode=mode, duration_s=2, omit_s=0.5)
        declared("multihost", m)
        dirs = ["tx", "rx"] if mode == "bidir" else [mode]
        total = 0.0
        for d in dirs:
            streams = [m[f"{d}_goodput_mbps@{p}"] for p in peers]
            assert all(s > 0 for s in streams), (
                streams
            )  # every peer got data (fairness is measured, not required)
            assert sum(streams) > 10
            assert m[f"{d}_aggregate_goodput_mbps"] == pytest.approx(sum(streams))
            total += sum(streams)
        assert m["aggregate_goodput_mbps"] == pytest.approx(total)
        assert m["streams"] == len(peers) * len(dirs)
        assert 0 < m["stream_fairness"] <= 1.0 + 1e-9
        assert m["min_stream_goodput_mbps"] <= m["aggregate_goodput_mbps"] / m["streams"] + 1e-9
        mon.add_to(out)
        if any(daemons.values()):  # per-host daemon CPU and memory, one sample per host
            per_host = {s.host for s in out.samples if s.name == "daemon_rss_mb"}
            assert per_host == {h.name for h in mesh4.hosts}
            assert all(0 < s.value < 500 for s in out.samples if s.name == "daemon_rss_mb")
    # the MSS clamp of Nebula's benchmark blog reached iperf3
    import json

    adir = sorted((mesh4.run_dir / "cases").glob("multihost-bidir*"))[-1]
    data = json.loads(next(adir.glob("tx-*-client.json")).read_text())
    assert data["start"]["tcp_mss"] <= 1200


@TUNNEL_LONG
def test_latency_under_load(mesh):
    m, out = run(mesh, "latency_load", idle_s=1.5, load_s=3, warmup_s=0.5, interval_s=0.01)
    declared("latency_load", m)
    assert 0 < m["idle_rtt_p50_ms"] <= m["idle_rtt_p99_ms"] < 50
    assert 0 < m["loaded_rtt_p50_ms"] <= m["loaded_rtt_p99_ms"] < 5000
    assert m["added_latency_p50_ms"] == pytest.approx(m["loaded_rtt_p50_ms"] - m["idle_rtt_p50_ms"])
    assert m["added_latency_p99_ms"] == pytest.approx(m["loaded_rtt_p99_ms"] - m["idle_rtt_p99_ms"])
    assert m["load_goodput_mbps"] > 10
    assert m["idle_ping_loss_pct"] < 10
    assert {s.name for s in out.series} == {"idle_rtt_ms", "loaded_rtt_ms"}
    # the loaded pings overlapped the load: ping -D's wall-clock reply times against iperf3's own record of the
    # load (start second and per-interval throughput); the idle pings came before the load started
    import json
    import re

    (adir,) = [d for d in (mesh.run_dir / "cases").iterdir() if d.name.startswith("latency-load-up")]
    stamps = {
        ph: [
            float(x)
            for x in re.findall(
                r"^\[(\d+\.\d+)\] \d+ bytes from", (adir / f"ping-{ph}.txt").read_text(), re.M
            )
        ]
        for ph in ("idle", "loaded")
    }
    load = json.loads((adir / "load-client.json").read_text())
    t_load = load["start"]["timestamp"]["timesecs"]  # whole seconds: the load started in [t_load, t_load + 1)
    ivs = [iv["sum"] for iv in load["intervals"]]
    t_load_end = t_load + 1 + ivs[-1]["end"]
    # each phase pinged for about its time (the count follows the spacing ping really keeps: 17-18 ms for
    # -i 0.01 on some machines), at least one request per interval asked or per spacing kept
    for ph, secs in (("loaded", 3.0), ("idle", 1.5)):
        span = max(stamps[ph]) - min(stamps[ph])
        # ping's spacing drifts between the phases on a busy machine (17-28 ms for -i 0.01 seen): about, not exact
        assert span >= 0.5 * secs, (ph, span)
        # the loaded phase must end inside the load (which runs 1.25 x load_s); the idle one may run long
        assert ph == "idle" or span <= 1.25 * secs, (ph, span)
        assert len(stamps[ph]) >= 0.9 * span / 0.02, (ph, len(stamps[ph]), span)
    assert max(stamps["idle"]) < t_load + 1
    window = (min(stamps["loaded"]) - t_load, max(stamps["loaded"]) - t_load, t_load_end - t_load)
    assert window[0] >= 0.5 and window[1] <= window[2], window  # pings' first, last; load's end (s)
    # ... and the load was flowing through every second of it, not just on average
    assert all(iv["bits_per_second"] > 10e6 for iv in ivs), ivs


def test_http_download(mesh):
    m, _ = run(
        mesh, "http_download", small_files=120, small_kib=16, large_files=2, large_mib=4, connections=6
    )
    declared("http_download", m)
    assert m["http_errors"] == 0
    assert 8 < m["fileset_mb"] < 12
    assert m["goodput_mbps"] == pytest.approx(m["fileset_mb"] * 8 / m["download_s"], rel=1e-6)
    assert 0 < m["small_file_p50_ms"] <= m["small_file_p99_ms"] < 10_000
    assert m["files_per_s"] == pytest.approx(122 / m["download_s"])
    no_nginx_left(mesh)
    # deterministic file set: generating again gives the same bytes
    from tunnelbench.workloads.http_download import HttpDownloadParams, make_fileset

    p = HttpDownloadParams(small_files=5, small_kib=4, large_files=1, large_mib=0.1)
    d1, f1 = make_fileset(mesh.run_dir / "fs1", p)
    d2, f2 = make_fileset(mesh.run_dir / "fs2", p)
    assert f1 == f2 and all((d1 / r).read_bytes() == (d2 / r).read_bytes() for r, _ in f1)


def test_http_api_rate_and_count(mesh):
    m, out = run(mesh, "http_api", count=60, rate_per_s=30, concurrency=2)
    declared("http_api", m)
    assert m["error_rate_pct"] == 0
    assert 0 < m["request_p50_ms"] <= m["request_p90_ms"] <= m["request_p99_ms"] <= m["request_max_ms"] < 1000
    assert len(out.series[0].points) == 60
    # fixed rate, not as fast as possible: hey's own per-request offsets (hey.csv) show the pacing. Each of the
    # 2 workers sends 30 requests at 15/s, one per tick: the last starts (30 - 1) / 15 = 1.93 s after the
    # first tick, so the offsets span 1.93 s (+-5%: the tick's jitter on a busy 2-core machine)
    import csv

    (adir,) = [d for d in (mesh.run_dir / "cases").iterdir() if d.name.startswith("http-api-30rps")]
    offsets = sorted(float(r["offset"]) for r in csv.DictReader((adir / "hey.csv").open()))
    assert len(offsets) == 60
    assert offsets[-1] - offsets[0] == pytest.approx(29 / 15, rel=0.05), offsets
    # the reported rate is requests over the whole hey run: at most the configured 30/s (the ticks cannot
    # be faster) and at least 60 requests over the ticks' 2.0 s plus 0.5 s for starting hey in the namespace
    assert 60 / (60 / 30 + 0.5) <= m["achieved_rate_per_s"] <= 30 * 1.02, m["achieved_rate_per_s"]
    no_nginx_left(mesh)


def test_overhead(mesh):
    m, _ = run(mesh, "overhead", duration_s=2, small_duration_s=1.5)
    declared("overhead", m)
    r = m["underlay_bytes_per_payload_byte"]
    if mesh.vpn == "internal":
        assert 1.0 < r < 1.1  # Ethernet + IP + TCP headers only
    else:
        assert 1.03 < r < 1.5  # a VPN puts more bytes on the underlay than the payload it carries
        # a TUN with TSO/GRO (today's wireguard-go) counts 64 KB super-packets on both sides of the ratio in
        # different shapes: only a VPN without offloads gives about one underlay packet per tunnel packet
        offloads = getattr(mesh.driver, "settings", {}).get("offloads_effective")
        assert 0.9 < m["underlay_packets_per_tunnel_packet"] < (64 if offloads else 1.5)
        assert 1.02 < m["underlay_bytes_per_tunnel_byte"] < 1.2  # WireGuard: +32 B + outer UDP/IP per packet
        assert m["underlay_bytes_per_payload_byte"] >= m["underlay_bytes_per_tunnel_byte"] * 0.99
    # 64-byte datagram + UDP/IP/Ethernet headers (106 B) on the baseline; a VPN adds its own on top
    assert m["small_underlay_bytes_per_packet"] == pytest.approx(106, abs=2) or mesh.vpn != "internal"
    if mesh.vpn != "internal":
        assert m["small_underlay_bytes_per_packet"] > 106 + 16
    assert m["small_packet_pps"] > 1000
    assert m["small_packet_pps"] <= m["small_packet_sent_pps"] * 1.01
    assert 0 <= m["small_packet_loss_pct"] <= 100


# softether (15 s, its server's start), nebula and tinc (5-8 s; the star is Mesh's, the same for every
# driver, and their hub config a mesh peer's): --long runs them; openvpn (a server and its clients) in CI
@pytest.mark.parametrize(
    "vpn",
    [*VPNS, *(pytest.param(v, marks=pytest.mark.long) for v in ("softether", "nebula", "tinc")), "openvpn"],
)
def test_many_clients_star(vpn, lab_factory):
    mesh = make_mesh(lab_factory, vpn, 7, star=True)
    try:
        hub, spokes = mesh.hosts[1], [h for h in mesh.hosts if h is not mesh.hosts[1]]
        assert mesh.pairs_down() == []
        if vpn == "softether":  # the virtual hub runs on the star's hub host (not the last host)
            assert mesh.driver.hub is hub
        if (
            vpn == "openvpn"
        ):  # one server process on the hub serves every spoke, at the address its CN's file pushes
            assert len(mesh.driver.procs[hub.name]) == 1 and "--mode server" in " ".join(
                mesh.driver.procs[hub.name][0].argv
            )
            for s in spokes:
                addr = s.run(["ip", "-4", "-o", "addr", "show", "dev", mesh.driver.ifname(s)]).stdout
                assert f" {mesh.tunnel_ip(s)}/24 " in addr, addr
        # cryptokey routing: spokes talk to the hub only (SoftEther's hub is a switch: spokes meet through it)
        if vpn == "nebula":  # the hub is the lighthouse and each spoke's only static host
            import json

            assert mesh.driver.control_host(mesh.driver.spec) is hub
            for s in spokes:
                conf = json.loads((mesh.driver.host_dir(s) / "config.yml").read_text())
                assert list(conf["static_host_map"]) == [mesh.tunnel_ip(hub)]
                assert conf["lighthouse"]["hosts"] == [mesh.tunnel_ip(hub)]
        elif (
            vpn == "tinc"
        ):  # the hub is the meta star's centre; a spoke holds its own and the hub's host file
            conf = (mesh.driver.confdir(spokes[0]) / "tinc.conf").read_text()
            assert [ln for ln in conf.splitlines() if ln.startswith("ConnectTo")] == [
                f"ConnectTo = {hub.name}"
            ]
            assert sorted(p.name for p in (mesh.driver.confdir(spokes[0]) / "hosts").iterdir()) == sorted(
                [hub.name, spokes[0].name]
            )
        elif vpn not in ("internal", "softether"):
            assert [h.name for h in mesh.driver.peers(spokes[0])] == [hub.name]
            probe = spokes[0].run(["ping", "-c1", "-W1", mesh.tunnel_ip(spokes[1])], check=False)
            assert probe.returncode != 0
        m, _ = run(mesh, "many_clients", clients=6, duration_s=3, interval_s=0.25, workers=2)
        declared("many_clients", m)
        assert m["failure_rate_pct"] == 0 and m["timeouts"] == 0
        assert m["clients_calling"] == 6
        assert m["calls"] == pytest.approx(6 * 3 / 0.25, abs=6)  # every 250 ms per client
        assert m["calls_per_s"] == pytest.approx(6 / 0.25, rel=0.2)
        assert (
            0
            < m["response_p25_ms"]
            <= m["response_p50_ms"]
            <= m["response_p75_ms"]
            <= m["response_p90_ms"]
            <= m["response_p99_ms"]
            <= m["response_max_ms"]
        )
        assert m["response_p25_ms"] <= m["response_mean_ms"] <= m["response_max_ms"]
        assert m["response_p99_ms"] < 1000
        assert m["schedule_lag_p99_ms"] < 250
        assert 0 < m["generator_cpu_pct"] < 2 * 100  # two workers, each at most one core
        with pytest.raises(Exception, match="needs 9 client hosts"):
            run(mesh, "many_clients", clients=9, duration_s=1)
        no_nginx_left(mesh)
    finally:
        mesh.stop()
        assert mesh.leftovers() == []


def test_tunnel_addresses_beyond_254():
    from pathlib import Path

    from tunnelbench.lab.host import Host

    class H(Host):
        def __init__(self, i):
            self.name, self.underlay_ip, self.journal, self.workdir = f"h{i}", "", None, Path("/nonexistent")

        def argv(self, argv):
            return list(argv)

    hosts = [H(i) for i in range(1, 1002)]
    d = DRIVERS["wireguard-go"](
        MeshSpec(hosts=hosts, tag="t", workdir=Path("/nonexistent"), topology="star", hub=hosts[1])
    )
    ips = [d.tunnel_ip(h) for h in hosts]
    assert ips[0] == "10.77.0.1" and ips[253] == "10.77.0.254" and ips[254] == "10.77.1.1"
    assert len(set(ips)) == len(ips) and all(not ip.endswith((".0", ".255")) for ip in ips)
    assert d.tunnel_prefixlen == 16 and DRIVERS["wireguard-go"].tunnel_prefixlen == 24
    assert len(d.peers(hosts[1])) == 1000 and d.peers(hosts[5]) == [hosts[1]]
    with pytest.raises(ValueError, match="does not support topology"):
        DRIVERS["vpncloud"](
            MeshSpec(hosts=hosts[:3], tag="t", workdir=Path("/x"), topology="star", hub=hosts[1])
        )


@TUNNEL_LONG
def test_streaming_rist_and_udp(mesh):
    for transport in ("rist", "udp"):
        m, _ = run(mesh, "streaming", transport=transport, bitrate_mbps=10, duration_s=3, playout_ms=400)
        declared("streaming", m)
        assert m["lost_pct"] < 5 and m["late_pct"] < 5  # an idle lab path at 10 Mbit/s
        assert 0 <= m["jitter_ms"] < 50
        assert 0 < m["delay_p50_ms"] <= m["delay_p99_ms"] < 1000
        assert 4.0 < m["quality_mos"] <= 4.5
        assert m["received_mbps"] == pytest.approx(10 * (100 - m["lost_pct"]) / 100, rel=0.1)
    from tunnelbench.workloads.streaming import mos

    assert mos(0) > 4.4 and mos(1) > mos(5) > mos(20) >= 1.0


def test_streaming_analyse_known_answers():
    """analyse() on hand-made arrivals whose answers are worked out by hand (no lab needed)."""
    from tunnelbench.workloads.streaming import StreamingParams, analyse, mos

    p = StreamingParams(packet_bytes=1000, duration_s=1.0, playout_ms=100.0, transport="udp")
    # 10 sent, 10 ms apart; seqs 0-7 arrive, 8 and 9 never do, and seq 3 arrives twice.
    # One-way delays in ms: the base is the smallest, 20; the playout deadline is 20 + 100 = 120 ms
    delay_ms = {0: 20, 1: 30, 2: 20, 3: 40, 4: 20, 5: 150, 6: 122, 7: 119}  # 150 and 122 late, 119 on time
    arrivals = [(q, q * 0.01, q * 0.01 + d / 1000) for q, d in delay_ms.items()]
    arrivals.append((3, 0.03, 0.03 + 0.300))  # the duplicate: counted, its delay ignored
    m = {s.name: s.value for s in analyse(arrivals, 10, p, 1.0).samples}
    assert m["lost_pct"] == pytest.approx(20)  # 2 of 10
    assert m["late_pct"] == pytest.approx(20)  # 2 of 10
    assert m["on_time_pct"] == pytest.approx(60)  # 8 arrived - 2 late
    assert m["duplicates"] == 1
    # sorted delays 20 20 20 30 40 119 122 150: median (30 + 40) / 2; p99 at rank 0.99 * 7 = 6.93
    assert m["delay_p50_ms"] == pytest.approx(35)
    assert m["delay_p99_ms"] == pytest.approx(122 + 0.93 * (150 - 122))
    assert m["received_mbps"] == pytest.approx(8 * 1000 * 8 / 1.0 / 1e6)  # 8 distinct datagrams in 1 s
    assert m["quality_mos"] == pytest.approx(mos(40))  # lost + late
    # G.107: no impairment gives R = 93.2, MOS 4.41; 40% effective loss gives R = 93.2 - 95 * 40 / 50 = 17.2
    assert mos(0) == pytest.approx(4.41, abs=0.005)
    assert mos(40) == pytest.approx(1 + 0.035 * 17.2 + 7e-6 * 17.2 * (17.2 - 60) * (100 - 17.2))
    # RFC 3550 jitter: delays alternating 10 / 20 ms in order, 16 transitions of |D| = 10 ms each:
    # J = 10 * (1 - (15/16)^16)
    alt = [(q, q * 0.1, q * 0.1 + (0.010 if q % 2 else 0.020)) for q in range(17)]
    j = {s.name: s.value for s in analyse(alt, 17, p, 1.0).samples}["jitter_ms"]
    assert j == pytest.approx(10 * (1 - (15 / 16) ** 16))
    steady = [(q, q * 0.1, q * 0.1 + 0.015) for q in range(17)]
    j = {s.name: s.value for s in analyse(steady, 17, p, 1.0).samples}["jitter_ms"]
    assert j == pytest.approx(0, abs=1e-9)  # a constant delay has no jitter


def running(pid: int) -> bool:
    """The kernel's view (/proc), not tunnelbench's: the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_resilience_restart_one_and_all(mesh):
    def pids() -> dict[str, set[int]]:
        return {h: {p.pid for p in ps} for h, ps in mesh.daemons().items()}

    client, server = mesh.hosts[0].name, mesh.hosts[1].name
    m = {}
    for event in ("restart_one", "restart_all"):  # one at a time: which daemons each event replaced
        before = pids()
        got, _ = run(mesh, "resilience", timeout=180, events=[event], before_s=0.5, after_s=0.5, timeout_s=40)
        after = pids()
        m |= got
        if mesh.vpn == "internal":  # no daemon: nothing to restart
            assert before == after == {client: set(), server: set()}
            continue
        # a restart is new daemon processes (the old PIDs gone, the kernel's process table agrees)
        for h in (server, client) if event == "restart_all" else (server,):
            assert before[h] and after[h] and not before[h] & after[h], (event, h, before, after)
            assert not [pid for pid in before[h] if running(pid)], f"{event}: an old daemon on {h} still runs"
        if event == "restart_one":  # ... of the server only: the client's daemon kept running
            assert before[client] == after[client], (before, after)
    declared("resilience", {k: v for k, v in m.items()} | {"failover_s": 0})
    for tag in ("one", "all"):
        assert 0 <= m[f"reconnect_{tag}_s"] < 40
        assert 0 < m[f"outage_{tag}_s"] < 41
        if mesh.vpn == "internal":  # nothing restarts: no outage beyond a probe interval or two
            assert m[f"outage_{tag}_s"] < 0.3
    # every pair answers again. Pairs the probe did not use may still be re-handshaking, so the mesh gets its
    # readiness wait rather than one 300 ms fping round (this test failed once in ten local runs with
    # wireguard-go; the assertion was not captured, the single round is the likeliest cause)
    mesh.wait_ready(30)


def test_resilience_failover_to_relay(tmp_path):
    """n2n on a relay-path lab: UDP between the peers blocked mid-probe, traffic must cross the supernode."""
    from conftest import lab_missing

    from tunnelbench.lab.journal import Journal
    from tunnelbench.lab.netns import NetnsLab
    from tunnelbench.lab.tags import new_run_id, new_tag

    if lab_missing():
        pytest.skip(lab_missing())
    cls = DRIVERS.get("n2n")
    if cls is None or not cls.availability().ok or "relay" not in cls.paths:
        pytest.skip("no VPN with a relay path is available here (n2n)")
    tag = new_tag()
    run_dir = tmp_path / new_run_id(tag)
    journal = Journal(run_dir, run_dir.name)
    lab = NetnsLab(tag, 3, run_dir, journal, path="relay")
    try:
        lab.build()
        lab.wait_links()
        driver = cls(MeshSpec(hosts=list(lab.hosts), tag=tag, workdir=run_dir, path="relay", relay=lab.relay))
        driver.configure()
        mesh = Mesh(driver)
        mesh.start()
        try:
            mesh.wait_ready(60)
            wl = WORKLOADS["resilience"](
                WORKLOADS["resilience"].Params(
                    events=["failover"], watch_s=8, direct_settle_s=3, timeout_s=30
                )
            )
            adir = run_dir / "cases" / "failover"
            adir.mkdir(parents=True)
            ctx = CaseContext(mesh, lab.hosts[0], lab.hosts[1], adir, time.monotonic() + 180, lab=lab)
            out = wl.run(ctx)
            m = {s.name: s.value for s in out.samples}
            print("failover metrics", m)
            assert 0 < m["failover_s"] < 8 + 1  # the longest reply gap after the block, within the window
            assert 0 < m["failback_s"] < 8 + 1
            # the probe (100 echoes/s, each way) crossed the relay host while blocked: far more than the
            # supernode's registration keepalives (~100 B every 20 s) could account for
            assert m["relay_bytes_during_block"] > 20_000, m
        finally:
            mesh.stop()
    finally:
        lab.destroy()
        journal.end()


def test_batched_lab_build(lab_factory):
    """Labs above BATCH_ABOVE hosts are built with `ip -batch`: same addressing, every host reachable."""
    from tunnelbench.lab.netns import BATCH_ABOVE

    lab = lab_factory(BATCH_ABOVE + 4)
    last = lab.hosts[-1]
    assert last.run(["ip", "-4", "-o", "addr", "show", "eth0"]).stdout.split()[3] == f"{last.underlay_ip}/24"
    assert "default via" in last.run(["ip", "route"]).stdout
    assert last.run(["ping", "-c1", "-W1", lab.hosts[0].underlay_ip], check=False).returncode == 0


def _tx_bytes(host) -> int:
    return int(host.run(["cat", f"/sys/class/net/{host.underlay_if}/statistics/tx_bytes"]).stdout)


def test_http_api_over_tls_returns_the_pod_list(mesh):
    """Seed 000's API test: HTTPS, a JSON list of pods, new connections (a TLS handshake each). The server's
    underlay interface must have sent at least every body once per request; the case's key is gone after."""
    from tunnelbench.workloads.http_api import pod_list

    server = mesh.hosts[1]
    tx0 = _tx_bytes(server)
    m, out = run(mesh, "http_api", count=20, rate_per_s=20, tls=True, objects=200, keepalive=False)
    sent = _tx_bytes(server) - tx0
    declared("http_api", m)
    body = len(pod_list(200))
    assert m["error_rate_pct"] == 0 and m["response_bytes"] == body > 150_000
    assert 20 * body <= sent <= 20 * body * 1.3 + 200_000, (sent, body)  # headers, TLS records, handshakes
    lat = [v for _, v in out.series[0].points]
    assert m["request_mean_ms"] == pytest.approx(sum(lat) / len(lat))
    (adir,) = [
        d for d in (mesh.run_dir / "cases").iterdir() if d.name.startswith("http-api-20rps-200obj-tls")
    ]
    conf = (adir / "nginx" / "nginx.conf").read_text()
    assert " ssl backlog" in conf and "ssl_certificate " in conf
    assert (adir / "nginx" / "api-cert.pem").exists() and not (adir / "nginx" / "api-key.pem").exists()
    no_nginx_left(mesh)
