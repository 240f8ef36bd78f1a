"""The interference guard (lab/interference.py) on hand-made /proc trees whose answers are worked out by hand
(processes that are the lab's by descent or namespace, kernel threads, a child reaped between samples, a
zombie, a process born between samples, steal time), and on this machine against a planted busy process's own
CPU counters."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tunnelbench.lab.interference import CLK_TCK, PF_KTHREAD, Guard, Reading, cpu_set, parse_stat

OWN = 100  # the guard's "this process"


class FakeProc:
    """A /proc with stat lines, net namespace links and /proc/stat, and a clock the test moves."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc = root / "proc"
        self.proc.mkdir()
        (root / "sys/devices/system/cpu").mkdir(parents=True)
        (root / "sys/devices/system/cpu/online").write_text("0-1\n")
        self.netns = root / "netns"
        self.netns.mkdir()
        (self.netns / "tb-h1").write_text("")
        self.lab_ino = (self.netns / "tb-h1").stat().st_ino
        self.t = 0.0
        self.steal = [0, 0]

    def set(
        self,
        pid: int,
        name: str,
        ppid: int,
        utime: int,
        cutime: int = 0,
        lab: bool = False,
        start: int = 1,
        flags: int = 0,
        policy: int = 0,
    ) -> None:
        d = self.proc / str(pid)
        d.mkdir(exist_ok=True)
        # fields 3.. : state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime
        # cstime priority nice threads itrealvalue starttime ...
        rest = ["S", ppid, 0, 0, 0, 0, flags, 0, 0, 0, 0, utime, 0, cutime, 0, 20, 0, 1, 0, start] + [0] * 30
        rest[38] = policy  # field 41
        (d / "stat").write_text(f"{pid} ({name}) " + " ".join(str(x) for x in rest) + "\n")
        (d / "ns").mkdir(exist_ok=True)
        link = d / "ns" / "net"
        if link.is_symlink():
            link.unlink()
        link.symlink_to(f"net:[{self.lab_ino if lab else 4026531840}]")

    def drop(self, pid: int) -> None:
        shutil.rmtree(self.proc / str(pid))

    def write_stat(self) -> None:
        lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
        for i, st in enumerate(self.steal):
            lines.append(f"cpu{i} 0 0 0 0 0 0 0 {st} 0 0")
        (self.proc / "stat").write_text("\n".join(lines) + "\n")

    def guard(self) -> Guard:
        return Guard(
            lambda: ["tb-h1"],
            cpus=[0, 1],
            proc=self.proc,
            netns_dir=self.netns,
            own_pid=OWN,
            clock=lambda: self.t,
        )


def test_a_reading_counts_only_what_is_outside_the_lab(tmp_path):
    f = FakeProc(tmp_path)
    f.set(1, "init", 0, 10)
    f.set(2, "kthreadd", 0, 999, flags=PF_KTHREAD)
    f.set(OWN, "tunnelbench", 1, 50)
    f.set(101, "iperf3", OWN, 20)  # a child of ours in the root namespace: ours
    f.set(200, "stress", 1, 100)
    f.set(300, "bash", 1, 5)
    f.set(301, "make", 300, 50)
    f.set(400, "wireguard-go", 1, 500, lab=True)  # a daemon in the lab's namespace: ours
    f.set(450, "go-build", 1, 0, policy=5)  # SCHED_IDLE: runs only on a CPU nothing else wants
    f.write_stat()
    g = f.guard()
    m0 = g.mark()
    f.t = 2.0
    f.set(2, "kthreadd", 0, 1999, flags=PF_KTHREAD)  # kernel threads carry the lab's packets: not counted
    f.set(OWN, "tunnelbench", 1, 150)
    f.set(101, "iperf3", OWN, 320)
    f.set(200, "stress", 1, 300)  # +200 ticks
    # make ran 30 more ticks and reaped a 20-tick child of its own, then ended: bash reaped its whole 100
    f.drop(301)
    f.set(300, "bash", 1, 5, cutime=100)
    f.set(400, "wireguard-go", 1, 900, lab=True)
    f.set(450, "go-build", 1, 150, policy=5)
    f.set(500, "cc1", 1, 40, start=5)  # born between the samples
    f.set(700, "nebula", OWN + 1000, 80, lab=True, start=6)  # born in the lab's namespace
    f.steal = [20, 5]  # +25 ticks on the lab's CPUs
    f.write_stat()
    r = g.between(m0, g.mark())
    tick = 1 / CLK_TCK
    # stress 200 + (bash's 100 - make's 50 already seen) + cc1 40 = 290 ticks
    assert r.other_s == pytest.approx(290 * tick)
    assert dict(r.top) == pytest.approx({"stress": 200 * tick, "bash": 50 * tick, "cc1": 40 * tick})
    assert r.steal_s == pytest.approx(25 * tick)
    assert r.wall_s == 2.0 and r.cpus == 2
    assert r.other_pct == pytest.approx(100 * 290 * tick / 4) and r.steal_pct == pytest.approx(
        100 * 25 * tick / 4
    )
    assert r.text().startswith(f"others took {r.other_pct:.0f}% of the lab's 2 CPUs (stress 50%")


