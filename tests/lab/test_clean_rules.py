"""`tunnelbench clean`'s safety rules: a live run is left alone without --force (taken with it), a journaled
PID whose start time no longer matches is not killed, nor one whose start time matches but whose command line
is not the journaled one, nor one journaled without a start time; a namespace or interface that does not carry
the run's tag is refused, one that looks like ours but is in no journal is reported and left alone; a path
outside the run's folders and the lab's known places is refused; the SSH undo follows the same rules and never
runs `rm -rf` outside this run's host folder, and an inventory in which a journal's host is ambiguous is refused
rather than guessed.

Every `clean` here runs with a private TUNNELBENCH_REGISTRY holding only this test's runs. The references:
`ip netns`, /proc (the processes the test itself started), and the commands a fake SSH host was asked to run."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path, PurePosixPath

import pytest
from conftest import lab_missing

from tunnelbench.lab import clean, journal, ssh_lab, ssh_undo
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


def _private_registry(tmp_path: Path, monkeypatch) -> Path:
    """This test's own TUNNELBENCH_REGISTRY, for this process too (the module reads it at import)."""
    reg = tmp_path / "reg"
    monkeypatch.setenv("TUNNELBENCH_REGISTRY", str(reg))
    monkeypatch.setattr(journal, "REGISTRY", reg)
    return reg


def test_a_process_is_killed_only_when_its_start_time_and_command_line_are_the_journaled_ones(
    tmp_path, monkeypatch
):
    """A dead run's registry journal names three live `sleep`s: one with its real start time and command line
    (killed: the positive control), one with its real start time but another command line (`sleep 602`
    journaled as `sleep 699`: not the process the run started), one without a start time. Reference: /proc
    and the processes this test started."""
    reg = _private_registry(tmp_path, monkeypatch)
    run_dir = tmp_path / "results" / new_run_id(new_tag())
    ours, other, no_start = (subprocess.Popen(["sleep", s]) for s in ("600", "602", "603"))
    try:
        entries = [
            {
                "kind": "process",
                "pid": ours.pid,
                "start": proc_start_ticks(ours.pid),
                "argv": ["sleep", "600"],
            },
            {
                "kind": "process",
                "pid": other.pid,
                "start": proc_start_ticks(other.pid),
                "argv": ["sleep", "699"],
            },
            {"kind": "process", "pid": no_start.pid, "start": None, "argv": ["sleep", "603"]},
        ]
        _register_dead_run(reg, run_dir, entries)
        rep = clean.clean_run(journal.run_leftovers(run_dir.name, run_dir))
        assert other.poll() is None and process_alive(other.pid, None), (
            "killed: start matched, command did not"
        )
        assert no_start.poll() is None and process_alive(no_start.pid, None), (
            "killed a PID without start time"
        )
        ours.wait(5)  # SIGKILLed: the wait returns (it would time out otherwise)
        assert rep.removed == [f"process {ours.pid} (sleep 600)"], rep
        assert rep.refused == [
            f"process {no_start.pid} (sleep 603): journaled without its start time, so it cannot be told "
            "from a reused PID",
            f"process {other.pid} (sleep 699): its start time matches but it runs 'sleep 602'",
        ], rep.refused
    finally:
        for p in (ours, other, no_start):
            p.kill()
            p.wait()


