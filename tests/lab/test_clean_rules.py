"""`tunnelbench clean`'s safety rules: a live run is left alone without --force (taken with it), a journaled
PID whose start time no longer matches is not killed, a namespace that looks like ours but is in no journal is
reported and left alone, the SSH undo never runs `rm -rf` outside a run's host folder, and an inventory in
which a journal's host is ambiguous is refused rather than guessed.

Every `clean` here runs with a private TUNNELBENCH_REGISTRY holding only this test's runs. The references:
`ip netns`, /proc (the processes the test itself started), and the commands a fake SSH host was asked to run."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path, PurePosixPath

import pytest
from conftest import lab_missing

from tunnelbench.lab import ssh_lab, ssh_undo
from tunnelbench.lab.inventory import InvHost, parse_inventory
from tunnelbench.lab.journal import proc_start_ticks
from tunnelbench.lab.journaling import process_alive
from tunnelbench.lab.netns import netns_exists
from tunnelbench.lab.tags import new_run_id, new_tag

TB = [str(Path(sys.executable).with_name("tunnelbench"))]


def tb_clean(registry: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNNELBENCH_REGISTRY": str(registry)}
    return subprocess.run([*TB, "clean", *args], capture_output=True, text=True, timeout=120, env=env)


def need_lab() -> None:
    why = lab_missing()
    if why:
        pytest.skip(why)


# the owner of a run: registers in the (private) registry, journals a namespace and a daemon, stays alive
OWNER = textwrap.dedent("""
    import subprocess, sys, time
    from pathlib import Path
    from tunnelbench.lab.journal import Journal
    run_dir, ns = Path(sys.argv[1]), sys.argv[2]
    j = Journal(run_dir, run_dir.name)
    j.netns(ns)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    d = subprocess.Popen(["sleep", "300"], start_new_session=True)
    j.process(d.pid, ["sleep", "300"], "h1")
    print(d.pid, flush=True)
    time.sleep(300)
