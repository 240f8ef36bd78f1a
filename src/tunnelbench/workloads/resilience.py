"""Resilience, from the traffic's point of view (seed 003's reboot test): a continuous ICMP probe from the
client to the server's tunnel address (every 10 ms) while

- `restart_one`: the server host's VPN daemon is stopped and started again (state kept, as after a
  daemon restart or a reboot),
- `restart_all`: every host's daemon is restarted (the whole mesh reboots),
- `failover` (lab.path = "relay" only): the lab first lets UDP flow between the peers (the VPN may take
  the direct path), then blocks UDP between them mid-probe so the VPN must move to its relay, then
  unblocks it again (and restores the block the scenario asked for).

reconnect = from the restart command to the first echo reply after it; outage = the longest gap between
consecutive replies around the event (what an application saw). Failover needs the namespace lab's path
policies (lab.block_udp_between_peers) and a VPN with a relay (driver.paths has "relay"); otherwise the
case fails with the reason."""

from __future__ import annotations

import re
import time
from typing import Literal

from pydantic import Field

from tunnelbench.workloads.base import CaseContext, MetricSpec, Outcome, Params, Workload, WorkloadError

REPLY = re.compile(r"^\[(?P<ts>[\d.]+)\] .*icmp_seq=(?P<seq>\d+) ")

Event = Literal["restart_one", "restart_all", "failover"]


class ResilienceParams(Params):
    events: list[Event] = Field(
        ["restart_one", "restart_all"], min_length=1, description="what to do, in order"
    )
    probe_interval_s: float = Field(0.01, ge=0.002, le=1, description="echo request spacing")
    before_s: float = Field(1.0, ge=0.1, le=60, description="probe this long before each event")
    after_s: float = Field(1.0, ge=0.1, le=60, description="probe this long after replies resume")
    timeout_s: float = Field(60.0, gt=0, le=600, description="give up waiting for replies after an event")
    direct_settle_s: float = Field(
        5.0, ge=0, le=120, description="failover: time given to find the direct path"
    )
    watch_s: float = Field(15.0, ge=1, le=600, description="failover: seconds watched after block / unblock")


class Probe:
    """ping -D running in the background; reply timestamps read from its output file."""

    def __init__(self, ctx: CaseContext, name: str, interval: float):
        self.path = ctx.artifact_dir / f"{name}.txt"
        argv = ["ping", "-D", "-n", "-i", f"{interval:g}", "-W", "1", ctx.server_ip]
        self.proc = ctx.client.spawn(argv, label=f"probe-{name}", log_path=self.path)

    def replies(self) -> list[float]:
        try:
            text = self.path.read_text(errors="replace")
        except OSError:
            return []
        return [float(m["ts"]) for line in text.splitlines() if (m := REPLY.match(line))]

    def wait_reply_after(self, t: float, timeout: float) -> float | None:
        end = time.time() + timeout
        while time.time() < end:
            after = [ts for ts in self.replies() if ts > t]
            if after:
                return after[0]
            time.sleep(0.02)
        return None

    def stop(self) -> None:
        self.proc.stop(grace=1)


def longest_gap(ts: list[float], start: float, end: float) -> float:
    """Longest interval without a reply in [start, end], bounded by the window edges."""
    pts = [start] + [t for t in ts if start < t < end] + [end]
    return max(b - a for a, b in zip(pts, pts[1:], strict=False))


