"""The runner's failure paths through the real Runner on a namespace lab, with test-only drivers and a
test-only workload registered for the test: a daemon killed mid-case (the case fails, `_heal` restarts the
mesh and the retry is ok), a case over its timeout, a VPN whose binaries are missing, meshes that never come
up (out of the run, later rounds not retried, the next VPN still measured), and a driver that leaves an
interface and a process behind after stop (reported, the lab rebuilt before anything else runs).

The references are independent of the runner: the PIDs the workload itself killed and saw, /proc, `ip link`
in the namespaces, a log of every daemon start each fake driver writes, and the bytes of the echo requests
and replies the workload exchanged across the router (against the run's path counters)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sqlite3
import time
import tomllib
from pathlib import Path
from typing import Literal

import pytest
from conftest import lab_missing
from pydantic import Field
from rich.console import Console

from tunnelbench.catalog import DRIVERS, WORKLOADS, resolve
from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome
from tunnelbench.lab.host import Host
from tunnelbench.lab.journaling import process_alive
from tunnelbench.lab.netns import netns_exists
from tunnelbench.runner.loop import Runner
from tunnelbench.scenario import parse_scenario
from tunnelbench.vpns.base import VpnDriver
from tunnelbench.workloads.base import CaseContext, NotApplicable, Params, Workload, WorkloadError

pytestmark = [pytest.mark.lab]

PLANT_LINK = "tbplant0"  # the interface the littering driver leaves in each host after stop
PLANT_SLEEP = "3001"  # `sleep 3001`: the process it leaves there


# -- test-only drivers ------------------------------------------------------------------------------------
class FakeVpn(VpnDriver):
    """A 'VPN' whose daemon is `sleep` and whose tunnel addresses are the underlay's (so the runner's fping
    readiness probe answers). Every start is logged to <workdir>/starts.jsonl (host, pid)."""

    name = "tbtest-fake"
    summary = "test-only driver"

    @classmethod
    def version(cls, host: Host) -> str:
        return "1.0 (test)"

    def tunnel_ip(self, host: Host) -> str:
        return host.underlay_ip

    def configure(self) -> None:
        for h in self.spec.hosts:
            h.write_file(self.host_dir(h) / "fake.conf", f"peer count {len(self.peers(h))}\n")

    def daemon_argv(self) -> list[str]:
        return ["sleep", "600"]

    def start(self, host: Host) -> None:
        p = host.spawn(self.daemon_argv(), label="fakedaemon", log_path=self.host_dir(host) / "daemon.log")
        self.procs[host.name].append(p)
        with open(self.spec.workdir / "starts.jsonl", "a") as f:
            f.write(json.dumps({"vpn": self.key, "host": host.name, "pid": p.pid}) + "\n")


class NeverReady(FakeVpn):
    """Its daemon runs but its tunnel addresses never answer: wait_ready must give up."""

    name = "tbtest-never"

    def tunnel_ip(self, host: Host) -> str:
        return f"10.77.0.{self.index(host)}"  # no interface of the lab has these


class Crashes(NeverReady):
    """Its daemon exits (status 3, a line in its log) as it starts."""

    name = "tbtest-crash"

    def daemon_argv(self) -> list[str]:
        return ["sh", "-c", "echo tbtest-boom; exit 3"]

    def start(self, host: Host) -> None:
        super().start(host)
        self.procs[host.name][-1].wait(5)  # dead before wait_ready looks (else the probe's timeout may win)


SECRET = "tbtest-5f3e9c1d7a2b4e6f8091a2b3c4d5e6f7"  # a fake network secret, 36 characters


class LogsItsSecret(FakeVpn):
    """Writes a secret file and, like EasyTier with its config, prints the secret into its daemon log."""

    name = "tbtest-leaky"
    secret_patterns = ("net.secret",)

    def configure(self) -> None:
        for h in self.spec.hosts:
            h.write_file(self.host_dir(h) / "net.secret", f"network_secret = {SECRET}\n", 0o600)

    def daemon_argv(self) -> list[str]:
        return ["sh", "-c", f"echo 'loaded config: network_secret = {SECRET}'; exec sleep 600"]


class Unavailable(FakeVpn):
    name = "tbtest-unavail"
    binaries = ("tbtest-no-such-binary",)


class Litters(FakeVpn):
    """After stop it leaves an interface and a stray `sleep` in every host's namespace."""

    name = "tbtest-litter"

    def after_stop(self, host: Host) -> None:
        # a veth pair (this kernel may have no dummy module); a second stop finds the name taken: check=False
        host.run(["ip", "link", "add", PLANT_LINK, "type", "veth", "peer", "name", "tbplant1"], check=False)
        host.run(["sh", "-c", f"sleep {PLANT_SLEEP} </dev/null >/dev/null 2>&1 &"], check=False)


