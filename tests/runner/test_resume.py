"""`tunnelbench run --resume RUN`: a run killed mid-case is continued in its folder (same seed and round
order, cases already ok kept, the unfinished one measured again), refused when it must not be; and the journal
copy under the registry lets `clean` undo a killed run whose results folder was deleted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

import pytest
from conftest import lab_missing

from tunnelbench.lab.netns import netns_exists
from tunnelbench.lab.tags import new_run_id, new_tag
from tunnelbench.runner.resume import scenario_sha256
from tunnelbench.store import DB_NAME, Store

TB = [str(Path(sys.executable).with_name("tunnelbench"))]

# interleaved (the default order), a random seed (none given): resume must reuse the recorded one
SCENARIO = """
name = "resume"
vpns = ["internal", "wireguard-go"]
[run]
repetitions = 3
drift_check_s = 0
[lab]
hosts = 2
[[workloads]]
name = "tcp"
duration_s = 1
omit_s = 0
[[workloads]]
name = "ping"
count = 20
interval_s = 0.01
"""


def tb(args: list[str], registry: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """The CLI with a private registry: `clean` and the owner checks see only this test's runs."""
    env = {**os.environ, "TUNNELBENCH_REGISTRY": str(registry)}
    return subprocess.run([*TB, *args], capture_output=True, text=True, timeout=timeout, env=env)


def ro(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)


def fake_run(tmp_path: Path, status: str, text: str = SCENARIO) -> Path:
    """A run folder as the runner leaves it (scenario.toml, the run row, the recorded hash), no lab needed."""
    tag = new_tag()
    run_dir = tmp_path / "results" / new_run_id(tag)
    run_dir.mkdir(parents=True)
    (run_dir / "scenario.toml").write_text(text)
    st = Store(run_dir / DB_NAME)
    st.begin_run(run_dir.name, tag, text, "test")
    st.set_env(run_dir.name, {"run.scenario_sha256": scenario_sha256(text), "run.overrides": {}})
    st.end_run(run_dir.name, status)
    st.close()
    return run_dir


# -- refusals (no lab) ------------------------------------------------------------------------------------
@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
def test_resume_refuses_an_edited_scenario_naming_the_file_and_the_hash(tmp_path):
    run_dir = fake_run(tmp_path, "interrupted")
    (run_dir / "scenario.toml").write_text(SCENARIO.replace("repetitions = 3", "repetitions = 5"))
    res = tb(["run", "--resume", run_dir.name, "--results", str(tmp_path / "results")], tmp_path / "reg")
    assert res.returncode == 2, res.stdout + res.stderr
    err = " ".join(res.stderr.split())  # rich wraps long lines
    assert "cannot resume" in err and "scenario.toml changed" in err and "sha256" in err
    assert scenario_sha256(SCENARIO)[:16] in err  # the recorded hash, and the way out
    assert "Restore the file" in err and "start a new run" in err


@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
def test_resume_refuses_a_finished_run(tmp_path):
    run_dir = fake_run(tmp_path, "ok")
    res = tb(["run", "--resume", str(run_dir)], tmp_path / "reg")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "finished ok" in res.stderr and "nothing to resume" in res.stderr


@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
def test_resume_refuses_a_run_whose_owner_is_alive(tmp_path):
    from tunnelbench.lab.journal import proc_start_ticks

    run_dir = fake_run(tmp_path, "running")
    reg = tmp_path / "reg"
    reg.mkdir()
    me = os.getpid()  # this test process stands for the run's live owner
    (reg / run_dir.name).write_text(
        json.dumps({"run_dir": str(run_dir), "pid": me, "start": proc_start_ticks(me)})
    )
    res = tb(["run", "--resume", str(run_dir)], reg)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "still running" in res.stderr and f"pid {me}" in res.stderr


@pytest.mark.slow  # 3-4 s: out of the fast lane
def test_resume_cannot_be_combined_with_a_scenario_or_overrides(tmp_path):
    run_dir = fake_run(tmp_path, "interrupted")
    res = tb(["run", "s.toml", "--vpn", "internal", "-n", "2", "--resume", str(run_dir)], tmp_path / "reg")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "cannot be combined with SCENARIO, --vpn, --repetitions" in " ".join(res.stderr.split())


