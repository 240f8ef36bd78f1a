"""The interactive lab (issue 17 item 5) through the real CLI: `up` returns while the lab and the VPN daemons stay
up, `exec` runs commands in a host (exit code passed through), `down` leaves nothing, and a lab whose keeper was
SIGKILLed is undone by `clean` (or `down`) from its journal. Every command runs with a private registry
(TUNNELBENCH_REGISTRY), so no other run on this machine is ever seen or touched."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunnelbench.lab.journaling import process_alive

pytestmark = [pytest.mark.lab]

TB = Path(sys.executable).with_name("tunnelbench")


class Cli:
    def __init__(self, tmp_path: Path):
        self.registry = tmp_path / "registry"
        self.results = tmp_path / "results"
        self.env = {**os.environ, "TUNNELBENCH_REGISTRY": str(self.registry)}

    def __call__(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        argv = [str(TB)] if TB.exists() else [sys.executable, "-m", "tunnelbench.cli"]
        return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=timeout, env=self.env)

    def up(self, *args: str) -> tuple[subprocess.CompletedProcess, int]:
        """Run `up` to its exit; returns its result and its PID."""
        argv = [str(TB)] if TB.exists() else [sys.executable, "-m", "tunnelbench.cli"]
        p = subprocess.Popen(
            [*argv, "up", *args, "--results", str(self.results)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        out, errs = p.communicate(timeout=240)
        return subprocess.CompletedProcess(p.args, p.returncode, out, errs), p.pid

    def states(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted((self.registry / "up").glob("*.json"))]


@pytest.fixture
def cli(tmp_path):
    from conftest import lab_missing

    why = lab_missing()
    if why:
        pytest.skip(why)
    c = Cli(tmp_path)
    yield c
    # a failed test must not leave a lab: end each keeper (its teardown), then undo what a dead one left
    for s in c.states():
        c("down", s["run_id"])
    for s in c.states():
        if process_alive(s["keeper"]["pid"], s["keeper"]["start"]):
            os.kill(s["keeper"]["pid"], signal.SIGKILL)
    if c.registry.is_dir() and any(p.is_file() and not p.name.startswith(".") for p in c.registry.iterdir()):
        c("clean")


def table(stdout: str) -> dict[str, dict]:
    """The hosts table `up` prints: host -> namespace, underlay and tunnel address."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 5 and re.fullmatch(r"h\d+", cells[0]):
            rows[cells[0]] = {"netns": cells[1], "underlay_ip": cells[2], "tunnel_ip": cells[3]}
    return rows