# -- a test-only workload ---------------------------------------------------------------------------------
class ProbeParams(Params):
    mode: Literal["ok", "kill-once", "overrun-once", "not-applicable", "fail"] = "ok"
    pings: int = Field(0, ge=0, le=10_000)  # echo requests of PING_SIZE B from the client to the server


PING_SIZE = 1000  # ICMP payload: each request and reply is PING_SIZE + 28 B of IP on the router
PINGS = 20


def planted(host: Host) -> tuple[int, int]:
    """(planted interfaces, planted processes) in a host's namespace, read from `ip` and /proc."""
    links = host.run(["ip", "-o", "link", "show"]).stdout
    n_links = sum(1 for line in links.splitlines() if line.split(":")[1].strip().split("@")[0] == PLANT_LINK)
    n_procs = 0
    for pid in getattr(host, "pids", list)():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        n_procs += cmd[:2] == [b"sleep", PLANT_SLEEP.encode()]
    return n_links, n_procs


class Probe(Workload):
    """Records what it sees (daemons alive, planted leftovers) and, once per run folder, breaks the case:
    kill-once SIGKILLs the server's daemon, overrun-once runs past the case deadline."""

    name = "tbtest-probe"
    summary = "test-only workload"
    Params = ProbeParams
    metrics = (
        MetricSpec("tbtest_daemons_alive", "count", "none", "VPN daemons alive when the case ran"),
        MetricSpec("tbtest_planted_links", "count", "none", "planted interfaces seen on client and server"),
        MetricSpec("tbtest_planted_procs", "count", "none", "planted processes seen on client and server"),
        MetricSpec("tbtest_echo_replies", "count", "none", "echo replies the client got from the server"),
        MetricSpec("tbtest_hostfw_tables", "count", "none", "host firewall nft tables on client and server"),
        MetricSpec("tbtest_slow_start_after_idle", "count", "none", "the sysctl's value on client + server"),
    )

    def label(self) -> str:
        return f"probe-{self.params.mode}"

    def expected_seconds(self) -> float:
        return 0.2

    def run(self, ctx: CaseContext) -> Outcome:
        out = Outcome()
        daemons = [p for ps in ctx.mesh.daemons().values() for p in ps]
        pids = sorted(p.pid for p in daemons)
        out.add("tbtest_daemons_alive", sum(process_alive(p.pid, None) for p in daemons))
        links = procs = 0
        for h in (ctx.client, ctx.server):
            a, b = planted(h)
            links, procs = links + a, procs + b
        out.add("tbtest_planted_links", links)
        out.add("tbtest_planted_procs", procs)
        tables = [
            ctx.client.run(["nft", "list", "tables"]).stdout,
            ctx.server.run(["nft", "list", "tables"]).stdout,
        ]
        out.add("tbtest_hostfw_tables", sum(t.count("hostfw") for t in tables))
        ssai = "/proc/sys/net/ipv4/tcp_slow_start_after_idle"
        out.add(
            "tbtest_slow_start_after_idle",
            sum(int(h.run(["cat", ssai]).stdout) for h in (ctx.client, ctx.server)),
        )
        (ctx.artifact_dir / "daemon_pids.json").write_text(json.dumps(pids))
        if self.params.pings:  # a known number of bytes across the router, straight between client and server
            argv = ["ping", "-n", "-q", "-c", str(self.params.pings), "-i", "0.002", "-s", str(PING_SIZE)]
            r = ctx.client.run([*argv, "-W", "1", ctx.server.public_ip], check=False)
            out.add("tbtest_echo_replies", int(re.search(r"(\d+) received", r.stdout).group(1)))
        if self.params.mode == "not-applicable":
            raise NotApplicable(f"not applicable: {ctx.mesh.vpn} has no such thing")
        if self.params.mode == "fail":
            raise WorkloadError("this probe always fails")
        marker = ctx.mesh.driver.spec.workdir / f"{self.label()}.{ctx.mesh.vpn}.done"
        if self.params.mode != "ok" and not marker.exists():
            marker.write_text("")
            if self.params.mode == "kill-once":
                victim = ctx.mesh.daemons()[ctx.server.name][0]
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait(5)
                (ctx.artifact_dir / "killed_pid").write_text(str(victim.pid))
            else:
                time.sleep(max(0.0, ctx.deadline - time.monotonic()) + 0.3)
        out.measure_s = 0.05
        return out


