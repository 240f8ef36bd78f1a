"""Revocation (a security conformance check, `tunnelbench run security`): one host is cut off the running mesh the way the VPN's operator would
do it (the driver's `revoke()`, described by its `revocation`: delete the WireGuard peer everywhere, `headscale
nodes delete`, ...) while a fast ping probe runs from that host to another one's tunnel address.

Hosts (needs >= 3, `[lab] hosts`): the revoked host is the third (h3), the probe target the second (h2), the
witness the first (h1). revocation_s = from the return of the revoke call to the last echo reply h3 got from h2
after the call (0 when none came after the return); the probe must then stay silent for `quiet_s`. A reply
later than `cap_s` after the return fails the case: "still reachable". The call's own duration is revoke_call_s.
others_ok: h1 -> h2 still answers after the revocation (revoking one host must not break the others);
cut_off_all: h3 reaches neither h2 nor h1 at the end.

A VPN whose driver has no revocation fails the case as "not supported". Positive control: a revoke that does
nothing must fail with "still reachable" (tests/security/test_revoke.py).

The revocation damages the mesh, and the runner rebuilds a mesh only after a failed case: the workload
restarts the whole mesh itself at the end (every daemon stopped and started again, which re-adds the peers;
a deleted Headscale node rejoins as a new node) and waits until every pair answers. Evidence: revoke-probe.txt
(the probe's `ping -D` output) and revoke.json (timestamps, the operator action, reply counts), also written
when the case fails."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from typing import Any

from pydantic import Field

from tunnelbench.core.clock import WallClockStep, WallClockWatch
from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome
from tunnelbench.lab.host import Host
from tunnelbench.workloads.base import CaseContext, NotApplicable, Params, Workload, WorkloadError
from tunnelbench.workloads.resilience import Probe

REPLY_LINE = re.compile(r"bytes from .*icmp_seq=", re.M)


class RevokeParams(Params):
    cap_s: float = Field(30.0, gt=0, le=600, description="a reply later than this after the revocation fails")
    probe_interval_s: float = Field(0.02, ge=0.002, le=1, description="echo request spacing h3 -> h2")
    before_s: float = Field(1.0, ge=0.1, le=60, description="probe this long before revoking")
    quiet_s: float = Field(
        3.0, ge=1.5, le=60, description="no reply for this long = cut off (> ping's 1 s reply wait)"
    )


def answers(src: Host, ip: str, count: int = 5) -> int:
    """Echo replies `src` gets from `ip` out of `count` (0 also when ping cannot send at all)."""
    r = src.run(["ping", "-n", "-c", str(count), "-i", "0.2", "-W", "1", ip], check=False, timeout=count + 5)
    return len(REPLY_LINE.findall(r.stdout))


class Revoke(Workload):
    name = "revoke"
    summary = "revocation: cut h3 off the mesh as the operator would; seconds until h2 stops answering it"
    tools = ("ping",)
    restarts_mesh = True
    headline = ("revocation_s",)
    Params = RevokeParams
    params: RevokeParams
    metrics = (
        MetricSpec("revocation_s", "s", "lower", "revoke call returned -> last echo reply h2 sent h3"),
        MetricSpec("revoke_call_s", "s", "lower", "duration of the operator's revoke action itself"),
        MetricSpec("others_ok", "bool", "higher", "1 = h1 -> h2 still answers after h3 was revoked"),
        MetricSpec(
            "cut_off_all", "bool", "higher", "1 = the revoked h3 reaches neither h2 nor h1 at the end"
        ),
    )

    def expected_seconds(self) -> float:
        p = self.params
        # probe before + the cap + the quiet window + witness pings + the mesh restart at the end
        return p.before_s + p.cap_s + p.quiet_s + 10 + 60

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        hosts = ctx.mesh.hosts
        if len(hosts) < 3:
            raise WorkloadError(
                f"revoke needs at least 3 hosts ([lab] hosts = 3 or more), this lab has {len(hosts)}"
            )
        witness, target, revoked = hosts[0], hosts[1], hosts[2]
        driver = ctx.mesh.driver
        if type(driver).revocation is None:
            raise NotApplicable(f"{ctx.mesh.vpn}: revocation not supported (the driver has no revoke)")
        t0 = time.monotonic()
        wall = WallClockWatch()  # the revocation time is read off ping's wall-clock stamps
        record: dict[str, Any] = {
            "revoked": revoked.name,
            "target": target.name,
            "witness": witness.name,
            "cap_s": p.cap_s,
        }
        sub = dataclasses.replace(ctx, client=revoked, server=target)
        probe = Probe(sub, "revoke-probe", p.probe_interval_s)
        revoked_done = False
        try:
            if probe.wait_reply_after(0, 10) is None:
                raise WorkloadError(f"no echo reply {revoked.name} -> {target.name} before the revocation")
            time.sleep(p.before_s)
            t_call = time.time()
            try:
                action = driver.revoke(revoked)
            except NotImplementedError as e:
                raise NotApplicable(f"{ctx.mesh.vpn}: revocation not supported ({e})") from e
            t_ret = time.time()
            revoked_done = True
            record |= {"action": action, "t_call": t_call, "t_return": t_ret}
            last = self._watch(probe, t_call, t_ret)
            probe.stop()
            replies = probe.replies()
            record |= {
                "last_reply": last,
                "replies_before": sum(ts < t_call for ts in replies),
                "replies_after_call": sum(ts >= t_call for ts in replies),
            }
            try:
                wall.check("the revocation")
            except WallClockStep as e:
                raise WorkloadError(str(e)) from None
            if last is not None and last - t_ret > p.cap_s:
                raise WorkloadError(
                    f"still reachable {last - t_ret:.1f} s after revocation (cap {p.cap_s:g} s): "
                    f"{revoked.name} -> {target.name} kept getting echo replies after {action}"
                )
            out = Outcome(artifacts=[probe.path, ctx.artifact_dir / "revoke.json"])
            out.add("revocation_s", max(0.0, last - t_ret) if last is not None else 0.0)
            out.add("revoke_call_s", t_ret - t_call)
            others = answers(witness, ctx.mesh.tunnel_ip(target))
            out.add("others_ok", 1 if others else 0)
            to_witness = answers(revoked, ctx.mesh.tunnel_ip(witness), 3)
            out.add(
                "cut_off_all",
                0 if to_witness or answers(revoked, ctx.mesh.tunnel_ip(target), 3) else 1,
            )
            record |= {"witness_replies": others, "revoked_to_witness_replies": to_witness}
            out.measure_s = time.monotonic() - t0
            return out
        finally:
            probe.stop()
            (ctx.artifact_dir / "revoke.json").write_text(json.dumps(record, indent=1))
            if revoked_done:  # the next case gets the whole mesh back
                ctx.mesh.stop()
                ctx.mesh.start()
                ctx.mesh.wait_ready(timeout=max(30.0, ctx.remaining()))

    def _watch(self, probe: Probe, t_call: float, t_ret: float) -> float | None:
        """Poll the probe until no reply came for quiet_s, or one came later than the cap; the last reply after
        the call (None: none came)."""
        p = self.params
        while True:
            last = max((ts for ts in probe.replies() if ts > t_call), default=None)
            if last is not None and last - t_ret > p.cap_s:
                return last
            if time.time() - max(t_ret, last or t_ret) >= p.quiet_s:
                return last
            time.sleep(0.05)
