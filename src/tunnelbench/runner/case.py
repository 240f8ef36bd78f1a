"""One case: a workload measured once on a running mesh, under the run's conditions, with everything that
judges it (the router's path counters, the kernel's drop counters, the engine's own drops and load, the
daemons' CPU and memory, a daemon that died, the timeout), retried as `run.retries` allows and committed to
the store at once. A failure keeps the daemon logs (secrets redacted) and heals the mesh for the retry."""

from __future__ import annotations

import re
import time
import traceback
from pathlib import Path
from typing import Any

from tunnelbench.core.files import write_atomic
from tunnelbench.core.results import Outcome, Series
from tunnelbench.diagnostics.case import CaseDiagnostics
from tunnelbench.impair.backend import ImpairError, NativeBackend
from tunnelbench.impair.load import engine_load
from tunnelbench.lab import counters, pathcheck
from tunnelbench.lab.host import CommandError, Host, abort_running
from tunnelbench.monitor import Monitor
from tunnelbench.runner.context import CASE_ERRORS, Bench, RunContext
from tunnelbench.runner.guard import CaseGuard
from tunnelbench.security.hygiene import KeyHygiene
from tunnelbench.vpns.mesh import Mesh
from tunnelbench.workloads.base import CaseContext, NotApplicable, Workload, WorkloadError


class Interrupted(BaseException):  # not an Exception: no case handler may swallow it
    """SIGTERM/SIGINT/SIGHUP: stop measuring, tear down, keep what is stored."""