def test_a_pods_process_is_the_labs_through_its_shim_and_a_strangers_child_is_not(tmp_path):
    """A Kubernetes pod's iperf3 lives in the pod's own network namespace (the CNI plugin's, not one of the
    lab's names) and its parent, the containerd shim, was re-parented to init but lives in the lab host's
    namespace: the pod's CPU is the lab's. The same tree under a shim outside the lab is "other"."""
    f = FakeProc(tmp_path)
    f.set(1, "init", 0, 10)
    f.set(OWN, "tunnelbench", 1, 50)
    f.set(600, "containerd-shim", 1, 5, lab=True)  # a lab host's shim (ppid 1 after its double fork)
    f.set(601, "pause", 600, 0)  # the pod's sandbox, in the pod's namespace
    f.set(602, "sh", 600, 0)
    f.set(603, "iperf3", 602, 0)  # a grandchild of the shim, in the pod's namespace
    f.set(800, "containerd-shim", 1, 5)  # a shim of this machine's own containerd, outside the lab
    f.set(801, "postgres", 800, 0)
    f.write_stat()
    g = f.guard()
    m0 = g.mark()
    f.t = 2.0
    f.set(603, "iperf3", 602, 300)
    f.set(801, "postgres", 800, 120)
    f.write_stat()
    r = g.between(m0, g.mark())
    # only the stranger's postgres: the pod's 300 ticks are the lab's
    assert r.other_s == pytest.approx(120 / CLK_TCK)
    assert dict(r.top) == pytest.approx({"postgres": 120 / CLK_TCK})


def test_steal_counts_from_the_guards_start_and_one_tick_is_a_tick(tmp_path):
    """The VM's steal counters are cumulative since boot: a reading holds only what was stolen after the
    guard started (here 300 + 40 ticks before it, 20 + 5 after). A process that used a single tick in the
    window is counted."""
    f = FakeProc(tmp_path)
    f.set(1, "init", 0, 10)
    f.set(OWN, "tunnelbench", 1, 50)
    f.set(200, "cron", 1, 7)
    f.steal = [300, 40]
    f.write_stat()
    g = f.guard()
    m0 = g.mark()
    f.t = 1.0
    f.set(200, "cron", 1, 8)
    f.steal = [320, 45]
    f.write_stat()
    m1 = g.mark()
    r = g.between(m0, m1)
    assert r.steal_s == pytest.approx(25 / CLK_TCK) and m1.steal_s == pytest.approx(25 / CLK_TCK)
    assert dict(r.top) == pytest.approx({"cron": 1 / CLK_TCK})


