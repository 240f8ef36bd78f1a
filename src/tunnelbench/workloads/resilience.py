"""Resilience, from the traffic's point of view (the ten-VPN thesis's reboot test): a continuous ICMP probe from the
client to the server's tunnel address (every 10 ms) while

- `restart_one`: the server host's VPN daemon is stopped and started again (state kept, as after a
  daemon restart or a reboot),
- `restart_all`: every host's daemon is restarted (the whole mesh reboots),
- `restart_each` (the ten-VPN thesis rebooted every machine and reported per node): each host's daemon in turn (h1,
  h2, ...; the first `each_hosts` of the mesh) is stopped and started again while every host it has a tunnel
  to (driver.peers) probes it (one `ping -D` per prober, started before the restart). Per node (metric host
  = the restarted node): node_reconnect_s = restart -> every prober answered again, node_gap_s = the longest
  reply gap any prober saw (node_probe_gap_s: per prober, host "node<-prober"); then the max and mean over
  the nodes. A node some prober gets no reply from within `each_timeout_s` (or the case's time left) is
  node_back = 0: the case fails there keeping the metrics measured so far.
- `failover` (lab.path = "relay" only): the lab first lets UDP flow between the peers (the VPN may take
  the direct path), then blocks UDP between them mid-probe so the VPN must move to its relay, then
  unblocks it again (and restores the block the scenario asked for).
- `control_loss` (Tailscale natlab's "blackhole the control server"): with the mesh up and the
  probe answering, the router drops everything to and from the VPN's control host (driver.control_host:
  Headscale + DERP, the Nebula lighthouse, the n2n supernode, the innernet server; lab/blackhole.py) for
  `control_watch_s`: does the data plane keep working (control_loss_gap_s, control_loss_replies_pct)?
  Then, still cut off, a peer joins: the server host's daemon is stopped and started again (it must
  register / handshake anew, as a new peer would) and control_loss_join_ok = 1 when the client's probe gets
  replies from it again within `control_join_timeout_s` (control_loss_join_s: restart -> first reply).
  Then the host is let back in (control_restore_s: unblock -> first reply after it, about one probe
  interval when the replies never stopped; control_mesh_restore_s: unblock -> every pair answering, within
  `control_restore_timeout_s`, else the case fails keeping the metrics measured so far). The control host must be neither client nor server (place
  them with lab.client / lab.server); a VPN without a central control plane (control_host None, e.g.
  EasyTier on the direct path) fails the case as "not applicable" with the reason, never a number.
- `relay_loss` (lab.path relay/nat): the same cut of the lab's relay host, without the join step: a
  relayed data plane is expected to stop (relay_loss_gap_s ~ the whole window).

reconnect = from the restart command to the first echo reply after it; outage = the longest gap between
consecutive replies around the event (what an application saw). Failover needs the namespace lab's path
policies (lab.block_udp_between_peers) and a VPN with a relay (driver.paths has "relay"); otherwise the
case fails with the reason."""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from typing import Literal

from pydantic import Field

from tunnelbench.core.clock import WallClockStep, WallClockWatch
from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome
from tunnelbench.instruments.ping import REPLY, echo_replies
from tunnelbench.lab.blackhole import Blackhole
from tunnelbench.lab.host import Host
from tunnelbench.vpns.mesh import MeshNotReady
from tunnelbench.workloads.base import CaseContext, NotApplicable, Params, Workload, WorkloadError

__all__ = ["REPLY", "Probe", "Resilience", "ResilienceParams", "longest_gap", "node_result", "summarise_each"]

Event = Literal["restart_one", "restart_all", "restart_each", "failover", "control_loss", "relay_loss"]
CUTS = ("control_loss", "relay_loss")  # events that blackhole one host at the router


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
    control_watch_s: float = Field(
        30.0,
        ge=1,
        le=600,
        description="control_loss / relay_loss: seconds the host stays cut off before the join",
    )
    control_join: bool = Field(
        True, description="control_loss: restart the server's daemon during the cut (a peer joining)"
    )
    control_join_timeout_s: float = Field(
        30.0, gt=0, le=600, description="control_loss: how long the rejoined server may take to answer"
    )
    control_restore_timeout_s: float = Field(
        120.0,
        gt=0,
        le=600,
        description="control_loss / relay_loss: how long replies may take to come back "
        "once the host is let back in (bounded by the case's time left)",
    )
    each_timeout_s: float = Field(
        60.0,
        gt=0,
        le=600,
        description="restart_each: a node not answering every prober this long after its "
        "restart is node_back = 0 and fails the case (bounded by the case's time left)",
    )
    each_hosts: int = Field(
        5,
        ge=1,
        le=1023,
        description="restart_each: restart the first this many hosts in turn (all of a smaller "
        "mesh); the case timeout is sized for this many, set it to lab.hosts to cover a larger mesh",
    )


