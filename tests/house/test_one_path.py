"""One path per tool (issue 16, item 5): one /proc/PID/stat reader, one list of lab tools, one iperf3 launcher,
one after-stop interface removal. Each shared piece is checked against a reference it did not compute: a
stat line written by hand and psutil, dpkg's own file lists, argv written out by hand."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from tunnelbench.lab import procstat, ssh_host, tools
from tunnelbench.lab.procstat import ProcStat, parse_stat

# -- /proc/PID/stat ----------------------------------------------------------------------------------------
# pid 4242, comm "tb) (x y) z", then fields 3.. : state S, ppid 1, ..., utime 1234 (14), stime 567 (15),
# starttime 998877 (22), rss 321 (24); a comm with ") " in it is the trap for a split at the first ')'
TRAP_LINE = (
    "4242 (tb) (x y) z) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 1 0 998877 10485760 321 "
    "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
)


def test_parse_stat_splits_at_the_last_parenthesis():
    assert parse_stat(TRAP_LINE) == ProcStat(state="S", utime=1234, stime=567, starttime=998877, rss=321)
    assert parse_stat("") is None and parse_stat("4242 (short) S 1 2") is None


def test_starttime_shell_pipeline_reads_the_hand_made_line(tmp_path):
    fake = tmp_path / "proc" / "4242"
    fake.mkdir(parents=True)
    (fake / "stat").write_text(TRAP_LINE)
    sh = procstat.starttime_sh(4242).replace("/proc/", f"{tmp_path}/proc/")
    assert subprocess.run(["sh", "-c", sh], capture_output=True, text=True).stdout.strip() == "998877"


@pytest.fixture
def trap_process():
    """A live process whose comm is the trap (set through /proc/self/comm, at most 15 bytes)."""
    code = "open('/proc/self/comm', 'w').write('a) (b c) d'); import sys; sys.stdin.read()"
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    end = time.monotonic() + 10
    while Path(f"/proc/{p.pid}/comm").read_text().strip() != "a) (b c) d":
        assert time.monotonic() < end, "comm never changed"
        time.sleep(0.01)
    yield p
    p.stdin.close()  # type: ignore[union-attr]
    p.wait(timeout=10)


def test_read_stat_of_a_live_process_agrees_with_psutil(trap_process):
    st = procstat.read_stat(trap_process.pid)
    ref = psutil.Process(trap_process.pid)
    ticks = os.sysconf("SC_CLK_TCK")
    assert st is not None and st.state == "S" and ref.status() == psutil.STATUS_SLEEPING
    # psutil: create_time = boot_time + starttime / CLK_TCK
    assert abs(psutil.boot_time() + st.starttime / ticks - ref.create_time()) < 2 / ticks
    # stat's rss may lag statm's by the per-thread counters not yet folded in: a few pages
    assert st.rss * os.sysconf("SC_PAGE_SIZE") == pytest.approx(ref.memory_info().rss, rel=0.05)
    # the shell reader (used where a remote script must read and act in one step) gives the same start time
    out = subprocess.run(
        ["sh", "-c", procstat.starttime_sh(trap_process.pid)], capture_output=True, text=True
    )
    assert int(out.stdout) == st.starttime
    assert procstat.read_stat(2**22 + 1) is None  # above pid_max: no such process


class StatHost:
    """An SSH host as the stat reader sees it: `cat /proc/PID/stat` answers with a given line."""

    name = "h1"

    def __init__(self, line: str, rc: int = 0):
        self.line, self.rc, self.runs = line, rc, []
        self._starts: dict[int, int | None] = {}

    def run(self, argv, check=True, timeout=None):
        self.runs.append(list(argv))
        return SimpleNamespace(stdout=self.line if self.rc == 0 else "", stderr="", returncode=self.rc)

    def sysconf(self):
        return {"CLK_TCK": 100, "PAGESIZE": 4096}


def test_the_ssh_readers_parse_the_hand_made_line():
    h = StatHost(TRAP_LINE)
    assert ssh_host.SshHost.proc_start(h, 4242) == 998877  # type: ignore[arg-type]
    assert h.runs == [["cat", "/proc/4242/stat"]]
    assert ssh_host.remote_alive(h, 4242, 998877) and ssh_host.remote_alive(h, 4242, None)  # type: ignore[arg-type]
    assert not ssh_host.remote_alive(h, 4242, 998878)  # type: ignore[arg-type]  a reused PID
    assert not ssh_host.remote_alive(StatHost(TRAP_LINE.replace(") S ", ") Z ")), 4242, None)  # type: ignore[arg-type]
    assert not ssh_host.remote_alive(StatHost("", rc=1), 4242, None)  # type: ignore[arg-type]
    h._starts[4242] = 998877
    rp = ssh_host.RemoteProc(h, 4242)  # type: ignore[arg-type]
    ct = rp.cpu_times()
    assert (ct.user, ct.system) == pytest.approx((12.34, 5.67))
    assert rp.memory_info().rss == 321 * 4096
    assert "sed 's/.*) //' /proc/4242/stat" in ssh_host.kill_script(4242, 998877, 15)


# -- the lab's tools -----------------------------------------------------------------------------------
def test_every_list_of_lab_tools_derives_from_the_one_list():
    from conftest import LAB_TOOLS as TEST_TOOLS

    from tunnelbench import doctor
    from tunnelbench.lab import provision
    from tunnelbench.runner import loop as runner

    names = [t.name for t in tools.TOOLS]
    assert len(names) == len(set(names))
    assert runner.LAB_TOOLS == TEST_TOOLS == tools.LAB_TOOLS
    assert runner.LAB_TOOLS == ("ip", "nft", "iperf3", "ping", "fping", "ss", "sysctl", "taskset")
    assert ssh_host.REMOTE_TOOLS == ("ip", "iperf3", "ping", "fping", "ss", "sysctl")
    assert list(doctor.TOOLS) == ["ip", "nft", "iptables", "tc", "iperf3", "ping", "fping", "ss", "ethtool"]
    by_name = {t.name: t for t in tools.TOOLS}
    # every tool an SSH host is checked for comes from a package `install --inventory` puts there
    assert {by_name[t].package for t in ssh_host.REMOTE_TOOLS} <= set(provision.TOOLS_APT.packages)
    assert {by_name[t].package for t in ("ip", "nft", "iptables")} <= set(provision.ROUTER_APT.packages)
    assert provision.TOOLS_APT.packages == (
        "iproute2",
        "iperf3",
        "iputils-ping",
        "fping",
        "procps",
        "python3-minimal",
    )
    assert provision.ROUTER_APT.packages == ("iproute2", "nftables", "iptables")


def _dpkg_owner(tool: str) -> str | None:
    for d in ("/usr/bin", "/usr/sbin", "/bin", "/sbin"):
        r = subprocess.run(["dpkg", "-S", f"{d}/{tool}"], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0]
    return None


@pytest.mark.slow  # 3-4 s: out of the fast lane
def test_each_tools_package_is_the_one_dpkg_says_provides_it():
    checked = 0
    for t in tools.TOOLS:
        owner = _dpkg_owner(t.name)
        if owner is not None:  # installed from a Debian package here
            assert owner == t.package, t.name
            checked += 1
    assert checked >= 5  # the lab's own tools are installed here from Debian packages


# -- iperf3 ----------------------------------------------------------------------------------------------
def test_both_iperf3_launchers_share_server_and_client_lines(tmp_path, monkeypatch):
    from test_parsers_known import FakeClock, make_ctx, result

    from tunnelbench.instruments import iperf3
    from tunnelbench.instruments.common import start_iperf3

    monkeypatch.setattr(iperf3, "time", FakeClock())
    ctx = make_ctx(tmp_path, {"mss": 1200})
    ctx.server.handler = lambda argv, kw: result("LISTEN 0 5 10.9.0.2:5300\n")
    run = start_iperf3(ctx, ctx.client, ctx.server, "10.9.0.2", 5300, ["-R"], 10, "load", omit_s=1, mss=1200)
    (srv,) = ctx.server.spawned
    assert srv.argv == ["iperf3", "-s", "-1", "-p", "5300", "-B", "10.9.0.2"]
    assert srv.label == "iperf3-server-load" and srv.log_path == tmp_path / "load-server.log"
    assert ctx.server.runs[0][0] == ["ss", "-Hltn", "sport = :5300"]
    (cli,) = ctx.client.spawned
    assert cli.argv == ["iperf3", "-c", "10.9.0.2", "-p", "5300", "-J", "-t", "10", "-O", "1", "-M", "1200",
                        "--connect-timeout", "5000", "--logfile", str(tmp_path / "load-client.json"), "-R"]  # fmt: skip
    assert cli.label == "iperf3-client-load" and run.json_path == tmp_path / "load-client.json"
    # a server that never listens is stopped and the error names it
    ctx2 = make_ctx(tmp_path)
    with pytest.raises(Exception, match=r"^iperf3 server on server not listening on :5300 after 5 s$"):
        start_iperf3(ctx2, ctx2.client, ctx2.server, "10.9.0.2", 5300, [], 1, "x")
    assert ctx2.server.spawned[0].stopped == 1 and ctx2.client.spawned == []


def test_wait_listening_names_its_server(monkeypatch):
    from test_parsers_known import FakeClock, FakeHost

    from tunnelbench.instruments import iperf3
    from tunnelbench.instruments.iperf3 import wait_listening

    monkeypatch.setattr(iperf3, "time", FakeClock())
    with pytest.raises(Exception, match=r"^nginx on web not listening on :80 after 2 s$"):
        wait_listening(FakeHost("web"), 80, timeout=2, what="nginx")


# -- after stop: the tunnel interface goes ------------------------------------------------------------------
class LinkHost:
    """A namespace host that records commands; `ip link show X` succeeds for the links in `links`."""

    remote, journal, underlay_ip, workdir = False, None, "10.99.0.1", Path("/nonexistent")

    def __init__(self, name: str, links: set[str]):
        self.name, self.links, self.runs, self.removed = name, links, [], []

    def run(self, argv, check=True, timeout=None, **kw):
        self.runs.append(list(argv))
        rc = 0 if argv[:3] != ["ip", "link", "show"] or argv[3] in self.links else 1
        return SimpleNamespace(stdout="", stderr="", returncode=rc)

    def remove(self, path):
        self.removed.append(str(path))

    def mkdir(self, path, mode=0o700):
        pass


# the drivers whose after_stop is (or starts with) the base class's
LINK_DRIVERS = [
    "easytier",
    "fastd",
    "n2n",
    "nebula",
    "vpncloud",
    "yggdrasil",
    "wireguard",
    "wireguard-go",
    "boringtun",
    "innernet",
    "tinc",
    "vxlan",
]


@pytest.mark.parametrize("name", LINK_DRIVERS)
def test_after_stop_deletes_the_tunnel_interface_only_if_it_is_there(name, tmp_path):
    from tunnelbench.catalog import DRIVERS
    from tunnelbench.vpns.base import MeshSpec

    hosts = [LinkHost("h1", {"tbcf00v1"}), LinkHost("h2", set())]
    d = DRIVERS[name](MeshSpec(hosts=hosts, tag="tbcf00", workdir=tmp_path))  # type: ignore[arg-type]
    for h in hosts:
        d.after_stop(h)  # type: ignore[arg-type]
    assert ["ip", "link", "del", "tbcf00v1"] in hosts[0].runs
    assert ["ip", "link", "show", "tbcf00v2"] in hosts[1].runs
    assert not [r for r in hosts[1].runs if r[:3] == ["ip", "link", "del"]]
    if name == "wireguard":  # the kernel's WireGuard has no wireguard-go UAPI socket to remove
        assert hosts[0].removed == []


# the drivers whose devices are not `ifname`: they name theirs with stop_links and the base class deletes them
# (names written out: openvpn's one tun per peer, SoftEther's vpn_ client device, a kernel tunnel's device per
# peer, kernel-libipsec's ipsec0)
@pytest.mark.parametrize(
    "name, link",
    [("openvpn", "tbcf00v1p2"), ("softether", "vpn_tbcf00v1"), ("gre", "tbcf00k2"), ("strongswan", "ipsec0")],
)
def test_after_stop_deletes_the_devices_the_driver_names(name, link, tmp_path):
    from tunnelbench.catalog import DRIVERS
    from tunnelbench.vpns.base import MeshSpec

    hosts = [LinkHost("h1", {link}), LinkHost("h2", set())]
    d = DRIVERS[name](MeshSpec(hosts=hosts, tag="tbcf00", workdir=tmp_path))  # type: ignore[arg-type]
    for h in hosts:
        d.after_stop(h)  # type: ignore[arg-type]
    assert [r for r in hosts[0].runs if r[:3] == ["ip", "link", "del"]] == [["ip", "link", "del", link]]
    assert not [r for r in hosts[1].runs if r[:3] == ["ip", "link", "del"]]


# -- one unit per metric: the declaration's ----------------------------------------------------------------
def test_outcome_add_takes_the_unit_its_metric_declares():
    from tunnelbench.analysis.analyze import metric_spec
    from tunnelbench.core.metrics import MetricSpec, declare
    from tunnelbench.core.results import Outcome

    out = Outcome()
    out.add("goodput_mbps", 12.5)  # the tcp workload declares it in Mbit/s
    out.add("daemon_cpu_pct", 40, "h1")  # the monitor's (case_metrics.py)
    out.add("engine_cpu_pct", 80, "router")  # the impairment engine's
    out.add("rtt_p99_ms", None)  # not measured: left out
    assert [(s.name, s.unit, s.host) for s in out.samples] == [
        ("goodput_mbps", "Mbit/s", None),
        ("daemon_cpu_pct", "%", "h1"),
        ("engine_cpu_pct", "%", "router"),
    ]
    with pytest.raises(KeyError, match="'tbtest_nobody_declares_this' is not declared"):
        out.add("tbtest_nobody_declares_this", 1.0)
    with pytest.raises(ValueError, match="'goodput_mbps' in 'Gbit/s', declared before in 'Mbit/s'"):
        declare([MetricSpec("goodput_mbps", "Gbit/s", "higher", "a second unit")], "a test")
    # analysis reads the engine's and the monitor's direction from the same declarations
    assert metric_spec("tcp", "engine_cpu_pct")[0] == "lower"
    assert metric_spec("tcp", "machine_cpu_pct")[0] == "none"
