"""Issue 19 item 3: the resilience workload's control_loss event (and relay_loss) in a real lab.

The router blackholes the VPN's control host while a probe runs between two other hosts. The fake VPN is the
baseline (`internal`, no daemon) told that h3 is its control host: cheap, and the probe's path never crosses
h3, so the cut must not touch it; a variant aims the probe *at* h3 (positive control: the metrics must see the
loss). Nebula (lighthouse h1, client h2, server h3) is the real driver, end to end through the runner too."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import tb

from tunnelbench.catalog import DRIVERS, WORKLOADS
from tunnelbench.lab.blackhole import Blackhole, table_name
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.internal import Internal
from tunnelbench.vpns.mesh import Mesh
from tunnelbench.workloads.base import CaseContext, WorkloadError
from tunnelbench.workloads.resilience import NotApplicable

Resilience = WORKLOADS["resilience"]
CUT_METRICS = {
    "control_loss_gap_s",
    "control_loss_replies_pct",
    "control_loss_join_ok",
    "control_restore_s",
    "control_dropped_packets",
    "control_mesh_restore_s",
}


# -- no lab ------------------------------------------------------------------------------------------------
class FakeHost:
    def __init__(self, name: str):
        self.name, self.remote, self.public_ip = name, False, f"10.100.{name[1:]}.2"


def spec(n: int, path: str = "direct") -> MeshSpec:
    hosts = [FakeHost(f"h{i}") for i in range(1, n + 1)]
    return MeshSpec(
        hosts=hosts,
        tag="t",
        workdir=Path("/nonexistent"),
        path=path,
        relay=hosts[-1] if path != "direct" else None,
    )  # type: ignore[arg-type]


def test_control_hosts_per_driver():
    """Which host each driver names as its control host: the one its own config puts the server on."""
    want = {
        "tailscale": ("h4", "h3"),
        "nebula": ("h1", "h3"),
        "n2n": ("h1", "h3"),
        "innernet": ("h4", None),
        "easytier": (None, "h3"),
        "internal": (None, None),
        "wireguard-go": (None, None),
    }
    for vpn, (direct, relay) in want.items():
        cls = DRIVERS[vpn]
        got = cls.control_host(spec(4))
        assert (got and got.name) == direct, (vpn, got)
        if relay is not None:
            assert cls.control_host(spec(3, "relay")).name == relay, vpn
    # ... and it is the host the driver really uses (one source of truth)
    s = spec(4)
    assert DRIVERS["tailscale"](s).infra is s.hosts[3]
    assert DRIVERS["n2n"](s).super_host is s.hosts[0]
    assert DRIVERS["innernet"](s).server is s.hosts[3]


def test_cut_events_move_the_path_and_cost_time():
    for ev in ("control_loss", "relay_loss"):
        wl = Resilience(Resilience.Params(events=[ev], control_watch_s=7, control_join_timeout_s=5))
        assert wl.moves_path()
        assert wl.label() == f"resilience-{ev}"
        assert wl.expected_seconds() >= 7 + (5 if ev == "control_loss" else 0)
    assert not Resilience(Resilience.Params(events=["restart_one"])).moves_path()


def test_probe_counts_echo_replies_only(tmp_path):
    """ping prints ICMP errors with a timestamp and icmp_seq too (n2n's TAP: "Destination Host Unreachable"
    while the peer is gone): they are not replies, for the gap, the restore time or the answered share."""
    from tunnelbench.workloads.resilience import Probe

    probe = Probe.__new__(Probe)
    probe.path = tmp_path / "p.txt"
    probe.proc = SimpleNamespace(log_text=probe.path.read_text)  # ping's log, as a local process reads it
    probe.path.write_text(
        "PING 10.77.0.3 (10.77.0.3) 56(84) bytes of data.\n"
        "[100.000] 64 bytes from 10.77.0.3: icmp_seq=1 ttl=64 time=0.2 ms\n"
        "[103.000] From 10.77.0.2 icmp_seq=300 Destination Host Unreachable\n"
        "[104.000] 64 bytes from 10.77.0.3: icmp_seq=401 ttl=64 time=0.2 ms\n"
    )
    assert probe.replies_seq() == [(100.0, 1), (104.0, 401)]
    assert probe.wait_reply_after(100.5, 0.1) == 104.0
    assert probe.answered_pct(99.0, 101.0) == pytest.approx(0.5)  # 1 answered of 2 s x 100 requests/s


def test_blackhole_rules_name_one_table_and_the_public_address():
    h = FakeHost("h3")
    h.public_ip = "10.100.3.2"
    b = Blackhole(None, "abc", h)  # type: ignore[arg-type]
    assert b.table == table_name("abc") == "abccut"
    r = b.rules()
    assert "table inet abccut" in r and "ip saddr 10.100.3.2" in r and "ip daddr 10.100.3.2" in r
    assert r.count(" drop\n") == 2 and "abcpath" not in r


# -- lab ---------------------------------------------------------------------------------------------------
class ControlledInternal(Internal):
    """The baseline with h3 as its "control host" (no daemon: restarts are instant)."""

    name = "internal"
    probe_to_control = False  # positive control: the server's address is the control host's
    fail_stop = False  # break the case mid-way (during the join, with the host cut off)

    @classmethod
    def control_host(cls, spec):
        return spec.hosts[2]

    def tunnel_ip(self, host):
        if self.probe_to_control and host is self.spec.hosts[1]:
            return self.spec.hosts[2].underlay_ip
        return host.underlay_ip

    def stop(self, host):
        if self.fail_stop:
            raise RuntimeError("planted failure during the cut")
        super().stop(host)


def ping(a, b) -> bool:
    return a.run(["ping", "-c1", "-W1", b.underlay_ip], check=False).returncode == 0


def run_case(lab, mesh, client, server, timeout=120, watch=None, **params):
    """Run the event in a thread; meanwhile record what an independent ping to the cut host saw."""
    wl = Resilience(
        Resilience.Params(
            **{"events": ["control_loss"], "before_s": 0.3, "after_s": 0.3, "timeout_s": 20, **params}
        )
    )
    adir = lab.run_dir / "cases" / f"cl-{time.monotonic_ns()}"
    adir.mkdir(parents=True)
    ctx = CaseContext(mesh, client, server, adir, time.monotonic() + timeout, lab=lab)
    box: dict = {}

    def go():
        try:
            box["out"] = wl.run(ctx)
        except Exception as e:
            box["error"] = e

    t = threading.Thread(target=go)
    t.start()
    seen = {}
    if watch is not None:  # (pinger, target): once the table is there, can the pinger reach the target?
        hole = Blackhole(lab.router, lab.tag, watch[1])
        end = time.monotonic() + 30
        while not hole.active() and time.monotonic() < end and t.is_alive():
            time.sleep(0.05)
        seen["active"] = hole.active()
        seen["during"] = ping(*watch)
        seen["peer_during"] = ping(client, server) if mesh.driver.name == "internal" else None
    t.join(timeout + 30)
    assert not t.is_alive()
    m = {s.name: s.value for s in box["out"].samples} if "out" in box else {}
    return m, box.get("error"), seen


@pytest.fixture
def fake(lab_factory):
    lab = lab_factory(3)
    driver = ControlledInternal(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir))
    return lab, Mesh(driver)


@pytest.mark.lab
def test_cut_drops_the_control_host_only_and_is_lifted(fake):
    lab, mesh = fake
    h1, h2, h3 = lab.hosts
    hole = Blackhole(lab.router, lab.tag, h3)
    m, err, seen = run_case(lab, mesh, h1, h2, control_watch_s=3, control_join_timeout_s=3, watch=(h1, h3))
    assert err is None, err
    # during the cut: h3 unreachable from h1, h1 <-> h2 untouched; afterwards the table is gone, h3 answers
    assert seen == {"active": True, "during": False, "peer_during": True}, seen
    assert not hole.active() and ping(h1, h3)
    assert CUT_METRICS | {"control_loss_join_s"} <= set(m), m
    assert m["control_loss_gap_s"] < 0.5 and m["control_loss_replies_pct"] > 90, (
        m
    )  # the probe never crossed h3
    assert m["control_loss_join_ok"] == 1 and m["control_restore_s"] < 0.5, m
    assert m["control_dropped_packets"] >= 1, m  # at least the independent ping above


@pytest.mark.lab
def test_cut_metrics_see_a_lost_data_plane(fake):
    """Positive control: the probe goes to the cut host itself, so replies stop for the whole window."""
    lab, mesh = fake
    mesh.driver.probe_to_control = True
    m, err, _ = run_case(lab, mesh, lab.hosts[0], lab.hosts[1], control_watch_s=3, control_join_timeout_s=2)
    assert err is None, err
    assert m["control_loss_gap_s"] > 2.9 and m["control_loss_replies_pct"] < 2, m
    assert m["control_loss_join_ok"] == 0 and "control_loss_join_s" not in m, m
    assert m["control_restore_s"] < 2, m  # ping -W1: replies resume within a second or so of the unblock
    assert m["control_dropped_packets"] > 200, m  # 100 probes/s for 5 s


@pytest.mark.lab
def test_cut_is_lifted_when_the_case_breaks_mid_way(fake):
    lab, mesh = fake
    h1, h2, h3 = lab.hosts
    mesh.driver.fail_stop = True
    hole = Blackhole(lab.router, lab.tag, h3)
    m, err, seen = run_case(lab, mesh, h1, h2, control_watch_s=2, control_join_timeout_s=2, watch=(h1, h3))
    assert isinstance(err, RuntimeError) and "planted failure" in str(err), err
    assert seen["active"] and not seen["during"]  # it did cut, then broke
    assert not hole.active() and ping(h1, h3)
    assert not h1.pids(), (
        "the probe is still running"
    )  # the baseline has no daemons: only the probe ran there


@pytest.mark.lab
def test_not_applicable_and_misplaced_control_host(lab_factory):
    lab = lab_factory(3)
    h1, h2, h3 = lab.hosts
    plain = Mesh(Internal(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir)))
    wl = Resilience(Resilience.Params(events=["control_loss"]))
    adir = lab.run_dir / "cases" / "na"
    adir.mkdir(parents=True)
    with pytest.raises(NotApplicable, match="not applicable: internal has no central control plane"):
        wl.run(CaseContext(plain, h1, h2, adir, time.monotonic() + 60, lab=lab))
    with pytest.raises(NotApplicable, match="no relay host"):
        Resilience(Resilience.Params(events=["relay_loss"])).run(
            CaseContext(plain, h1, h2, adir, time.monotonic() + 60, lab=lab)
        )
    fake = Mesh(ControlledInternal(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir)))
    with pytest.raises(WorkloadError, match="control host is h3, the probe's server"):
        wl.run(CaseContext(fake, h1, h3, adir, time.monotonic() + 60, lab=lab))
    assert not Blackhole(lab.router, lab.tag, h3).active()


@pytest.mark.lab
def test_relay_loss_cuts_the_labs_relay_host(lab_factory):
    """relay_loss blackholes lab.relay (h3 on a relay-path lab); the baseline's ICMP between h1 and h2 never
    crosses it, so only the independent ping to h3 is lost. No join step: no control_* metrics."""
    lab = lab_factory(3, path="relay")
    h1, h2, h3 = lab.hosts
    mesh = Mesh(
        Internal(
            MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir, path="relay", relay=lab.relay)
        )
    )
    m, err, seen = run_case(lab, mesh, h1, h2, watch=(h1, h3), events=["relay_loss"], control_watch_s=3)
    assert err is None, err
    assert seen == {"active": True, "during": False, "peer_during": True}, seen
    assert not Blackhole(lab.router, lab.tag, h3).active() and ping(h1, h3)
    want = {
        "relay_loss_gap_s",
        "relay_loss_replies_pct",
        "relay_restore_s",
        "relay_mesh_restore_s",
        "relay_dropped_packets",
    }
    assert set(m) >= want and not [k for k in m if k.startswith("control")], m
    assert m["relay_loss_gap_s"] < 0.5 and m["relay_dropped_packets"] >= 1, m


def nebula_or_skip():
    cls = DRIVERS["nebula"]
    a = cls.availability()
    if not a.ok:
        pytest.skip(f"nebula: {a.reason}")
    return cls


@pytest.mark.lab
def test_nebula_keeps_its_data_plane_without_the_lighthouse(lab_factory):
    """Nebula, lighthouse h1 (direct path), probe h2 -> h3: static host map, so tunnels need no lighthouse."""
    cls = nebula_or_skip()
    lab = lab_factory(3)
    h1, h2, h3 = lab.hosts
    driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir))
    assert cls.control_host(driver.spec) is h1
    driver.configure()
    mesh = Mesh(driver)
    mesh.start()
    try:
        mesh.wait_ready(60)
        m, err, seen = run_case(
            lab, mesh, h2, h3, timeout=150, control_watch_s=5, control_join_timeout_s=20, watch=(h2, h1)
        )
        print("nebula control_loss", m)
        assert err is None, err
        assert seen["active"] and not seen["during"]
        assert not Blackhole(lab.router, lab.tag, h1).active() and ping(h2, h1)
        assert set(m) >= CUT_METRICS, m
        assert m["control_loss_gap_s"] < 1 and m["control_loss_replies_pct"] > 90, m
        assert m["control_loss_join_ok"] == 1, (
            m
        )  # the restarted h3 handshakes with h2 from the static host map
        assert m["control_dropped_packets"] > 0, m
        mesh.wait_ready(30)  # the lighthouse is back in the mesh
    finally:
        mesh.stop()
    assert mesh.leftovers() == []


SCENARIO = """
name = "cl-e2e"
vpns = ["nebula"]
[run]
repetitions = 1
retries = 0
[lab]
hosts = 3
client = "h2"
server = "h3"
[[workloads]]
name = "resilience"
events = ["control_loss"]
control_watch_s = 3
control_join_timeout_s = 15
before_s = 0.5
after_s = 0.5
"""


@pytest.mark.lab
def test_runner_stores_the_control_loss_metrics(tmp_path):
    """Through the runner: the case is ok (the path check does not judge it), its metrics are in the store."""
    from conftest import lab_missing

    if lab_missing():
        pytest.skip(lab_missing())
    nebula_or_skip()
    (tmp_path / "s.toml").write_text(SCENARIO)
    p = tb("run", str(tmp_path / "s.toml"), "--results", str(tmp_path / "r"), "--no-html", timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (db,) = (tmp_path / "r").glob("*/results.sqlite")
    c = sqlite3.connect(db)
    status, error, cid = c.execute("SELECT status, error, id FROM \"case\" WHERE vpn='nebula'").fetchone()
    assert status == "ok", error
    names = {r[0] for r in c.execute("SELECT name FROM metric WHERE case_id=?", (cid,))}
    assert names >= CUT_METRICS, names