class Resilience(Workload):
    name = "resilience"
    summary = "reconnect after restarting one / all daemons, failover to the relay, seen by a 10 ms probe"
    tools = ("ping",)
    restarts_mesh = True
    headline = ("reconnect_one_s", "reconnect_all_s", "failover_s")
    Params = ResilienceParams
    metrics = (
        MetricSpec("reconnect_one_s", "s", "lower", "server daemon restart -> first reply"),
        MetricSpec("outage_one_s", "s", "lower", "longest reply gap around the server daemon restart"),
        MetricSpec("reconnect_all_s", "s", "lower", "all daemons restarted -> first reply"),
        MetricSpec("outage_all_s", "s", "lower", "longest reply gap around the mesh restart"),
        MetricSpec("failover_s", "s", "lower", "longest reply gap after UDP between peers is blocked"),
        MetricSpec("failback_s", "s", "lower", "longest reply gap after UDP is allowed again"),
        MetricSpec("relay_bytes_during_block", "B", "none", "bytes the relay host carried while blocked"),
        MetricSpec(
            "relay_bytes_before_block", "B", "none", "bytes the relay host carried before (0 = direct)"
        ),
    )

    def moves_path(self) -> bool:
        return "failover" in self.params.events  # unblocks the direct path, then blocks it mid-probe

    def label(self) -> str:
        return "resilience-" + "-".join(e.replace("restart_", "") for e in self.params.events)

    def expected_seconds(self) -> float:
        p = self.params
        extra = p.direct_settle_s + 2 * p.watch_s if "failover" in p.events else 0
        return len(p.events) * (p.before_s + p.after_s + 20) + extra

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        out = Outcome()
        t0 = time.monotonic()
        for ev in p.events:
            if ev == "failover":
                self._failover(ctx, out)
            else:
                self._restart(ctx, out, ev)
        # the whole mesh must answer again before the next case
        ctx.mesh.wait_ready(timeout=min(p.timeout_s, ctx.remaining()))
        out.measure_s = time.monotonic() - t0
        return out

    def _restart(self, ctx: CaseContext, out: Outcome, ev: str) -> None:
        p = self.params
        tag = "one" if ev == "restart_one" else "all"
        probe = Probe(ctx, f"probe-{tag}", p.probe_interval_s)
        try:
            if probe.wait_reply_after(0, 5) is None:
                raise WorkloadError("no echo reply before the restart")
            time.sleep(p.before_s)
            t_ev = time.time()
            if tag == "one":
                ctx.mesh.driver.stop(ctx.server)
                ctx.mesh.driver.start(ctx.server)
            else:
                ctx.mesh.stop()
                ctx.mesh.start()
            first = probe.wait_reply_after(t_ev, p.timeout_s)
            if first is None:
                raise WorkloadError(f"{ev}: no reply within {p.timeout_s:g} s")
            time.sleep(p.after_s)
            out.add(f"reconnect_{tag}_s", first - t_ev, "s")
            out.add(
                f"outage_{tag}_s",
                longest_gap(probe.replies(), t_ev - p.before_s / 2, first + p.after_s / 2),
                "s",
            )
        finally:
            probe.stop()

    def _failover(self, ctx: CaseContext, out: Outcome) -> None:
        p = self.params
        lab = ctx.options.get("lab")
        driver = ctx.mesh.driver
        if lab is None or not hasattr(lab, "block_udp_between_peers"):
            raise WorkloadError("failover needs the namespace lab's UDP-blocking policy (lab.path = 'relay')")
        if getattr(lab, "relay", None) is None:
            raise WorkloadError("failover needs a relay host: run it with lab.path = 'relay'")
        if "relay" not in type(driver).paths:
            raise WorkloadError(f"{ctx.mesh.vpn} has no relay path: nothing to fail over to")
        lab.unblock()
        try:
            time.sleep(p.direct_settle_s)
            watch = hasattr(lab, "watch_relay") and hasattr(lab, "relay_bytes")
            probe = Probe(ctx, "probe-failover", p.probe_interval_s)
            try:
                if probe.wait_reply_after(0, 10) is None:
                    raise WorkloadError("failover: no echo reply on the direct path")
                if watch:  # was the VPN direct before the block? (near 0 = yes, else it was relaying anyway)
                    lab.watch_relay()
                time.sleep(p.before_s)
                if watch:
                    out.add("relay_bytes_before_block", sum(lab.relay_bytes().values()), "B")
                    lab.watch_relay()
                t_block = time.time()
                lab.block_udp_between_peers()
                # a VPN may keep using the dead direct path until a timer fires: watch a fixed window, then
                # wait (up to timeout_s) for replies to be flowing at its end
                time.sleep(p.watch_s)
                if probe.wait_reply_after(time.time() - 0.5, p.timeout_s) is None:
                    raise WorkloadError(f"failover: no replies {p.watch_s + p.timeout_s:g} s after the block")
                time.sleep(p.after_s)
                out.add(
                    "failover_s", longest_gap(probe.replies(), t_block - p.before_s / 2, time.time()), "s"
                )
                if watch:
                    out.add("relay_bytes_during_block", sum(lab.relay_bytes().values()), "B")
                t_unblock = time.time()
                lab.unblock()
                time.sleep(p.watch_s)
                out.add("failback_s", longest_gap(probe.replies(), t_unblock, time.time()), "s")
            finally:
                probe.stop()
        finally:
            lab.block_udp_between_peers()  # the path the scenario asked for