class Probe:
    """ping -D running in the background (from the case's client to its server unless `src` / `dst` say
    otherwise); reply timestamps read from its output file."""

    offset = 0.0  # the probing host's clock minus this machine's (set per probe; 0: one clock)

    def __init__(
        self, ctx: CaseContext, name: str, interval: float, src: Host | None = None, dst: str | None = None
    ):
        self.path = ctx.artifact_dir / f"{name}.txt"
        argv = ["ping", "-D", "-n", "-i", f"{interval:g}", "-W", "1", dst or ctx.server_ip]
        host = src or ctx.client
        # ping -D stamps replies with its host's wall clock; the events are timed with this machine's
        self.offset = host.clock_offset()
        self.proc = host.spawn(argv, label=f"probe-{name}", log_path=self.path)

    def replies(self) -> list[float]:
        return [ts for ts, _ in self.replies_seq()]

    def replies_seq(self) -> list[tuple[float, int]]:
        """(reply timestamp on this machine's clock, icmp_seq) of every reply so far, from ping's log where it
        is written (on an SSH lab, the remote host: the local copy at `path` is made only when the probe
        stops)."""
        return [(ts - self.offset, seq) for ts, seq, _ in echo_replies(self.proc.log_text())]

    def answered_pct(self, start: float, end: float) -> float | None:
        """Share of the echo requests sent in [start, end] that were answered there. ping's real send rate
        (a loaded machine sends fewer than -i asks for) from icmp_seq over the whole probe so far: it counts
        every request sent, answered or not (seq wraps at 65536: ~11 min at 10 ms)."""
        got = self.replies_seq()
        if len(got) < 2 or got[-1][0] <= got[0][0]:
            return None
        rate = (got[-1][1] - got[0][1]) / (got[-1][0] - got[0][0])
        answered = len({seq for ts, seq in got if start < ts <= end})
        return min(100.0, 100 * answered / (rate * (end - start))) if rate > 0 else None

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
    pts = [start] + sorted(t for t in ts if start < t < end) + [end]
    return max(b - a for a, b in zip(pts, pts[1:], strict=False))


@dataclass
class NodeResult:
    """One node's restart as its probers saw it (restart_each)."""

    node: str
    t_restart: float  # time.time() when the stop command was given
    t_stopped: float  # time.time() when the stop returned (the old daemon gone)
    reconnect_s: float | None  # restart -> the last prober's first reply; None = a prober got none in time
    probe_reconnect_s: dict[str, float | None]  # per prober: restart -> its first reply after it
    probe_gap_s: dict[str, float]  # per prober: longest reply gap in the window around the restart
    missing: list[str]  # probers without a reply within the cap

    @property
    def back(self) -> bool:
        return self.reconnect_s is not None

    @property
    def gap_s(self) -> float:
        return max(self.probe_gap_s.values())


def node_result(
    node: str,
    replies: dict[str, list[float]],
    t_restart: float,
    cap_s: float,
    before_s: float,
    after_s: float,
    t_stopped: float | None = None,
) -> NodeResult:
    """Per-node numbers from each prober's reply timestamps (time.time() clock, as ping -D prints them).
    A prober's reconnect is its first reply in (t_stopped, t_restart + cap_s] (t_stopped: the old daemon
    gone, default t_restart; a reply before it may still be the old daemon's) minus t_restart; the node's
    is the slowest prober's (every other host reaches it again). Gaps are taken in [t_restart - before_s/2,
    end], end = the node's reconnect + after_s/2, or t_restart + cap_s when a prober never got a reply
    (gap ~ the cap)."""
    if not replies:
        raise ValueError(f"{node}: no prober")
    t_stopped = t_restart if t_stopped is None else t_stopped
    firsts = {
        a: next((t for t in sorted(ts) if t_stopped < t <= t_restart + cap_s), None)
        for a, ts in replies.items()
    }
    missing = [a for a, t in firsts.items() if t is None]
    t_back = None if missing else max(t for t in firsts.values() if t is not None)
    end = t_restart + cap_s if t_back is None else t_back + after_s / 2
    start = t_restart - before_s / 2
    return NodeResult(
        node=node,
        t_restart=t_restart,
        t_stopped=t_stopped,
        reconnect_s=None if t_back is None else t_back - t_restart,
        probe_reconnect_s={a: None if t is None else t - t_restart for a, t in firsts.items()},
        probe_gap_s={a: longest_gap(ts, start, end) for a, ts in replies.items()},
        missing=missing,
    )