TEST_DRIVERS = (FakeVpn, NeverReady, Crashes, Unavailable, Litters, LogsItsSecret)


@pytest.fixture
def registered(monkeypatch):
    why = lab_missing()
    if why:
        pytest.skip(why)
    for d in TEST_DRIVERS:
        monkeypatch.setitem(DRIVERS, d.name, d)
    monkeypatch.setitem(WORKLOADS, Probe.name, Probe)
    resolve.cache_clear()
    yield
    resolve.cache_clear()


def run_scenario(tmp_path: Path, toml: str) -> tuple[Path, str, str]:
    """Run a scenario in this process with the real Runner; (run folder, run status, console output)."""
    sc = parse_scenario(tomllib.loads(toml), "test")
    buf = io.StringIO()
    runner = Runner(sc, toml, Console(file=buf, width=400), results_root=tmp_path / "results")
    res = runner.run()
    assert not netns_exists(f"{runner.tag}-h1"), "the lab outlived the run"
    return res.run_dir, res.status, buf.getvalue()


def cases(run_dir: Path, vpn: str) -> list[sqlite3.Row]:
    db = sqlite3.connect(run_dir / "results.sqlite")
    db.row_factory = sqlite3.Row
    rows = db.execute(
        'SELECT * FROM "case" WHERE vpn=? ORDER BY repetition, label, attempt, id', (vpn,)
    ).fetchall()
    db.close()
    return rows


def metric(run_dir: Path, case_id: int, name: str) -> float:
    db = sqlite3.connect(run_dir / "results.sqlite")
    row = db.execute("SELECT value FROM metric WHERE case_id=? AND name=?", (case_id, name)).fetchone()
    db.close()
    assert row is not None, f"case {case_id} stored no {name}"
    return row[0]


def starts(run_dir: Path, vpn: str) -> list[dict]:
    p = run_dir / "starts.jsonl"
    return [e for e in map(json.loads, p.read_text().splitlines()) if e["vpn"] == vpn] if p.exists() else []


BASE = """
name = "runner-failures"
vpns = {vpns}
[run]
repetitions = {reps}
retries = {retries}
case_timeout_s = 1.5
tunnel_timeout_s = 1
monitor_interval_s = 0.1
drift_check_s = 0
order = "{order}"
seed = 7
[lab]
hosts = 2
"""


def probe(mode: str, pings: int = 0) -> str:
    return f'[[workloads]]\nname = "tbtest-probe"\nmode = "{mode}"\npings = {pings}\n'


def test_daemon_death_and_overrun_fail_the_case_and_heal_restarts_only_a_broken_mesh(tmp_path, registered):
    """A daemon SIGKILLed mid-case: that attempt fails naming it, `_heal` restarts the mesh (every host's
    daemon started again, new PIDs) and the retry is ok. A case past its timeout fails as such; the mesh was
    healthy, so `_heal` leaves it alone (no further start) and the retry is ok."""
    toml = BASE.format(vpns='["tbtest-fake"]', reps=2, retries=1, order="block")
    toml += probe("kill-once") + probe("overrun-once")
    run_dir, status, out = run_scenario(tmp_path, toml)
    assert status == "ok", out
    rows = cases(run_dir, "tbtest-fake")
    got = [(r["repetition"], r["label"], r["attempt"], r["status"]) for r in rows]
    assert got == [
        (1, "probe-kill-once", 0, "failed"),
        (1, "probe-kill-once", 1, "ok"),
        (1, "probe-overrun-once", 0, "failed"),
        (1, "probe-overrun-once", 1, "ok"),
        (2, "probe-kill-once", 0, "ok"),
        (2, "probe-overrun-once", 0, "ok"),
    ], out
    killed_case, retry = rows[0], rows[1]
    killed = int((Path(killed_case["artifact_dir"]) / "killed_pid").read_text())
    assert killed_case["error"] == "WorkloadError: VPN daemon(s) died during the case: h2/fakedaemon"
    # the killed daemon's log was kept with the failed attempt
    assert (Path(killed_case["artifact_dir"]) / "daemon-logs" / "h2-fakedaemon.log").exists()
    # _heal: every host's daemon started again (2 hosts x 2 starts), the retry saw both alive with new PIDs
    st = starts(run_dir, "tbtest-fake")
    assert sorted(e["host"] for e in st) == ["h1", "h1", "h2", "h2"], st
    first_pids = {e["pid"] for e in st[:2]}
    assert killed in first_pids
    retry_pids = json.loads((Path(retry["artifact_dir"]) / "daemon_pids.json").read_text())
    assert set(retry_pids) == {e["pid"] for e in st[2:]} and killed not in retry_pids
    assert metric(run_dir, retry["id"], "tbtest_daemons_alive") == 2
    overrun = rows[2]
    assert overrun["error"] == "WorkloadError: case exceeded its timeout of 2 s", overrun[
        "error"
    ]  # 1.5 -> "2"
    assert overrun["ended"] - overrun["started"] >= 1.5


