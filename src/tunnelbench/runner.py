"""The orchestrator: scenario -> lab -> tunnel up -> workloads x repetitions -> store.

One VPN at a time on the host set; teardown is verified before the next VPN starts. A failing case is
retried (daemon logs kept) and never stops the run. Every finished case is committed to the store at once."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import re
import shutil
import signal
import sqlite3
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from tunnelbench import __version__, environment
from tunnelbench.analysis.outcome import PLANNED_KEY
from tunnelbench.case_metrics import CASE_METRICS
from tunnelbench.catalog import resolve as resolve_driver
from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome, Series
from tunnelbench.diagnostics.case import CaseDiagnostics
from tunnelbench.impair import placement as impair_placement
from tunnelbench.impair import tax
from tunnelbench.impair.backend import Backend, ImpairError, NativeBackend
from tunnelbench.impair.calibrate import calibrate, measure_base
from tunnelbench.impair.load import engine_load
from tunnelbench.impair.tcpcheck import goodput_mbps, iperf3_tcp
from tunnelbench.lab import counters, cpus, hostfw, pathcheck, sysctl
from tunnelbench.lab.base import Lab
from tunnelbench.lab.host import CommandError, Host, abort_running
from tunnelbench.lab.journal import Journal, run_leftovers
from tunnelbench.lab.make import end_lab, make_lab
from tunnelbench.lab.tags import new_run_id, new_tag
from tunnelbench.lab.tools import LAB_TOOLS  # the one list of the lab's tools
from tunnelbench.monitor import Monitor
from tunnelbench.scenario import Scenario
from tunnelbench.security import keys
from tunnelbench.security.drops import DropLedger
from tunnelbench.store import DB_NAME, Store
from tunnelbench.vpns.base import Availability, MeshSpec, VpnDriver
from tunnelbench.vpns.mesh import Mesh, MeshNotReady
from tunnelbench.workloads.base import CaseContext, NotApplicable, Workload, WorkloadError

# A case fails on any error (a parser bug in one workload must not end the run); Interrupted and
# KeyboardInterrupt are not Exceptions of this kind and always end it.
CASE_ERRORS = (Exception,)


def round_orders(vpns: list[str], rounds: int, seed: int) -> list[list[str]]:
    """The VPN order of every round: each round a fresh shuffle from one generator seeded with `seed`, so the
    same seed gives the same plan (a resumed or repeated run) and every VPN appears once per round."""
    rng = random.Random(seed)
    out = []
    for _ in range(rounds):
        order = list(vpns)
        rng.shuffle(order)
        out.append(order)
    return out


def eta_text(elapsed_s: float, completed: float, total: float | None, free: float = 0) -> str:
    """The progress line's estimate of the time left: this process's seconds per case it measured (`free`
    cases, kept from before a resume, took none) times the cases still to come; "" before the first case."""
    done = completed - free
    if done <= 0 or not total:
        return ""
    left = elapsed_s / done * max(total - completed, 0)
    return f" · ~{left / 60:.0f} min left" if left >= 60 else f" · ~{left:.0f} s left"


def _safe(name: str) -> str:
    """A VPN key as a folder name."""
    return name.replace("/", "_")


def scenario_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class ResumeError(Exception):
    """A run that cannot be resumed; the message names the problem and what to do."""


@dataclass
class ResumePlan:
    """A killed or interrupted run to continue: its folder, identity and the scenario it started with."""

    run_id: str
    run_dir: Path
    tag: str
    text: str  # scenario.toml as run (its sha256 checked against the one recorded at the start)
    overrides: dict[str, Any]  # the command-line overrides it ran with (run.overrides)
    status: str  # the run's status before this resume


def load_resume(run_dir: Path) -> ResumePlan:
    """Check that a run folder holds a run that can be continued; ResumeError says why not."""
    db = run_dir / DB_NAME
    if not db.exists():
        raise ResumeError(f"{run_dir} is not a run folder (no {DB_NAME})")
    st = Store(db)
    try:
        rows = st.runs()
        if len(rows) != 1:
            raise ResumeError(f"{db} holds {len(rows)} runs; a run folder holds one")
        run = rows[0]
        env = st.env(run["id"])
    finally:
        st.close()
    run_id = run["id"]
    if run["status"] == "ok":
        ended = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run["ended"] or 0))
        raise ResumeError(f"run {run_id} finished ok ({ended}): there is nothing to resume; start a new run")
    owner = run_leftovers(run_id, run_dir)
    if owner.owner_alive():
        raise ResumeError(
            f"run {run_id} is still running (pid {owner.owner_pid}): only a killed or interrupted "
            f"run can be resumed; stop it first (Ctrl-C, or kill -TERM {owner.owner_pid})"
        )
    recorded = env.get("run.scenario_sha256")
    if recorded is None:
        raise ResumeError(
            f"run {run_id} recorded no scenario hash (run.scenario_sha256): it was made by a "
            "tunnelbench without --resume and cannot be resumed; start a new run"
        )
    path = run_dir / "scenario.toml"
    text = path.read_text() if path.exists() else run["scenario"]  # the store keeps the same text
    now = scenario_sha256(text)
    if now != recorded:
        raise ResumeError(
            f"{path} changed since run {run_id} started (sha256 {now[:16]}…, recorded {recorded[:16]}…): "
            "a resumed run must measure the scenario it started with. Restore the file (the original text is in "
            f"{db}, table run, column scenario) to resume, or start a new run with the edited file"
        )
    return ResumePlan(
        run_id,
        run_dir.absolute(),
        run["tag"],
        text,
        json.loads(env.get("run.overrides", "{}")),
        run["status"],
    )


class Interrupted(BaseException):  # not an Exception: no case handler may swallow it
    """SIGTERM/SIGINT/SIGHUP: stop measuring, tear down, keep what is stored."""


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
        self.workloads: list[Workload] = scenario.build_workloads()
        self.lab: Lab | None = None
        self.mesh: Mesh | None = None
        self.progress: Progress | None = None
        self.task: TaskID | None = None  # set with self.progress
        self.backend: Backend | None = None
        self.dead: set[str] = set()  # VPNs out of the run (unavailable, or never came up)
        self.seen: set[str] = set()  # VPNs whose mesh was tried at least once
        self.bringups: dict[str, int] = {}  # per VPN, how many times its mesh was brought up
        self.drops = DropLedger()  # the router's drops per VPN session (security/drops.py)
        self.drift: list[dict[str, Any]] = []
        # key hygiene: per VPN its record (keys.<vpn>), and the secret values of every session, kept in memory
        # until the outputs are scanned (scan_outputs): the report is written after run() returns
        self.key_records: dict[str, dict[str, Any]] = {}
        self.secrets = keys.Secrets()
        self.tuning_now: str | None = None  # the tuning applied in the hosts now; None = their own values
        self.tuning_saved: dict[str, dict[str, str]] = {}  # sysctl.snapshot(): host -> key -> value
        self.tunings_recorded: set[str] = set()
        self.placement: cpus.Placement | None = None
        self.seed = 0
        self.path_watch: pathcheck.PathWatch | None = None
        self.t_start = time.monotonic()
        # resume: cases already ok, (vpn, condition label, workload label, rep); the killed run's seed and orders
        self.done: set[tuple[str, str, str, int]] = set()
        self.prior_seed: int | None = None
        self.prior_orders: list[list[str]] | None = None
        self.session_prefix = ""  # a resumed process's mesh sessions get their own folders
        self.free_progress = 0  # progress advanced without measuring (cases already ok): not in the ETA
        if resume is not None:
            self._check_resume()

    # -- helpers -----------------------------------------------------------------------------------
    def _phase(self, vpn: str | None, phase: str, seconds: float) -> None:
        self.store.add_phase(self.run_id, vpn, phase, seconds)

    def _say(self, msg: str, style: str = "") -> None:
        """Print a line; `msg` is plain text (VPN errors and user names may hold brackets, never markup)."""
        (self.progress.console if self.progress else self.console).print(
            Text(msg, style=style), highlight=False
        )

    def _case_timeout(self, wl: Workload) -> float:
        return self.sc.run.case_timeout_s or (wl.expected_seconds() * 2 + 30)

    # -- resume ------------------------------------------------------------------------------------
    def _check_resume(self) -> None:
        """Before anything changes: the killed run's seed must give back its stored round orders."""
        st = Store(self.run_dir / DB_NAME)
        try:
            env = st.env(self.run_id)
        finally:
            st.close()
        if "run.seed" in env:
            self.prior_seed = int(json.loads(env["run.seed"]))
        if "run.round_orders" in env:
            self.prior_orders = json.loads(env["run.round_orders"])
        if (
            self.prior_seed is not None
            and self.prior_orders is not None
            and self.sc.run.order == "interleaved"
        ):
            again = round_orders(self.sc.vpns, self.sc.run.repetitions, self.prior_seed)
            if self.prior_orders[: len(again)] != again:
                raise ResumeError(
                    f"run {self.run_id}: seed {self.prior_seed} no longer gives the stored round "
                    f"orders ({self.prior_orders} vs {again}); this tunnelbench plans rounds "
                    "differently, so the run cannot be continued: start a new run"
                )

    def _undo_leftovers(self) -> None:
        """Remove what the killed process left (namespaces, daemons, files) from its journal, as `clean` does,
        so resume works straight after a SIGKILL."""
        from tunnelbench.lab.clean import clean_run

        left = run_leftovers(self.run_id, self.run_dir)
        if left.owner_alive():  # checked by load_resume too; a second resume may have started meanwhile
            raise ResumeError(f"run {self.run_id} is running again (pid {left.owner_pid})")
        inv = None
        if self.sc.lab.backend == "ssh" and any(e.get("backend") == "ssh" for e in left.entries):
            from tunnelbench.lab.inventory import load_inventory

            assert self.sc.lab.inventory is not None
            inv = load_inventory(self.sc.lab.inventory)
            if self.sc.lab.insecure_no_host_key_check:
                inv.insecure()
        rep = clean_run(left, inv)
        if rep.removed:
            self._say(f"removed what the interrupted run left: {', '.join(rep.removed)}", "yellow")
        if rep.problems or rep.skipped:
            raise ResumeError(
                "the interrupted run's leftovers could not all be removed: "
                + "; ".join(rep.problems + rep.skipped)
                + "; fix that (or run `tunnelbench clean`), "
                "then resume"
            )

    def _reopen(self) -> None:
        """Resume bookkeeping: drop the cases the killed process never finished, remember those already ok, and
        carry over what earlier processes recorded (drift, drops, key records), so run totals keep adding up."""
        assert self.resume is not None
        st = self.store
        env = st.env(self.run_id)
        discarded = st.discard_unfinished(self.run_id)
        self.done = st.done_cases(self.run_id)
        resumed = json.loads(env.get("run.resumed", "[]"))
        resumed.append(
            {
                "at": time.time(),
                "previous_status": self.resume.status,
                "cases_ok": len(self.done),
                "discarded": discarded,
                "tunnelbench_version": __version__,
            }
        )
        st.set_env(self.run_id, {"run.resumed": resumed})
        st.reopen_run(self.run_id)
        self.session_prefix = f"r{len(resumed)}"
        self.drift = json.loads(env.get("drift.reference", "[]"))
        for v in st.vpns(self.run_id):
            (self.seen if v["status"] == "ok" else self.dead).add(v["name"])  # out of the run stays out
        for k, val in env.items():
            if k.startswith("keys.") and k != "keys.scan":
                self.key_records[k[len("keys.") :]] = json.loads(val)
        self.drops.resume(env)
        self._say(
            f"resume {len(resumed)} of this run (it was left {self.resume.status}): {len(self.done)} "
            f"cases already ok are kept, {len(discarded)} unfinished case(s) discarded and measured again",
            "yellow",
        )

    def _is_done(self, vpn: str, label: str, wl: Workload, rep: int) -> bool:
        return (vpn, label, wl.label(), rep) in self.done

    def _session_needed(
        self, vpn: str, reps: list[int], only: set[tuple[str, str]] | None, adaptive: bool = False
    ) -> bool:
        """Has a session of this VPN anything left to measure? (A resumed run does not bring up a VPN whose
        cases of the round are all ok.)"""
        if not self.done:
            return True
        for _p, _t, label in self._conditions():
            for wl in self.workloads:
                if only is not None and (label, wl.label()) not in only:
                    continue
                if any(not self._is_done(vpn, label, wl, rep) for rep in reps):
                    return True
        cfg = self.sc.run
        if adaptive and cfg.max_repetitions and cfg.max_repetitions > cfg.repetitions:
            # block order's adaptive repetitions, planned as _adaptive_reps plans them
            for _p, _t, label in self._conditions():
                pending = [wl for wl in self.workloads if wl.headline]
                for rep in range(max(reps) + 1, cfg.max_repetitions + 1):
                    pending = [wl for wl in pending if not self._precise(vpn, label, wl, rep)]
                    if any(not self._is_done(vpn, label, wl, rep) for wl in pending):
                        return True
        return False

    def _skip_done(self, n: int) -> None:
        """Advance the progress bar over cases a resumed run keeps."""
        assert self.progress is not None and self.task is not None
        self.progress.advance(self.task, n)
        self.free_progress += n

    def _first_attempt(self, vpn: str, profile: str, wl: Workload, rep: int) -> int:
        """A resumed case's attempts continue after the killed process's (their artifact folders are kept)."""
        if self.resume is None:
            return 0
        d = self.run_dir / "cases" / vpn / profile / wl.label()
        used = [int(m.group(1)) for p in d.glob(f"r{rep}a*") if (m := re.fullmatch(rf"r{rep}a(\d+)", p.name))]
        return max(used, default=-1) + 1

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
            (self.run_dir / "scenario.toml").write_text(self.toml)
        if self.resume is not None:
            self._undo_leftovers()  # before registering: it unregisters the killed process
        self.store = Store(self.run_dir / DB_NAME)
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
                self._teardown()
            finally:
                self._record(
                    "the run's wall time", lambda: self._phase(None, "wall", time.monotonic() - t_start)
                )
                self._record("the run's end", lambda: self.store.end_run(self.run_id, status))
                with contextlib.suppress(sqlite3.Error):
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
        mapping = self.lab.mapping()
        if mapping is not None:
            env["lab.inventory"] = self.sc.lab.inventory
            env["lab.mapping"] = mapping
            self._say(f"ssh lab: {mapping}")
            # each host's clock against this machine's (ping's reply stamps are set on this clock with it)
            for h in self.lab.hosts:
                env[f"clock.offset_ms.{h.name}"] = round(1000 * h.clock_offset(), 3)
        env["lab.backend"] = self.sc.lab.backend
        env["lab.hosts"] = self.sc.lab.hosts
        env["fairness.mss"] = self.sc.fairness.mss or "none (path default)"
        env["fairness.tunnel_mtu"] = self.sc.fairness.tunnel_mtu or "none (each VPN's default)"
        env["lab.path"] = self.sc.lab.path
        env["lab.underlay_mtu"] = self.sc.lab.underlay_mtu or "1500 (veth default)"
        if self.lab.relay is not None:
            env["lab.relay"] = self.lab.relay.name
        self.store.set_env(self.run_id, env)
        if self.sc.hosts.firewall == "stateful":  # before any VPN starts: every packet through conntrack
            hostfw.install(self.lab.hosts, f"{self.tag}hostfw")
            self.store.set_env(
                self.run_id,
                {"hosts.firewall": "stateful", "hosts.firewall.rules": hostfw.rules(f"{self.tag}hostfw")},
            )
        if self.sc.lab.backend == "netns":  # refuse unknown or read-only sysctls before any VPN starts
            sysctl.check(self.lab.hosts, {k for t in self.sc.tunings for k in self.sc.tuning(t)})
            sysctl.check_values(self.lab.hosts, {t: self.sc.tuning(t) for t in self.sc.tunings})
        self._phase(None, "lab_setup", time.monotonic() - t0)

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
        if self.mesh is not None:
            with contextlib.suppress(Exception):
                self.mesh.stop()
                self._keys_teardown(self.mesh.vpn, self.mesh.driver)
                self._attribute_drops(self.mesh.vpn)  # a session cut short (interrupted) keeps its share
        if self.backend is not None:
            with contextlib.suppress(Exception):
                self.backend.clear()
        if self.lab is not None:
            totals: dict[str, Any] = {}
            with contextlib.suppress(Exception):  # read before the router goes
                totals = self.drops.totals(self.lab)
            # first: nothing the store says (a full disk) may keep the lab up
            problems = end_lab(self.lab, self.journal)
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
        self._record("the teardown time", lambda: self._phase(None, "lab_teardown", time.monotonic() - t0))

    def _record(self, what: str, write: Callable[[], object]) -> None:
        """A store write while the run ends: one that fails (a full results disk) is said, not raised, so the
        teardown and the other records still happen; the error that stopped the run is raised on its own."""
        try:
            write()
        except (sqlite3.Error, OSError) as e:
            self._say(f"not stored: {what} ({e})", "red")

    def _run_vpns(self) -> None:
        assert self.lab is not None
        client = next(h for h in self.lab.hosts if h.name == self.sc.lab.client)
        server = next(h for h in self.lab.hosts if h.name == self.sc.lab.server)
        self.client, self.server = client, server
        if self.sc.lab.backend == "netns":  # the lab's router forwards every underlay byte
            self.path_watch = pathcheck.PathWatch(self.lab, client, server)
            if self.sc.lab.plant_fault == "udp-blocked":  # the path check's negative control
                self.lab.block_udp_pair(client, server)
                self.store.set_env(self.run_id, {"lab.plant_fault": "udp-blocked"})
                self._say(
                    "plant_fault: UDP between the client and the server is dropped at the router "
                    "(a test-only negative control of the path check)",
                    "yellow",
                )
        conds = self._conditions()
        total = len(conds) * len(self.sc.vpns) * self.sc.run.repetitions * len(self.workloads)
        cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*cols, console=self.console, transient=False) as progress:
            self.progress, self.task = progress, progress.add_task("starting", total=total)
            self._prepare_impairment(client, server, progress, self.task)  # places CPUs before calibrating
            if self.prior_seed is not None:  # resumed: the same plan as the killed process
                self.seed = self.prior_seed
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
            per_round = len(conds) * len(self.workloads)
            for vpn in self.sc.vpns:
                if vpn in self.dead:  # out of the run before a resume: its cases were counted as skipped
                    self._skip_done(per_round * reps)
            if self.sc.run.order == "block":
                for vpn in self.sc.vpns:
                    if vpn in self.dead:
                        continue
                    if not self._session_needed(vpn, list(range(1, reps + 1)), None, adaptive=True):
                        self._skip_done(per_round * reps)
                        continue
                    self._drift_reference(f"before {vpn}")
                    self._vpn_session(vpn, list(range(1, reps + 1)), None, adaptive=True)
            else:
                orders = round_orders(self.sc.vpns, reps, self.seed)
                self.store.set_env(self.run_id, {"run.round_orders": orders})
                for r, order in enumerate(orders, start=1):
                    todo = [v for v in order if v not in self.dead and self._session_needed(v, [r], None)]
                    self._skip_done(per_round * sum(v not in self.dead and v not in todo for v in order))
                    if todo:
                        self._drift_reference(f"round {r}")
                    for vpn in todo:
                        if vpn not in self.dead:
                            self._vpn_session(vpn, [r], None)
                self._adaptive_rounds(orders)
        self.progress = None

    def _conditions(self) -> list[tuple[str, str, str]]:
        """(profile, tuning, stored label) for every profile x host tuning of the run."""
        tunings = self.sc.tunings or ["default"]
        return [(p, t, p if t == "default" else f"{p}+{t}") for p in self.sc.profiles for t in tunings]

    def _adaptive_rounds(self, orders: list[list[str]]) -> None:
        """Interleaved adaptive repetitions: more rounds, each only for the (VPN, condition, workload) groups whose
        headline metric is not yet precise enough, in a fresh seeded order per round."""
        cfg = self.sc.run
        if not cfg.max_repetitions or cfg.max_repetitions <= cfg.repetitions:
            return
        rng = random.Random(f"{self.seed}:adaptive")
        for r in range(cfg.repetitions + 1, cfg.max_repetitions + 1):
            pending: dict[str, set[tuple[str, str]]] = {}
            for vpn in self.sc.vpns:
                if vpn in self.dead:
                    continue
                for _p, _t, label in self._conditions():
                    for wl in self.workloads:
                        if wl.headline and not self._precise(vpn, label, wl, r):
                            pending.setdefault(vpn, set()).add((label, wl.label()))
            if not pending:
                return
            order = [v for v in self.sc.vpns if v in pending]
            rng.shuffle(order)
            orders.append(order)
            if (
                self.prior_orders is not None
                and len(self.prior_orders) >= r
                and self.prior_orders[r - 1] != order
            ):
                self._say(
                    f"adaptive round {r}: order {order} differs from the interrupted run's "
                    f"{self.prior_orders[r - 1]}",
                    "yellow",
                )
            self.store.set_env(self.run_id, {"run.round_orders": orders})
            todo = [v for v in order if self._session_needed(v, [r], pending[v])]
            if todo:
                self._drift_reference(f"round {r} (adaptive)")
            for vpn in todo:
                self._vpn_session(vpn, [r], pending[vpn])

    # -- impairment --------------------------------------------------------------------------------
    def _prepare_impairment(self, client: Host, server: Host, progress: Progress, task: TaskID) -> None:
        """Pick the backend and calibrate every profile on the raw path before any VPN runs."""
        assert self.lab is not None
        self.backend = None
        profiles = [self.sc.profile(n) for n in self.sc.profiles]
        if all(p.is_baseline for p in profiles):
            self._apply_placement()
            return
        t0 = time.monotonic()
        # the lab's router, or on SSH hosts the inventory's placement (router host or each peer's egress)
        self.backend = impair_placement.backend_for(self.lab, self.sc.impair.backend, self.run_dir / "impair")
        env: dict[str, object] = {"impair.backend": self.backend.name}
        self.backend.gso_mode = self.sc.impair.gso
        if not isinstance(self.backend, NativeBackend):
            # netem: per wire packet (GSO super-packets segmented first) or super-packets whole, per condition
            env["impair.netem"] = {
                label: self.backend.netem_mode(self.sc.profile(p)) for p, _t, label in self._conditions()
            }
        # the engine mode of every condition: GSO super-packets whole, per wire packet, or no engine
        env["impair.modes"] = {
            label: (
                tax.mode_of(self.sc.profile(p), self.sc.impair.gso)
                if isinstance(self.backend, NativeBackend)
                else None
            )
            for p, _t, label in self._conditions()
        }
        if (where := impair_placement.plan(self.lab)) is not None:
            env["impair.placement"] = where
        if isinstance(self.backend, NativeBackend):
            env["impair.engine"] = f"{self.backend.binary} {self.backend.version()}"
        self.store.set_env(self.run_id, env)
        self._apply_placement()  # calibration measures the path as the cases will have it
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
                    cal = calibrate(
                        self.backend,
                        p,
                        client,
                        server,
                        self.run_dir / "impair",
                        base,
                        count=self.sc.impair.calibration_probes,
                    )
                finally:
                    self.backend.clear()
                self.store.set_env(self.run_id, {f"calibration.{p.name}": cal.to_json()})
                bad = "; ".join(
                    f"{c.quantity} {c.measured:.3g} vs {c.configured:.3g} {c.unit}" for c in cal.failed()
                )
                self._say(
                    f"calibrated {p.name} ({self.backend.name}): {p.summary()}"
                    + (f" OUT OF TOLERANCE: {bad}" if bad else ""),
                    "red" if bad else "",
                )
        self._phase(None, "calibration", time.monotonic() - t0)

    def _apply_condition(self, name: str, tuning: str, mesh: Mesh) -> str | None:
        """Switch the path to a profile (and the hosts to a TCP tuning) under a running mesh; returns why cases
        cannot run, or None."""
        p = self.sc.profile(name)
        t0 = time.monotonic()
        mesh.probe_ms = int(300 + 2 * 2 * (p.delay_ms + 3 * p.jitter_ms))
        try:
            self._set_tuning(tuning)
        except CASE_ERRORS as e:
            return f"cannot apply host tuning {tuning}: {e}"
        try:
            if self.backend is not None:
                self.backend.clear()
                if not p.is_baseline:
                    self.backend.apply(p)
            mesh.wait_ready(self.sc.run.tunnel_timeout_s + 4 * (p.delay_ms + p.jitter_ms) / 1000)
            return None
        except MeshNotReady as e:
            pairs = len(mesh.probed_pairs())
            # every daemon still runs (e.down): the tunnels carry what they can
            if e.down and self.sc.run.unreachable == "measure":
                self._say(
                    f"{mesh.vpn}: under profile {name}, {len(e.down)} of {pairs} pairs never answered a probe; "
                    "the cases run on the tunnels already up (run.unreachable = measure)",
                    "yellow",
                )
                self.store.set_env(
                    self.run_id,
                    {f"unreachable.{mesh.vpn}.{name}": {"never_answered": len(e.down), "pairs": pairs}},
                )
                return None
            return self._not_answering(name, tuning, e)
        except CASE_ERRORS as e:  # ImpairError included
            return self._not_answering(name, tuning, e)
        finally:
            self._phase(mesh.vpn, "tunnel_wait", time.monotonic() - t0)

    @staticmethod
    def _not_answering(profile: str, tuning: str, e: Exception) -> str:
        return (
            f"mesh not answering under profile {profile}"
            + (f", tuning {tuning}" if tuning != "default" else "")
            + f": {e}"
        )

    # -- host TCP tunings (sysctls per host namespace) ----------------------------------------------
    def _set_tuning(self, tuning: str) -> None:
        values = self.sc.tuning(tuning)
        if tuning != self.tuning_now:
            self._restore_tuning()
            if values:
                self.tuning_saved = sysctl.snapshot(self._sut_hosts(), values)
                sysctl.apply(self._sut_hosts(), values)
            self.tuning_now = tuning
        if tuning not in self.tunings_recorded:  # what the hosts' TCP stack was under this tuning, read back
            self.tunings_recorded.add(tuning)
            self.store.set_env(
                self.run_id,
                {
                    f"sysctl.tuning.{tuning}": {
                        "set": values,
                        "read_back": sysctl.snapshot(self._sut_hosts(), self.sc.sysctl_keys()),
                    }
                },
            )

    def _restore_tuning(self) -> None:
        if self.tuning_saved:
            sysctl.restore(self._sut_hosts(), self.tuning_saved)
        self.tuning_saved, self.tuning_now = {}, None  # the hosts' own values: no tuning applied

    def _sut_hosts(self) -> list[Host]:
        assert self.lab is not None
        return list(self.lab.hosts)

    # -- CPU placement, the engine's tax, drift -----------------------------------------------------
    def _apply_placement(self) -> None:
        """Confine the system under test (and the engine) to fixed CPUs for every profile of the run."""
        assert self.lab is not None
        engine_used = isinstance(self.backend, NativeBackend)
        cfg = self.sc.cpu
        if self.sc.lab.backend == "ssh":
            pl = cpus.Placement("off", "not applied on SSH hosts", 0)
        else:
            pl = cpus.plan(
                cfg.placement, engine_used, [h.name for h in self.lab.hosts], cfg.engine_cpus, cfg.sut_cpus
            )
        pl.pin(self.lab.hosts)
        if isinstance(self.backend, NativeBackend):
            self.backend.place(pl.engine, cfg.engine_busy_poll_us, cfg.engine_realtime)
            pl.engine_busy_poll_us, pl.engine_realtime = self.backend.busy_poll_us, self.backend.realtime
            if cfg.steer_rx:  # off by default: measured here it raised the tax (more IPIs), see README
                # the engine re-injects released packets on its own CPU; without steering, the receiving host's
                # whole stack (and the wake-up of its daemon, a cross-CPU IPI) would run there per packet
                for h in self.lab.hosts:
                    mask = sum(1 << c for c in cpus.cpu_list(pl.hosts[h.name]))
                    h.run(
                        [
                            "sh",
                            "-c",
                            f"for q in /sys/class/net/{h.underlay_if}/queues/rx-*; do echo {mask:x} > $q/rps_cpus; done",
                        ]
                    )
                pl.steer_rx = True
        self.placement = pl
        self.store.set_env(self.run_id, {"cpu.placement": pl.to_json()})
        self._say(pl.summary())

    def _tax_check(self, vpn: str, mesh: Mesh) -> None:
        """Once per VPN, in a run with the native engine: its TCP with the engine in the path at zero
        impairment against without it, in each engine mode the run's profiles use."""
        be = self.backend
        if not isinstance(be, NativeBackend) or not self.sc.impair.tax_check_s:
            return
        profiles = [self.sc.profile(n) for n in self.sc.profiles]
        modes = tax.modes_for(profiles, self.sc.impair.gso)
        if not modes:
            return
        assert self.progress is not None and self.task is not None
        self.progress.update(self.task, description=f"{vpn}: measuring the engine's tax")
        t0 = time.monotonic()
        try:
            checks = tax.measure_tax(
                be,
                vpn,
                self.client,
                self.server,
                mesh.tunnel_ip(self.server),
                self.sc.impair.tax_check_s,
                modes,
            )
        except CASE_ERRORS as e:
            self.store.set_env(self.run_id, {f"engine_tax.{vpn}": {"error": str(e)}})
            self._say(f"{vpn}: engine-tax check failed: {e}", "red")
            return
        finally:
            self._phase(vpn, "tax_check", time.monotonic() - t0)
        self.store.set_env(self.run_id, {f"engine_tax.{vpn}": {c.mode: c.to_json() for c in checks}})
        for c in checks:
            self._say(
                f"{vpn}: engine tax ({c.summary()})"
                + (" > 10%: throughput under this engine mode is partly the emulator's" if c.flagged else ""),
                "red" if c.flagged else "",
            )

    def _drift_reference(self, when: str) -> None:
        """A fixed reference measurement (raw underlay TCP, no VPN, no impairment) at every round boundary:
        the machine's own drift over the run, next to which the VPNs' per-round values can be read."""
        if not self.sc.run.drift_check_s or self.sc.lab.backend == "ssh":
            return
        assert self.progress is not None and self.task is not None
        self.progress.update(self.task, description=f"drift reference ({when})")
        t0 = time.monotonic()
        try:
            if self.backend is not None:
                self.backend.clear()
            mbps = goodput_mbps(
                iperf3_tcp(self.client, self.server, self.server.underlay_ip, self.sc.run.drift_check_s, 5296)
            )
            self.drift.append({"when": when, "t": time.time(), "goodput_mbps": mbps})
        except CASE_ERRORS as e:
            self.drift.append({"when": when, "t": time.time(), "error": str(e)})
        self.store.set_env(self.run_id, {"drift.reference": self.drift})
        self._phase(None, "drift_check", time.monotonic() - t0)

    def _vpn_options(self, vpn: str) -> dict[str, Any]:
        """Options for a VPN key: those given for its base name, then those for the exact `name@version`."""
        base = vpn.split("@", 1)[0]
        return {
            **self.sc.vpn_options.get(base, {}),
            **(self.sc.vpn_options.get(vpn, {}) if vpn != base else {}),
        }

    # -- one VPN -----------------------------------------------------------------------------------
    def _skip_all(self, vpn: str, reason: str, profiles: list[str]) -> None:
        for profile in profiles:
            for wl in self.workloads:
                self.store.record_skip(self.run_id, vpn, profile, wl.name, wl.label(), reason)

    def _availability(self, vpn: str, cls: type[VpnDriver]) -> Availability:
        assert self.lab is not None
        avail = cls.availability(self.lab.hosts)
        path = self.sc.lab.path
        if avail.ok and path not in cls.paths:
            why = cls.paths_why.get(path, f"{vpn} does not support the {path!r} path scenario")
            avail = type(avail)(False, f"path {path}: {why}")
        if avail.ok and self.sc.lab.topology not in cls.topologies:
            avail = type(avail)(False, f"topology {self.sc.lab.topology}: not supported by {vpn}")
        return avail

    def _vpn_session(
        self, vpn: str, reps: list[int], only: set[tuple[str, str]] | None, adaptive: bool = False
    ) -> None:
        """Bring one VPN's mesh up, run the given repetitions of every condition and workload (or only the
        (condition label, workload label) pairs in `only`), tear it down and verify."""
        assert self.lab is not None
        progress, task = self.progress, self.task
        assert progress is not None and task is not None
        cls = resolve_driver(vpn)
        conds = self._conditions()
        n_cases = len(reps) * len(self.workloads) * len(conds) if only is None else 0
        first = vpn not in self.seen
        self.seen.add(vpn)
        avail = self._availability(vpn, cls)
        if not avail.ok:
            self.dead.add(vpn)
            self.store.set_vpn(self.run_id, vpn, None, "unavailable", avail.reason)
            self._skip_all(vpn, avail.reason, [c[2] for c in conds])
            self._say(f"{vpn}: skipped: {avail.reason}", "yellow")
            progress.advance(task, self._remaining_cases(vpn, reps))
            return
        # lab.hosts_per_vpn: the first hosts (client and server among them); the rest stay idle for this VPN
        hosts = list(self.lab.hosts)[: self.sc.mesh_hosts(vpn)]
        spec = MeshSpec(
            hosts=hosts,
            tag=self.lab.tag,
            workdir=self.run_dir,
            mtu=self.sc.fairness.tunnel_mtu,
            options=self._vpn_options(vpn),
            path=self.sc.lab.path,
            relay=self.lab.relay,
            topology=self.sc.lab.topology,
            hub=self.server,
            session=""
            if first and not self.session_prefix
            else f"{self.session_prefix}s{self.bringups.get(vpn, 0) + 1}",
        )
        self.bringups[vpn] = self.bringups.get(vpn, 0) + 1
        mesh: Mesh | None = None
        progress.update(
            task,
            description=f"{vpn}: bringing the mesh up" + (f" (round {reps[0]})" if len(reps) == 1 else ""),
        )
        t0 = time.monotonic()
        self.drops.begin(self.lab)
        try:
            driver = cls(spec)
            mesh = Mesh(driver)
            driver.configure()
            self._phase(vpn, "vpn_setup", time.monotonic() - t0)
            t1 = time.monotonic()
            self.mesh = mesh
            mesh.start()
            waited = mesh.wait_ready(self.sc.run.tunnel_timeout_s)
            driver.warm_up()
            self._phase(vpn, "tunnel_wait", time.monotonic() - t1)
        except CASE_ERRORS as e:
            self._phase(vpn, "tunnel_wait", time.monotonic() - t0)
            reason = f"mesh did not come up: {e}"
            if mesh is not None:
                self._keep_logs(mesh.driver, self.run_dir / "cases" / _safe(vpn) / "startup-failure")
                self._stop_and_verify(mesh, vpn)
            self._say(f"{vpn}: {reason}", "red")
            if (
                first
            ):  # never came up: the VPN is out of the run (later rounds would wait out the timeout again)
                self.dead.add(vpn)
                self.store.set_vpn(self.run_id, vpn, avail.version, "failed", reason)
                self._skip_all(vpn, reason, [c[2] for c in conds])
                progress.advance(task, self._remaining_cases(vpn, reps))
            else:
                for _p, _t, label in conds:
                    for rep in reps:
                        for wl in self.workloads:
                            if not self._is_done(vpn, label, wl, rep):
                                self.store.record_skip(
                                    self.run_id, vpn, label, wl.name, wl.label(), f"round {rep}: {reason}"
                                )
                progress.advance(task, n_cases)
            return
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
                    f" (of the lab's {len(self.lab.hosts)}: lab.hosts_per_vpn)"
                    if len(hosts) < len(self.lab.hosts)
                    else ""
                )
                + f" up, all pairs answering after {waited:.2f} s"
            )
            self._tax_check(vpn, mesh)
            self._key_check(vpn, driver)
        try:
            for profile, tuning, label in conds:
                wls = [wl for wl in self.workloads if only is None or (label, wl.label()) in only]
                if not wls:
                    continue
                if all(self._is_done(vpn, label, wl, rep) for rep in reps for wl in wls) and not adaptive:
                    self._skip_done(len(reps) * len(wls) if only is None else 0)
                    continue  # resumed: this condition's cases are all ok
                why = self._apply_condition(profile, tuning, mesh)
                if why:
                    self._say(f"{vpn}: {why}", "red")
                    for rep in reps:
                        for wl in wls:
                            if self._is_done(vpn, label, wl, rep):
                                continue
                            if self.sc.run.unreachable == "fail":  # Goethals et al.: measured as failures
                                self.store.record_failure(
                                    self.run_id,
                                    vpn,
                                    label,
                                    wl.name,
                                    wl.label(),
                                    wl.params.model_dump(),
                                    rep,
                                    f"MeshNotReady: {why}",
                                )
                            else:
                                self.store.record_skip(self.run_id, vpn, label, wl.name, wl.label(), why)
                    progress.advance(task, len(reps) * len(wls) if only is None else 0)
                    continue
                for rep in reps:
                    for wl in wls:
                        if self._is_done(vpn, label, wl, rep):  # resumed: kept from the interrupted run
                            self._skip_done(1 if only is None else 0)
                            continue
                        progress.update(
                            task, description=f"{vpn} · {label} · {wl.label()} · rep {rep}{self._eta()}"
                        )
                        # the session's last case: nothing follows on this mesh, so a mesh restart needs no settling
                        last = (
                            (profile, tuning, label) == conds[-1]
                            and rep == reps[-1]
                            and wl is wls[-1]
                            and not adaptive
                        )
                        t_case = time.monotonic()
                        status = self._run_case(
                            mesh, wl, label, rep, self.client, self.server, settle=not last
                        )
                        self._log_case(vpn, label, wl, rep, status, t_case)
                        if only is None:
                            progress.advance(task)
                if adaptive:
                    self._adaptive_reps(mesh, label, max(reps))
        finally:
            if self.backend is not None:
                self.backend.clear()
            self._restore_tuning()
        self._stop_and_verify(mesh, vpn)

    def _remaining_cases(self, vpn: str, reps: list[int]) -> int:
        """Cases of a VPN not yet counted by the progress bar: this round's and all later fixed rounds'."""
        per_round = len(self.workloads) * len(self._conditions())
        later = self.sc.run.repetitions - max(reps) if self.sc.run.order == "interleaved" else 0
        return per_round * (len(reps) + max(later, 0))

    def _eta(self, completed: float | None = None) -> str:
        if completed is None:
            completed = self.progress.tasks[0].completed if self.progress else 0
        total = self.progress.tasks[0].total if self.progress else 0
        return eta_text(time.monotonic() - self.t_start, completed, total, self.free_progress)

    def _adaptive_reps(self, mesh: Mesh, label: str, last: int) -> None:
        """Block order's adaptive repetitions: repeat each workload whose headline metric is not precise enough."""
        cfg = self.sc.run
        if not cfg.max_repetitions or cfg.max_repetitions <= cfg.repetitions:
            return
        pending = [wl for wl in self.workloads if wl.headline]
        for rep in range(last + 1, cfg.max_repetitions + 1):
            pending = [wl for wl in pending if not self._precise(mesh.vpn, label, wl, rep)]
            if not pending:
                return
            for wl in pending:
                if self._is_done(mesh.vpn, label, wl, rep):
                    continue
                assert self.progress is not None and self.task is not None
                self.progress.update(
                    self.task, description=f"{mesh.vpn} · {label} · {wl.label()} · rep {rep} (adaptive)"
                )
                t_case = time.monotonic()
                status = self._run_case(mesh, wl, label, rep, self.client, self.server)
                self._log_case(mesh.vpn, label, wl, rep, status, t_case)

    def _precise(self, vpn: str, profile: str, wl: Workload, before_rep: int) -> bool:
        """Is the 95% bootstrap CI of the mean of the workload's first headline metric within
        target_ci_pct of the mean (over this run's successful repetitions before `before_rep`, the one being
        planned: a resumed run plans as the interrupted one did)?"""
        from tunnelbench.analysis.stats import describe

        values = self.store.case_values(self.run_id, vpn, profile, wl.label(), wl.headline[0], before_rep)
        if len(values) < 2:
            return False
        d = describe(values)
        if d.mean == 0:
            return d.mean_ci_hi == d.mean_ci_lo
        return 100 * (d.mean_ci_hi - d.mean_ci_lo) / 2 / abs(d.mean) <= self.sc.run.target_ci_pct

    def _vpn_settings(self, driver: VpnDriver) -> dict[str, Any]:
        """What ran (driver.settings, with its defaults), the path scenario, and the feature record."""
        out = dict(driver.settings)
        out.setdefault("mtu", driver.mtu)
        out["path"] = driver.spec.path
        out["mesh_hosts"] = len(driver.spec.hosts)
        if driver.features:
            from tunnelbench.vpns.features import record

            out["features"] = record(driver.name, driver.features)
        return out

    def _stop_and_verify(self, mesh: Mesh, vpn: str) -> None:
        assert self.lab is not None
        t0 = time.monotonic()
        mesh.stop()
        self.mesh = None
        self._attribute_drops(vpn)  # before a rebuild below: a new lab's counters start again at 0
        self._keys_teardown(vpn, mesh.driver)
        left = mesh.leftovers()
        if left:
            # never let the next VPN start on a dirty host set: rebuild the lab from scratch
            self._say(f"{vpn}: teardown left {left}; rebuilding the lab", "red")
            self.store.set_env(self.run_id, {f"teardown_leftovers.{vpn}": left})
            self.lab.destroy()
            self.lab = make_lab(self.sc.lab, self.tag, self.run_dir, self.journal)
            self.lab.build()
            self.lab.wait_links()
            # the new lab's hosts, without the old ones' CPU pinning or firewall; its router has none of the old
            # one's tables (path counters, the planted fault): every later case read the gone pathwatch table and
            # failed, and ran without the scenario's host firewall (sysctls: each session sets its tuning)
            if self.sc.hosts.firewall == "stateful":
                hostfw.install(self.lab.hosts, f"{self.tag}hostfw")
            self.client = next(h for h in self.lab.hosts if h.name == self.sc.lab.client)
            self.server = next(h for h in self.lab.hosts if h.name == self.sc.lab.server)
            if self.placement is not None:
                self.placement.pin(self.lab.hosts)
            if self.path_watch is not None:
                self.path_watch = pathcheck.PathWatch(self.lab, self.client, self.server)
                if self.sc.lab.plant_fault == "udp-blocked":
                    self.lab.block_udp_pair(self.client, self.server)
        self._phase(vpn, "teardown", time.monotonic() - t0)

    def _key_check(self, vpn: str, driver: VpnDriver) -> None:
        """Once per VPN while its mesh is up: its secret files' mode, owner and place (keys.<vpn>)."""
        t0 = time.monotonic()
        try:
            rec = keys.check(driver, self.run_dir)
        except CASE_ERRORS as e:
            rec = {"error": str(e), "files_checked": 0, "violations": []}
        self.key_records[vpn] = {**rec, "removed": [], "kept": self.sc.run.keep_keys}
        self.store.set_env(self.run_id, {f"keys.{vpn}": self.key_records[vpn]})
        self._phase(vpn, "key_check", time.monotonic() - t0)
        for v in rec["violations"]:
            self._say(f"{vpn}: key hygiene: {v['path']}: {v['why']}", "red")

    def _keys_teardown(self, vpn: str, driver: VpnDriver) -> None:
        """After every session's stop (processes gone): its secret values into memory, its secret files removed
        unless keep_keys. Each session has its own folders, so a later session of the VPN is not touched."""
        try:
            removed = keys.collect_and_remove(driver, self.secrets, self.sc.run.keep_keys, self.run_dir)
        except CASE_ERRORS as e:
            self._say(f"{vpn}: removing its keys failed: {e}", "red")
            return
        rec = self.key_records.setdefault(
            vpn, {"files_checked": 0, "violations": [], "removed": [], "kept": self.sc.run.keep_keys}
        )
        rec["removed"] = [*rec.get("removed", []), *removed]
        self.store.set_env(self.run_id, {f"keys.{vpn}": rec})

    def scan_outputs(self) -> dict[str, Any]:
        """After the report is written: search it, the store and the exports for every secret value of the run,
        and store the result (`keys.scan`: outputs, counts, offsets; never a value). The report is not rewritten
        with this result (a rewrite would need a rescan); `tunnelbench report` shows it later."""
        from tunnelbench.store import DB_NAME, Store

        result = keys.scan_outputs(self.run_dir, self.run_id, self.secrets.all())
        st = Store(self.run_dir / DB_NAME)
        try:
            self._record("the key scan's result", lambda: st.set_env(self.run_id, {"keys.scan": result}))
        finally:
            st.close()
        return result

    def _attribute_drops(self, vpn: str) -> None:
        """The router's drops since this session began go to the VPN (security/drops.py)."""
        assert self.lab is not None
        share = self.drops.attribute(self.lab, vpn)
        if share:
            self.store.set_env(self.run_id, share)

    def _keep_logs(self, driver: VpnDriver, dest: Path) -> None:
        """A failed case's daemon logs, for the report: with the session's secret values redacted (some
        daemons log their config, keys included, and the report embeds these logs)."""
        dest.mkdir(parents=True, exist_ok=True)
        try:
            secrets = self.secrets.all() | keys.session_secrets(driver)
        except CASE_ERRORS:
            secrets = self.secrets.all()
        for h, procs in driver.procs.items():
            for p in procs:
                p.copy_log(dest / f"{h}-{p.label}.log")
                keys.redact(dest / f"{h}-{p.label}.log", secrets)

    def _log_case(self, vpn: str, profile: str, wl: Workload, rep: int, status: str, t0: float) -> None:
        """A log, not a live bar (the console is not a terminal): one line per finished case."""
        if self.console.is_terminal:
            return
        done, total = 0.0, 0.0
        if self.progress is not None and self.progress.tasks:
            done, total = self.progress.tasks[0].completed + 1, self.progress.tasks[0].total or 0
        self.console.print(
            Text(
                f"[{done:.0f}/{total:.0f}] {vpn} · {profile} · {wl.label()} · rep {rep}: {status} "
                f"({time.monotonic() - t0:.1f} s){self._eta(done) if done < total else ''}"
            ),
            highlight=False,
        )

    def _run_case(
        self,
        mesh: Mesh,
        wl: Workload,
        profile: str,
        rep: int,
        client: Host,
        server: Host,
        settle: bool = True,
    ) -> str:
        """Measure one case, retrying as `run.retries` allows; its final status (ok, n/a or failed)."""
        first = self._first_attempt(mesh.vpn, profile, wl, rep)
        for attempt in range(first, first + self.sc.run.retries + 1):
            adir = self.run_dir / "cases" / mesh.vpn / profile / wl.label() / f"r{rep}a{attempt}"
            adir.mkdir(parents=True, exist_ok=True)
            cid = self.store.start_case(
                self.run_id,
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
            ctx = CaseContext(
                mesh,
                client,
                server,
                adir,
                t0 + self._case_timeout(wl),
                {"mss": self.sc.fairness.mss},
                self.lab,
            )
            diag = self._diagnostics(adir, mesh, client)
            try:
                diag.start()
                self._check_path()
                health = self.backend.health if self.backend is not None else None
                mon = Monitor(mesh.daemons, self.sc.run.monitor_interval_s, health, lambda _: abort_running())
                if client.remote:  # SSH: the targets' machine CPU, not the controller's
                    mon.machines = [h for h in self._lab_hosts() if h.remote]
                eng0 = self._engine_stats()
                kern_hosts = [client, server, self.lab.router if self.lab else None]
                kern0 = counters.sample(kern_hosts)  # kernel drop counters (lab/counters.py)
                # a workload whose server talks to more hosts than the client (many_clients) has no pair path
                # to confirm: the router would count its other clients' bytes as "relayed"
                path0 = self._path_counters() if wl.hosts_needed() <= 2 else None
                track = None
                if path0 is not None and self.path_watch is not None:
                    track = pathcheck.PathTrack(self.path_watch)
                    track.start(path0)
                try:
                    with mon:
                        out: Outcome = wl.run(ctx)
                finally:
                    diag.stop()
                    if track is not None:
                        track.stop()
                    if mon.unhealthy:  # the watchdog aborted the case: report why, not the tool's complaint
                        raise ImpairError(mon.unhealthy)
                mon.add_to(out)
                if track is not None:  # the path, second by second: did it change within the case?
                    n, pts = pathcheck.changes(track.samples)
                    if pts:
                        out.add("path_changes", n)
                        out.series.append(Series("path_direct_pct", "%", pts))
                self._add_engine_stats(out, eng0, self._engine_stats())
                for name, n, _unit, host in counters.deltas(kern0, counters.sample(kern_hosts)):
                    out.add(name, n, host)
                self._check_path()
                if path0 is not None:
                    self._confirm_path(path0, out, client, server, judge=not wl.moves_path())
                dead = [f"{h}/{p.label}" for h, ps in mesh.daemons().items() for p in ps if not p.alive()]
                if dead:
                    raise WorkloadError(f"VPN daemon(s) died during the case: {', '.join(dead)}")
                if time.monotonic() > ctx.deadline:
                    raise WorkloadError(f"case exceeded its timeout of {self._case_timeout(wl):.0f} s")
                diag.finish(failed=False)
                self.store.finish_case(cid, "ok", out)
                self._phase(mesh.vpn, "measure", out.measure_s)
                self._phase(mesh.vpn, "case_overhead", time.monotonic() - t0 - out.measure_s)
                if wl.restarts_mesh and mesh.driver.settle_s and settle:
                    self._phase(mesh.vpn, "tunnel_wait", mesh.driver.warm_up())
                return "ok"
            except (Interrupted, KeyboardInterrupt):
                diag.stop()  # its processes end now; what it took stays in the case folder
                self.store.finish_case(cid, "interrupted", error="run interrupted")
                raise
            except NotApplicable as e:  # not this VPN's kind of test: n/a with the reason, no retry
                diag.finish(failed=False)
                self.store.finish_case(cid, "n/a", error=str(e)[:2000])
                self._say(f"{mesh.vpn} · {wl.label()}: n/a: {e}"[:400], "yellow")
                return "n/a"
            except CASE_ERRORS as e:
                (adir / "error.txt").write_text(traceback.format_exc())
                # the verdict first: a host that stopped answering (SSH) must not leave the case "running";
                # a case on the wrong path keeps the path share it saw (failed cases never count as results)
                self.store.finish_case(
                    cid, "failed", getattr(e, "outcome", None), error=f"{type(e).__name__}: {e}"[:2000]
                )
                self._phase(mesh.vpn, "failed_case", time.monotonic() - t0)
                self._say(
                    f"{mesh.vpn} · {wl.label()} · rep {rep} attempt {attempt + 1} failed: {e}"[:400], "red"
                )
                try:
                    diag.finish(failed=True)
                    self._keep_logs(mesh.driver, adir / "daemon-logs")
                except (CommandError, OSError, TimeoutError, RuntimeError) as why:  # RuntimeError: SshError
                    self._say(f"{mesh.vpn} · {wl.label()}: its logs were not all kept: {why}"[:400], "yellow")
                self._heal(mesh)
        return "failed"

    def _diagnostics(self, adir: Path, mesh: Mesh, client: Host) -> CaseDiagnostics:
        """The case's pcap, kernel log and CPU profile, as `run.capture` and `run.flamegraph` ask."""
        return CaseDiagnostics(
            adir,
            self.sc.run.capture,
            self.sc.run.capture_packets,
            self.sc.run.flamegraph,
            self.lab.router if self.lab else None,
            client,
            mesh.daemons,
            self._lab_hosts(),
        )

    def _engine_stats(self) -> dict[str, Any] | None:
        if not isinstance(self.backend, NativeBackend) or self.backend.profile is None:
            return None
        try:
            st = self.backend.stats()
        except Exception:  # a missing stats file is the watchdog's business, not this bookkeeping's
            return None
        return {**st, "_t": time.monotonic()} if st else None  # no engine running (a rate-only profile): {}

    def _add_engine_stats(self, out: Outcome, s0: dict[str, Any] | None, s1: dict[str, Any] | None) -> None:
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
        assert isinstance(self.backend, NativeBackend)  # s0 and s1 are its engine's (_engine_stats)
        # asked for SCHED_FIFO: did it get it? (an engine with its own CPU does not ask)
        if self.backend.realtime:
            out.add("engine_realtime", 1.0 if s1.get("realtime") else 0.0, "router")
        load = engine_load(s0, s1, s1["_t"] - s0["_t"])
        if load is not None:  # judged by its work, lateness and drops, not by its CPU share (impair/load.py)
            out.add("engine_cpu_pct", load.cpu_pct, "router")
            out.add("engine_work_pct", load.work_pct, "router")
            out.add("engine_late_us", load.late_us, "router")
            out.add("engine_bound", 1.0 if load.bound else 0.0, "router")

    def _lab_hosts(self) -> list[Host]:
        assert self.lab is not None
        return list(self.lab.all_hosts())

    def _path_counters(self) -> dict[str, int] | None:
        """The router's path counters before a case; None (no verdict for it) when they cannot be read."""
        if self.path_watch is None:
            return None
        try:
            return self.path_watch.read()
        except CASE_ERRORS as e:
            self._say(f"path counters unreadable, this case's path is not checked: {e}"[:300], "yellow")
            return None

    def _confirm_path(
        self, before: dict[str, int], out: Outcome, client: Host, server: Host, judge: bool = True
    ) -> None:
        """Store the share of the case's underlay bytes that went straight between client and server, and fail
        the case when that is not the scenario's path (lab/pathcheck.py)."""
        assert self.path_watch is not None
        try:
            sh = pathcheck.share(before, self.path_watch.read())
        except CASE_ERRORS:  # the counters are a check, not the measurement: a failed read is no verdict
            return
        path_out = Outcome()
        path_out.add("path_underlay_bytes", sh.total)
        path_out.add("path_direct_pct", sh.direct_pct)
        out.samples += path_out.samples
        why = pathcheck.verdict(self.sc.lab.path, sh, client.name, server.name) if judge else None
        if why:
            err = pathcheck.PathError(why)
            err.outcome = path_out
            raise err

    def _check_path(self) -> None:
        """Fail the case if the impairment engine is down (fail closed) or stalled."""
        why = self.backend.health() if self.backend is not None else None
        if why:
            raise ImpairError(why)

    def _heal(self, mesh: Mesh) -> None:
        """After a failure: if the mesh is broken, restart it so the retry and later cases get a fair chance."""
        t0 = time.monotonic()
        if self.backend is not None and self.backend.health() and self.backend.profile is not None:
            self._say(f"restarting the impairment engine ({self.backend.health()})", "yellow")
            try:
                self.backend.apply(self.backend.profile)
            except CASE_ERRORS as e:  # ImpairError included
                self._say(f"impairment engine restart failed: {e}", "red")
        try:
            dead = any(not p.alive() for ps in mesh.daemons().values() for p in ps)
            if dead or mesh.pairs_down():
                self._say(f"{mesh.vpn}: restarting the mesh after a failure", "yellow")
                mesh.stop()
                mesh.start()
                mesh.wait_ready(self.sc.run.tunnel_timeout_s)
                mesh.driver.warm_up()
        except CASE_ERRORS as e:
            self._say(f"{mesh.vpn}: mesh restart failed: {e}", "red")
        self._phase(mesh.vpn, "tunnel_wait", time.monotonic() - t0)
