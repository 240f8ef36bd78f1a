"""The journal's two copies when a disk fails (no lab): the registry's copy (what `clean` reads while the run
lives) must be written, or the journal raises; the results folder's copy failing is noted and the run goes
on. And the registry is a source of things to undo only when no one else could have written it (owner root,
not writable by group or others, no symlink), with the rules every undo shares. References: the files' own lines,
read back, their modes, and entries written by hand."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tunnelbench.lab import journal as journal_mod
from tunnelbench.lab.journal import Journal


@pytest.fixture
def journal(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_mod, "REGISTRY", tmp_path / "registry")
    return Journal(tmp_path / "run", "20261127-000000-tbunit")


def test_a_failed_results_folder_copy_is_noted_and_the_registry_copy_kept(journal, tmp_path):
    journal.path = tmp_path / "gone" / "journal.jsonl"  # its folder does not exist: every write fails
    journal.netns("tbunitns")
    journal.netns("tbunitns2")
    lines = [json.loads(x) for x in journal.copy_path.read_text().splitlines()]
    assert [e["name"] for e in lines] == ["tbunitns", "tbunitns2"]
    assert journal.run_dir_error is not None and str(journal.path) in journal.run_dir_error
    assert "No such file" in journal.run_dir_error  # the first failure, in the OS's words


def test_a_failed_registry_copy_raises(journal, tmp_path):
    journal.copy_path = tmp_path / "gone" / "copy.jsonl"
    with pytest.raises(OSError):
        journal.netns("tbunitns")
    assert journal.run_dir_error is None


# -- the registry is believed only when no one else could have written it (issue 42) -----------------------
RUN = "20261127-000000-tbab12"
ENTRY = {"kind": "netns", "name": "tbab12-h1"}


def _registered(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """A dead run as this machine's registry holds it: its registration (no owner) and its journal copy."""
    reg = tmp_path / "registry"
    monkeypatch.setattr(journal_mod, "REGISTRY", reg)
    reg.mkdir(mode=0o755)
    reg.chmod(0o755)
    run_dir = tmp_path / "results" / RUN
    run_dir.mkdir(parents=True)
    (reg / RUN).write_text(json.dumps({"run_dir": str(run_dir), "pid": None, "start": None}))
    (reg / f"{RUN}.jsonl").write_text(json.dumps(ENTRY) + "\n")
    for f in reg.iterdir():
        f.chmod(0o644)
    return reg, run_dir


def test_a_believed_registry_is_the_source_of_entries(tmp_path, monkeypatch):
    _reg, run_dir = _registered(tmp_path, monkeypatch)  # the positive control: root's, 0755/0644
    left = journal_mod.run_leftovers(RUN, run_dir)
    assert left.entries == [ENTRY] and left.registered and not left.distrust


@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        (lambda reg: (reg / f"{RUN}.jsonl").chmod(0o666), "is writable by group or others (mode 0666)"),
        (lambda reg: (reg / RUN).chmod(0o664), "is writable by group or others (mode 0664)"),
        (lambda reg: reg.chmod(0o777), "is writable by group or others (mode 0777)"),
        # another owner: only root can give a file away (os.chown), so these run in the lab lane
        pytest.param(
            lambda reg: os.chown(reg / RUN, 65534, 65534),
            "is owned by uid 65534, not root",
            marks=pytest.mark.root,
        ),
        pytest.param(
            lambda reg: os.chown(reg / f"{RUN}.jsonl", 65534, 65534),
            "is owned by uid 65534, not root",
            marks=pytest.mark.root,
        ),
    ],
)
def test_a_registry_file_others_could_write_is_no_source_of_entries(tmp_path, monkeypatch, spoil, why):
    reg, run_dir = _registered(tmp_path, monkeypatch)
    spoil(reg)
    left = journal_mod.run_leftovers(RUN, run_dir)
    assert left.entries == [], "an entry from a registry file others could have written would be undone"
    assert why in left.distrust, left.distrust
    assert [r.entries for r in journal_mod.registered_runs()] == [[]]


def test_a_symlinked_registration_is_not_believed(tmp_path, monkeypatch):
    reg, run_dir = _registered(tmp_path, monkeypatch)
    real = tmp_path / "elsewhere.json"
    (reg / RUN).rename(real)
    (reg / RUN).symlink_to(real)
    left = journal_mod.run_leftovers(RUN, run_dir)
    assert left.entries == [] and "is a symlink" in left.distrust


def test_the_journal_writes_its_registry_files_private_whatever_the_umask(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_mod, "REGISTRY", tmp_path / "registry")
    old = os.umask(0)
    try:
        j = Journal(tmp_path / "run", RUN)
        j.netns("tbab12-h1")
    finally:
        os.umask(old)
    modes = {
        p.name: stat.S_IMODE(p.stat().st_mode) for p in (j.registry_file, j.copy_path, tmp_path / "registry")
    }
    assert modes == {RUN: 0o600, f"{RUN}.jsonl": 0o600, "registry": 0o755}, modes