def test_a_process_that_joins_a_lab_namespace_early_is_the_labs_and_late_stays_other(tmp_path):
    """A VPN daemon is started in the root namespace and enters its host's namespace at once (ip netns exec):
    one that is in a lab namespace by its third sample is the lab's. After that the guard stops looking (a
    readlink of every process every second), so one that enters later stays "other"."""
    f = FakeProc(tmp_path)
    f.set(1, "init", 0, 10)
    f.set(OWN, "tunnelbench", 1, 50)
    f.set(300, "early", 1, 0)
    f.set(400, "late", 1, 0)
    f.write_stat()
    g = f.guard()
    g.mark()  # sample 1 of both
    f.t = 1.0
    f.set(300, "early", 1, 0, lab=True)  # in a lab namespace at its 2nd sample
    g.mark()
    f.t = 2.0
    g.mark()  # 400's third sample, still outside
    f.t = 3.0
    f.set(400, "late", 1, 0, lab=True)  # enters after its third sample
    m0 = g.mark()
    f.t = 5.0
    f.set(300, "early", 1, 100, lab=True)
    f.set(400, "late", 1, 60, lab=True)
    r = g.between(m0, g.mark())
    assert dict(r.top) == pytest.approx({"late": 60 / CLK_TCK})


def test_a_zombie_and_a_chain_reaped_in_one_window_are_counted_once(tmp_path):
    f = FakeProc(tmp_path)
    f.set(OWN, "tunnelbench", 1, 0)
    f.set(300, "bash", 1, 0)
    f.set(800, "worker", 300, 500)  # many threads: 500 ticks so far
    f.set(900, "sh", 300, 0)
    f.set(901, "pytest", 900, 2300)
    f.write_stat()
    g = f.guard()
    g.mark()
    f.t = 1.0
    f.set(800, "worker", 300, 100)  # a zombie: its stat shows the leader's time only
    f.write_stat()
    m1 = g.mark()
    f.t = 2.0
    # the worker used 20 ticks more before it ended (520 in all); the subshell reaped pytest (2310 in all),
    # then ended itself, and bash reaped both: 520 + 2310
    f.drop(800)
    f.drop(900)
    f.drop(901)
    f.set(300, "bash", 1, 0, cutime=520 + 2310)
    f.write_stat()
    r = g.between(m1, g.mark())
    tick = 1 / CLK_TCK
    assert r.other_s == pytest.approx(30 * tick), r.top  # 20 (worker) + 10 (pytest), not 2,830


def test_affinity_outside_the_lab_cpus_is_not_counted(tmp_path):
    f = FakeProc(tmp_path)
    f.set(OWN, "tunnelbench", 1, 0)
    f.set(200, "pinned", 1, 0)
    (f.proc / "200" / "status").write_text("Name:\tpinned\nCpus_allowed_list:\t3\n")
    f.set(201, "anywhere", 1, 0)
    (f.proc / "201" / "status").write_text("Name:\tanywhere\nCpus_allowed_list:\t0-3\n")
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-3\n")
    f.write_stat()
    g = f.guard()  # the lab on CPUs 0-1 of 0-3
    m0 = g.mark()
    f.t = 1.0
    f.set(200, "pinned", 1, 100)
    f.set(201, "anywhere", 1, 30)
    f.write_stat()
    r = g.between(m0, g.mark())
    assert dict(r.top) == pytest.approx({"anywhere": 30 / CLK_TCK})


def test_wait_quiet_returns_when_a_window_is_below_the_line(tmp_path):
    f = FakeProc(tmp_path)
    f.set(OWN, "tunnelbench", 1, 0)
    f.set(200, "stress", 1, 0)
    f.write_stat()
    g = f.guard()
    g.mark()
    busy = iter([100, 200, 300, 300, 300])  # stress: busy for three windows, then idle

    def sleep(s: float) -> None:
        f.t += s
        f.set(200, "stress", 1, next(busy))

    quiet, waited = g.wait_quiet(10.0, 30.0, 1.0, sleep=sleep)
    assert quiet and waited == 4.0  # three busy windows, then one quiet one
    busy = iter(range(400, 10_000, 100))
    quiet, waited = g.wait_quiet(10.0, 3.0, 1.0, sleep=sleep)
    assert not quiet and waited == 3.0


def test_a_reading_text_and_json():
    r = Reading(2.0, 2, 1.92, 0.0, (("stress-ng", 1.9), ("chromium", 0.02)))
    assert r.text() == "others took 48% of the lab's 2 CPUs (stress-ng 48%)"  # below 1%: unnamed
    assert r.disturbed(10.0) and not r.disturbed(50.0)
    assert r.to_json()["top"] == [["stress-ng", 47.5], ["chromium", 0.5]]


