"""The orchestrator: scenario -> lab -> tunnel up -> workloads x repetitions -> store.

One VPN at a time on the host set; teardown is verified before the next VPN starts. A failing case is
retried (daemon logs kept) and never stops the run. Every finished case is committed to the store at once."""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tunnelbench import __version__, environment
from tunnelbench.impair.backend import Backend, ImpairError, NativeBackend, make_backend
from tunnelbench.impair.calibrate import calibrate, measure_base
from tunnelbench.lab import Lab, make_lab
from tunnelbench.lab.host import abort_running
from tunnelbench.lab.journal import Journal
from tunnelbench.lab.tags import new_run_id, new_tag
from tunnelbench.monitor import Monitor
from tunnelbench.scenario import Scenario
from tunnelbench.store import DB_NAME, Store
from tunnelbench.vpns import DRIVERS, Mesh, MeshSpec
from tunnelbench.vpns.base import VpnDriver
from tunnelbench.workloads import CaseContext, Outcome, Workload, WorkloadError

LAB_TOOLS = ("ip", "nft", "ping", "fping", "iperf3", "ss", "sysctl")
# A case fails on any error (a parser bug in one workload must not end the run); Interrupted and
# KeyboardInterrupt are not Exceptions of this kind and always end it.
CASE_ERRORS = (Exception,)


class Interrupted(BaseException):  # not an Exception: no case handler may swallow it
    """SIGTERM/SIGINT/SIGHUP: stop measuring, tear down, keep what is stored."""


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    status: str
    wall_s: float