def test_unavailable_and_never_ready_vpns_are_skipped_and_the_run_goes_on(tmp_path, registered):
    """Interleaved, 2 rounds: a VPN with a missing binary is skipped with that reason; a mesh whose pairs
    never answer, and one whose daemon exits, are marked failed ("mesh did not come up"), their cases skipped,
    and they are not brought up again in round 2; the working VPN's cases are all ok."""
    vpns = '["tbtest-unavail", "tbtest-never", "tbtest-crash", "tbtest-fake"]'
    toml = BASE.format(vpns=vpns, reps=2, retries=0, order="interleaved") + probe("ok")
    t0 = time.monotonic()
    run_dir, status, out = run_scenario(tmp_path, toml)
    assert status == "ok", out
    db = sqlite3.connect(run_dir / "results.sqlite")
    vpn = {n: (s, r) for n, s, r in db.execute("SELECT name, status, reason FROM vpn")}
    # the run stored the definitions it measured with: the probe's six metrics (none a headline) and the
    # runner's own, as the class above declares them
    specs = db.execute(
        "SELECT workload, name, better, headline FROM metric_spec WHERE workload != ''"
    ).fetchall()
    assert sorted(specs) == sorted(("tbtest-probe", m.name, m.better, 0) for m in Probe.metrics), specs
    assert db.execute("SELECT better FROM metric_spec WHERE workload = '' AND name = 'daemon_cpu_pct'").fetchall() == [
        ("lower",)]  # fmt: skip
    # every VPN's record keeps its driver's capabilities, up or not (the security table reads them)
    caps = {
        n: json.loads(s or "{}").get("capabilities") for n, s in db.execute("SELECT name, settings FROM vpn")
    }
    assert caps == dict.fromkeys(vpn, {"acl": False, "revocation": None}), caps
    db.close()
    assert vpn["tbtest-unavail"] == ("unavailable", "missing binaries: tbtest-no-such-binary"), vpn
    assert vpn["tbtest-never"][0] == "failed"
    assert vpn["tbtest-never"][1].startswith(
        "mesh did not come up: tbtest-never: pairs not answering after 1 s"
    )
    assert vpn["tbtest-crash"][0] == "failed"
    assert vpn["tbtest-crash"][1].startswith("mesh did not come up: tbtest-crash daemon fakedaemon on h")
    assert "tbtest-boom" in vpn["tbtest-crash"][1]
    assert vpn["tbtest-fake"][0] == "ok"
    for name in ("tbtest-unavail", "tbtest-never", "tbtest-crash"):
        rows = cases(run_dir, name)
        assert rows and all(r["status"] == "skipped" for r in rows), (name, [dict(r) for r in rows])
        assert all(r["error"] == vpn[name][1] for r in rows)
    # brought up once (round 1 only), never started at all when unavailable
    assert not starts(run_dir, "tbtest-unavail")
    assert sorted(e["host"] for e in starts(run_dir, "tbtest-never")) == ["h1", "h2"]
    assert sorted(e["host"] for e in starts(run_dir, "tbtest-crash")) == ["h1", "h2"]
    ok = cases(run_dir, "tbtest-fake")
    assert [(r["repetition"], r["status"]) for r in ok] == [(1, "ok"), (2, "ok")]
    assert "tbtest-unavail: skipped: missing binaries" in out
    # the exit code a CI job sees: 1, naming the three VPNs out of the run and every case each missed
    from tunnelbench.analysis.outcome import judge_store
    from tunnelbench.store import Store

    st = Store(run_dir / "results.sqlite")
    verdict = judge_store(st, st.run_row()["id"])
    st.close()
    assert (verdict.code, verdict.measured, verdict.planned) == (1, 2, 8), verdict
    assert verdict.missing == {"tbtest-unavail": 2, "tbtest-never": 2, "tbtest-crash": 2}, verdict
    # the failed meshes' daemons are gone and their logs were kept
    for e in starts(run_dir, "tbtest-never"):
        assert not process_alive(e["pid"], None)
    assert list((run_dir / "cases" / "tbtest-crash" / "startup-failure").glob("h*-fakedaemon.log"))
    assert time.monotonic() - t0 < 60