def test_store_discards_unfinished_cases_and_plans_from_earlier_repetitions(tmp_path):
    from tunnelbench.core.results import Outcome

    st = Store(tmp_path / DB_NAME)
    st.begin_run("r", "tb0000", SCENARIO, "test")

    def case(rep: int, status: str, value: float) -> int:
        cid = st.start_case("r", "wg", "baseline", "tcp", "tcp", {}, rep, 0, "h1", "h2", tmp_path)
        if status != "running":
            out = Outcome()
            out.add("goodput_mbps", value)
            st.finish_case(cid, status, out)
        return cid

    case(1, "ok", 10.0)
    case(2, "failed", 0.0)
    case(2, "ok", 20.0)
    interrupted = case(3, "interrupted", 30.0)
    case(4, "running", 0.0)
    gone = st.discard_unfinished("r")
    assert gone == [
        "wg · baseline · tcp · rep 3 attempt 1 (interrupted)",
        "wg · baseline · tcp · rep 4 attempt 1 (running)",
    ]
    assert [c.status for c in st.cases("r")] == ["ok", "failed", "ok"]  # failed attempts stay, like retries
    assert not st.db.execute("SELECT * FROM metric WHERE case_id=?", (interrupted,)).fetchall()
    assert st.done_cases("r") == {("wg", "baseline", "tcp", 1), ("wg", "baseline", "tcp", 2)}
    # an adaptive repetition is planned from the repetitions before it only, as the killed run planned it
    assert st.case_values("r", "wg", "baseline", "tcp", "goodput_mbps", 2) == [10.0]
    assert st.case_values("r", "wg", "baseline", "tcp", "goodput_mbps") == [10.0, 20.0]
    st.close()


def test_journal_end_closes_what_came_before(tmp_path):
    from tunnelbench.lab.journal import read_open_entries

    j = tmp_path / "journal.jsonl"
    lines = [
        {"kind": "netns", "name": "tb1-h1"},
        {"kind": "end", "by": "clean"},
        {"kind": "netns", "name": "tb1-h2"},
    ]
    j.write_text("".join(json.dumps(e) + "\n" for e in lines) + '{"kind": "net')  # torn last line
    # a resumed run journals after the clean of the killed process: only its own entries are open
    assert read_open_entries(j) == [{"kind": "netns", "name": "tb1-h2"}]


# -- what --resume undoes: only this machine's registry is a source (issue 42, finding 1) ------------------
def private_registry(tmp_path: Path, monkeypatch) -> Path:
    """This test's own TUNNELBENCH_REGISTRY (the module reads it at import: set for this process too)."""
    from tunnelbench.lab import journal

    reg = tmp_path / "registry"
    monkeypatch.setenv("TUNNELBENCH_REGISTRY", str(reg))
    monkeypatch.setattr(journal, "REGISTRY", reg)
    return reg


