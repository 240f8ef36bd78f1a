from __future__ import annotations

import time
from pathlib import Path

import pytest

from tunnelbench.lab.addressing import host_ip, router_ip
from tunnelbench.lab.journal import read_open_entries
from tunnelbench.lab.netns import netns_exists

pytestmark = pytest.mark.lab


def test_hosts_reach_each_other_through_router(lab_factory):
    lab = lab_factory(3)
    h1, h2, h3 = lab.hosts
    assert h1.run(["ping", "-c1", "-W2", h3.underlay_ip]).returncode == 0
    # the path crosses the router: TTL drops by one
    out = h1.run(["ping", "-c1", "-W2", h2.underlay_ip]).stdout
    assert "ttl=63" in out
    assert h1.underlay_ip == host_ip(1) and router_ip(1) == "10.100.1.1"


def test_router_drops_and_counts_offlab_traffic(lab_factory):
    lab = lab_factory(2)
    before = lab.offlab_drops()
    # 192.0.2.1 is TEST-NET-1; it never leaves the router namespace (no uplink) and must be counted
    lab.hosts[0].run(["ping", "-c2", "-i0.05", "-W1", "192.0.2.1"], check=False)
    assert lab.offlab_drops() >= before + 2


def test_destroy_leaves_nothing_and_releases_journal(lab_factory):
    lab = lab_factory(2)
    p = lab.hosts[0].spawn(["sleep", "300"], label="sleeper", log_path=None)
    names = [h.netns for h in [*lab.hosts, lab.router]]
    assert all(netns_exists(n) for n in names)
    assert lab.destroy() == []
    assert not any(netns_exists(n) for n in names)
    assert not p.alive()
    open_kinds = {e["kind"] for e in read_open_entries(lab.journal.path)}
    assert "netns" not in open_kinds


def test_a_process_log_is_readable_by_root_only(lab_factory, tmp_path):
    """A daemon's log may hold its secrets: the file spawn writes to is 0600 (os.stat, not the product's word),
    and the output lands in it."""
    lab = lab_factory(2)
    log = tmp_path / "logs" / "d.log"
    p = lab.hosts[0].spawn(["sh", "-c", "echo secret-in-log"], label="talker", log_path=log)
    p.wait(10)
    assert log.stat().st_mode & 0o777 == 0o600
    assert "secret-in-log" in log.read_text()


def test_a_daemon_that_ignores_sigterm_is_killed_and_one_that_survives_stays_in_the_journal(lab_factory):
    """stop() ends a process that ignores SIGTERM with SIGKILL (its /proc entry gone, the kernel's word) and
    releases its journal entry; a process still alive after SIGKILL (here: alive() held true, as for one stuck
    in the kernel) keeps its entry, so the leftover check and `tunnelbench clean` still see it."""
    lab = lab_factory(2)
    h = lab.hosts[0]
    p = h.spawn(["sh", "-c", "trap '' TERM; exec sleep 300"], label="deaf", log_path=None)
    time.sleep(0.2)  # the trap is set before exec
    pid = p.pid
    t0 = time.monotonic()
    assert p.stop(grace=0.5) is True
    assert time.monotonic() - t0 >= 0.5  # SIGTERM was ignored for the whole grace, SIGKILL ended it
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    assert all(e.get("pid") != pid for e in read_open_entries(lab.journal.path))

    q = h.spawn(["sleep", "300"], label="stuck", log_path=None)
    real_alive = q.alive
    q.alive = lambda: True  # type: ignore[method-assign]
    assert q.stop(grace=0.1) is False
    assert any(e.get("pid") == q.pid for e in read_open_entries(lab.journal.path))
    q.alive = real_alive  # type: ignore[method-assign]
    assert q.stop(grace=1) is True
    assert all(e.get("pid") != q.pid for e in read_open_entries(lab.journal.path))