def test_leftovers_after_stop_are_reported_and_the_lab_is_rebuilt(tmp_path, registered):
    """A driver that leaves an interface and a process in the hosts after stop: the run records them
    (teardown_leftovers.<vpn>) and rebuilds the lab, so no later case (of any VPN) meets them, and the rebuilt
    lab's router still counts each case's underlay bytes, and its hosts have the scenario's firewall and
    sysctls again (read in the hosts by the probe: the rebuilt lab once had neither)."""
    toml = BASE.format(vpns='["tbtest-litter", "tbtest-fake"]', reps=2, retries=0, order="interleaved")
    toml += '[hosts]\nfirewall = "stateful"\nsysctl = {"net.ipv4.tcp_slow_start_after_idle" = 0}\n'
    toml += probe("ok", pings=PINGS)
    run_dir, status, out = run_scenario(tmp_path, toml)
    assert status == "ok", out
    db = sqlite3.connect(run_dir / "results.sqlite")
    env = dict(db.execute("SELECT key, value FROM environment"))
    orders = json.loads(env["run.round_orders"])
    db.close()
    left = json.loads(env["teardown_leftovers.tbtest-litter"])
    for h in ("h1", "h2"):
        assert f"{h}: interface {PLANT_LINK}" in left, left
        assert any(
            x.startswith(f"{h}: process sleep pid ") and "(in the host's namespace)" in x for x in left
        )
    assert "tbtest-fake" not in {k.split(".", 1)[1] for k in env if k.startswith("teardown_leftovers.")}
    assert "teardown left" in out and "rebuilding the lab" in out
    # round 2's cases (at least) ran after a littering session: none met what it left
    rows = [*cases(run_dir, "tbtest-litter"), *cases(run_dir, "tbtest-fake")]
    assert [r["status"] for r in rows] == ["ok"] * 4, [(r["vpn"], r["repetition"], r["error"]) for r in rows]
    assert sorted(orders[0]) == ["tbtest-fake", "tbtest-litter"] and len(orders) == 2
    for r in rows:
        assert metric(run_dir, r["id"], "tbtest_planted_links") == 0, dict(r)
        assert metric(run_dir, r["id"], "tbtest_planted_procs") == 0, dict(r)
        assert metric(run_dir, r["id"], "tbtest_hostfw_tables") == 2, dict(r)  # one in each host
        assert metric(run_dir, r["id"], "tbtest_slow_start_after_idle") == 0, dict(
            r
        )  # the kernel's default: 1
        # the rebuilt lab's router counts the path again (its new nft table), so every case is path-checked:
        # the probe's echo requests and the replies it got crossed the router; little else can have (the fake
        # VPN sends nothing, ARP is no IP): at most a reply that came after ping gave up on it
        echo = (PINGS + metric(run_dir, r["id"], "tbtest_echo_replies")) * (PING_SIZE + 28)
        got = metric(run_dir, r["id"], "path_underlay_bytes")
        assert echo <= got <= 2 * PINGS * (PING_SIZE + 28) + 1500, (dict(r), echo, got)
        assert metric(run_dir, r["id"], "path_direct_pct") == 100, dict(r)
    assert "path counters unreadable" not in out


def test_not_applicable_is_skipped_and_a_failed_case_keeps_its_logs_without_secrets(tmp_path, registered):
    """A workload that does not apply to the VPN: one skipped case with the reason, no retry, no failure in
    the headline. A failed case's daemon logs are kept for the report with the session's secret redacted
    (EasyTier logs its network_secret; the report embeds these logs)."""
    from tunnelbench.analysis.analyze import analyze, load_run
    from tunnelbench.report.headline import build
    from tunnelbench.security.keys import REDACTED

    toml = BASE.format(vpns='["tbtest-leaky"]', reps=1, retries=1, order="block") + probe("not-applicable")
    toml += probe("fail")
    run_dir, status, _ = run_scenario(tmp_path, toml)
    rows = cases(run_dir, "tbtest-leaky")
    by = {}
    for r in rows:
        by.setdefault(r["label"], []).append((r["status"], r["error"]))
    assert by["probe-not-applicable"] == [("n/a", "not applicable: tbtest-leaky has no such thing")]
    assert [s for s, _ in by["probe-fail"]] == ["failed", "failed"]  # retried once, as configured
    findings = [t for t, _ in build(analyze([load_run(run_dir)])).findings]
    assert not any("not-applicable" in t for t in findings), findings
    logs = sorted(run_dir.glob("cases/tbtest-leaky/*/probe-fail/*/daemon-logs/*.log"))
    assert len(logs) == 2 * 2, logs  # two attempts x two hosts
    for log in logs:
        text = log.read_bytes()
        assert SECRET.encode() not in text and REDACTED in text, text
