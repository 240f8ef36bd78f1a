"""Every workload against the baseline and a VPN, in a real lab: metrics present, in range, consistent."""

from __future__ import annotations

import time

import pytest

from tunnelbench.vpns import DRIVERS, Mesh, MeshSpec
from tunnelbench.workloads import WORKLOADS, CaseContext

pytestmark = pytest.mark.lab


@pytest.fixture(params=["internal", "wireguard-go"])
def mesh(request, lab_factory):
    cls = DRIVERS[request.param]
    a = cls.availability()
    if not a.ok:
        pytest.skip(f"{request.param}: {a.reason}")
    lab = lab_factory(2)
    driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir))
    driver.configure()
    m = Mesh(driver)
    m.start()
    m.wait_ready(30)
    m.run_dir = lab.run_dir
    yield m
    m.stop()
    assert m.leftovers() == []


def run(mesh, name: str, **params):
    wl = WORKLOADS[name](WORKLOADS[name].Params(**params))
    adir = mesh.run_dir / "cases" / wl.label()
    adir.mkdir(parents=True, exist_ok=True)
    ctx = CaseContext(mesh, mesh.hosts[0], mesh.hosts[1], adir, time.monotonic() + 60, {"mss": None})
    out = wl.run(ctx)
    return {s.name: s.value for s in out.samples}, out


def test_tcp_single_and_parallel(mesh):
    m, out = run(mesh, "tcp", duration_s=1, omit_s=0)
    assert 10 < m["goodput_mbps"] < 100_000
    assert m["goodput_mbps"] <= m["goodput_sender_mbps"] * 1.05
    assert 0 <= m["retransmit_rate"] < 1
    assert out.measure_s >= 1
    m4, _ = run(mesh, "tcp", duration_s=1, omit_s=0, streams=3)
    assert 10 < m4["goodput_mbps"] < 100_000
    assert set(WORKLOADS["tcp"].Params.model_fields) >= {"streams", "duration_s"}


def test_tcp_mss_clamp_is_applied(mesh):
    wl = WORKLOADS["tcp"](WORKLOADS["tcp"].Params(duration_s=1, omit_s=0))
    adir = mesh.run_dir / "cases" / "mss"
    adir.mkdir(parents=True)
    ctx = CaseContext(mesh, mesh.hosts[0], mesh.hosts[1], adir, time.monotonic() + 60, {"mss": 1000})
    wl.run(ctx)
    import json

    data = json.loads((adir / "tcp-client.json").read_text())
    assert data["start"]["tcp_mss"] <= 1000


def test_udp_fixed_rate_and_unlimited(mesh):
    m, _ = run(mesh, "udp", duration_s=1, bitrate="20M")
    assert m["goodput_sender_mbps"] == pytest.approx(20, rel=0.1)
    assert m["udp_loss_pct"] < 5
    assert m["udp_packets"] > 1000
    assert m["udp_jitter_ms"] >= 0
    mu, _ = run(mesh, "udp", duration_s=1, bitrate="0")
    assert mu["goodput_mbps"] > 10
    assert 0 <= mu["udp_loss_pct"] <= 100


def test_ping_idle(mesh):
    m, out = run(mesh, "ping", count=30, interval_s=0.01)
    assert m["ping_loss_pct"] < 10  # a userspace VPN on a busy 2-core machine may drop one

    assert 0 < m["rtt_min_ms"] <= m["rtt_p50_ms"] <= m["rtt_p99_ms"] <= m["rtt_max_ms"] < 50
    (series,) = out.series
    assert len(series.points) == round(30 * (1 - m["ping_loss_pct"] / 100))


def test_connect_time(mesh):
    m, _ = run(mesh, "connect", timeout_s=30)
    assert 0 < m["connect_s"] <= m["mesh_ready_s"] < 30
    assert mesh.pairs_down() == []