class CaseRunner:
    def __init__(
        self, ctx: RunContext, bench: Bench, hygiene: KeyHygiene, resumed: bool, guard: CaseGuard
    ) -> None:
        self.ctx, self.sc, self.bench, self.hygiene, self.resumed = ctx, ctx.sc, bench, hygiene, resumed
        self.guard = guard

    def timeout(self, wl: Workload) -> float:
        return self.sc.run.case_timeout_s or (wl.expected_seconds() * 2 + 30)

    def first_attempt(self, vpn: str, profile: str, wl: Workload, rep: int) -> int:
        """A resumed case's attempts continue after the killed process's (their artifact folders are kept)."""
        if not self.resumed:
            return 0
        d = self.ctx.run_dir / "cases" / vpn / profile / wl.label()
        used = [int(m.group(1)) for p in d.glob(f"r{rep}a*") if (m := re.fullmatch(rf"r{rep}a(\d+)", p.name))]
        return max(used, default=-1) + 1

    def run(self, mesh: Mesh, wl: Workload, profile: str, rep: int, settle: bool = True) -> str:
        """Measure one case, retrying as `run.retries` allows and measuring again as `[interference]`
        allows; its final status (ok, n/a or failed)."""
        ctx, b = self.ctx, self.bench
        client, server = b.client, b.server
        attempt = self.first_attempt(mesh.vpn, profile, wl, rep) - 1
        failures = remeasured = 0
        while failures <= self.sc.run.retries:
            attempt += 1
            self.guard.before_case()
            adir = ctx.run_dir / "cases" / mesh.vpn / profile / wl.label() / f"r{rep}a{attempt}"
            adir.mkdir(parents=True, exist_ok=True)
            cid = ctx.store.start_case(
                ctx.run_id,
                mesh.vpn,
                profile,
                wl.name,
                wl.label(),
                wl.params.model_dump(),
                rep,
                attempt,
                client.name,
                server.name,
                adir,
            )
            t0 = time.monotonic()
            cctx = CaseContext(
                mesh,
                client,
                server,
                adir,
                t0 + self.timeout(wl),
                {"mss": self.sc.fairness.mss, "kube": self.sc.lab.kube_options()},
                b.lab,
            )
            diag = self._diagnostics(adir, mesh, client)
            try:
                diag.start()
                self.check_path()
                health = b.backend.health if b.backend is not None else None
                mon = Monitor(mesh.daemons, self.sc.run.monitor_interval_s, health, lambda _: abort_running())
                if client.remote:  # SSH: the targets' machine CPU, not the controller's
                    mon.machines = [h for h in b.hosts() if h.remote]
                eng0 = self._engine_stats()
                kern_hosts = [client, server, b.lab.router]
                kern0 = counters.sample(kern_hosts)  # kernel drop counters (lab/counters.py)
                # a workload whose server talks to more hosts than the client (many_clients) has no pair path
                # to confirm: the router would count its other clients' bytes as "relayed"
                path0 = self._path_counters() if wl.pair_path() else None
                track = None
                if path0 is not None and b.path_watch is not None:
                    track = pathcheck.PathTrack(b.path_watch)
                    track.start(path0)
                g0 = self.guard.mark()
                try:
                    with mon:
                        out: Outcome = wl.run(cctx)
                finally:
                    diag.stop()
                    if track is not None:
                        track.stop()
                    if mon.unhealthy:  # the watchdog aborted the case: report why, not the tool's complaint
                        raise ImpairError(mon.unhealthy)
                busy = self.guard.reading(g0)
                mon.add_to(out)
                if busy is not None:
                    out.add("interference_pct", busy.other_pct)
                    out.add("steal_pct", busy.steal_pct)
                if track is not None:  # the path, second by second: did it change within the case?
                    n, pts = pathcheck.changes(track.samples)
                    if pts:
                        out.add("path_changes", n)
                        out.series.append(Series("path_direct_pct", "%", pts))
                self.add_engine_stats(out, eng0, self._engine_stats())
                for name, n, _unit, host in counters.deltas(kern0, counters.sample(kern_hosts)):
                    out.add(name, n, host)
                self.check_path()
                off = None
                if path0 is not None:
                    off = self._confirm_path(path0, out, client, server, judge=not wl.moves_path())
                    if off:
                        ctx.say(
                            f"{mesh.vpn} · {wl.label()} · rep {rep}: kept off-path: {off}"[:400], "yellow"
                        )
                dead = [f"{h}/{p.label}" for h, ps in mesh.daemons().items() for p in ps if not p.alive()]
                if dead:
                    raise WorkloadError(f"VPN daemon(s) died during the case: {', '.join(dead)}")
                if time.monotonic() > cctx.deadline:
                    raise WorkloadError(f"case exceeded its timeout of {self.timeout(wl):.0f} s")
                decision = self.guard.decide(busy, remeasured, adir)
                if decision == "remeasure":  # set aside (kept in the store), measured again when quiet
                    diag.finish(failed=off is not None)
                    assert busy is not None
                    ctx.store.finish_case(cid, "disturbed", out, error=f"disturbed: {busy.text()}"[:2000])
                    ctx.say(
                        f"{mesh.vpn} · {wl.label()} · rep {rep}: disturbed ({busy.text()}): measuring it again"[
                            :400
                        ],
                        "yellow",
                    )
                    remeasured += 1
                    ctx.phase(mesh.vpn, "disturbed_case", time.monotonic() - t0)
                    self.guard.remeasure(time.monotonic() - t0)
                    continue
                if decision == "keep":
                    assert busy is not None
                    out.add("disturbed", 1.0)
                    ctx.say(
                        f"{mesh.vpn} · {wl.label()} · rep {rep}: kept as disturbed ({busy.text()})"[:400],
                        "yellow",
                    )
                diag.finish(failed=off is not None)  # an off-path case keeps its capture as evidence
                ctx.store.finish_case(cid, "ok", out)
                ctx.phase(mesh.vpn, "measure", out.measure_s)
                ctx.phase(mesh.vpn, "case_overhead", time.monotonic() - t0 - out.measure_s)
                if wl.restarts_mesh and mesh.driver.settle_s and settle:
                    ctx.phase(mesh.vpn, "tunnel_wait", mesh.driver.warm_up())
                return "ok"
            except (Interrupted, KeyboardInterrupt):
                diag.stop()  # its processes end now; what it took stays in the case folder
                ctx.store.finish_case(cid, "interrupted", error="run interrupted")
                raise
            except NotApplicable as e:  # not this VPN's kind of test: n/a with the reason, no retry
                diag.finish(failed=False)
                ctx.store.finish_case(cid, "n/a", error=str(e)[:2000])
                ctx.say(f"{mesh.vpn} · {wl.label()}: n/a: {e}"[:400], "yellow")
                return "n/a"
            except CASE_ERRORS as e:
                write_atomic(adir / "error.txt", traceback.format_exc())
                # the verdict first: a host that stopped answering (SSH) must not leave the case "running";
                # a case on the wrong path keeps the path share it saw (failed cases never count as results)
                ctx.store.finish_case(
                    cid, "failed", getattr(e, "outcome", None), error=f"{type(e).__name__}: {e}"[:2000]
                )
                ctx.phase(mesh.vpn, "failed_case", time.monotonic() - t0)
                failures += 1
                ctx.say(
                    f"{mesh.vpn} · {wl.label()} · rep {rep} attempt {attempt + 1} failed: {e}"[:400], "red"
                )
                try:
                    diag.finish(failed=True)
                    self.hygiene.keep_logs(mesh.driver, adir / "daemon-logs")
                except (CommandError, OSError, TimeoutError, RuntimeError) as why:  # RuntimeError: SshError
                    ctx.say(f"{mesh.vpn} · {wl.label()}: its logs were not all kept: {why}"[:400], "yellow")
                self.heal(mesh)
        return "failed"

    def _diagnostics(self, adir: Path, mesh: Mesh, client: Host) -> CaseDiagnostics:
        """The case's pcap, kernel log and CPU profile, as `run.capture` and `run.flamegraph` ask."""
        return CaseDiagnostics(
            adir,
            self.sc.run.capture,
            self.sc.run.capture_packets,
            self.sc.run.flamegraph,
            self.bench.lab.router,
            client,
            mesh.daemons,
            self.bench.hosts(),
        )

    def _engine_stats(self) -> dict[str, Any] | None:
        be = self.bench.backend
        if not isinstance(be, NativeBackend) or be.profile is None:
            return None
        try:
            st = be.stats()
        except Exception:  # a missing stats file is the watchdog's business, not this bookkeeping's
            return None
        return {**st, "_t": time.monotonic()} if st else None  # no engine running (a rate-only profile): {}

    def add_engine_stats(self, out: Outcome, s0: dict[str, Any] | None, s1: dict[str, Any] | None) -> None:
        """Drops the engine made that the profile did not ask for (its own queue overflowing, the kernel's
        NFQUEUE full), as per-case metrics of the router: non-zero means the emulator, not the VPN, lost
        packets. A restart in between (pid changed) makes the delta meaningless: skipped."""
        if not s0 or not s1 or s0.get("pid") != s1.get("pid"):
            return
        out.add("engine_overflow_drops", s1["dropped_overflow"] - s0["dropped_overflow"], "router")
        if s1.get("kernel_queue_dropped") is not None and s0.get("kernel_queue_dropped") is not None:
            kd = s1["kernel_queue_dropped"] - s0["kernel_queue_dropped"]
            kd += (s1.get("kernel_user_dropped") or 0) - (s0.get("kernel_user_dropped") or 0)
            out.add("engine_kernel_drops", kd, "router")
        out.add("engine_packets", s1["packets_in"] - s0["packets_in"], "router")
        be = self.bench.backend
        assert isinstance(be, NativeBackend)  # s0 and s1 are its engine's (_engine_stats)
        # asked for SCHED_FIFO: did it get it? (an engine with its own CPU does not ask)
        if be.realtime:
            out.add("engine_realtime", 1.0 if s1.get("realtime") else 0.0, "router")
        load = engine_load(s0, s1, s1["_t"] - s0["_t"])
        if load is not None:  # judged by its work, lateness and drops, not by its CPU share (impair/load.py)
            out.add("engine_cpu_pct", load.cpu_pct, "router")
            out.add("engine_work_pct", load.work_pct, "router")
            out.add("engine_late_us", load.late_us, "router")
            out.add("engine_bound", 1.0 if load.bound else 0.0, "router")

    def _path_counters(self) -> dict[str, int] | None:
        """The router's path counters before a case; None (no verdict for it) when they cannot be read."""
        if self.bench.path_watch is None:
            return None
        try:
            return self.bench.path_watch.read()
        except CASE_ERRORS as e:
            self.ctx.say(f"path counters unreadable, this case's path is not checked: {e}"[:300], "yellow")
            return None

    def _confirm_path(
        self, before: dict[str, int], out: Outcome, client: Host, server: Host, judge: bool = True
    ) -> str | None:
        """Store the share of the case's underlay bytes that went straight between client and server, and mark
        the case off-path when that is not the scenario's path (lab/pathcheck.py): it keeps its value, with
        the path it took, and the analysis does not rank it against cases on the scenario's path."""
        assert self.bench.path_watch is not None
        try:
            sh = pathcheck.share(before, self.bench.path_watch.read())
        except CASE_ERRORS:  # the counters are a check, not the measurement: a failed read is no verdict
            return None
        path_out = Outcome()
        path_out.add("path_underlay_bytes", sh.total)
        path_out.add("path_direct_pct", sh.direct_pct)
        out.samples += path_out.samples
        why = pathcheck.verdict(self.sc.lab.path, sh, client.name, server.name) if judge else None
        if why:  # kept with the path it took (not ranked against the scenario's path), not failed
            out.add("off_path", 1.0)
        return why

    def check_path(self) -> None:
        """Fail the case if the impairment engine is down (fail closed) or stalled."""
        be = self.bench.backend
        why = be.health() if be is not None else None
        if why:
            raise ImpairError(why)

    def heal(self, mesh: Mesh) -> None:
        """After a failure: if the mesh is broken, restart it so the retry and later cases get a fair chance."""
        t0 = time.monotonic()
        be, ctx = self.bench.backend, self.ctx
        if be is not None and be.health() and be.profile is not None:
            ctx.say(f"restarting the impairment engine ({be.health()})", "yellow")
            try:
                be.apply(be.profile)
            except CASE_ERRORS as e:  # ImpairError included
                ctx.say(f"impairment engine restart failed: {e}", "red")
        try:
            dead = any(not p.alive() for ps in mesh.daemons().values() for p in ps)
            if dead or mesh.pairs_down():
                ctx.say(f"{mesh.vpn}: restarting the mesh after a failure", "yellow")
                mesh.stop()
                mesh.start()
                mesh.wait_ready(self.sc.run.tunnel_timeout_s)
                mesh.driver.warm_up()
        except CASE_ERRORS as e:
            ctx.say(f"{mesh.vpn}: mesh restart failed: {e}", "red")
        ctx.phase(mesh.vpn, "tunnel_wait", time.monotonic() - t0)
