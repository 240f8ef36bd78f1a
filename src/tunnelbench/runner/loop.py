"""The run's loop: scenario -> lab -> for every round, every VPN in the round's order: mesh up, the round's
cases, teardown verified -> store.

One VPN at a time on the host set; teardown is verified before the next VPN starts (a dirty one rebuilds the
lab). A failing case is retried (daemon logs kept) and never stops the run. Every finished case is committed
to the store at once. The parts: the plan (schedule.py), the conditions a case runs under (conditions.py),
one case (case.py), a killed run continued (resume.py), the key hygiene of every session
(security/hygiene.py), the router's drops per session (security/drops.py)."""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from tunnelbench import __version__, environment
from tunnelbench.analysis.outcome import PLANNED_KEY
from tunnelbench.case_metrics import CASE_METRICS
from tunnelbench.catalog import resolve as resolve_driver
from tunnelbench.core.files import write_atomic
from tunnelbench.core.metrics import MetricSpec
from tunnelbench.lab import hostfw, sysctl
from tunnelbench.lab.base import Lab
from tunnelbench.lab.interference import Guard
from tunnelbench.lab.journal import Journal
from tunnelbench.lab.make import end_lab, make_lab
from tunnelbench.lab.tags import new_run_id, new_tag
from tunnelbench.lab.tools import LAB_TOOLS  # the one list of the lab's tools
from tunnelbench.runner.case import CaseRunner, Interrupted
from tunnelbench.runner.conditions import Conditions
from tunnelbench.runner.context import CASE_ERRORS, Bench, RunContext, safe
from tunnelbench.runner.guard import CaseGuard
from tunnelbench.runner.resume import ResumePlan, prior_plan, reopen, scenario_sha256, undo_leftovers
from tunnelbench.runner.schedule import Only, Schedule, eta_text, round_orders
from tunnelbench.scenario import Scenario
from tunnelbench.security.drops import DropLedger
from tunnelbench.security.hygiene import KeyHygiene
from tunnelbench.store import DB_NAME, Store
from tunnelbench.vpns.base import Availability, VpnDriver
from tunnelbench.vpns.mesh import Mesh
from tunnelbench.vpns.session import end_mesh, make_mesh, start_mesh
from tunnelbench.workloads.base import Workload


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    status: str
    wall_s: float


def _raise_interrupted(signum: int, _frame: FrameType | None) -> NoReturn:
    raise Interrupted(signal.Signals(signum).name)