def test_the_journal_refuses_a_registry_others_could_write(tmp_path, monkeypatch):
    reg = tmp_path / "registry"
    reg.mkdir()
    reg.chmod(0o777)
    monkeypatch.setattr(journal_mod, "REGISTRY", reg)
    with pytest.raises(OSError, match=r"cannot be trusted: .*writable by group or others \(mode 0777\)"):
        Journal(tmp_path / "run", RUN)
    assert list(reg.iterdir()) == []


def test_the_rules_every_undo_shares():
    """lab/journal.py `refusal`, entry by entry, against the run 20261127-000000-tbab12 (tag tbab12)."""
    own = ["/srv/results/" + RUN]
    ok = [
        {"kind": "netns", "name": "tbab12-h1"},
        {"kind": "link", "netns": "tbab12-h1", "name": "tbab12v1"},
        {"kind": "link", "netns": "", "name": "tbab12v1", "backend": "ssh"},  # vxlan on an SSH host
        {"kind": "link_prefix", "prefix": "tbab12", "backend": "ssh"},
        {"kind": "nft_table", "name": "tbab12guard", "backend": "ssh"},
        {"kind": "process", "pid": 10, "start": 99, "argv": ["x"]},
        {"kind": "path", "path": "/run/tbsock/tbab12-h1-tailscaled.sock", "backend": "ssh"},
        {"kind": "path", "path": "/var/run/wireguard/tbab12v1.sock", "backend": "ssh"},
        {"kind": "path", "path": f"/srv/results/{RUN}/hosts/h1/x.pid", "backend": "ssh"},
    ]
    assert [journal_mod.refusal(e, RUN, own) for e in ok] == [None] * len(ok)
    refused = [
        {"kind": "netns", "name": "tbcd34-h1"},  # another run's
        {"kind": "netns", "name": "h1"},
        {"kind": "link", "netns": "tbab12-h1", "name": "eth0"},
        {"kind": "link", "netns": "", "name": "tbab12v1"},  # this machine's own namespace
        {"kind": "link_prefix", "prefix": "", "backend": "ssh"},  # every interface
        {"kind": "link_prefix", "prefix": "tb", "backend": "ssh"},  # every run's
        {"kind": "nft_table", "name": "filter", "backend": "ssh"},
        {"kind": "process", "pid": 10, "start": None, "argv": ["x"]},
        {"kind": "path", "path": "/etc/passwd", "backend": "ssh"},
        {"kind": "path", "path": "/run/tbsock/tbcd34-h1-tailscaled.sock", "backend": "ssh"},
        {"kind": "path", "path": f"/srv/results/{RUN}/../../etc/shadow", "backend": "ssh"},
        {"kind": "path", "path": f"/srv/results/{RUN}", "backend": "ssh"},  # the folder itself
        {"kind": "path", "path": "relative/x", "backend": "ssh"},
    ]
    whys = [journal_mod.refusal(e, RUN, own) for e in refused]
    assert [e for e, why in zip(refused, whys, strict=True) if why is None] == []
    # a run id tunnelbench did not make has no tag: no name is its own
    assert journal_mod.refusal({"kind": "netns", "name": "h1"}, "myrun", own) is not None
    assert journal_mod.refusal({"kind": "netns", "name": "tbab12-h1"}, "x-tbab12", own) is not None


def test_a_command_line_is_the_journaled_one_through_exec_wrappers_and_rewritten_titles():
    """lab/journaling.py `same_command` against command lines as /proc shows them (the nginx title as nginx
    1.22 wrote it over its arguments, seen here with `od -c /proc/PID/cmdline`)."""
    from tunnelbench.lab.journaling import parse_cmdline, same_command

    argv = ["/usr/sbin/nginx", "-p", "/r/x", "-c", "/r/x/n.conf", "-g", "daemon off;"]
    title = parse_cmdline(b"nginx: master process /usr/sbin/nginx -p /r/x -c /r/x/n.conf -g daemon off;\0\0")
    assert same_command(title, argv)
    assert same_command(["sleep", "600"], ["sleep", "600"])
    assert same_command(
        ["/b/impaird", "--config", "c"], ["taskset", "-c", "1", "/b/impaird", "--config", "c"]
    )
    mounts = ["unshare", "-m", "sh", "-c", 'mount ... && exec "$@"', "tb-mountns", "/b/vpnserver", "execsvc"]
    assert same_command(["/b/vpnserver", "execsvc"], mounts)
    assert not same_command(["sleep", "600"], ["sleep", "601"])
    assert not same_command(["sleep", "600", "x"], ["sleep", "600"])  # more than was journaled
    assert not same_command(["nginx: master process /usr/sbin/nginx"], argv)  # not its arguments
    assert not same_command([], ["sleep"]) and not same_command(["sleep"], [])  # a zombie; no argv journaled
    assert parse_cmdline(b"a\0b c\0") == ["a", "b c"] and parse_cmdline(b"") == []


def test_a_run_id_tunnelbench_did_not_make_owns_no_file_in_the_known_places():
    e = {"kind": "path", "path": "/run/tbsock/x.sock", "backend": "ssh"}
    assert journal_mod.refusal(e, "x", []) is not None  # "x.sock" starts with the run id "x"
    assert journal_mod.refusal({**e, "path": "/run/tbsock/x/y.sock"}, "x", ["/run/tbsock/x"]) is None
