"""The conditions a case runs under: the impairment profile on the path (the backend picked and every profile
calibrated before any VPN runs), the hosts' TCP tuning (sysctls), the CPU placement of the system under test
and the engine, and the two reference measurements around them (the engine's tax per VPN, the machine's drift
per round)."""

from __future__ import annotations

import time
from typing import Any

from tunnelbench.impair import placement as impair_placement
from tunnelbench.impair import tax
from tunnelbench.impair.backend import NativeBackend
from tunnelbench.impair.calibrate import calibrate, measure_base
from tunnelbench.impair.tcpcheck import goodput_mbps, iperf3_tcp
from tunnelbench.lab import cpus, sysctl
from tunnelbench.lab.host import Host
from tunnelbench.runner.context import CASE_ERRORS, Bench, RunContext
from tunnelbench.runner.schedule import Schedule
from tunnelbench.vpns.mesh import Mesh, MeshNotReady


class Conditions:
    def __init__(self, ctx: RunContext, bench: Bench, schedule: Schedule) -> None:
        self.ctx, self.sc, self.bench, self.schedule = ctx, ctx.sc, bench, schedule
        self.tuning_now: str | None = None  # the tuning applied in the hosts now; None = their own values
        self.tuning_saved: dict[str, dict[str, str]] = {}  # sysctl.snapshot(): host -> key -> value
        self.tunings_recorded: set[str] = set()
        self.drift: list[dict[str, Any]] = []

    # -- impairment --------------------------------------------------------------------------------
    def prepare_impairment(self) -> None:
        """Pick the backend and calibrate every profile on the raw path before any VPN runs."""
        b, sc, ctx = self.bench, self.sc, self.ctx
        b.backend = None
        profiles = [sc.profile(n) for n in sc.profiles]
        if all(p.is_baseline for p in profiles):
            self.apply_placement()
            return
        t0 = time.monotonic()
        # the lab's router, or on SSH hosts the inventory's placement (router host or each peer's egress)
        backend = b.backend = impair_placement.backend_for(b.lab, sc.impair.backend, ctx.run_dir / "impair")
        conds = self.schedule.conditions()
        env: dict[str, object] = {"impair.backend": backend.name}
        backend.gso_mode = sc.impair.gso
        if not isinstance(backend, NativeBackend):
            # netem: per wire packet (GSO super-packets segmented first) or super-packets whole, per condition
            env["impair.netem"] = {label: backend.netem_mode(sc.profile(p)) for p, _t, label in conds}
        # the engine mode of every condition: GSO super-packets whole, per wire packet, or no engine
        env["impair.modes"] = {
            label: (tax.mode_of(sc.profile(p), sc.impair.gso) if isinstance(backend, NativeBackend) else None)
            for p, _t, label in conds
        }
        if (where := impair_placement.plan(b.lab)) is not None:
            env["impair.placement"] = where
        if isinstance(backend, NativeBackend):
            env["impair.engine"] = f"{backend.binary} {backend.version()}"
        ctx.store.set_env(ctx.run_id, env)
        self.apply_placement()  # calibration measures the path as the cases will have it
        if sc.impair.calibrate:
            ctx.status("calibrating the impaired path")
            base = measure_base(b.client, b.server, ctx.run_dir / "impair")
            ctx.store.set_env(
                ctx.run_id, {"calibration.base": {"one_way_ms": base.one_way_ms, "rtt_ms": base.rtt_ms}}
            )
            for p in profiles:
                if p.is_baseline:
                    continue
                backend.apply(p)
                try:
                    cal = calibrate(
                        backend,
                        p,
                        b.client,
                        b.server,
                        ctx.run_dir / "impair",
                        base,
                        count=sc.impair.calibration_probes,
                    )
                finally:
                    backend.clear()
                ctx.store.set_env(ctx.run_id, {f"calibration.{p.name}": cal.to_json()})
                bad = "; ".join(
                    f"{c.quantity} {c.measured:.3g} vs {c.configured:.3g} {c.unit}" for c in cal.failed()
                )
                ctx.say(
                    f"calibrated {p.name} ({backend.name}): {p.summary()}"
                    + (f" OUT OF TOLERANCE: {bad}" if bad else ""),
                    "red" if bad else "",
                )
        ctx.phase(None, "calibration", time.monotonic() - t0)

    def apply(self, name: str, tuning: str, mesh: Mesh) -> str | None:
        """Switch the path to a profile (and the hosts to a TCP tuning) under a running mesh; returns why cases
        cannot run, or None."""
        p = self.sc.profile(name)
        t0 = time.monotonic()
        slower = mesh.expect_delay(p.delay_ms, p.jitter_ms)
        try:
            self.set_tuning(tuning)
        except CASE_ERRORS as e:
            return f"cannot apply host tuning {tuning}: {e}"
        backend = self.bench.backend
        try:
            if backend is not None:
                backend.clear()
                if not p.is_baseline:
                    backend.apply(p)
            mesh.wait_ready(self.sc.run.tunnel_timeout_s + slower)
            return None
        except MeshNotReady as e:
            pairs = len(mesh.probed_pairs())
            # every daemon still runs (e.down): the tunnels carry what they can
            if e.down and self.sc.run.unreachable == "measure":
                self.ctx.say(
                    f"{mesh.vpn}: under profile {name}, {len(e.down)} of {pairs} pairs never answered a probe; "
                    "the cases run on the tunnels already up (run.unreachable = measure)",
                    "yellow",
                )
                self.ctx.store.set_env(
                    self.ctx.run_id,
                    {f"unreachable.{mesh.vpn}.{name}": {"never_answered": len(e.down), "pairs": pairs}},
                )
                return None
            return self._not_answering(name, tuning, e)
        except CASE_ERRORS as e:  # ImpairError included
            return self._not_answering(name, tuning, e)
        finally:
            self.ctx.phase(mesh.vpn, "tunnel_wait", time.monotonic() - t0)

    @staticmethod
    def _not_answering(profile: str, tuning: str, e: Exception) -> str:
        return (
            f"mesh not answering under profile {profile}"
            + (f", tuning {tuning}" if tuning != "default" else "")
            + f": {e}"
        )

    def clear(self) -> None:
        """After a session: the path without impairment, the hosts with their own sysctls."""
        if self.bench.backend is not None:
            self.bench.backend.clear()
        self.restore_tuning()

    # -- host TCP tunings (sysctls per host namespace) ----------------------------------------------
    def set_tuning(self, tuning: str) -> None:
        values = self.sc.tuning(tuning)
        hosts = self._sut_hosts()
        if tuning != self.tuning_now:
            self.restore_tuning()
            if values:
                self.tuning_saved = sysctl.snapshot(hosts, values)
                sysctl.apply(hosts, values)
            self.tuning_now = tuning
        if tuning not in self.tunings_recorded:  # what the hosts' TCP stack was under this tuning, read back
            self.tunings_recorded.add(tuning)
            self.ctx.store.set_env(
                self.ctx.run_id,
                {
                    f"sysctl.tuning.{tuning}": {
                        "set": values,
                        "read_back": sysctl.snapshot(hosts, self.sc.sysctl_keys()),
                    }
                },
            )

    def restore_tuning(self) -> None:
        if self.tuning_saved:
            sysctl.restore(self._sut_hosts(), self.tuning_saved)
        self.tuning_saved, self.tuning_now = {}, None  # the hosts' own values: no tuning applied

    def _sut_hosts(self) -> list[Host]:
        return list(self.bench.lab.hosts)

    # -- CPU placement, the engine's tax, drift -----------------------------------------------------
    def apply_placement(self) -> None:
        """Confine the system under test (and the engine) to fixed CPUs for every profile of the run."""
        b = self.bench
        engine_used = isinstance(b.backend, NativeBackend)
        cfg = self.sc.cpu
        if self.sc.lab.backend == "ssh":
            pl = cpus.Placement("off", "not applied on SSH hosts", 0)
        else:
            pl = cpus.plan(
                cfg.placement, engine_used, [h.name for h in b.lab.hosts], cfg.engine_cpus, cfg.sut_cpus
            )
        pl.pin(b.lab.hosts)
        if isinstance(b.backend, NativeBackend):
            b.backend.place(pl.engine, cfg.engine_busy_poll_us, cfg.engine_realtime)
            pl.engine_busy_poll_us, pl.engine_realtime = b.backend.busy_poll_us, b.backend.realtime
            if cfg.steer_rx:  # off by default: measured here it raised the tax (more IPIs), see README
                # the engine re-injects released packets on its own CPU; without steering, the receiving host's
                # whole stack (and the wake-up of its daemon, a cross-CPU IPI) would run there per packet
                for h in b.lab.hosts:
                    mask = sum(1 << c for c in cpus.cpu_list(pl.hosts[h.name]))
                    h.run(
                        [
                            "sh",
                            "-c",
                            f"for q in /sys/class/net/{h.underlay_if}/queues/rx-*; do echo {mask:x} > $q/rps_cpus; done",
                        ]
                    )
                pl.steer_rx = True
        b.placement = pl
        self.ctx.store.set_env(self.ctx.run_id, {"cpu.placement": pl.to_json()})
        self.ctx.say(pl.summary())

    def tax_check(self, vpn: str, mesh: Mesh) -> None:
        """Once per VPN, in a run with the native engine: its TCP with the engine in the path at zero
        impairment against without it, in each engine mode the run's profiles use."""
        be, ctx = self.bench.backend, self.ctx
        if not isinstance(be, NativeBackend) or not self.sc.impair.tax_check_s:
            return
        profiles = [self.sc.profile(n) for n in self.sc.profiles]
        modes = tax.modes_for(profiles, self.sc.impair.gso)
        if not modes:
            return
        ctx.status(f"{vpn}: measuring the engine's tax")
        t0 = time.monotonic()
        try:
            checks = tax.measure_tax(
                be,
                vpn,
                self.bench.client,
                self.bench.server,
                mesh.tunnel_ip(self.bench.server),
                self.sc.impair.tax_check_s,
                modes,
            )
        except CASE_ERRORS as e:
            ctx.store.set_env(ctx.run_id, {f"engine_tax.{vpn}": {"error": str(e)}})
            ctx.say(f"{vpn}: engine-tax check failed: {e}", "red")
            return
        finally:
            ctx.phase(vpn, "tax_check", time.monotonic() - t0)
        ctx.store.set_env(ctx.run_id, {f"engine_tax.{vpn}": {c.mode: c.to_json() for c in checks}})
        for c in checks:
            ctx.say(
                f"{vpn}: engine tax ({c.summary()})"
                + (
                    " clearly > 10%: throughput under this engine mode is partly the emulator's"
                    if c.flagged
                    else ""
                ),
                "red" if c.flagged else "",
            )

    def drift_reference(self, when: str) -> None:
        """A fixed reference measurement (raw underlay TCP, no VPN, no impairment) at every round boundary:
        the machine's own drift over the run, next to which the VPNs' per-round values can be read."""
        if not self.sc.run.drift_check_s or self.sc.lab.backend == "ssh":
            return
        b, ctx = self.bench, self.ctx
        ctx.status(f"drift reference ({when})")
        t0 = time.monotonic()
        try:
            if b.backend is not None:
                b.backend.clear()
            mbps = goodput_mbps(
                iperf3_tcp(b.client, b.server, b.server.underlay_ip, self.sc.run.drift_check_s, 5296)
            )
            self.drift.append({"when": when, "t": time.time(), "goodput_mbps": mbps})
        except CASE_ERRORS as e:
            self.drift.append({"when": when, "t": time.time(), "error": str(e)})
        ctx.store.set_env(ctx.run_id, {"drift.reference": self.drift})
        ctx.phase(None, "drift_check", time.monotonic() - t0)