def journal_processes(run_dir: Path) -> list[dict]:
    """Processes the lab journaled (the VPN daemons, plus the keeper, host "local")."""
    lines = (run_dir / "journal.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == "process"]


def lab_namespaces(tag: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{tag}-")]


def assert_nothing_left(cli: Cli, state: dict, daemons: list[dict]) -> None:
    assert lab_namespaces(state["tag"]) == []
    assert [d["pid"] for d in daemons if process_alive(d["pid"], d["start"])] == []
    assert not process_alive(state["keeper"]["pid"], state["keeper"]["start"])
    assert cli.states() == []
    assert not (cli.registry / state["run_id"]).exists()  # the run's registration: journal ended


def test_internal_lab_up_exec_down(cli):
    res, up_pid = cli.up("--vpn", "internal", "--hosts", "3")
    assert res.returncode == 0, res.stdout + res.stderr
    hosts = table(res.stdout)
    assert sorted(hosts) == ["h1", "h2", "h3"]
    (state,) = cli.states()
    assert hosts["h2"]["tunnel_ip"] == hosts["h2"]["underlay_ip"] == "10.100.2.2"  # no VPN: the underlay
    assert not process_alive(up_pid, None)
    assert process_alive(state["keeper"]["pid"], state["keeper"]["start"])
    assert f"tunnelbench exec h1 -- ping -c3 {hosts['h2']['tunnel_ip']}" in res.stdout

    for target in ("h2", "h3"):
        r = cli("exec", "h1", "--", "ping", "-c1", "-W2", hosts[target]["tunnel_ip"])
        assert r.returncode == 0, r.stdout + r.stderr
        assert "1 received" in r.stdout
    r = cli("exec", "h1", "--", "ip", "-o", "-4", "addr")
    assert f"inet {hosts['h1']['underlay_ip']}/" in r.stdout
    assert cli("exec", "h1", "--", "sh", "-c", "exit 7").returncode == 7
    r = subprocess.run(
        [str(TB), "exec", "h2", "--", "sh", "-c", "read x; echo got $x"],
        input="hello\n",
        capture_output=True,
        text=True,
        env=cli.env,
        timeout=30,
    )
    assert r.stdout.strip() == "got hello"  # stdin is the command's
    r = cli("exec", "h2")  # no command: a shell, reading the (empty) stdin
    assert r.returncode == 0, r.stderr

    r = cli("exec", "h9", "--", "true")
    assert r.returncode == 2 and "no host 'h9'" in r.stderr and "h1, h2, h3" in r.stderr

    r = cli("up", "--vpn", "internal", "--results", str(cli.results))
    assert r.returncode != 0 and state["run_id"] in r.stderr and "tunnelbench down" in r.stderr
    assert len(cli.states()) == 1

    # clean (without --force) leaves a live lab alone: its keeper is the run's owner
    r = cli("clean")
    assert r.returncode == 0 and "still running" in r.stdout, r.stdout + r.stderr
    assert cli("exec", "h1", "--", "ping", "-c1", "-W2", hosts["h3"]["tunnel_ip"]).returncode == 0

    r = cli("down")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified: no namespace of the lab is left" in r.stdout
    assert_nothing_left(cli, state, [])
    r = cli("exec", "h1", "--", "true")
    assert r.returncode != 0 and "no lab is up" in r.stderr


def test_wireguard_go_daemons_outlive_up_and_down_leaves_nothing(cli):
    res, up_pid = cli.up("--vpn", "wireguard-go", "--hosts", "3")
    assert res.returncode == 0, res.stdout + res.stderr
    hosts = table(res.stdout)
    (state,) = cli.states()
    run_dir = Path(state["run_dir"])
    assert hosts["h2"]["tunnel_ip"] == "10.77.0.2" and hosts["h1"]["netns"] == f"{state['tag']}-h1"

    # up has exited; the daemons it had started (journaled) live on, children of the keeper, not of up
    assert not process_alive(up_pid, None)
    procs = journal_processes(run_dir)
    daemons = [p for p in procs if p["host"] != "local"]
    keeper = [p for p in procs if p["host"] == "local"]
    assert len(daemons) == 3 and [k["pid"] for k in keeper] == [state["keeper"]["pid"]]
    for d in daemons:
        assert process_alive(d["pid"], d["start"]), d
        ppid = int(Path(f"/proc/{d['pid']}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert ppid == state["keeper"]["pid"]

    for src, dst in (("h1", "h2"), ("h3", "h1")):
        r = cli("exec", src, "--", "ping", "-c1", "-W2", hosts[dst]["tunnel_ip"])
        assert r.returncode == 0, r.stdout + r.stderr
    r = cli("exec", "h1", "--", "ip", "-o", "addr")
    assert re.search(rf"inet {re.escape(hosts['h1']['tunnel_ip'])}/\d+ .*{state['tag']}v1", r.stdout), (
        r.stdout
    )
    assert cli("exec", "h3", "--", "sh", "-c", "exit 7").returncode == 7

    keys = list(run_dir.glob("hosts/h*/wireguard-go/private.key"))
    assert len(keys) == 3 and all(stat.S_IMODE(k.stat().st_mode) == 0o600 for k in keys)

    r = cli("down", state["run_id"][-6:])  # a unique part of the id picks the lab
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified: wireguard-go left no process, interface or route on any host" in r.stdout
    assert "verified: 3 daemon process(es) gone" in r.stdout
    assert_nothing_left(cli, state, daemons)
    assert not list(run_dir.glob("hosts/h*/wireguard-go/private.key"))  # keys removed with the mesh


def test_delay_profile_is_applied_on_the_path(cli):
    res, _ = cli.up("--vpn", "internal", "--hosts", "2", "--profile", "delay-50")
    assert res.returncode == 0, res.stdout + res.stderr
    hosts = table(res.stdout)
    (state,) = cli.states()
    r = cli("exec", "h1", "--", "ping", "-c3", "-i", "0.2", "-W3", hosts["h2"]["tunnel_ip"])
    assert r.returncode == 0, r.stdout + r.stderr
    rtt_min = float(re.search(r"= ([\d.]+)/", r.stdout).group(1))
    assert 95 <= rtt_min < 300, r.stdout  # 50 ms one way on the path: ~100 ms round trip
    r = cli("down")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "impairment cleared" in r.stdout
    assert_nothing_left(cli, state, [])


@pytest.mark.parametrize("undo", ["clean", "down"])
def test_crashed_keeper_is_undone_from_the_journal(cli, undo):
    res, _ = cli.up("--vpn", "wireguard-go", "--hosts", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    (state,) = cli.states()
    daemons = [p for p in journal_processes(Path(state["run_dir"])) if p["host"] != "local"]
    assert len(daemons) == 2 and all(process_alive(d["pid"], d["start"]) for d in daemons)
    os.kill(state["keeper"]["pid"], signal.SIGKILL)  # the crash: nobody tears down
    end = time.monotonic() + 10
    while Path(f"/proc/{state['keeper']['pid']}").exists() and time.monotonic() < end:
        time.sleep(0.05)  # reaped, not only dead: clean counts a zombie owner as a running run
    assert all(process_alive(d["pid"], d["start"]) for d in daemons)  # the mesh outlives its keeper
    assert len(lab_namespaces(state["tag"])) == 3

    r = cli(undo)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "removed netns" in r.stdout and "removed process" in r.stdout
    assert_nothing_left(cli, state, daemons)
    again = cli("clean")  # (namespaces of other people's runs may be listed as unknown: never touched)
    assert "removed" not in again.stdout and state["tag"] not in again.stdout, again.stdout