def test_resume_of_a_hand_made_folder_leaves_alone_the_file_and_the_processes_its_journal_names(
    tmp_path, monkeypatch
):
    """The finding as reported: a run folder made by hand (status interrupted, the matching scenario hash)
    whose journal.jsonl names an unrelated file and unrelated processes, one without a start time and one
    with its real start time and command line. `--resume` calls load_resume, then undo_leftovers: the
    registry has no record of the run, so the folder's journal is no source of things to undo. References:
    the file's bytes and /proc (the processes this test started)."""
    from tunnelbench.lab.journal import proc_start_ticks
    from tunnelbench.lab.journaling import process_alive
    from tunnelbench.runner.resume import load_resume, undo_leftovers
    from tunnelbench.scenario import parse_scenario

    reg = private_registry(tmp_path, monkeypatch)
    run_dir = fake_run(tmp_path, "interrupted")
    victim = tmp_path / "someone-else" / "notes.txt"
    victim.parent.mkdir()
    victim.write_text("not tunnelbench's\n")
    no_start = subprocess.Popen(["sleep", "600"])
    exact = subprocess.Popen(["sleep", "601"])
    said: list[str] = []
    try:
        entries = [
            {"kind": "path", "path": str(victim)},
            {"kind": "process", "pid": no_start.pid, "start": None, "host": "h1", "argv": ["sleep", "600"]},
            {
                "kind": "process",
                "pid": exact.pid,
                "start": proc_start_ticks(exact.pid),
                "host": "h1",
                "argv": ["sleep", "601"],
            },
        ]
        (run_dir / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
        plan = load_resume(run_dir)
        sc = parse_scenario(tomllib.loads(plan.text), "test")
        undo_leftovers(sc, plan.run_id, plan.run_dir, lambda msg, _style: said.append(msg))
        assert victim.read_text() == "not tunnelbench's\n", (
            "resume removed a file only the folder's journal named"
        )
        assert no_start.poll() is None and process_alive(no_start.pid, None), (
            "resume killed a PID without start"
        )
        assert exact.poll() is None and process_alive(exact.pid, None), (
            "resume killed a process it never started"
        )
        (note,) = [m for m in said if m.startswith("left alone:")]
        assert "registry" in note and "no record of run" in note, note
        assert str(victim) in note and f"process {no_start.pid}" in note and f"process {exact.pid}" in note
        assert not reg.exists() or not list(reg.iterdir())  # nothing registered or believed
    finally:
        for p in (no_start, exact):
            p.kill()
            p.wait()


# -- the journal copy under the registry ---------------------------------------------------------------
JOURNAL_ONLY = """
import sys
from pathlib import Path
from tunnelbench.lab.journal import Journal
from tunnelbench.lab.netns import sh
run_dir, ns = Path(sys.argv[1]), sys.argv[2]
j = Journal(run_dir, run_dir.name)
j.netns(ns)
sh(["ip", "netns", "add", ns])
# exits without teardown: as if SIGKILLed
"""


@pytest.mark.lab
def test_a_dead_or_zombie_owner_does_not_hold_its_run(tmp_path):
    """clean skips a run whose owner lives; a killed owner not yet reaped (a zombie) or gone no longer holds it
    (seen: a SIGKILLed `up` keeper stayed a zombie and clean refused its lab)."""
    from tunnelbench.lab.journal import Leftovers, proc_start_ticks

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    start = proc_start_ticks(child.pid)
    run = Leftovers("r", tmp_path, child.pid, start, [])
    assert run.owner_alive()
    assert not Leftovers("r", tmp_path, child.pid, (start or 0) + 1, []).owner_alive()  # a reused PID
    child.kill()
    for _ in range(100):  # not reaped (no wait()): the child is a zombie
        if Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1].startswith("Z"):
            break
        time.sleep(0.05)
    assert not run.owner_alive()
    child.wait()
    assert not run.owner_alive() and not Leftovers("r", tmp_path, child.pid, None, []).owner_alive()


