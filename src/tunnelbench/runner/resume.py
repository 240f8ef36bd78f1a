"""Continuing a killed or interrupted run (`run --resume DIR`): what makes a run folder resumable, the
leftovers of the killed process removed from its journal, and the bookkeeping carried over (cases already
ok, drift, VPNs in and out of the run)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tunnelbench.security.keys  # noqa: F401  (registers the sweep of a killed run's secret files)
from tunnelbench import __version__
from tunnelbench.lab.journal import run_leftovers
from tunnelbench.scenario import Scenario
from tunnelbench.store import DB_NAME, Store


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


def scenario_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


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


@dataclass
class PriorPlan:
    """The killed run's seed and round orders (None: it recorded none)."""

    seed: int | None = None
    orders: list[list[str]] | None = None


def prior_plan(run_dir: Path, run_id: str) -> PriorPlan:
    """Before anything changes: the killed run's seed and orders, as stored."""
    st = Store(run_dir / DB_NAME)
    try:
        env = st.env(run_id)
    finally:
        st.close()
    return PriorPlan(
        int(json.loads(env["run.seed"])) if "run.seed" in env else None,
        json.loads(env["run.round_orders"]) if "run.round_orders" in env else None,
    )


def undo_leftovers(sc: Scenario, run_id: str, run_dir: Path, say: Callable[[str, str], None]) -> None:
    """Remove what the killed process left (namespaces, daemons, files, secret files), as `clean` does, so
    resume works straight after a SIGKILL; ResumeError when something stays. Only what this machine's registry
    journaled is undone (lab/journal.py): a run folder's own journal (a folder copied from elsewhere, or the
    registry went with a reboot) names things that are reported and left alone."""
    from tunnelbench.lab.clean import clean_run

    left = run_leftovers(run_id, run_dir)
    if left.owner_alive():  # checked by load_resume too; a second resume may have started meanwhile
        raise ResumeError(f"run {run_id} is running again (pid {left.owner_pid})")
    inv = None
    if sc.lab.backend == "ssh" and any(e.get("backend") == "ssh" for e in left.entries):
        from tunnelbench.lab.inventory import load_inventory

        assert sc.lab.inventory is not None
        inv = load_inventory(sc.lab.inventory)
        if sc.lab.insecure_no_host_key_check:
            inv.insecure()
    rep = clean_run(left, inv)
    if rep.removed:
        say(f"removed what the interrupted run left: {', '.join(rep.removed)}", "yellow")
    for why in rep.refused:
        say(f"left alone: {why}", "yellow")
    if rep.problems or rep.skipped:
        raise ResumeError(
            "the interrupted run's leftovers could not all be removed: "
            + "; ".join(rep.problems + rep.skipped)
            + "; fix that (or run `tunnelbench clean`), "
            "then resume"
        )


@dataclass
class Reopened:
    """What a resumed process carries over from the earlier ones."""

    done: set[tuple[str, str, str, int]]  # cases already ok: (vpn, condition label, workload label, rep)
    discarded: list[Any]  # the cases the killed process never finished (measured again)
    resumes: int  # this is the n-th resume of the run
    drift: list[dict[str, Any]]
    seen: set[str] = field(default_factory=set)  # VPNs whose mesh came up before
    dead: set[str] = field(default_factory=set)  # VPNs out of the run before (they stay out)
    env: dict[str, str] = field(default_factory=dict)


def reopen(st: Store, run_id: str, previous_status: str) -> Reopened:
    """Drop the cases the killed process never finished, remember those already ok, and record this resume."""
    env = st.env(run_id)
    discarded = st.discard_unfinished(run_id)
    done = st.done_cases(run_id)
    resumed = json.loads(env.get("run.resumed", "[]"))
    resumed.append(
        {
            "at": time.time(),
            "previous_status": previous_status,
            "cases_ok": len(done),
            "discarded": discarded,
            "tunnelbench_version": __version__,
        }
    )
    st.set_env(run_id, {"run.resumed": resumed})
    st.reopen_run(run_id)
    out = Reopened(done, discarded, len(resumed), json.loads(env.get("drift.reference", "[]")), env=env)
    for v in st.vpns(run_id):
        (out.seen if v["status"] == "ok" else out.dead).add(v["name"])  # out of the run stays out
    return out