def summarise_each(results: list[NodeResult]) -> list[tuple[str, float, str, str | None]]:
    """(metric, value, unit, host) of restart_each: per node, then over the nodes. The max / mean reconnect
    only when every node came back (a missing node would make them look better than they were)."""
    out: list[tuple[str, float, str, str | None]] = []
    for r in results:
        out.append(("node_back", 1.0 if r.back else 0.0, "bool", r.node))
        if r.reconnect_s is not None:
            out.append(("node_reconnect_s", r.reconnect_s, "s", r.node))
        out.append(("node_gap_s", r.gap_s, "s", r.node))
        out += [("node_probe_gap_s", g, "s", f"{r.node}<-{a}") for a, g in r.probe_gap_s.items()]
    if not results:
        return out
    failed = sum(not r.back for r in results)
    out.append(("reconnect_each_failed", float(failed), "count", None))
    out.append(("reconnect_each_nodes", float(len(results)), "count", None))
    if not failed:
        rec = [r.reconnect_s for r in results if r.reconnect_s is not None]
        out.append(("reconnect_each_max_s", max(rec), "s", None))
        out.append(("reconnect_each_mean_s", statistics.fmean(rec), "s", None))
    out.append(("outage_each_max_s", max(r.gap_s for r in results), "s", None))
    return out