""")


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)


@pytest.mark.lab
def test_a_live_run_is_skipped_without_force_and_cleaned_with_it(tmp_path):
    need_lab()
    reg = tmp_path / "reg"
    tag = new_tag()
    run_dir = tmp_path / "results" / new_run_id(tag)
    ns = f"{tag}-h1"
    env = {**os.environ, "TUNNELBENCH_REGISTRY": str(reg)}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(run_dir), ns], stdout=subprocess.PIPE, text=True, env=env
    )
    daemon = 0
    try:
        daemon = int(owner.stdout.readline())
        assert netns_exists(ns) and process_alive(daemon, None)
        res = tb_clean(reg)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"run {run_dir.name} is still running (pid {owner.pid}); use --force" in res.stdout, res.stdout
        assert netns_exists(ns) and process_alive(daemon, None), "clean touched a live run"
        assert (reg / run_dir.name).exists()
        res = tb_clean(reg, "--force")
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"removed netns {ns}" in res.stdout and f"removed process {daemon} (sleep 300)" in res.stdout
        assert not netns_exists(ns)
        for _ in range(50):  # SIGKILLed; reaped by init (its parent is the owner, which may reap it late)
            if not process_alive(daemon, None):
                break
            time.sleep(0.05)
        assert not process_alive(daemon, None)
        assert not (reg / run_dir.name).exists() and not (reg / f"{run_dir.name}.jsonl").exists()
        assert owner.poll() is None, "clean --force killed the run's owner itself"
    finally:
        owner.kill()
        owner.wait()
        if daemon:
            _kill(daemon)
        if netns_exists(ns):
            subprocess.run(["ip", "netns", "del", ns], check=False)


def _register_dead_run(reg: Path, run_dir: Path, entries: list[dict]) -> None:
    """A killed run as the registry keeps it: its registration (owner gone) and its journal copy."""
    reg.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (reg / run_dir.name).write_text(json.dumps({"run_dir": str(run_dir), "pid": gone.pid, "start": 1}))
    (reg / f"{run_dir.name}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))


@pytest.mark.lab
def test_a_reused_pid_is_not_killed_and_a_look_alike_namespace_is_left_alone(tmp_path):
    """A dead run's journal names two live `sleep`s: one with its real start ticks (killed), one whose start
    ticks differ (its PID reused by an unrelated process: left alive). A namespace with our tag prefix that no
    journal names is reported as unknown and not deleted, next to the run's own namespace, which is."""
    need_lab()
    reg = tmp_path / "reg"
    tag = new_tag()
    run_dir = tmp_path / "results" / new_run_id(tag)
    ours, stranger = f"{tag}-h1", f"{new_tag()}-h1"
    ours_proc = subprocess.Popen(["sleep", "300"])
    reused = subprocess.Popen(["sleep", "301"])
    try:
        for ns in (ours, stranger):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        start = proc_start_ticks(reused.pid)
        assert start is not None
        _register_dead_run(
            reg,
            run_dir,
            [
                {"kind": "netns", "name": ours},
                {
                    "kind": "process",
                    "pid": ours_proc.pid,
                    "start": proc_start_ticks(ours_proc.pid),
                    "host": "h1",
                    "argv": ["sleep", "300"],
                },
                {
                    "kind": "process",
                    "pid": reused.pid,
                    "start": start - 1,
                    "host": "h1",
                    "argv": ["wireguard-go"],
                },
            ],
        )
        res = tb_clean(reg)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"removed process {ours_proc.pid} (sleep 300)" in res.stdout, res.stdout
        assert f"process {reused.pid}" not in res.stdout
        ours_proc.wait(5)  # killed: the wait returns (it would time out otherwise)
        assert reused.poll() is None and process_alive(reused.pid, start), "clean killed a reused PID"
        assert not netns_exists(ours) and f"removed netns {ours}" in res.stdout
        assert netns_exists(stranger), "clean deleted a namespace no journal names"
        assert f"namespace {stranger} looks like tunnelbench's but is in no journal: left alone" in res.stdout
        assert not list(reg.iterdir())  # the dead run is done with
    finally:
        for p in (ours_proc, reused):
            p.kill()
            p.wait()
        for ns in (ours, stranger):
            if netns_exists(ns):
                subprocess.run(["ip", "netns", "del", ns], check=False)


# -- SSH: what is ever removed, and on which host ----------------------------------------------------------
class FakeSshHost:
    """Records the commands undo_entries asks for; a path 'exists' until an `rm -rf` of it was asked."""

    def __init__(self, name: str = "h1", address: str = "192.0.2.5"):
        self.name, self.address = name, address
        self.commands: list[list[str]] = []
        self.removed: set[str] = set()

    def run(self, argv, check: bool = True, **kw):
        self.commands.append(list(argv))
        if argv[:3] == ["rm", "-rf", "--"]:
            self.removed.add(argv[3])
        return subprocess.CompletedProcess(argv, 0, "", "")

    def exists(self, path) -> bool:
        return str(path) not in self.removed

    def remove(self, path) -> None:
        self.removed.add(str(path))


def test_ssh_undo_removes_only_a_run_host_folder():
    inv = InvHost("edge", "192.0.2.5", workdir_root="/var/tmp/tunnelbench")
    good = str(ssh_lab.remote_workdir(inv, new_run_id(new_tag()), "h1"))  # what SshLab journals
    other_root = str(
        ssh_lab.remote_workdir(InvHost("e", "x", workdir_root="/srv"), new_run_id(new_tag()), "h2")
    )
    rid = new_run_id(new_tag())
    bad = [
        "/",
        "/etc",
        "/var/tmp/tunnelbench",
        f"/var/tmp/tunnelbench/{rid}",  # the run folder itself (all hosts' folders), not one host's
        f"/{rid}/h1",  # too shallow: the root would be /
        f"/var/tmp/tunnelbench/{rid}/../../../etc",
        f"/var/tmp/tunnelbench/{rid}/h1/../../..",
        f"/var/tmp/tunnelbench/../../../{rid}/h1",  # = /<run>/h1, outside the workdir root
        f"var/tmp/tunnelbench/{rid}/h1",  # relative: resolved against the SSH user's home
        "/var/tmp/tunnelbench/20260101-1200-tbab12/h1",  # not a run id
        "/var/tmp/tunnelbench/20260101-120000-xyab12/h1",  # not our tag prefix
        "/home/user/h1",
    ]
    h = FakeSshHost()
    entries = [{"kind": "remote_dir", "path": p} for p in (good, other_root, *bad)]
    rep = ssh_undo.undo_entries(h, entries)  # type: ignore[arg-type]
    rms = [c[3] for c in h.commands if c[:3] == ["rm", "-rf", "--"]]
    assert rms == [good, other_root], h.commands
    assert rep.removed == [f"h1 (192.0.2.5): folder {good}", f"h1 (192.0.2.5): folder {other_root}"]
    assert rep.problems == [f"h1: refusing to remove unexpected path {p!r}" for p in bad]
    # the emptied run folder above the host folder goes with `rmdir` (never recursive)
    assert ["rmdir", "--", str(PurePosixPath(good).parent)] in h.commands