@pytest.mark.lab
def test_clean_undoes_a_killed_run_whose_results_folder_was_deleted(tmp_path):
    why = lab_missing()
    if why:
        pytest.skip(why)
    reg = tmp_path / "reg"
    tag = new_tag()
    run_dir = tmp_path / "results" / new_run_id(tag)
    ns = f"{tag}-h1"
    env = {**os.environ, "TUNNELBENCH_REGISTRY": str(reg)}
    try:
        subprocess.run(
            [sys.executable, "-c", JOURNAL_ONLY, str(run_dir), ns], check=True, env=env, timeout=30
        )
        assert netns_exists(ns)
        copy = reg / f"{run_dir.name}.jsonl"
        assert json.loads(copy.read_text().splitlines()[0]) == {"kind": "netns", "name": ns}
        shutil.rmtree(tmp_path / "results")  # the results folder (and its journal.jsonl) is gone
        res = tb(["clean"], reg, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        assert not netns_exists(ns), res.stdout
        assert not list(reg.iterdir())  # registration and journal copy removed: nothing left to clean
    finally:
        if netns_exists(ns):
            subprocess.run(["ip", "netns", "del", ns], check=False)


# -- kill mid-case, resume, compare (real lab) ---------------------------------------------------------
def case_keys(db: sqlite3.Connection) -> list[tuple]:
    return db.execute(
        "SELECT vpn, profile, label, repetition, status FROM \"case\" WHERE status != 'skipped' ORDER BY id"
    ).fetchall()


def sessions(db: sqlite3.Connection) -> Counter:
    """Mesh bring-ups per VPN (one vpn_setup phase each)."""
    return Counter(v for (v,) in db.execute("SELECT vpn FROM phase WHERE phase='vpn_setup'"))


def wait_mid_case(db_glob, timeout: float = 180) -> Path:
    """The run folder once some cases are ok and one (not the first round's) is being measured."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for db in db_glob():
            try:
                c = ro(db)
                ok = c.execute("SELECT COUNT(*) FROM \"case\" WHERE status='ok'").fetchone()[0]
                running = c.execute(
                    "SELECT COUNT(*) FROM \"case\" WHERE status='running' AND workload='tcp'"
                ).fetchone()[0]
                c.close()
            except sqlite3.Error:
                continue
            if ok >= 5 and running:
                return db.parent
        time.sleep(0.05)
    raise AssertionError(f"no run reached a tcp case in progress after 5 ok cases within {timeout} s")


@pytest.mark.lab
@pytest.mark.slow
def test_sigkill_mid_case_then_resume_finishes_every_case_once_in_the_same_round_order(tmp_path):
    why = lab_missing()
    if why:
        pytest.skip(why)
    scen, results, reg = tmp_path / "s.toml", tmp_path / "results", tmp_path / "reg"
    scen.write_text(SCENARIO)
    env = {**os.environ, "TUNNELBENCH_REGISTRY": str(reg)}
    p = subprocess.Popen([*TB, "run", str(scen), "--results", str(results), "--no-html"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    tag = ""
    try:
        run_dir = wait_mid_case(lambda: list(results.glob("*/results.sqlite")))
        tag = run_dir.name.rsplit("-", 1)[-1]
        os.killpg(p.pid, signal.SIGKILL)  # the run's whole process group, as a crash or `kill -9 -PGID` would
        p.wait(10)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    try:
        db = ro(run_dir / DB_NAME)
        env_before = dict(db.execute("SELECT key, value FROM environment").fetchall())
        before = case_keys(db)
        setups_before = sessions(db)
        db.close()
        assert any(netns_exists(f"{tag}-{h}") for h in ("r", "h1", "h2")), "the killed run left its lab"
        assert [k for k in before if k[-1] == "running"], before
        orders = json.loads(env_before["run.round_orders"])
        assert env_before["run.scenario_sha256"] == scenario_sha256((run_dir / "scenario.toml").read_text())
        # sessions the resume must bring up: (vpn, round) with a case not yet ok; the others are not brought up
        done = {(v, lbl, r) for v, _p, lbl, r, st in before if st == "ok"}
        todo = Counter(
            v
            for r, order in enumerate(orders, 1)
            for v in order
            if not all((v, lbl, r) in done for lbl in ("tcp", "ping"))
        )

        t0 = time.monotonic()
        res = tb(["run", "--resume", run_dir.name, "--results", str(results), "--no-html"], reg)
        resume_s = time.monotonic() - t0
        assert res.returncode == 0, res.stdout + res.stderr
        assert "resuming run" in res.stderr and "unfinished case(s) discarded" in res.stderr

        db = ro(run_dir / DB_NAME)
        after = case_keys(db)
        keys = Counter((v, prof, lbl, r) for v, prof, lbl, r, _st in after)
        want = {
            (v, "baseline", lbl, r)
            for v in ("internal", "wireguard-go")
            for lbl in ("tcp", "ping")
            for r in (1, 2, 3)
        }
        assert set(keys) == want and set(keys.values()) == {1}, keys  # every case exactly once
        assert {st for *_k, st in after} == {"ok"}, after
        # the cases ok before the kill are the same rows, not measured again
        assert {k[:4] for k in before if k[-1] == "ok"} <= {k[:4] for k in after}
        env_after = dict(db.execute("SELECT key, value FROM environment").fetchall())
        assert env_after["run.seed"] == env_before["run.seed"]
        assert json.loads(env_after["run.round_orders"]) == orders
        (resumed,) = json.loads(env_after["run.resumed"])
        assert resumed["previous_status"] == "running" and len(resumed["discarded"]) >= 1
        assert db.execute("SELECT status FROM run").fetchone()[0] == "ok"
        assert sessions(db) == setups_before + todo, (sessions(db), setups_before, todo)
        db.close()
        left = [
            n
            for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
            if n.startswith(f"{tag}-")
        ]
        assert not left
        assert not list(reg.iterdir())  # the resumed run unregistered at its end
        print(f"resume took {resume_s:.1f} s for {sum(todo.values())} sessions")
    finally:
        tb(["clean"], reg, timeout=120)  # private registry: only this test's run


def test_eta_counts_only_the_cases_this_process_measured():
    from tunnelbench.runner.schedule import eta_text

    assert eta_text(10.0, 0, 90) == ""  # nothing measured yet: no estimate
    assert eta_text(100.0, 10, 90) == " · ~13 min left"  # 10 s per case, 80 to go: 800 s
    assert eta_text(30.0, 10, 12) == " · ~6 s left"  # 3 s per case, 2 to go
    # resumed with 40 cases kept: 10 measured in 100 s, 40 to go -> 400 s, not 100/50*40 = 80 s
    assert eta_text(100.0, 50, 90, free=40) == " · ~7 min left"
    assert eta_text(100.0, 40, 90, free=40) == ""