def _raise_interrupted(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


class Runner:
    def __init__(self, scenario: Scenario, scenario_toml: str, console: Console | None = None,
                 results_root: Path | None = None, profile: str | None = None):  # fmt: skip
        self.sc = scenario
        self.toml = scenario_toml
        self.console = console or Console(stderr=True)
        self.tag = new_tag()
        self.run_id = new_run_id(self.tag)
        # absolute: daemons resolve config paths against their own cwd or config dir (fastd includes,
        # swanctl and SoftEther inside a mount namespace), so a relative --results broke them
        self.run_dir = (results_root or Path(scenario.run.results_dir)).absolute() / self.run_id
        self.workloads: list[Workload] = scenario.build_workloads()
        self.lab: Lab | None = None
        self.mesh: Mesh | None = None
        self.progress: Progress | None = None
        self.backend: Backend | None = None

    # -- helpers -----------------------------------------------------------------------------------
    def _phase(self, vpn: str | None, phase: str, seconds: float) -> None:
        self.store.add_phase(self.run_id, vpn, phase, seconds)

    def _say(self, msg: str) -> None:
        (self.progress.console if self.progress else self.console).print(msg, highlight=False)

    def _case_timeout(self, wl: Workload) -> float:
        return self.sc.run.case_timeout_s or (wl.expected_seconds() * 2 + 30)

    def preflight(self) -> None:
        if self.sc.lab.backend == "ssh":
            return  # the tools must be on the hosts: SshLab.build checks them there
        missing = [t for t in LAB_TOOLS if shutil.which(t) is None]
        if missing:
            raise SystemExit(f"missing lab tools: {', '.join(missing)}; run `tunnelbench doctor` (the README's "
                             "setup installs them)")  # fmt: skip

    # -- the run -----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.preflight()
        t_start = time.monotonic()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "scenario.toml").write_text(self.toml)
        self.store = Store(self.run_dir / DB_NAME)
        self.journal = Journal(self.run_dir, self.run_id)
        self.store.begin_run(self.run_id, self.tag, self.toml, __version__)
        old = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGHUP)}
        status = "failed"
        try:
            self._build_lab()
            self._run_vpns()
            status = "ok"
        except (Interrupted, KeyboardInterrupt) as e:
            status = "interrupted"
            self._say(f"[yellow]interrupted ({e or 'SIGINT'}): tearing down; finished cases are kept[/]")
            raise
        finally:
            # teardown must finish even if a second signal arrives
            for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(s, signal.SIG_IGN)
            try:
                self._teardown()
            finally:
                self.store.add_phase(self.run_id, None, "wall", time.monotonic() - t_start)
                self.store.end_run(self.run_id, status)
                self.store.close()
                for s, h in old.items():
                    signal.signal(s, h)
                signal.signal(signal.SIGINT, signal.default_int_handler)
        return RunResult(self.run_id, self.run_dir, status, time.monotonic() - t_start)

    def _build_lab(self) -> None:
        t0 = time.monotonic()
        self.lab = make_lab(self.sc.lab, self.tag, self.run_dir, self.journal)
        self.lab.build()
        self.lab.wait_links()
        h0 = self.lab.hosts[0]
        env = environment.collect_remote(h0) if h0.remote else environment.collect(h0.argv([]))
        if hasattr(self.lab, "mapping"):
            env["lab.inventory"] = self.sc.lab.inventory
            env["lab.mapping"] = self.lab.mapping()
            self._say(f"ssh lab: {self.lab.mapping()}")
        env["lab.backend"] = self.sc.lab.backend
        env["lab.hosts"] = self.sc.lab.hosts
        env["fairness.mss"] = self.sc.fairness.mss or "none (path default)"
        env["fairness.tunnel_mtu"] = self.sc.fairness.tunnel_mtu or "none (each VPN's default)"
        env["lab.path"] = self.sc.lab.path
        relay = getattr(self.lab, "relay", None)
        if relay is not None:
            env["lab.relay"] = relay.name
        self.store.set_env(self.run_id, env)
        self._phase(None, "lab_setup", time.monotonic() - t0)

    def _teardown(self) -> None:
        t0 = time.monotonic()
        if self.mesh is not None:
            with contextlib.suppress(Exception):
                self.mesh.stop()
        if self.backend is not None:
            with contextlib.suppress(Exception):
                self.backend.clear()
        if self.lab is not None:
            self.store.set_env(self.run_id, {"router.offlab_drops": self.lab.offlab_drops(),
                                             "router.tunnel_leak_drops": self.lab.offlab_drops("tunnel_leak")})  # fmt: skip
            problems = self.lab.destroy()
            for p in problems:
                self._say(f"[red]teardown problem: {p}[/]")
        self.journal.end()
        self._phase(None, "lab_teardown", time.monotonic() - t0)

    def _run_vpns(self) -> None:
        assert self.lab is not None
        client = next(h for h in self.lab.hosts if h.name == self.sc.lab.client)
        server = next(h for h in self.lab.hosts if h.name == self.sc.lab.server)
        total = len(self.sc.profiles) * len(self.sc.vpns) * self.sc.run.repetitions * len(self.workloads)
        cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*cols, console=self.console, transient=False) as progress:
            self.progress = progress
            task = progress.add_task("starting", total=total)
            self._prepare_impairment(client, server, progress, task)
            for vpn in self.sc.vpns:
                self._run_vpn(vpn, client, server, progress, task)
        self.progress = None

    # -- impairment --------------------------------------------------------------------------------
    def _prepare_impairment(self, client, server, progress: Progress, task) -> None:
        """Pick the backend and calibrate every profile on the raw path before any VPN runs."""
        assert self.lab is not None
        self.backend = None
        profiles = [self.sc.profile(n) for n in self.sc.profiles]
        if all(p.is_baseline for p in profiles):
            return
        t0 = time.monotonic()
        if self.sc.lab.backend == "ssh":  # the inventory's placement: router host or each peer's egress
            self.backend = self.lab.impair_backend(self.sc.impair.backend)  # type: ignore[attr-defined]
        else:
            self.backend = make_backend(
                self.sc.impair.backend, self.lab.router, self.lab.hosts, self.run_dir / "impair"
            )
        env: dict[str, object] = {"impair.backend": self.backend.name}
        if hasattr(self.lab, "impairment_plan"):
            env["impair.placement"] = self.lab.impairment_plan()
        if isinstance(self.backend, NativeBackend):
            env["impair.engine"] = f"{self.backend.binary} {self.backend.version()}"
        self.store.set_env(self.run_id, env)
        if self.sc.impair.calibrate:
            progress.update(task, description="calibrating the impaired path")
            base = measure_base(client, server, self.run_dir / "impair")
            self.store.set_env(
                self.run_id, {"calibration.base": {"one_way_ms": base.one_way_ms, "rtt_ms": base.rtt_ms}}
            )
            for p in profiles:
                if p.is_baseline:
                    continue
                self.backend.apply(p)
                try:
                    cal = calibrate(self.backend, p, client, server, self.run_dir / "impair", base,
                                    count=self.sc.impair.calibration_probes)  # fmt: skip
                finally:
                    self.backend.clear()
                self.store.set_env(self.run_id, {f"calibration.{p.name}": cal.to_json()})
                flag = (
                    ""
                    if cal.ok
                    else " [red]OUT OF TOLERANCE: "
                    + "; ".join(
                        f"{c.quantity} {c.measured:.3g} vs {c.configured:.3g} {c.unit}" for c in cal.failed()
                    )
                    + "[/]"
                )
                self._say(f"calibrated {p.name} ({self.backend.name}): {p.summary()}{flag}")
        self._phase(None, "calibration", time.monotonic() - t0)

    def _apply_profile(self, name: str, mesh: Mesh) -> str | None:
        """Switch the path to a profile under a running mesh; returns why cases cannot run, or None."""
        p = self.sc.profile(name)
        t0 = time.monotonic()
        mesh.probe_ms = int(300 + 2 * 2 * (p.delay_ms + 3 * p.jitter_ms))
        try:
            if self.backend is not None:
                self.backend.clear()
                if not p.is_baseline:
                    self.backend.apply(p)
            mesh.wait_ready(self.sc.run.tunnel_timeout_s + 4 * (p.delay_ms + p.jitter_ms) / 1000)
            return None
        except (*CASE_ERRORS, ImpairError) as e:
            return f"mesh not answering under profile {name}: {e}"
        finally:
            self._phase(mesh.vpn, "tunnel_wait", time.monotonic() - t0)

    # -- one VPN -----------------------------------------------------------------------------------
    def _skip_all(self, vpn: str, reason: str, profiles: list[str]) -> None:
        for profile in profiles:
            for wl in self.workloads:
                self.store.record_skip(self.run_id, vpn, profile, wl.name, wl.label(), reason)

    def _run_vpn(self, vpn: str, client, server, progress: Progress, task) -> None:
        assert self.lab is not None
        cls = DRIVERS[vpn]
        per_profile = self.sc.run.repetitions * len(self.workloads)
        n_cases = per_profile * len(self.sc.profiles)
        avail = cls.availability(self.lab.hosts)
        path = self.sc.lab.path
        if avail.ok and path not in cls.paths:
            why = cls.paths_why.get(path, f"{vpn} does not support the {path!r} path scenario")
            avail = type(avail)(False, f"path {path}: {why}")
        if avail.ok and self.sc.lab.topology not in cls.topologies:
            avail = type(avail)(False, f"topology {self.sc.lab.topology}: not supported by {vpn}")
        if not avail.ok:
            self.store.set_vpn(self.run_id, vpn, None, "unavailable", avail.reason)
            self._skip_all(vpn, avail.reason, self.sc.profiles)
            self._say(f"[yellow]{vpn}: skipped: {avail.reason}[/]")
            progress.advance(task, n_cases)
            return
        spec = MeshSpec(hosts=list(self.lab.hosts), tag=self.lab.tag, workdir=self.run_dir,
                        mtu=self.sc.fairness.tunnel_mtu, options=self.sc.vpn_options.get(vpn, {}),
                        path=path, relay=getattr(self.lab, "relay", None),
                        topology=self.sc.lab.topology, hub=server)  # fmt: skip
        driver = cls(spec)
        mesh = Mesh(driver)
        progress.update(task, description=f"{vpn}: bringing the mesh up")
        t0 = time.monotonic()
        try:
            driver.configure()
            self._phase(vpn, "vpn_setup", time.monotonic() - t0)
            t1 = time.monotonic()
            self.mesh = mesh
            mesh.start()
            waited = mesh.wait_ready(self.sc.run.tunnel_timeout_s)
            time.sleep(driver.settle_s)
            self._phase(vpn, "tunnel_wait", time.monotonic() - t1)
        except CASE_ERRORS as e:
            self._phase(vpn, "tunnel_wait", time.monotonic() - t0)
            reason = f"mesh did not come up: {e}"
            self._keep_logs(driver, self.run_dir / "cases" / vpn / "startup-failure")
            self.store.set_vpn(self.run_id, vpn, avail.version, "failed", reason, self._vpn_settings(driver))
            self._skip_all(vpn, reason, self.sc.profiles)
            self._say(f"[red]{vpn}: {reason}[/]")
            self._stop_and_verify(mesh, vpn)
            progress.advance(task, n_cases)
            return
        self.store.set_vpn(self.run_id, vpn, avail.version, "ok", "", self._vpn_settings(driver))
        self._say(
            f"{vpn} {avail.version}: mesh of {len(self.lab.hosts)} up, all pairs answering after {waited:.2f} s"
        )
        try:
            for profile in self.sc.profiles:
                why = self._apply_profile(profile, mesh)
                if why:
                    self._say(f"[red]{vpn}: {why}[/]")
                    self._skip_all(vpn, why, [profile])
                    progress.advance(task, per_profile)
                    continue
                for rep in range(1, self.sc.run.repetitions + 1):
                    for wl in self.workloads:
                        progress.update(task, description=f"{vpn} · {profile} · {wl.label()} · rep {rep}")
                        self._run_case(mesh, wl, profile, rep, client, server)
                        progress.advance(task)
                self._adaptive_reps(mesh, profile, client, server, progress, task)
        finally:
            if self.backend is not None:
                self.backend.clear()
        self._stop_and_verify(mesh, vpn)

    def _adaptive_reps(self, mesh: Mesh, profile: str, client, server, progress: Progress, task) -> None:
        """Adaptive repetitions: repeat each workload whose headline metric is not yet precise enough."""
        cfg = self.sc.run
        if not cfg.max_repetitions or cfg.max_repetitions <= cfg.repetitions:
            return
        pending = [wl for wl in self.workloads if wl.headline]
        for rep in range(cfg.repetitions + 1, cfg.max_repetitions + 1):
            pending = [wl for wl in pending if not self._precise(mesh.vpn, profile, wl)]
            if not pending:
                return
            for wl in pending:
                progress.update(
                    task, description=f"{mesh.vpn} · {profile} · {wl.label()} · rep {rep} (adaptive)"
                )
                self._run_case(mesh, wl, profile, rep, client, server)

    def _precise(self, vpn: str, profile: str, wl: Workload) -> bool:
        """Is the 95% bootstrap CI of the mean of the workload's first headline metric within
        target_ci_pct of the mean (over this run's successful repetitions)?"""
        from tunnelbench.analysis.stats import describe

        values = [v for (v,) in self.store.db.execute(
            'SELECT m.value FROM metric m JOIN "case" c ON c.id = m.case_id WHERE c.run_id = ? AND c.vpn = ? '
            "AND c.profile = ? AND c.label = ? AND c.status = 'ok' AND m.name = ? AND m.host IS NULL",
            (self.run_id, vpn, profile, wl.label(), wl.headline[0]))]  # fmt: skip
        if len(values) < 2:
            return False
        d = describe(values)
        if d.mean == 0:
            return d.mean_ci_hi == d.mean_ci_lo
        return 100 * (d.mean_ci_hi - d.mean_ci_lo) / 2 / abs(d.mean) <= self.sc.run.target_ci_pct

    def _vpn_settings(self, driver: VpnDriver) -> dict:
        """What ran (driver.settings, with its defaults), the path scenario, and the feature record."""
        out = dict(getattr(driver, "settings", {}))
        out.setdefault("mtu", driver.mtu)
        out["path"] = driver.spec.path
        if driver.features:
            from tunnelbench.vpns.features import record

            out["features"] = record(driver.name, driver.features)
        return out

    def _stop_and_verify(self, mesh: Mesh, vpn: str) -> None:
        assert self.lab is not None
        t0 = time.monotonic()
        mesh.stop()
        self.mesh = None
        left = mesh.leftovers()
        if left:
            # never let the next VPN start on a dirty host set: rebuild the lab from scratch
            self._say(f"[red]{vpn}: teardown left {left}; rebuilding the lab[/]")
            self.store.set_env(self.run_id, {f"teardown_leftovers.{vpn}": left})
            self.lab.destroy()
            self.lab = make_lab(self.sc.lab, self.tag, self.run_dir, self.journal)
            self.lab.build()
            self.lab.wait_links()
        self._phase(vpn, "teardown", time.monotonic() - t0)

    def _keep_logs(self, driver: VpnDriver, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        for h, procs in driver.procs.items():
            for p in procs:
                p.copy_log(dest / f"{h}-{p.label}.log")

    def _run_case(self, mesh: Mesh, wl: Workload, profile: str, rep: int, client, server) -> None:
        for attempt in range(self.sc.run.retries + 1):
            adir = self.run_dir / "cases" / mesh.vpn / profile / wl.label() / f"r{rep}a{attempt}"
            adir.mkdir(parents=True, exist_ok=True)
            cid = self.store.start_case(self.run_id, mesh.vpn, profile, wl.name, wl.label(),
                                        wl.params.model_dump(), rep, attempt, client.name, server.name, adir)  # fmt: skip
            t0 = time.monotonic()
            ctx = CaseContext(mesh, client, server, adir, t0 + self._case_timeout(wl),
                              {"mss": self.sc.fairness.mss, "lab": self.lab})  # fmt: skip
            try:
                self._check_path()
                health = self.backend.health if self.backend is not None else None
                mon = Monitor(mesh.daemons, self.sc.run.monitor_interval_s, health, lambda _: abort_running())
                if client.remote:  # SSH: the targets' machine CPU, not the controller's
                    mon.machines = [h for h in self._lab_hosts() if h.remote]
                eng0 = self._engine_stats()
                try:
                    with mon:
                        out: Outcome = wl.run(ctx)
                finally:
                    if mon.unhealthy:  # the watchdog aborted the case: report why, not the tool's complaint
                        raise ImpairError(mon.unhealthy)
                mon.add_to(out)
                self._add_engine_stats(out, eng0, self._engine_stats())
                self._check_path()
                dead = [f"{h}/{p.label}" for h, ps in mesh.daemons().items() for p in ps if not p.alive()]
                if dead:
                    raise WorkloadError(f"VPN daemon(s) died during the case: {', '.join(dead)}")
                if time.monotonic() > ctx.deadline:
                    raise WorkloadError(f"case exceeded its timeout of {self._case_timeout(wl):.0f} s")
                self.store.finish_case(cid, "ok", out)
                self._phase(mesh.vpn, "measure", out.measure_s)
                self._phase(mesh.vpn, "case_overhead", time.monotonic() - t0 - out.measure_s)
                if wl.restarts_mesh and mesh.driver.settle_s:
                    time.sleep(mesh.driver.settle_s)
                    self._phase(mesh.vpn, "tunnel_wait", mesh.driver.settle_s)
                return
            except (Interrupted, KeyboardInterrupt):
                self.store.finish_case(cid, "interrupted", error="run interrupted")
                raise
            except CASE_ERRORS as e:
                (adir / "error.txt").write_text(traceback.format_exc())
                self._keep_logs(mesh.driver, adir / "daemon-logs")
                self.store.finish_case(cid, "failed", error=f"{type(e).__name__}: {e}"[:2000])
                self._phase(mesh.vpn, "failed_case", time.monotonic() - t0)
                self._say(
                    f"[red]{mesh.vpn} · {wl.label()} · rep {rep} attempt {attempt + 1} failed: {e}"[:400]
                    + "[/]"
                )
                self._heal(mesh)

    def _engine_stats(self) -> dict | None:
        if not isinstance(self.backend, NativeBackend) or self.backend.profile is None:
            return None
        try:
            return self.backend.stats()
        except Exception:  # a missing stats file is the watchdog's business, not this bookkeeping's
            return None

    def _add_engine_stats(self, out: Outcome, s0: dict | None, s1: dict | None) -> None:
        """Drops the engine made that the profile did not ask for (its own queue overflowing, the kernel's
        NFQUEUE full), as per-case metrics of the router: non-zero means the emulator, not the VPN, lost
        packets. A restart in between (pid changed) makes the delta meaningless: skipped."""
        if not s0 or not s1 or s0.get("pid") != s1.get("pid"):
            return
        out.add("engine_overflow_drops", s1["dropped_overflow"] - s0["dropped_overflow"], "packets", "router")
        if s1.get("kernel_queue_dropped") is not None and s0.get("kernel_queue_dropped") is not None:
            kd = s1["kernel_queue_dropped"] - s0["kernel_queue_dropped"]
            kd += (s1.get("kernel_user_dropped") or 0) - (s0.get("kernel_user_dropped") or 0)
            out.add("engine_kernel_drops", kd, "packets", "router")
        out.add("engine_packets", s1["packets_in"] - s0["packets_in"], "packets", "router")
        out.add("engine_realtime", 1.0 if s1.get("realtime") else 0.0, "bool", "router")

    def _lab_hosts(self) -> list:
        assert self.lab is not None
        return list(self.lab.all_hosts()) if hasattr(self.lab, "all_hosts") else list(self.lab.hosts)

    def _check_path(self) -> None:
        """Fail the case if the impairment engine is down (fail closed) or stalled."""
        why = self.backend.health() if self.backend is not None else None
        if why:
            raise ImpairError(why)

    def _heal(self, mesh: Mesh) -> None:
        """After a failure: if the mesh is broken, restart it so the retry and later cases get a fair chance."""
        t0 = time.monotonic()
        if self.backend is not None and self.backend.health() and self.backend.profile is not None:
            self._say(f"[yellow]restarting the impairment engine ({self.backend.health()})[/]")
            try:
                self.backend.apply(self.backend.profile)
            except (*CASE_ERRORS, ImpairError) as e:
                self._say(f"[red]impairment engine restart failed: {e}[/]")
        try:
            dead = any(not p.alive() for ps in mesh.daemons().values() for p in ps)
            if dead or mesh.pairs_down():
                self._say(f"[yellow]{mesh.vpn}: restarting the mesh after a failure[/]")
                mesh.stop()
                mesh.start()
                mesh.wait_ready(self.sc.run.tunnel_timeout_s)
                time.sleep(mesh.driver.settle_s)
        except CASE_ERRORS as e:
            self._say(f"[red]{mesh.vpn}: mesh restart failed: {e}[/]")
        self._phase(mesh.vpn, "tunnel_wait", time.monotonic() - t0)
