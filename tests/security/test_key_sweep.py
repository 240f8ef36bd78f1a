"""Secrets do not outlive their session (issue 42, finding 12): a mesh stop that raises still removes the
session's keys (the runner's teardown and its stop-and-verify); a killed run's secret files are swept by
`clean` and `run --resume`; a daemon's log (EasyTier logs its network secret) is redacted and scanned; the SSH
lab's local copies of logs are 0600; Headscale's database is a secret file.

No lab: the hosts are this machine with a work folder in tmp_path. References: the secret a config holds
(read back with tomllib), the files on disk and their modes, hand-written logs and entries."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tomllib
from pathlib import Path, PurePosixPath

import pytest
from synthetic_runs import make_run

from tunnelbench.lab import clean, journal
from tunnelbench.lab.host import ThisMachine
from tunnelbench.lab.tags import new_run_id, new_tag
from tunnelbench.security import keys
from tunnelbench.security.hygiene import KeyHygiene
from tunnelbench.vpns.base import MeshSpec, VpnDriver
from tunnelbench.vpns.easytier import EasyTier
from tunnelbench.vpns.tailscale import Tailscale

SECRET = "tbsweep-5f3e9c1d7a2b4e6f8091a2b3c4d5e6f7"  # a fake network secret, 39 characters


class FolderHost(ThisMachine):
    """This machine, as a lab host whose work folder is <run_dir>/hosts/<name>."""

    def __init__(self, name: str, run_dir: Path):
        self.name = name
        self.workdir = run_dir / "hosts" / name


class Leaky(VpnDriver):
    """Writes a secret file and a daemon log that prints the secret, as EasyTier does with its config."""

    name = "tbtest-sweep"
    summary = "test-only driver"

    @classmethod
    def version(cls, host) -> str:
        return "1.0 (test)"

    def tunnel_ip(self, host) -> str:
        return "10.0.0.1"

    def configure(self) -> None:
        for h in self.spec.hosts:
            h.write_file(self.host_dir(h) / "net.secret", f"network_secret = {SECRET}\n", 0o600)
            h.write_file(
                self.host_dir(h) / "daemon.log", f"loaded config: network_secret = {SECRET}\n", 0o600
            )

    def start(self, host) -> None:
        pass


class StopRaises:
    """A Mesh whose stop raises, as one does when a daemon will not die or a driver's after_stop fails."""

    def __init__(self, driver: VpnDriver):
        self.vpn, self.driver = driver.key, driver

    def stop(self) -> None:
        raise RuntimeError("after_stop failed")


def _session(tmp_path: Path) -> tuple[Path, Leaky]:
    run_dir = tmp_path / new_run_id(new_tag())
    driver = Leaky(MeshSpec(hosts=[FolderHost("h1", run_dir)], tag="tb0000", workdir=run_dir))
    driver.configure()
    return run_dir, driver


def _hygiene(run_dir: Path) -> KeyHygiene:
    return KeyHygiene(run_dir, False, lambda *a: None, lambda env: None, lambda *a: None)


def _runner(run_dir: Path, mesh: StopRaises):
    """The Runner as its teardown sees it after a session: a mesh up, no lab (torn down elsewhere)."""
    from tunnelbench.runner.loop import Runner

    r = Runner.__new__(Runner)
    r.mesh, r.bench, r.lab_made = mesh, object(), None  # type: ignore[assignment]
    r.hygiene = _hygiene(run_dir)
    r.journal = type("J", (), {"end": lambda self: None, "run_dir_error": None})()  # type: ignore[assignment]
    r.ctx = type("C", (), {"phase": lambda self, *a: None})()  # type: ignore[assignment]
    r._say = lambda *a: None  # type: ignore[method-assign]
    r._attribute_drops = lambda vpn: None  # type: ignore[method-assign]
    return r


def test_the_runners_teardown_removes_the_keys_of_a_session_whose_stop_raises(tmp_path):
    run_dir, driver = _session(tmp_path)
    key = driver.host_dir(driver.spec.hosts[0]) / "net.secret"
    r = _runner(run_dir, StopRaises(driver))
    r.bench = None
    r._teardown()  # a stop that raises is suppressed there; the keys must go all the same
    assert not key.exists(), "the session's key outlived a stop that raised"
    assert SECRET not in (key.parent / "daemon.log").read_text()