class Runner:
    def __init__(
        self,
        scenario: Scenario,
        scenario_toml: str,
        console: Console | None = None,
        results_root: Path | None = None,
        profile: str | None = None,
        overrides: dict[str, Any] | None = None,
        resume: ResumePlan | None = None,
    ):
        self.sc = scenario
        self.toml = scenario_toml
        self.console = console or Console(stderr=True)
        self.overrides = overrides or {}
        self.resume = resume
        # resumed: the same id, folder and tag (the killed lab is removed before the new one is built)
        if resume is not None:
            self.tag, self.run_id, self.run_dir = resume.tag, resume.run_id, resume.run_dir
        else:
            self.tag = new_tag()
            self.run_id = new_run_id(self.tag)
            # absolute: daemons resolve config paths against their own cwd or config dir (fastd includes,
            # swanctl and SoftEther inside a mount namespace), so a relative --results broke them
            self.run_dir = (results_root or Path(scenario.run.results_dir)).absolute() / self.run_id
        self.ctx = RunContext(scenario, self.run_id, self.run_dir, self.tag, self.console)
        self.workloads: list[Workload] = scenario.build_workloads()
        self.schedule = Schedule(self.ctx, self.workloads)
        self.hygiene = KeyHygiene(
            self.run_dir,
            scenario.run.keep_keys,
            self.ctx.say,
            lambda env: self.ctx.store.set_env(self.run_id, env),
            self.ctx.phase,
        )
        self.bench: Bench | None = None
        # what else takes the lab's CPUs (lab/interference.py): watched on this machine's namespace lab only
        watched = scenario.lab.backend == "netns" and scenario.interference.mode != "off"
        self.guard = CaseGuard(
            self.ctx,
            scenario.interference,
            Guard(self._lab_netns, interval_s=scenario.interference.interval_s) if watched else None,
            unwatched=f"hosts over {scenario.lab.backend.upper()}: their CPUs are not read from this machine",
        )
        self.lab_made: Lab | None = None  # the lab, from before it is built (the bench: once it is)
        self.conditions: Conditions | None = None
        self.cases: CaseRunner | None = None
        self.mesh: Mesh | None = None
        self.dead: set[str] = set()  # VPNs out of the run (unavailable, or never came up)
        self.seen: set[str] = set()  # VPNs whose mesh was tried at least once
        self.bringups: dict[str, int] = {}  # per VPN, how many times its mesh was brought up
        self.drops = DropLedger()  # the router's drops per VPN session (security/drops.py)
        self.seed = 0
        self.t_start = time.monotonic()
        self.prior = prior_plan(self.run_dir, self.run_id) if resume is not None else None
        self.session_prefix = ""  # a resumed process's mesh sessions get their own folders
        self.resumed_drift: list[dict[str, Any]] = []  # the drift references of the earlier processes
        self.free_progress = 0  # progress advanced without measuring (cases already ok): not in the ETA
        if self.prior is not None:  # before anything changes: the seed must give back the stored orders
            self.schedule.check_prior(self.prior)

    def _lab_netns(self) -> list[str]:
        """The lab's network namespaces now (a rebuilt lab has new ones): their processes are the lab's."""
        lab = self.bench.lab if self.bench is not None else self.lab_made
        if lab is None:
            return []
        return [ns for h in lab.all_hosts() if isinstance(ns := getattr(h, "netns", None), str)]

    @property
    def secrets(self) -> Any:
        """The run's secret values (in memory until the outputs are scanned)."""
        return self.hygiene.secrets

    # -- helpers -----------------------------------------------------------------------------------
    def _say(self, msg: str, style: str = "") -> None:
        self.ctx.say(msg, style)

    def _advance(self, n: int = 1, free: bool = False) -> None:
        """Advance the progress bar; `free`: over cases a resumed run keeps (not in the ETA)."""
        if self.ctx.progress is not None and self.ctx.task is not None:
            self.ctx.progress.advance(self.ctx.task, n)
        if free:
            self.free_progress += n

    def _eta(self, completed: float | None = None) -> str:
        p = self.ctx.progress
        if completed is None:
            completed = p.tasks[0].completed if p else 0
        total = p.tasks[0].total if p else 0
        return eta_text(time.monotonic() - self.t_start, completed, total, self.free_progress)

    def _log_case(self, vpn: str, profile: str, wl: Workload, rep: int, status: str, t0: float) -> None:
        """A log, not a live bar (the console is not a terminal): one line per finished case."""
        if self.console.is_terminal:
            return
        done, total = 0.0, 0.0
        p = self.ctx.progress
        if p is not None and p.tasks:
            done, total = p.tasks[0].completed + 1, p.tasks[0].total or 0
        self.console.print(
            Text(
                f"[{done:.0f}/{total:.0f}] {vpn} · {profile} · {wl.label()} · rep {rep}: {status} "
                f"({time.monotonic() - t0:.1f} s){self._eta(done) if done < total else ''}"
            ),
            highlight=False,
        )

    def preflight(self) -> None:
        if self.sc.lab.backend == "ssh":
            return  # the tools must be on the hosts: SshLab.build checks them there
        missing = [t for t in LAB_TOOLS if shutil.which(t) is None]
        if missing:
            raise SystemExit(
                f"missing lab tools: {', '.join(missing)}; run `tunnelbench doctor` (the README's "
                "setup installs them)"
            )

    # -- the run -----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.preflight()
        t_start = self.t_start = time.monotonic()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.resume is None or not (self.run_dir / "scenario.toml").exists():
            write_atomic(self.run_dir / "scenario.toml", self.toml)
        if self.resume is not None:  # before registering: it unregisters the killed process
            undo_leftovers(self.sc, self.run_id, self.run_dir, self._say)
        self.store = self.ctx.store = Store(self.run_dir / DB_NAME)
        self.journal = Journal(self.run_dir, self.run_id)
        if self.resume is None:
            self.store.begin_run(self.run_id, self.tag, self.toml, __version__)
            self.store.set_metric_specs(self.run_id, self._metric_specs())
            # what --resume checks and re-applies: the text as run, and the overrides parsed into it
            self.store.set_env(
                self.run_id,
                {"run.scenario_sha256": scenario_sha256(self.toml), "run.overrides": self.overrides},
            )
        else:
            self._reopen()
        old = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGHUP)}
        status = "failed"
        try:
            self.guard.check_before_run()
            if self.guard.guard is not None:
                self.guard.guard.start()
            self._build_lab()
            self._run_vpns()
            status = "ok"
        except (Interrupted, KeyboardInterrupt) as e:
            status = "interrupted"
            self._say(f"interrupted ({e or 'SIGINT'}): tearing down; finished cases are kept", "yellow")
            raise
        finally:
            # teardown must finish even if a second signal arrives
            for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(s, signal.SIG_IGN)
            try:
                if self.guard.guard is not None:
                    self.guard.guard.stop()
                self._teardown()
            finally:
                self._record(
                    "the run's wall time", lambda: self.ctx.phase(None, "wall", time.monotonic() - t_start)
                )
                self._record("the run's end", lambda: self.store.end_run(self.run_id, status))
                with contextlib.suppress(sqlite3.Error):
                    self.store.close()
                for s, h in old.items():
                    signal.signal(s, h)
                signal.signal(signal.SIGINT, signal.default_int_handler)
        return RunResult(self.run_id, self.run_dir, status, time.monotonic() - t_start)

    def _reopen(self) -> None:
        """Resume bookkeeping: the cases already ok, and what earlier processes recorded (drift, drops, key
        records, VPNs in and out of the run), so run totals keep adding up."""
        assert self.resume is not None
        r = reopen(self.store, self.run_id, self.resume.status)
        self.schedule.done = r.done
        self.session_prefix = f"r{r.resumes}"
        self.resumed_drift = r.drift
        self.seen |= r.seen
        self.dead |= r.dead
        self.hygiene.resume(r.env)
        self.guard.resume(r.env)
        self.drops.resume(r.env)
        self._say(
            f"resume {r.resumes} of this run (it was left {self.resume.status}): {len(r.done)} "
            f"cases already ok are kept, {len(r.discarded)} unfinished case(s) discarded and measured again",
            "yellow",
        )

    def _build_lab(self) -> None:
        t0 = time.monotonic()
        # held before it is built: a build that fails half-way is ended by the teardown
        lab = self.lab_made = make_lab(self.sc.lab, self.tag, self.run_dir, self.journal)
        lab.build()
        lab.wait_links()
        b = self.bench = Bench.of(self.sc, lab)
        self.conditions = Conditions(self.ctx, b, self.schedule)
        self.conditions.drift = self.resumed_drift
        self.cases = CaseRunner(self.ctx, b, self.hygiene, self.resume is not None, self.guard)
        h0 = b.lab.hosts[0]
        env = environment.collect_remote(h0) if h0.remote else environment.collect(h0.argv([]))
        mapping = b.lab.mapping()
        if mapping is not None:
            env["lab.inventory"] = self.sc.lab.inventory
            env["lab.mapping"] = mapping
            self._say(f"ssh lab: {mapping}")
            # each host's clock against this machine's (ping's reply stamps are set on this clock with it)
            for h in b.lab.hosts:
                env[f"clock.offset_ms.{h.name}"] = round(1000 * h.clock_offset(), 3)
        env["lab.backend"] = self.sc.lab.backend
        env["lab.hosts"] = self.sc.lab.hosts
        env["fairness.mss"] = self.sc.fairness.mss or "none (path default)"
        env["fairness.tunnel_mtu"] = self.sc.fairness.tunnel_mtu or "none (each VPN's default)"
        env["lab.path"] = self.sc.lab.path
        env["lab.underlay_mtu"] = self.sc.lab.underlay_mtu or "1500 (veth default)"
        if b.lab.relay is not None:
            env["lab.relay"] = b.lab.relay.name
        self.store.set_env(self.run_id, env)
        if self.sc.hosts.firewall == "stateful":  # before any VPN starts: every packet through conntrack
            hostfw.install(b.lab.hosts, f"{self.tag}hostfw")
            self.store.set_env(
                self.run_id,
                {"hosts.firewall": "stateful", "hosts.firewall.rules": hostfw.rules(f"{self.tag}hostfw")},
            )
        if self.sc.lab.backend == "netns":  # refuse unknown or read-only sysctls before any VPN starts
            sysctl.check(b.lab.hosts, {k for t in self.sc.tunings for k in self.sc.tuning(t)})
            sysctl.check_values(b.lab.hosts, {t: self.sc.tuning(t) for t in self.sc.tunings})
        self.ctx.phase(None, "lab_setup", time.monotonic() - t0)

    def _metric_specs(self) -> list[tuple[str, MetricSpec, int]]:
        """Every metric this run can store, as defined now: each workload's (with its place among the
        workload's headline metrics, 1-based; 0 = not one) and the runner's own (workload "")."""
        out = [
            (wl.name, m, wl.headline.index(m.name) + 1 if m.name in wl.headline else 0)
            for wl in self.workloads
            for m in wl.metrics
        ]
        return out + [("", m, 0) for m in CASE_METRICS]

    def _teardown(self) -> None:
        t0 = time.monotonic()
        problems: list[str] = []
        b = self.bench
        if self.mesh is not None:
            with contextlib.suppress(Exception):
                self.hygiene.stop_session(self.mesh.vpn, self.mesh.driver, self.mesh.stop)
                self._attribute_drops(self.mesh.vpn)  # a session cut short (interrupted) keeps its share
        if b is not None and b.backend is not None:
            with contextlib.suppress(Exception):
                b.backend.clear()
        lab = b.lab if b is not None else self.lab_made
        if lab is not None:
            totals: dict[str, Any] = {}
            with contextlib.suppress(Exception):  # read before the router goes
                totals = self.drops.totals(lab)
            # first: nothing the store says (a full disk) may keep the lab up
            problems = end_lab(lab, self.journal)
            for p in problems:
                self._say(f"teardown problem: {p}", "red")
            self._record("the router's drop totals", lambda: self.store.set_env(self.run_id, totals))
        else:
            self.journal.end()
        if problems:  # kept registered: the next `clean` (with the inventory, for SSH hosts) undoes the rest
            flag = f" --inventory {self.sc.lab.inventory}" if self.sc.lab.backend == "ssh" else ""
            self._say(
                f"what the teardown could not undo stays journaled: `tunnelbench clean{flag}` removes it",
                "yellow",
            )
        if self.journal.run_dir_error:  # the teardown went on; its record in the results folder did not
            self._say(
                f"the results folder's journal.jsonl is incomplete ({self.journal.run_dir_error}): the lab "
                "teardown went on all the same (any problem it met is listed above)",
                "yellow",
            )
        self._record("the teardown time", lambda: self.ctx.phase(None, "lab_teardown", time.monotonic() - t0))

    def _record(self, what: str, write: Callable[[], object]) -> None:
        """A store write while the run ends: one that fails (a full results disk) is said, not raised, so the
        teardown and the other records still happen; the error that stopped the run is raised on its own."""
        try:
            write()
        except (sqlite3.Error, OSError) as e:
            self._say(f"not stored: {what} ({e})", "red")

    def _run_vpns(self) -> None:
        assert self.bench is not None and self.conditions is not None
        sched = self.schedule
        if self.bench.watch_path(self.sc):  # the path check's negative control
            self.store.set_env(self.run_id, {"lab.plant_fault": "udp-blocked"})
            self._say(
                "plant_fault: UDP between the client and the server is dropped at the router "
                "(a test-only negative control of the path check)",
                "yellow",
            )
        total = sched.total()
        cols = (
            TextColumn("{task.description}", markup=False),  # it holds VPN and profile names: text
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*cols, console=self.console, transient=False) as progress:
            self.ctx.progress, self.ctx.task = progress, progress.add_task("starting", total=total)
            self.conditions.prepare_impairment()  # places CPUs before calibrating
            self._guard_cpus()
            if self.prior is not None and self.prior.seed is not None:  # resumed: the killed process's plan
                self.seed = self.prior.seed
            else:
                self.seed = (
                    self.sc.run.seed
                    if self.sc.run.seed is not None
                    else random.SystemRandom().randrange(2**31)
                )
            reps = self.sc.run.repetitions
            self.store.set_env(
                self.run_id,
                {
                    "run.order": self.sc.run.order,
                    "run.seed": self.seed,
                    PLANNED_KEY: total // len(self.sc.vpns),
                },
            )
            per_round = sched.per_round()
            for vpn in self.sc.vpns:
                if vpn in self.dead:  # out of the run before a resume: its cases were counted as skipped
                    self._advance(per_round * reps, free=True)
            if self.sc.run.order == "block":
                for vpn in self.sc.vpns:
                    if vpn in self.dead:
                        continue
                    if not sched.session_needed(vpn, list(range(1, reps + 1)), None, adaptive=True):
                        self._advance(per_round * reps, free=True)
                        continue
                    self.conditions.drift_reference(f"before {vpn}")
                    self._vpn_session(vpn, list(range(1, reps + 1)), None, adaptive=True)
            else:
                orders = round_orders(self.sc.vpns, reps, self.seed)
                self.store.set_env(self.run_id, {"run.round_orders": orders})
                for r, order in enumerate(orders, start=1):
                    todo = [v for v in order if v not in self.dead and sched.session_needed(v, [r], None)]
                    self._advance(
                        per_round * sum(v not in self.dead and v not in todo for v in order), free=True
                    )
                    if todo:
                        self.conditions.drift_reference(f"round {r}")
                    for vpn in todo:
                        if vpn not in self.dead:
                            self._vpn_session(vpn, [r], None)
                self._adaptive_rounds(orders)
        self.ctx.progress = None

    def _guard_cpus(self) -> None:
        """The interference guard reads the CPUs the lab was placed on (all of them when placement is off)."""
        pl = self.bench.placement if self.bench is not None else None
        if self.guard.guard is None or pl is None or pl.mode == "off":
            return
        from tunnelbench.lab.cpus import cpu_list

        cpus = {c for spec in (pl.sut, pl.engine) if spec for c in cpu_list(spec)}
        if cpus:
            self.guard.guard.set_cpus(cpus)

    def _adaptive_rounds(self, orders: list[list[str]]) -> None:
        """Interleaved adaptive repetitions: more rounds, each only for the (VPN, condition, workload) groups whose
        headline metric is not yet precise enough, in a fresh seeded order per round."""
        assert self.conditions is not None
        cfg = self.sc.run
        if not self.schedule.adaptive:
            return
        rng = random.Random(f"{self.seed}:adaptive")
        prior = self.prior.orders if self.prior is not None else None
        for r in range(cfg.repetitions + 1, self.schedule.max_reps + 1):
            pending = self.schedule.adaptive_pending(self.sc.vpns, self.dead, r)
            if not pending:
                return
            if self._over_budget(r):
                return
            order = [v for v in self.sc.vpns if v in pending]
            rng.shuffle(order)
            orders.append(order)
            if prior is not None and len(prior) >= r and prior[r - 1] != order:
                self._say(
                    f"adaptive round {r}: order {order} differs from the interrupted run's {prior[r - 1]}",
                    "yellow",
                )
            self.store.set_env(self.run_id, {"run.round_orders": orders})
            todo = [v for v in order if self.schedule.session_needed(v, [r], pending[v])]
            if todo:
                self.conditions.drift_reference(f"round {r} (adaptive)")
            for vpn in todo:
                self._vpn_session(vpn, [r], pending[vpn])

    def _over_budget(self, r: int) -> bool:
        """Would adaptive round r pass run.time_budget_s (the time so far plus the mean round so far)? Said
        and recorded (`run.adaptive_stopped`) when it would."""
        budget = self.sc.run.time_budget_s
        if budget is None:
            return False
        elapsed = time.monotonic() - self.t_start
        per_round = elapsed / max(r - 1, 1)
        if elapsed + per_round <= budget:
            return False
        why = (
            f"adaptive round {r} not started: {elapsed:.0f} s so far plus a round's {per_round:.0f} s would pass "
            f"run.time_budget_s = {budget:.0f} s; groups still short of target_ci_pct keep {r - 1} repetitions"
        )
        self._say(why, "yellow")
        self.store.set_env(self.run_id, {"run.adaptive_stopped": why})
        return True

    # -- one VPN -----------------------------------------------------------------------------------
    def _skip_all(self, vpn: str, reason: str, profiles: list[str]) -> None:
        for profile in profiles:
            for wl in self.workloads:
                self.store.record_skip(self.run_id, vpn, profile, wl.name, wl.label(), reason)

    def _availability(self, vpn: str, cls: type[VpnDriver]) -> Availability:
        assert self.bench is not None
        avail = cls.availability(self.bench.lab.hosts)
        path = self.sc.lab.path
        if avail.ok and path not in cls.paths:
            why = cls.paths_why.get(path, f"{vpn} does not support the {path!r} path scenario")
            avail = type(avail)(False, f"path {path}: {why}")
        if avail.ok and self.sc.lab.topology not in cls.topologies:
            avail = type(avail)(False, f"topology {self.sc.lab.topology}: not supported by {vpn}")
        return avail

    def _vpn_session(self, vpn: str, reps: list[int], only: Only, adaptive: bool = False) -> None:
        """Bring one VPN's mesh up, run the given repetitions of every condition and workload (or only the
        (condition label, workload label) pairs in `only`), tear it down and verify."""
        mesh = self._bring_up(vpn, reps, only)
        if mesh is None:
            return
        assert self.conditions is not None
        try:
            self._session_cases(mesh, reps, only, adaptive)
        finally:
            self.conditions.clear()
        self._stop_and_verify(mesh, vpn)

    def _bring_up(self, vpn: str, reps: list[int], only: Only) -> Mesh | None:
        """The VPN's mesh up and answering (its first time: the engine's tax and the key check too); None when
        it is out of the run or did not come up (its cases recorded as skipped, with the reason)."""
        assert self.bench is not None and self.conditions is not None
        b, sched = self.bench, self.schedule
        cls = resolve_driver(vpn)
        conds = sched.conditions()
        n_cases = len(reps) * len(self.workloads) * len(conds) if only is None else 0
        first = vpn not in self.seen
        self.seen.add(vpn)
        avail = self._availability(vpn, cls)
        if not avail.ok:
            self.dead.add(vpn)
            self.store.set_vpn(self.run_id, vpn, None, "unavailable", avail.reason, self._vpn_record(cls))
            self._skip_all(vpn, avail.reason, [c[2] for c in conds])
            self._say(f"{vpn}: skipped: {avail.reason}", "yellow")
            self._advance(sched.remaining_cases(vpn, reps))
            return None
        # lab.hosts_per_vpn: the first hosts (client and server among them); the rest stay idle for this VPN
        hosts = list(b.lab.hosts)[: self.sc.mesh_hosts(vpn)]
        session = (
            ""
            if first and not self.session_prefix
            else f"{self.session_prefix}s{self.bringups.get(vpn, 0) + 1}"
        )
        self.bringups[vpn] = self.bringups.get(vpn, 0) + 1
        mesh: Mesh | None = None
        self.ctx.status(f"{vpn}: bringing the mesh up" + (f" (round {reps[0]})" if len(reps) == 1 else ""))
        t0 = time.monotonic()
        t1 = t0
        self.drops.begin(b.lab)

        def configured(_seconds: float) -> None:  # the driver built and configured: the daemons start next
            nonlocal t1
            self.ctx.phase(vpn, "vpn_setup", time.monotonic() - t0)
            t1 = time.monotonic()

        try:
            mesh = self.mesh = make_mesh(
                cls,
                b.lab,
                hosts=hosts,
                options=self.sc.vpn_options,
                mtu=self.sc.fairness.tunnel_mtu,
                path=self.sc.lab.path,
                topology=self.sc.lab.topology,
                hub=b.server,
                session=session,
            )
            driver = mesh.driver
            waited = start_mesh(mesh, self.sc.run.tunnel_timeout_s, configured=configured).waited_s or 0.0
            self.ctx.phase(vpn, "tunnel_wait", time.monotonic() - t1)
        except CASE_ERRORS as e:
            self.ctx.phase(vpn, "tunnel_wait", time.monotonic() - t0)
            reason = f"mesh did not come up: {e}"
            if mesh is not None:
                self.hygiene.keep_logs(mesh.driver, self.run_dir / "cases" / safe(vpn) / "startup-failure")
                self._stop_and_verify(mesh, vpn)
            self._say(f"{vpn}: {reason}", "red")
            if (
                first
            ):  # never came up: the VPN is out of the run (later rounds would wait out the timeout again)
                self.dead.add(vpn)
                self.store.set_vpn(self.run_id, vpn, avail.version, "failed", reason, self._vpn_record(cls))
                self._skip_all(vpn, reason, [c[2] for c in conds])
                self._advance(sched.remaining_cases(vpn, reps))
            else:
                for _p, _t, label in conds:
                    for rep in reps:
                        for wl in self.workloads:
                            if not sched.is_done(vpn, label, wl, rep):
                                self.store.record_skip(
                                    self.run_id, vpn, label, wl.name, wl.label(), f"round {rep}: {reason}"
                                )
                self._advance(n_cases)
            return None
        self.store.set_vpn(self.run_id, vpn, avail.version, "ok", "", self._vpn_settings(driver))
        if mesh.unsettled_at_ready:  # the cases' path checks will say what the bytes did
            self._say(
                f"{vpn}: paths not settled at the tunnel timeout: {'; '.join(mesh.unsettled_at_ready)}",
                "yellow",
            )
        if first:
            self._say(
                f"{vpn} {avail.version}: mesh of {len(hosts)}"
                + (
                    f" (of the lab's {len(b.lab.hosts)}: lab.hosts_per_vpn)"
                    if len(hosts) < len(b.lab.hosts)
                    else ""
                )
                + f" up, all pairs answering after {waited:.2f} s"
            )
            self.conditions.tax_check(vpn, mesh)
            self.hygiene.check(vpn, driver)
        return mesh

    def _session_cases(self, mesh: Mesh, reps: list[int], only: Only, adaptive: bool) -> None:
        """Every condition of the session in turn, and under each the given repetitions of every workload."""
        assert self.conditions is not None and self.cases is not None
        sched, vpn = self.schedule, mesh.vpn
        conds = sched.conditions()
        for profile, tuning, label in conds:
            wls = [wl for wl in self.workloads if only is None or (label, wl.label()) in only]
            if not wls:
                continue
            if all(sched.is_done(vpn, label, wl, rep) for rep in reps for wl in wls) and not adaptive:
                self._advance(len(reps) * len(wls) if only is None else 0, free=True)
                continue  # resumed: this condition's cases are all ok
            why = self.conditions.apply(profile, tuning, mesh)
            if why:
                self._not_measured(vpn, label, reps, wls, why)
                self._advance(len(reps) * len(wls) if only is None else 0)
                continue
            for rep in reps:
                for wl in wls:
                    if sched.is_done(vpn, label, wl, rep):  # resumed: kept from the interrupted run
                        self._advance(1 if only is None else 0, free=True)
                        continue
                    self.ctx.status(f"{vpn} · {label} · {wl.label()} · rep {rep}{self._eta()}")
                    # the session's last case: nothing follows on this mesh, so a mesh restart needs no settling
                    last = (
                        (profile, tuning, label) == conds[-1]
                        and rep == reps[-1]
                        and wl is wls[-1]
                        and not adaptive
                    )
                    t_case = time.monotonic()
                    status = self.cases.run(mesh, wl, label, rep, settle=not last)
                    self._log_case(vpn, label, wl, rep, status, t_case)
                    if only is None:
                        self._advance()
            if adaptive:
                self._adaptive_reps(mesh, label, max(reps))

    def _not_measured(self, vpn: str, label: str, reps: list[int], wls: list[Workload], why: str) -> None:
        """A condition the mesh does not answer under: its cases failed (run.unreachable = fail, Goethals et
        al.: measured as failures) or skipped, with the reason."""
        self._say(f"{vpn}: {why}", "red")
        for rep in reps:
            for wl in wls:
                if self.schedule.is_done(vpn, label, wl, rep):
                    continue
                if self.sc.run.unreachable == "fail":
                    self.store.record_failure(
                        self.run_id, vpn, label, wl.name, wl.label(), wl.params.model_dump(), rep,
                        f"MeshNotReady: {why}",
                    )  # fmt: skip
                else:
                    self.store.record_skip(self.run_id, vpn, label, wl.name, wl.label(), why)

    def _adaptive_reps(self, mesh: Mesh, label: str, last: int) -> None:
        """Block order's adaptive repetitions: repeat each workload whose headline metric is not precise enough."""
        assert self.cases is not None
        if not self.schedule.adaptive:
            return
        pending = [wl for wl in self.workloads if wl.headline]
        for rep in range(last + 1, self.schedule.max_reps + 1):
            pending = [wl for wl in pending if not self.schedule.precise(mesh.vpn, label, wl, rep)]
            if not pending:
                return
            for wl in pending:
                if self.schedule.is_done(mesh.vpn, label, wl, rep):
                    continue
                self.ctx.status(f"{mesh.vpn} · {label} · {wl.label()} · rep {rep} (adaptive)")
                t_case = time.monotonic()
                status = self.cases.run(mesh, wl, label, rep)
                self._log_case(mesh.vpn, label, wl, rep, status, t_case)

    @staticmethod
    def _vpn_record(cls: type[VpnDriver]) -> dict[str, Any]:
        """What every VPN record keeps, up or not: the driver's capabilities (the security table's "not
        supported" reads them from the run)."""
        return {"capabilities": cls.capabilities()}

    def _vpn_settings(self, driver: VpnDriver) -> dict[str, Any]:
        """What ran (driver.settings, with its defaults), the path scenario, the capabilities and the feature
        record."""
        out = dict(driver.settings)
        out.setdefault("mtu", driver.mtu)
        out["path"] = driver.spec.path
        out["mesh_hosts"] = len(driver.spec.hosts)
        out.update(self._vpn_record(type(driver)))
        if driver.features:
            from tunnelbench.vpns.features import record

            out["features"] = record(driver.name, driver.features)
        return out

    def _stop_and_verify(self, mesh: Mesh, vpn: str) -> None:
        assert self.bench is not None
        t0 = time.monotonic()
        left = end_mesh(mesh, lambda: self.hygiene.stop_session(vpn, mesh.driver, mesh.stop))
        self.mesh = None
        self._attribute_drops(vpn)  # before a rebuild below: a new lab's counters start again at 0
        if left:
            # never let the next VPN start on a dirty host set: rebuild the lab from scratch
            self._say(f"{vpn}: teardown left {left}; rebuilding the lab", "red")
            self.store.set_env(self.run_id, {f"teardown_leftovers.{vpn}": left})
            self.bench.rebuild(self.sc, self.tag, self.run_dir, self.journal)
        self.ctx.phase(vpn, "teardown", time.monotonic() - t0)

    def scan_outputs(self) -> dict[str, Any]:
        """After the report is written: search it, the store and the exports for every secret value of the run,
        and store the result (`keys.scan`: outputs, counts, offsets; never a value). The report is not rewritten
        with this result (a rewrite would need a rescan); `tunnelbench report` shows it later."""
        result = self.hygiene.scan_outputs(self.run_id)
        st = Store(self.run_dir / DB_NAME)
        try:
            self._record("the key scan's result", lambda: st.set_env(self.run_id, {"keys.scan": result}))
        finally:
            st.close()
        return result

    def _attribute_drops(self, vpn: str) -> None:
        """The router's drops since this session began go to the VPN (security/drops.py)."""
        assert self.bench is not None
        share = self.drops.attribute(self.bench.lab, vpn)
        if share:
            self.store.set_env(self.run_id, share)
