"""Revocation (issue 14 item 4) in a real 3-host lab: each VPN's operator action cuts h3 off within the cap, the
probe's own timestamps agree, h1 -> h2 keeps working; a revoke that does nothing must fail as "still reachable"."""

from __future__ import annotations

import json
import time

import pytest

from tunnelbench.catalog import DRIVERS, WORKLOADS
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.mesh import Mesh
from tunnelbench.workloads.base import CaseContext, NotApplicable, WorkloadError
from tunnelbench.workloads.resilience import REPLY

pytestmark = pytest.mark.lab

VPNS = ["wireguard-go", "boringtun", "tailscale", "nebula", "innernet"]
LAB_HOSTS = {"innernet": 4}  # innernet's server is the last host, and it cannot be revoked: h3 must be a peer
MARGIN_S = 0.5  # a reply in flight when the workload took its last timestamp


def up(lab_factory, vpn: str) -> Mesh:
    cls = DRIVERS[vpn]
    a = cls.availability()
    if not a.ok:
        pytest.skip(f"{vpn}: {a.reason}")
    lab = lab_factory(LAB_HOSTS.get(vpn, 3))
    driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir))
    driver.configure()
    m = Mesh(driver)
    m.start()
    m.wait_ready(60)
    m.run_dir = lab.run_dir  # type: ignore[attr-defined]
    return m


def run_revoke(mesh: Mesh, **params) -> tuple[dict, CaseContext]:
    wl = WORKLOADS["revoke"](WORKLOADS["revoke"].Params(**params))
    adir = mesh.run_dir / "cases" / f"revoke-{time.monotonic_ns()}"  # type: ignore[attr-defined]
    adir.mkdir(parents=True)
    ctx = CaseContext(mesh, mesh.hosts[0], mesh.hosts[1], adir, time.monotonic() + 180, {})
    out = wl.run(ctx)
    return {s.name: s.value for s in out.samples}, ctx


def probe_replies(ctx: CaseContext) -> list[float]:
    text = (ctx.artifact_dir / "revoke-probe.txt").read_text()
    return [float(m["ts"]) for line in text.splitlines() if (m := REPLY.match(line))]


# innernet (36 s: a 4-host lab, its server's CIDR tooling), tailscale (27 s: headscale's API) and boringtun
# (9 s: a WireguardGo subclass, the same `revoke` over the same UAPI socket): --long runs them; wireguard-go
# and nebula cut a peer off in CI
@pytest.mark.parametrize(
    "vpn",
    [
        pytest.param(v, marks=pytest.mark.long) if v in ("innernet", "tailscale", "boringtun") else v
        for v in VPNS
    ],
)
def test_revocation_cuts_off_within_cap(vpn, lab_factory):
    assert DRIVERS[vpn].revocation
    mesh = up(lab_factory, vpn)
    try:
        m, ctx = run_revoke(mesh)
        assert {s.name for s in WORKLOADS["revoke"].metrics} == set(m)
        rec = json.loads((ctx.artifact_dir / "revoke.json").read_text())
        t_call, t_ret = rec["t_call"], rec["t_return"]
        assert 0 <= m["revocation_s"] < 30
        assert 0 <= m["revoke_call_s"] == pytest.approx(t_ret - t_call)
        # the test's own reading of the probe: replies flowed before, none after the measured cut-off
        replies = probe_replies(ctx)
        assert sum(ts < t_call for ts in replies) > 0
        late = [ts - t_ret for ts in replies if ts > t_ret + m["revocation_s"] + MARGIN_S]
        assert late == [], f"replies {late} s after the revocation, measured {m['revocation_s']:.2f} s"
        assert m["others_ok"] == 1 and m["cut_off_all"] == 1
        print(
            f"{vpn}: revocation_s={m['revocation_s']:.3f} revoke_call_s={m['revoke_call_s']:.3f} ({rec['action']})"
        )
        # the workload restarted the mesh: every pair answers again, h3 included
        assert mesh.pairs_down() == []
    finally:
        mesh.stop()
    assert mesh.leftovers() == []


def test_noop_revoke_is_still_reachable(lab_factory, monkeypatch):
    """Positive control: if the operator's action does nothing, the check must catch it."""
    mesh = up(lab_factory, "wireguard-go")
    monkeypatch.setattr(type(mesh.driver), "revoke", lambda self, host: "nothing")
    try:
        with pytest.raises(WorkloadError, match="still reachable") as e:
            run_revoke(mesh, cap_s=3)
        print(e.value)
    finally:
        mesh.stop()
    assert mesh.leftovers() == []


def test_needs_three_hosts(lab_factory):
    cls = DRIVERS["wireguard-go"]
    if not cls.availability().ok:
        pytest.skip("wireguard-go unavailable")
    lab = lab_factory(2)
    driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir))
    wl = WORKLOADS["revoke"](WORKLOADS["revoke"].Params())
    ctx = CaseContext(Mesh(driver), lab.hosts[0], lab.hosts[1], lab.run_dir, time.monotonic() + 10, {})
    with pytest.raises(WorkloadError, match=r"\[lab\] hosts"):
        wl.run(ctx)


def test_unsupported_vpn_says_so(lab_factory):
    """A driver without a revoke hook (internal: no VPN at all): the case is n/a, not supported, before any
    probe (n/a: neither measured nor failed, no reason for exit 1)."""
    lab = lab_factory(3)
    driver = DRIVERS["internal"](MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir))
    assert type(driver).revocation is None
    with pytest.raises(NotImplementedError):
        driver.revoke(lab.hosts[2])
    wl = WORKLOADS["revoke"](WORKLOADS["revoke"].Params())
    ctx = CaseContext(Mesh(driver), lab.hosts[0], lab.hosts[1], lab.run_dir, time.monotonic() + 10, {})
    with pytest.raises(NotApplicable, match="revocation not supported"):
        wl.run(ctx)


def test_a_wall_clock_step_during_the_revocation_fails_the_case(lab_factory, monkeypatch):
    """The revocation time is read off ping's wall-clock stamps: a step of the wall clock (here +30 s, in this
    process, while the operator's action runs) must fail the case, not enter the result."""
    mesh = up(lab_factory, "wireguard-go")
    revoke = type(mesh.driver).revoke
    real = time.time

    def revoke_and_step(self, host):
        action = revoke(self, host)
        monkeypatch.setattr(time, "time", lambda: real() + 30.0)
        return action

    monkeypatch.setattr(type(mesh.driver), "revoke", revoke_and_step)
    try:
        with pytest.raises(
            WorkloadError, match=r"the wall clock stepped by \+30\.\d+ s during the revocation"
        ):
            run_revoke(mesh, cap_s=3)
    finally:
        monkeypatch.setattr(time, "time", real)
        mesh.stop()
    assert mesh.leftovers() == []