class Resilience(Workload):
    name = "resilience"
    summary = "reconnect after restarting one / all daemons, failover to the relay, seen by a 10 ms probe"
    tools = ("ping",)
    restarts_mesh = True
    headline = ("reconnect_one_s", "reconnect_all_s", "failover_s")
    Params = ResilienceParams
    params: ResilienceParams
    metrics = (
        MetricSpec("reconnect_one_s", "s", "lower", "server daemon restart -> first reply"),
        MetricSpec("outage_one_s", "s", "lower", "longest reply gap around the server daemon restart"),
        MetricSpec("reconnect_all_s", "s", "lower", "all daemons restarted -> first reply"),
        MetricSpec("outage_all_s", "s", "lower", "longest reply gap around the mesh restart"),
        MetricSpec(
            "node_reconnect_s",
            "s",
            "lower",
            "restart_each, host = the restarted node: its restart -> every other host's probe answered",
        ),
        MetricSpec(
            "node_gap_s",
            "s",
            "lower",
            "restart_each, host = the restarted node: longest reply gap any other host's probe saw",
        ),
        MetricSpec(
            "node_probe_gap_s",
            "s",
            "lower",
            "restart_each, host = 'node<-prober': longest reply gap that prober saw around the restart",
        ),
        MetricSpec(
            "node_back",
            "bool",
            "higher",
            "restart_each, host = the restarted node: 1 = every prober answered within each_timeout_s",
        ),
        MetricSpec("reconnect_each_max_s", "s", "lower", "restart_each: slowest node's reconnect (all back)"),
        MetricSpec("reconnect_each_mean_s", "s", "lower", "restart_each: mean node reconnect (all back)"),
        MetricSpec(
            "outage_each_max_s", "s", "lower", "restart_each: longest reply gap over every node and prober"
        ),
        MetricSpec("reconnect_each_failed", "count", "lower", "restart_each: nodes not back within the cap"),
        MetricSpec("reconnect_each_nodes", "count", "none", "restart_each: nodes restarted"),
        MetricSpec("failover_s", "s", "lower", "longest reply gap after UDP between peers is blocked"),
        MetricSpec("failback_s", "s", "lower", "longest reply gap after UDP is allowed again"),
        MetricSpec("relay_bytes_during_block", "B", "none", "bytes the relay host carried while blocked"),
        MetricSpec(
            "relay_bytes_before_block", "B", "none", "bytes the relay host carried before (0 = direct)"
        ),
        MetricSpec("control_loss_gap_s", "s", "lower", "longest reply gap while the control host is cut off"),
        MetricSpec(
            "control_loss_replies_pct", "%", "higher", "probes answered while the control host is cut off"
        ),
        MetricSpec(
            "control_loss_join_ok",
            "bool",
            "higher",
            "1 = the server's restarted daemon answered the client again with the control host cut off",
        ),
        MetricSpec(
            "control_loss_join_s", "s", "lower", "restart during the cut -> first reply (joined only)"
        ),
        MetricSpec("control_restore_s", "s", "lower", "control host let back in -> first reply after it"),
        MetricSpec(
            "control_mesh_restore_s", "s", "lower", "control host let back in -> every pair answering"
        ),
        MetricSpec(
            "control_dropped_packets", "count", "none", "packets the router dropped to/from the control host"
        ),
        MetricSpec("relay_loss_gap_s", "s", "lower", "longest reply gap while the relay host is cut off"),
        MetricSpec(
            "relay_loss_replies_pct", "%", "higher", "probes answered while the relay host is cut off"
        ),
        MetricSpec("relay_restore_s", "s", "lower", "relay host let back in -> first reply after it"),
        MetricSpec("relay_mesh_restore_s", "s", "lower", "relay host let back in -> every pair answering"),
        MetricSpec(
            "relay_dropped_packets", "count", "none", "packets the router dropped to/from the relay host"
        ),
    )

    def moves_path(self) -> bool:
        # failover unblocks the direct path, then blocks it mid-probe; a cut host changes what the router sees
        return any(e in ("failover", *CUTS) for e in self.params.events)

    def label(self) -> str:
        return "resilience-" + "-".join(e.replace("restart_", "") for e in self.params.events)

    def expected_seconds(self) -> float:
        p = self.params
        extra = p.direct_settle_s + 2 * p.watch_s if "failover" in p.events else 0
        extra += sum(p.control_watch_s for e in p.events if e in CUTS)
        if "control_loss" in p.events and p.control_join:
            extra += p.control_join_timeout_s
        # restart_each: per node the probers' first replies (<= 5 s), before, stop + start + reconnect (20 s,
        # as the other restarts), after
        extra += (p.each_hosts - 1) * (p.before_s + p.after_s + 25) + 5 if "restart_each" in p.events else 0
        return len(p.events) * (p.before_s + p.after_s + 20) + extra

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        out = Outcome()
        t0 = time.monotonic()
        wall = WallClockWatch()  # every event's times are read off ping's wall-clock stamps
        for ev in p.events:
            if ev == "failover":
                self._failover(ctx, out)
            elif ev in CUTS:
                self._cut(ctx, out, ev)
            elif ev == "restart_each":
                self._restart_each(ctx, out)
            else:
                self._restart(ctx, out, ev)
        # the whole mesh must answer again before the next case
        ctx.mesh.wait_ready(timeout=min(p.timeout_s, ctx.remaining()))
        try:
            wall.check(f"the resilience events ({', '.join(p.events)})")
        except WallClockStep as e:
            raise WorkloadError(str(e)) from None
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
                t_stopped = time.time()
                ctx.mesh.driver.start(ctx.server)
            else:
                ctx.mesh.stop()
                t_stopped = time.time()
                ctx.mesh.start()
            # the first reply once the old daemons are gone: one stamped between the stop command and its
            # return may still be theirs (over SSH the stop takes a round trip or two: seen as a 5 ms
            # "reconnect"); the time is counted from the stop command, as restart_each counts it
            first = probe.wait_reply_after(t_stopped, p.timeout_s)
            if first is None:
                raise WorkloadError(f"{ev}: no reply within {p.timeout_s:g} s")
            time.sleep(p.after_s)
            out.add(f"reconnect_{tag}_s", first - t_ev)
            out.add(
                f"outage_{tag}_s",
                longest_gap(probe.replies(), t_ev - p.before_s / 2, first + p.after_s / 2),
            )
        finally:
            probe.stop()

    def _restart_each(self, ctx: CaseContext, out: Outcome) -> None:
        p = self.params
        driver = ctx.mesh.driver
        results: list[NodeResult] = []
        try:
            for node in ctx.mesh.hosts[: p.each_hosts]:
                probers = [a for a in ctx.mesh.hosts if a is not node and node in driver.peers(a)]
                if not probers:
                    raise WorkloadError(f"restart_each: no host has a tunnel to {node.name}")
                r = self._restart_node(ctx, node, probers)
                results.append(r)
                if not r.back:
                    raise WorkloadError(
                        f"restart_each: {node.name} not answering {', '.join(r.missing)} within "
                        f"{p.each_timeout_s:g} s of its restart (or the case's time left)"
                    )
        except WorkloadError as e:
            e.outcome = out  # the runner stores a failed case's metrics
            raise
        finally:
            for name, value, _unit, host in summarise_each(results):
                out.add(name, value, host)
            (ctx.artifact_dir / "restart-each.json").write_text(
                json.dumps([asdict(r) for r in results], indent=1)
            )

    def _restart_node(self, ctx: CaseContext, node: Host, probers: list[Host]) -> NodeResult:
        """Probe `node` from each of `probers` (one ping each), restart its daemon, wait for every probe."""
        p = self.params
        ip = ctx.mesh.tunnel_ip(node)
        probes = {
            a.name: Probe(ctx, f"each-{node.name}-from-{a.name}", p.probe_interval_s, a, ip) for a in probers
        }
        try:
            limit = time.time() + min(p.each_timeout_s, ctx.remaining())
            for a, probe in probes.items():
                if probe.wait_reply_after(0, max(0.1, limit - time.time())) is None:
                    raise WorkloadError(
                        f"restart_each: {a} got no echo reply from {node.name} before its restart"
                    )
            time.sleep(p.before_s)
            t_ev = time.time()
            ctx.mesh.driver.stop(node)
            t_stopped = time.time()  # replies before this may be the old daemon's
            ctx.mesh.driver.start(node)
            cap = min(p.each_timeout_s, ctx.remaining())
            end = t_ev + cap
            for probe in probes.values():  # the slowest prober bounds the wait; each waits until `end`
                probe.wait_reply_after(t_stopped, max(0.0, end - time.time()))
            time.sleep(p.after_s)
            return node_result(
                node.name,
                {a: pr.replies() for a, pr in probes.items()},
                t_ev,
                cap,
                p.before_s,
                p.after_s,
                t_stopped,
            )
        finally:
            for probe in probes.values():
                probe.stop()

    def _failover(self, ctx: CaseContext, out: Outcome) -> None:
        p = self.params
        lab = ctx.lab
        driver = ctx.mesh.driver
        if lab is None or not lab.path_policies:
            raise WorkloadError("failover needs the namespace lab's UDP-blocking policy (lab.path = 'relay')")
        if lab.relay is None:
            raise WorkloadError("failover needs a relay host: run it with lab.path = 'relay'")
        if "relay" not in type(driver).paths:
            raise WorkloadError(f"{ctx.mesh.vpn} has no relay path: nothing to fail over to")
        lab.unblock()
        try:
            time.sleep(p.direct_settle_s)
            watch = lab.path_policies  # relay byte counters come with the path policies
            probe = Probe(ctx, "probe-failover", p.probe_interval_s)
            try:
                if probe.wait_reply_after(0, 10) is None:
                    raise WorkloadError("failover: no echo reply on the direct path")
                if watch:  # was the VPN direct before the block? (near 0 = yes, else it was relaying anyway)
                    lab.watch_relay()
                time.sleep(p.before_s)
                if watch:
                    out.add("relay_bytes_before_block", sum(lab.relay_bytes().values()))
                    lab.watch_relay()
                t_block = time.time()
                lab.block_udp_between_peers()
                # a VPN may keep using the dead direct path until a timer fires: watch a fixed window, then
                # wait (up to timeout_s) for replies to be flowing at its end
                time.sleep(p.watch_s)
                if probe.wait_reply_after(time.time() - 0.5, p.timeout_s) is None:
                    raise WorkloadError(f"failover: no replies {p.watch_s + p.timeout_s:g} s after the block")
                time.sleep(p.after_s)
                out.add("failover_s", longest_gap(probe.replies(), t_block - p.before_s / 2, time.time()))
                if watch:
                    out.add("relay_bytes_during_block", sum(lab.relay_bytes().values()))
                t_unblock = time.time()
                lab.unblock()
                time.sleep(p.watch_s)
                out.add("failback_s", longest_gap(probe.replies(), t_unblock, time.time()))
            finally:
                probe.stop()
        finally:
            lab.block_udp_between_peers()  # the path the scenario asked for

    # -- control_loss / relay_loss -----------------------------------------------------------------
    def _cut_target(self, ctx: CaseContext, ev: str) -> Blackhole:
        lab = ctx.lab
        driver = ctx.mesh.driver
        if ev == "control_loss":
            host = type(driver).control_host(driver.spec)
            if host is None:
                raise NotApplicable(
                    f"control_loss: not applicable: {ctx.mesh.vpn} has no central control "
                    "plane in this lab (driver.control_host is None)"
                )
        else:
            host = (lab.relay if lab else None) or driver.spec.relay
            if host is None:
                raise NotApplicable(
                    "relay_loss: not applicable: the lab has no relay host (lab.path = 'relay' or 'nat')"
                )
        if host.name in (ctx.client.name, ctx.server.name):
            raise WorkloadError(
                f"{ev}: {ctx.mesh.vpn}'s {ev.split('_')[0]} host is {host.name}, the probe's "
                f"{'client' if host.name == ctx.client.name else 'server'}: place lab.client and "
                "lab.server on two other hosts"
            )
        if lab is None or lab.router is None or not lab.tag:
            raise WorkloadError(f"{ev} needs the namespace lab's router to cut {host.name} off")
        return Blackhole(lab.router, lab.tag, host)

    def _cut(self, ctx: CaseContext, out: Outcome, ev: str) -> None:
        p = self.params
        kind = ev.split("_")[0]  # control | relay
        hole = self._cut_target(ctx, ev)
        probe = Probe(ctx, f"probe-{ev}", p.probe_interval_s)
        starter: threading.Thread | None = None
        try:
            if probe.wait_reply_after(0, 10) is None:
                raise WorkloadError(f"{ev}: no echo reply before the cut")
            time.sleep(p.before_s)
            try:
                t_cut = time.time()
                hole.cut()
                time.sleep(p.control_watch_s)
                t_end = t_cut + p.control_watch_s
                out.add(f"{ev}_gap_s", longest_gap(probe.replies(), t_cut, t_end))
                # ping's send rate from icmp_seq of the replies so far (before_s of them at least)
                out.add(f"{ev}_replies_pct", probe.answered_pct(t_cut, t_end))
                failed: list[BaseException] = []
                if ev == "control_loss" and p.control_join:
                    starter = self._rejoin(ctx, out, probe, failed)
                out.add(f"{kind}_dropped_packets", hole.dropped())
            finally:
                t_restore = time.time()
                hole.restore()
            if starter is not None:  # a start blocked on the control server (tailscale up) may finish now
                starter.join(ctx.remaining())
                if starter.is_alive():
                    raise WorkloadError(f"{ev}: the server's daemon did not finish starting after the cut")
                if failed:  # it gave up while cut off: start it again with the control host back
                    (ctx.artifact_dir / f"{ev}-join-error.txt").write_text(f"{failed[0]!r}\n")
                    ctx.mesh.driver.stop(ctx.server)
                    ctx.mesh.driver.start(ctx.server)
            limit = min(p.control_restore_timeout_s, ctx.remaining())
            first = probe.wait_reply_after(t_restore, limit)
            if first is None:
                err = WorkloadError(f"{ev}: no reply within {limit:.0f} s after {hole.host.name} came back")
                err.outcome = out  # the runner stores a failed case's metrics
                raise err
            out.add(f"{kind}_restore_s", first - t_restore)
            try:  # every pair, not only the probe's (a peer may learn the rejoined one later)
                ctx.mesh.wait_ready(timeout=min(p.control_restore_timeout_s, ctx.remaining()))
            except MeshNotReady as e:
                e.outcome = out
                raise
            out.add(f"{kind}_mesh_restore_s", time.time() - t_restore)
            time.sleep(p.after_s)
        finally:
            hole.restore()  # already gone unless something above raised between cut and restore
            if starter is not None and starter.is_alive():
                starter.join(ctx.remaining())
            probe.stop()

    def _rejoin(
        self, ctx: CaseContext, out: Outcome, probe: Probe, failed: list[BaseException]
    ) -> threading.Thread:
        """During the cut: stop the server's daemon, start it again (in a thread: a start may block on the
        control server, e.g. `tailscale up`) and wait up to control_join_timeout_s for the client's probe to
        get replies from it. Returns the starting thread (it may still run)."""
        p = self.params
        driver = ctx.mesh.driver
        driver.stop(ctx.server)
        t_join = time.time()

        def start() -> None:
            try:
                driver.start(ctx.server)
            except Exception as e:  # judged by the probe; restarted after the cut
                failed.append(e)

        starter = threading.Thread(target=start, name="control-loss-join", daemon=True)
        starter.start()
        first = probe.wait_reply_after(t_join, p.control_join_timeout_s)
        out.add("control_loss_join_ok", 0 if first is None else 1)
        if first is not None:
            out.add("control_loss_join_s", first - t_join)
        return starter