def _inventory():
    """Two peers behind one NAT address (different SSH ports) and a third with an address of its own."""
    inv = parse_inventory(
        {
            "all": {
                "children": {
                    "peers": {
                        "hosts": {
                            "a": {
                                "ansible_host": "198.51.100.7",
                                "ansible_port": 2201,
                                "tunnelbench_underlay_ip": "10.0.0.1",
                            },
                            "b": {
                                "ansible_host": "198.51.100.7",
                                "ansible_port": 2202,
                                "tunnelbench_underlay_ip": "10.0.0.2",
                            },
                            "c": {"ansible_host": "198.51.100.9", "tunnelbench_underlay_ip": "10.0.0.3"},
                        }
                    }
                }
            }
        },
        "inv.yaml",
    )
    inv.path = Path("inv.yaml")
    return inv


def test_clean_inventory_refuses_a_host_it_cannot_tell_apart(monkeypatch):
    """A journal entry without a port whose address two inventory hosts share is ambiguous: refused, no SSH
    connection made. One with its port, or an address only one host has, is undone on exactly that host."""
    connected: list[tuple[str, str, int]] = []
    undone: list[tuple[str, list[str]]] = []

    class RecordingHost:
        def __init__(self, name, inv, workdir, journal):
            self.name, self.inv = name, inv

        def connect(self):
            connected.append((self.name, self.inv.address, self.inv.port))

        def close(self):
            pass

    def fake_undo(h, ents, journal=None):
        undone.append((h.inv.name, [e["path"] for e in ents]))
        return ssh_undo.UndoReport(removed=[f"{h.name}: {len(ents)}"])

    monkeypatch.setattr(ssh_undo, "SshHost", RecordingHost)
    monkeypatch.setattr(ssh_undo, "undo_entries", fake_undo)
    e = {"backend": "ssh", "kind": "path"}
    entries = [
        {**e, "host": "h1", "address": "198.51.100.7", "path": "/x1"},  # no port: a or b?
        {**e, "host": "h2", "address": "198.51.100.7", "port": 2202, "path": "/x2"},  # b
        {**e, "host": "h3", "address": "198.51.100.9", "path": "/x3"},  # c, the only one there
        {**e, "host": "h4", "address": "203.0.113.1", "path": "/x4"},  # in no inventory host
        {**e, "host": "h5", "address": "198.51.100.7", "port": 2299, "path": "/x5"},  # no host on that port
    ]
    rep = ssh_undo.clean_ssh_entries(entries, _inventory())
    assert sorted(undone) == [("b", ["/x2"]), ("c", ["/x3"])], undone
    assert sorted(connected) == [("h2", "198.51.100.7", 2202), ("h3", "198.51.100.9", 22)]
    assert rep.problems == [
        "h1 (198.51.100.7:?): ambiguous (several hosts share the address) in inventory inv.yaml; cannot clean it",
        "h4 (203.0.113.1:?): not in inventory inv.yaml; cannot clean it",
        "h5 (198.51.100.7:2299): not in inventory inv.yaml; cannot clean it",
    ], rep.problems