def test_stop_and_verify_removes_the_keys_before_the_stops_exception_goes_on(tmp_path):
    run_dir, driver = _session(tmp_path)
    key = driver.host_dir(driver.spec.hosts[0]) / "net.secret"
    r = _runner(run_dir, StopRaises(driver))
    with pytest.raises(RuntimeError, match="after_stop failed"):
        r._stop_and_verify(r.mesh, driver.key)
    assert not key.exists(), "the session's key outlived a stop that raised"
    assert r.hygiene.records[driver.key]["removed"] == ["hosts/h1/tbtest-sweep/net.secret"]


def test_easytier_network_secret_is_redacted_from_its_log_when_the_session_ends(tmp_path):
    """The real driver's config; the log line is hand-written as EasyTier logs its config at start."""
    run_dir = tmp_path / new_run_id(new_tag())
    h = FolderHost("h1", run_dir)
    driver = EasyTier(MeshSpec(hosts=[h, FolderHost("h2", run_dir)], tag="tb0000", workdir=run_dir))
    driver.configure()
    conf = driver.host_dir(h) / "easytier.toml"
    secret = tomllib.loads(conf.read_text())["network_identity"]["network_secret"]
    log = driver.host_dir(h) / "daemon.log"
    log.write_text(f"starting easytier with config: {conf.read_text()}\n")
    secrets = keys.Secrets()
    removed = keys.collect_and_remove(driver, secrets, False, run_dir)
    assert "hosts/h1/easytier/easytier.toml" in removed and not conf.exists()
    text = log.read_text()
    assert secret not in text and keys.REDACTED.decode() in text, text
    assert secret.encode() in secrets.all()


def test_the_key_scan_searches_the_logs_kept_in_the_run_folder(tmp_path):
    run_dir = make_run(tmp_path, "20260101-000000-tbkeys", {"internal": (1000, 30)}, n=3)
    log = run_dir / "hosts" / "h1" / "easytier" / "daemon.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"0123 network_secret = " + SECRET.encode() + b"\n")
    found = keys.scan_outputs(run_dir, run_dir.name, {SECRET.encode()})
    assert {"output": "hosts/h1/easytier/daemon.log", "offset": 22, "length": len(SECRET)} in found["hits"]
    assert SECRET not in json.dumps(found)


def _killed_run(tmp_path: Path, keep_keys: bool = False) -> tuple[Path, list[Path], Path]:
    """A run folder as a SIGKILLed run leaves it: session folders with secret files and a daemon log holding
    the secret, a public certificate, and the scenario it ran."""
    run_dir = tmp_path / "results" / new_run_id(new_tag())
    h1 = run_dir / "hosts" / "h1"
    files = {
        h1 / "tbtest-sweep" / "net.secret": f"network_secret = {SECRET}\n",
        h1 / "nebula-1.9.0-s2" / "host.key": "-----BEGIN NEBULA X25519 PRIVATE KEY-----\nAAAA\n",
        h1 / "easytier" / "easytier.toml": f'[network_identity]\nnetwork_secret = "{SECRET}"\n',
        h1 / "tailscale" / "infra" / "db.sqlite": "SQLite format 3\0" + "k" * 40,
    }
    for f, text in files.items():
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    (h1 / "nebula-1.9.0-s2" / "host.crt").write_text("public\n")
    log = h1 / "easytier" / "daemon.log"
    log.write_text(f"loaded config: network_secret = {SECRET}\n")
    (run_dir / "scenario.toml").write_text(f'name = "x"\n[run]\nkeep_keys = {str(keep_keys).lower()}\n')
    return run_dir, list(files), log


def test_clean_sweeps_a_killed_runs_secret_files_and_redacts_its_logs(tmp_path, monkeypatch):
    reg = tmp_path / "reg"
    monkeypatch.setenv("TUNNELBENCH_REGISTRY", str(reg))
    monkeypatch.setattr(journal, "REGISTRY", reg)
    run_dir, secret_files, log = _killed_run(tmp_path)
    reg.mkdir()
    (reg / run_dir.name).write_text(json.dumps({"run_dir": str(run_dir), "pid": None, "start": None}))
    rep = clean.clean_run(journal.run_leftovers(run_dir.name, run_dir))
    assert [f for f in secret_files if f.exists()] == [], rep
    assert (run_dir / "hosts" / "h1" / "nebula-1.9.0-s2" / "host.crt").exists()  # a public half stays
    assert SECRET not in log.read_text()
    assert f"secret file {secret_files[0].relative_to(run_dir)}" in rep.removed