def test_a_path_is_removed_only_inside_the_runs_folders_or_a_known_place_named_after_it(
    tmp_path, monkeypatch
):
    """Files a dead run's registry journal names: one in its run folder and one in a known place named after
    the run (removed), one elsewhere, one in the known place named after no run, one reached through a
    symlink in the run folder that points outside it (all left alone). Reference: the files on disk."""
    reg = _private_registry(tmp_path, monkeypatch)
    tag = new_tag()
    run_dir = tmp_path / "results" / new_run_id(tag)
    place, elsewhere = tmp_path / "sockets", tmp_path / "elsewhere"
    monkeypatch.setattr(journal, "KNOWN_PLACES", (str(place),))
    for d in (run_dir, place, elsewhere):
        d.mkdir(parents=True)
    (run_dir / "out").symlink_to(elsewhere)
    removed = [run_dir / "hosts" / "h1" / "x.pid", place / f"{tag}-h1-tailscaled.sock"]
    kept = [elsewhere / "precious", place / "tb0000-h1-tailscaled.sock", place / "other.sock"]
    through_link = run_dir / "out" / "precious2"
    for f in (*removed, *kept, elsewhere / "precious2"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    _register_dead_run(
        reg, run_dir, [{"kind": "path", "path": str(f)} for f in (*removed, *kept, through_link)]
    )
    rep = clean.clean_run(journal.run_leftovers(run_dir.name, run_dir))
    assert [f for f in removed if f.exists()] == [], rep
    assert [f for f in [*kept, elsewhere / "precious2"] if not f.exists()] == [], (
        "removed a file not the run's"
    )
    assert rep.removed == [f"file {f}" for f in removed]
    assert len(rep.refused) == 4 and all("outside run" in r for r in rep.refused), rep.refused


@pytest.mark.lab
def test_a_namespace_or_interface_without_the_runs_tag_is_refused(tmp_path, monkeypatch):
    """A dead run's registry journal names another run's namespace, an interface in it, and an interface
    without the run's tag in the run's own namespace: all left alone. Its own tagged interface is removed (the
    positive control). Reference: `ip netns` and `ip link` in the namespaces."""
    need_lab()
    reg = _private_registry(tmp_path, monkeypatch)
    tag = new_tag()
    other = new_tag()
    while other == tag:
        other = new_tag()
    run_dir = tmp_path / "results" / new_run_id(tag)
    ours, stranger = f"{tag}-h1", f"{other}-h1"

    def links(ns: str) -> set[str]:
        out = subprocess.run(["ip", "-n", ns, "-o", "link", "show"], capture_output=True, text=True).stdout
        return {ln.split(":")[1].strip().split("@")[0] for ln in out.splitlines()}

    try:
        for ns in (ours, stranger):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        for ns, name in ((stranger, "v0"), (ours, "v0"), (ours, f"{tag}v1")):
            veth = ["link", "add", name, "type", "veth", "peer", "name", name + "p"]
            subprocess.run(["ip", "-n", ns, *veth], check=True)
        _register_dead_run(
            reg,
            run_dir,
            [
                {"kind": "netns", "name": stranger},
                {"kind": "link", "netns": stranger, "name": "v0"},
                {"kind": "link", "netns": ours, "name": "v0"},
                {"kind": "link", "netns": ours, "name": f"{tag}v1"},
            ],
        )
        rep = clean.clean_run(journal.run_leftovers(run_dir.name, run_dir))
        assert netns_exists(stranger), "clean deleted another run's namespace"
        assert "v0" in links(stranger) and "v0" in links(ours), "clean deleted an interface without the tag"
        assert f"{tag}v1" not in links(ours) and rep.removed == [f"interface {tag}v1 in {ours}"], rep
        assert rep.refused == [
            f"netns {stranger}: {stranger!r} does not carry run {run_dir.name}'s tag ({tag})",
            f"interface v0 in {stranger}: 'v0' does not carry run {run_dir.name}'s tag ({tag})",
            f"interface v0 in {ours}: 'v0' does not carry run {run_dir.name}'s tag ({tag})",
        ], rep.refused
    finally:
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
    rid = new_run_id(new_tag())
    good = str(ssh_lab.remote_workdir(inv, rid, "h1"))  # what SshLab journals
    other_root = str(ssh_lab.remote_workdir(InvHost("e", "x", workdir_root="/srv"), rid, "h2"))
    bad = [
        str(ssh_lab.remote_workdir(inv, new_run_id(new_tag()), "h1")),  # another run's host folder
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
    rep = ssh_undo.undo_entries(h, entries, run_id=rid)  # type: ignore[arg-type]
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

    def fake_undo(h, ents, journal=None, run_id=None):
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
    rep = ssh_undo.clean_ssh_entries(entries, _inventory(), new_run_id(new_tag()))
    assert sorted(undone) == [("b", ["/x2"]), ("c", ["/x3"])], undone
    assert sorted(connected) == [("h2", "198.51.100.7", 2202), ("h3", "198.51.100.9", 22)]
    assert rep.problems == [
        "h1 (198.51.100.7:?): ambiguous (several hosts share the address) in inventory inv.yaml; cannot clean it",
        "h4 (203.0.113.1:?): not in inventory inv.yaml; cannot clean it",
        "h5 (198.51.100.7:2299): not in inventory inv.yaml; cannot clean it",
    ], rep.problems


class FakeHostWithProcs(FakeSshHost):
    """A fake SSH host with processes (pid -> start ticks, command line), interfaces and nft tables, answering
    the commands the undo sends as a Linux host would; what it signalled and deleted is recorded."""

    def __init__(self, procs: dict[int, tuple[int, list[str]]], links: list[str]):
        super().__init__()
        self.procs, self.links = dict(procs), list(links)
        self.signalled: list[int] = []

    def run(self, argv, check: bool = True, **kw):
        self.commands.append(list(argv))
        out, rc = "", 0
        pid = next((int(m[1]) for a in argv if (m := re.fullmatch(r"/proc/(\d+)/\w+", a))), None)
        if argv[0] == "cat" and pid is not None:  # /proc/PID/stat: the start time is field 22
            if pid in self.procs:
                out = f"{pid} (x) S {' '.join(['0'] * 18)} {self.procs[pid][0]} 0 0\n"
            else:
                rc = 1
        elif argv[0] == "od" and pid is not None:
            raw = b"".join(a.encode() + b"\0" for a in self.procs[pid][1]) if pid in self.procs else b""
            out, rc = " ".join(f"{b:02x}" for b in raw), 0 if pid in self.procs else 1
        elif argv[:2] == ["sh", "-c"] and (m := re.search(r"kill -\d+ (\d+)", argv[2])):
            target, start = int(m[1]), re.search(r'\[ "\$s" = (\d+) \]', argv[2])
            if target in self.procs and (start is None or int(start[1]) == self.procs[target][0]):
                self.signalled.append(target)
                del self.procs[target]
        elif argv[:4] == ["ip", "-o", "link", "show"]:
            out = "".join(f"{i}: {n}: <UP> mtu 1500\n" for i, n in enumerate(self.links, 1))
        elif argv[:3] == ["ip", "link", "del"]:
            self.links.remove(argv[3])
        elif argv[:3] == ["rm", "-rf", "--"]:
            self.removed.add(argv[3])
        return subprocess.CompletedProcess(argv, rc, out, "")


def test_ssh_undo_follows_the_same_rules():
    """On an SSH host: a process journaled without a start time, or whose command line is not the journaled
    one, is not signalled; an interface prefix or nft table without the run's tag (the empty prefix: every
    interface) and a path outside the run's places are refused. What is the run's goes (positive controls).
    Reference: the commands the fake host was sent and what it deleted."""
    rid = new_run_id(new_tag())
    tag = rid.rsplit("-", 1)[1]
    daemon = ["/usr/local/bin/wireguard-go", "-f", f"{tag}v1"]
    h = FakeHostWithProcs(
        {101: (5000, daemon), 102: (5001, ["/usr/sbin/sshd", "-D"]), 103: (5002, ["/usr/sbin/nginx"])},
        ["lo", "eth0", "wg0", f"{tag}v1"],
    )
    e = {"backend": "ssh", "host": "h1", "address": "192.0.2.5"}
    sock = f"/run/tbsock/{tag}-h1-tailscaled.sock"
    entries = [
        {**e, "kind": "process", "pid": 101, "start": 5000, "argv": daemon},
        {**e, "kind": "process", "pid": 102, "start": 5001, "argv": ["/usr/local/bin/tbdaemon"]},
        {**e, "kind": "process", "pid": 103, "start": None, "argv": ["/usr/sbin/nginx"]},
        {**e, "kind": "link_prefix", "prefix": ""},
        {**e, "kind": "link_prefix", "prefix": tag},
        {**e, "kind": "nft_table", "family": "inet", "name": "filter"},
        {**e, "kind": "nft_table", "family": "inet", "name": f"{tag}guard"},
        {**e, "kind": "path", "path": "/etc/passwd"},
        {**e, "kind": "path", "path": sock},
    ]
    rep = ssh_undo.undo_entries(h, entries, run_id=rid)  # type: ignore[arg-type]
    assert h.signalled == [101], h.signalled  # nothing but the run's daemon was signalled
    assert h.links == ["lo", "eth0", "wg0"], h.links
    assert [c for c in h.commands if c[0] == "nft"] == [["nft", "delete", "table", "inet", f"{tag}guard"]]
    assert h.removed == {sock}
    refused = "\n".join(rep.refused)
    assert len(rep.refused) == 5, refused
    for why in (
        "process 102 (/usr/local/bin/tbdaemon) on h1: its start time matches but it runs '/usr/sbin/sshd -D'",
        "process 103 (/usr/sbin/nginx) on h1: journaled without its start time",
        f"interfaces ''* on h1: '' does not carry run {rid}'s tag",
        f"nft_table filter on h1: 'filter' does not carry run {rid}'s tag",
        "file /etc/passwd on h1: /etc/passwd is outside run",
    ):
        assert why in refused, (why, refused)