@pytest.mark.slow  # ~2 s of a planted busy process
def test_a_planted_busy_process_is_counted_as_its_own_counters_say(tmp_path):
    """On this machine: a busy process that is not ours (started through a shell that exits, so it is no
    descendant of this one) is counted with the CPU time its own /proc/PID/stat shows over the window."""
    yes = shutil.which("yes")
    assert yes
    busy = tmp_path / "tbbusyprobe"
    busy.symlink_to(yes)  # comm = the name it was run by: one this test alone uses
    pid = int(
        subprocess.run(
            ["sh", "-c", f"{busy} >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
        ).stdout
    )

    def cpu() -> float:
        f = Path(f"/proc/{pid}/stat").read_text()
        x = f[f.rindex(")") + 2 :].split()
        return (int(x[11]) + int(x[12])) / CLK_TCK

    try:
        g = Guard(cpus=None)
        g.mark()
        c0 = cpu()
        m0 = g.mark()
        time.sleep(1.5)
        m1 = g.mark()
        c1 = cpu()
        r = g.between(m0, m1)
        got = dict(r.top).get("tbbusyprobe", 0.0)
        assert c1 - c0 > 0.05, "the busy process got no CPU"
        # the guard's window lies within the test's reads: at most the few ticks between them apart
        assert c1 - c0 - 0.1 <= got <= c1 - c0 + 0.02, (got, c1 - c0)
        assert os.getppid() != pid
    finally:
        os.kill(pid, 9)


def test_a_stat_line_is_read_by_its_fields_whatever_the_process_calls_itself():
    """proc(5): field 2 is comm in parentheses (it may hold spaces and ')'), then state, ppid (4), ..., flags
    (9), utime/stime (14, 15), cutime/cstime (16, 17), starttime (22), ..., policy (41). A line written by
    hand with each field's number as its value (offset by 1000 so none is 0)."""
    rest = [str(1000 + n) for n in range(4, 53)]  # fields 4..52
    line = "4242 (a) b (c) " + "S " + " ".join(rest)
    st = parse_stat(4242, line)
    assert st is not None and st.name == "a) b (c" and st.ppid == 1004 and st.flags == 1009
    assert (st.own, st.children, st.start, st.policy) == (1014 + 1015, 1016 + 1017, 1022, 1041)
    short = "7 (sh) S " + " ".join(rest[:20])  # an old kernel's line without the scheduling policy
    st = parse_stat(7, short)
    assert st is not None and st.policy == 0 and st.start == 1022
    assert parse_stat(8, "8 sh S 1 2") is None and parse_stat(9, "9 (sh) S x") is None  # no comm, not numbers
    assert cpu_set("0-2,5") == {0, 1, 2, 5} and cpu_set("3") == {3} and cpu_set("\n") == set()


def test_a_reading_in_numbers():
    """2 CPUs for 10 s = 20 CPU-seconds: 5 s of others = 25%, 1 s of steal = 5%."""
    r = Reading(10.0, 2, 5.0, 1.0, (("go", 4.0), ("sh", 0.1)))
    assert (r.other_pct, r.steal_pct, r.taken_pct) == (25.0, 5.0, 30.0)
    assert r.disturbed(30.0) and not r.disturbed(30.1)
    assert r.text() == "others took 25% of the lab's 2 CPUs (go 20%); steal 5%"
    assert r.to_json() == {
        "wall_s": 10.0,
        "cpus": 2,
        "other_pct": 25.0,
        "steal_pct": 5.0,
        "top": [["go", 20.0], ["sh", 0.5]],
    }
    one = Reading(3.0004, 1, 1.0, 0.0)
    assert one.text() == "others took 33% of the lab's 1 CPU" and one.to_json()["wall_s"] == 3.0
    assert one.to_json()["other_pct"] == 33.33
    assert Reading(0.0, 2, 1.0, 0.0).other_pct == 0.0  # no window: nothing taken