def test_resume_sweeps_the_secret_files_of_a_run_the_registry_forgot(tmp_path, monkeypatch):
    """After a reboot the registry has no record of the killed run: its journal is no source, but the secret
    files in the folder being resumed are swept all the same."""
    from tunnelbench.runner.resume import undo_leftovers
    from tunnelbench.scenario import parse_scenario

    reg = tmp_path / "reg"
    monkeypatch.setenv("TUNNELBENCH_REGISTRY", str(reg))
    monkeypatch.setattr(journal, "REGISTRY", reg)
    run_dir, secret_files, log = _killed_run(tmp_path)
    said: list[str] = []
    sc = parse_scenario({"name": "x", "workloads": [{"name": "ping"}]}, "test")
    undo_leftovers(sc, run_dir.name, run_dir, lambda m, _s: said.append(m))
    assert [f for f in secret_files if f.exists()] == []
    assert SECRET not in log.read_text()
    assert any("secret file" in m for m in said), said


def test_a_run_that_kept_its_keys_keeps_them_and_the_sweep_stays_in_the_run_folder(tmp_path):
    """`[run] keep_keys`: the keys stay. A session folder that is a symlink out of the run folder, and a log
    hard-linked to a file outside it, are not touched (the sweep never writes through a link)."""
    run_dir, secret_files, _log = _killed_run(tmp_path, keep_keys=True)
    assert keys.sweep_run(run_dir) and all(f.exists() for f in secret_files)
    run_dir, secret_files, log = _killed_run(tmp_path / "b")
    outside = tmp_path / "outside"
    (outside / "x").mkdir(parents=True)
    (outside / "x" / "host.key").write_text("not the run's\n")
    (run_dir / "hosts" / "h1" / "linked").symlink_to(outside / "x")
    other = tmp_path / "outside" / "other.log"
    other.write_text(f"network_secret = {SECRET}\n")
    os.link(other, run_dir / "hosts" / "h1" / "easytier" / "hard.log")
    keys.sweep_run(run_dir)
    assert (outside / "x" / "host.key").read_text() == "not the run's\n"
    assert SECRET in other.read_text(), "the sweep wrote through a hard link"
    assert [f for f in secret_files if f.exists()] == [] and SECRET not in log.read_text()


def test_headscale_database_and_keys_are_secret_files(tmp_path):
    run_dir = tmp_path / new_run_id(new_tag())
    hosts = [FolderHost("h1", run_dir), FolderHost("h2", run_dir)]
    driver = Tailscale(MeshSpec(hosts=hosts, tag="tb0000", workdir=run_dir))
    infra = driver.host_dir(driver.infra) / "infra"
    names = (
        "db.sqlite",
        "db.sqlite-wal",
        "db.sqlite-shm",
        "noise_private.key",
        "headscale.yaml",
        "derp.yaml",
    )
    for n in names:
        driver.infra.write_file(infra / n, "x", 0o600)
    found = {p.name for p in driver.secret_files(driver.infra)}
    assert found == {"db.sqlite", "db.sqlite-wal", "db.sqlite-shm", "noise_private.key"}, found


def test_the_ssh_labs_local_copies_of_logs_are_private(tmp_path):
    from tunnelbench.lab.ssh_host import SshProcess
    from tunnelbench.lab.ssh_lab import SshLab

    class Remote:
        name, workdir = "h1", PurePosixPath("/var/tmp/tunnelbench/r/h1")

        def read_file(self, path) -> bytes:
            return f"network_secret = {SECRET}\n".encode()

        def run(self, argv, check=True, **kw):
            return subprocess.CompletedProcess(argv, 0, f"{self.workdir}/easytier/daemon.log\n", "")

    old = os.umask(0o022)
    try:
        p = SshProcess(Remote(), "easytier", ["x"], 1, Path("/var/tmp/x.log"))  # type: ignore[arg-type]
        assert p.copy_log(tmp_path / "copy" / "daemon.log")
        lab = SshLab.__new__(SshLab)
        lab.run_dir, lab.hosts, lab.router, lab.relays, lab.control = tmp_path, [Remote()], None, [], None  # type: ignore[list-item]
        lab.all_hosts = lambda: [Remote()]  # type: ignore[method-assign]
        lab.collect_logs()
    finally:
        os.umask(old)
    modes = {
        str(f.relative_to(tmp_path)): stat.S_IMODE(f.stat().st_mode)
        for f in (tmp_path / "copy" / "daemon.log", tmp_path / "hosts" / "h1" / "easytier" / "daemon.log")
    }
    assert modes == {"copy/daemon.log": 0o600, "hosts/h1/easytier/daemon.log": 0o600}, modes
