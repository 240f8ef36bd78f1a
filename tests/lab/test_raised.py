"""A machine-wide limit the lab raises (fs.inotify.max_user_instances for hundreds of wireguard-go daemons):
journaled with the value before, before the write; put back when the mesh stops, even when a stop raised, and
by `clean` after a kill; left alone when someone raised it further meanwhile. Against a hand-made /proc/sys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tunnelbench.lab.raised as raised
from tunnelbench.lab.host import Host
from tunnelbench.lab.journal import machine_wide_check, undo_handler
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.mesh import Mesh
from tunnelbench.vpns.wireguard_go import WireguardGo

KEY = "fs.inotify.max_user_instances"


class ListJournal:
    """What a run's journal holds, and the knob's value at the moment each entry was written."""

    def __init__(self, knob: Path):
        self.knob, self.added, self.released = knob, [], []  # type: ignore[var-annotated]

    def add(self, entry: dict[str, Any]) -> dict[str, Any]:
        self.added.append((dict(entry), self.knob.read_text().strip()))
        return entry

    def release(self, entry: dict[str, Any]) -> None:
        self.released.append(dict(entry))


@pytest.fixture
def knob(tmp_path, monkeypatch):
    root = tmp_path / "sys"
    path = root / "fs" / "inotify" / "max_user_instances"
    path.parent.mkdir(parents=True)
    path.write_text("128\n")
    monkeypatch.setattr(raised, "PROC_SYS", root)
    return path


def test_journaled_before_it_is_raised_and_put_back_after(knob):
    j = ListJournal(knob)
    entry = raised.raise_at_least(KEY, 356, j)
    assert knob.read_text() == "356\n"
    # the journal had the value before while the knob still held it: a kill right after the write loses nothing
    assert j.added == [({"kind": "raised_sysctl", "key": KEY, "before": 128, "set": 356}, "128")]
    assert raised.restore(entry, j) == [] and knob.read_text() == "128\n"
    assert j.released == [j.added[0][0]]


def test_high_enough_is_left_alone_and_nothing_journaled(knob):
    knob.write_text("8192\n")
    j = ListJournal(knob)
    assert raised.raise_at_least(KEY, 356, j) is None
    assert knob.read_text() == "8192\n" and j.added == []


def test_a_value_someone_raised_further_stays_theirs(knob):
    j = ListJournal(knob)
    entry = raised.raise_at_least(KEY, 356, j)
    knob.write_text("1024\n")  # another run, or the user, while this one ran
    assert raised.restore(entry, j) == []
    assert knob.read_text() == "1024\n" and len(j.released) == 1


def test_only_the_lab_s_limits_may_be_raised_and_clean_writes_nothing_else(knob):
    with pytest.raises(ValueError, match="not a limit the lab raises"):
        raised.raise_at_least("kernel.panic", 10, None)
    check = machine_wide_check("raised_sysctl")
    assert check is not None
    good = {"kind": "raised_sysctl", "key": KEY, "before": 128, "set": 356}
    assert check(good, "20261129-000000-tbabcd") is None
    assert "not a limit" in str(check({**good, "key": "kernel.panic_on_oops"}, "r"))
    assert "plain integers" in str(check({**good, "before": "128; reboot"}, "r"))
    assert "plain integers" in str(check({**good, "set": True}, "r"))
    # clean's undo of a killed run's entry: the value before, while the knob holds what the run wrote
    undo = undo_handler("raised_sysctl")
    assert undo is not None
    knob.write_text("356\n")
    assert undo(None, good) == f"{KEY} put back to 128"  # type: ignore[arg-type]
    assert knob.read_text() == "128\n"
    assert undo(None, good) is None  # nothing to do twice


class FakeHost(Host):
    def __init__(self, name: str, workdir: Path, journal: ListJournal):
        self.name, self.underlay_ip, self.workdir, self.journal = name, "10.100.1.2", workdir, journal

    def argv(self, argv):  # type: ignore[no-untyped-def]
        return list(argv)


def test_a_wireguard_go_mesh_puts_the_limit_back_when_it_stops_even_if_a_stop_raised(knob, tmp_path):
    j = ListJournal(knob)
    hosts: list[Host] = [FakeHost(f"h{i}", tmp_path / f"h{i}", j) for i in range(1, 101)]
    driver = WireguardGo(MeshSpec(hosts=hosts, tag="tbrais", workdir=tmp_path))
    driver._raise_inotify(len(hosts))  # what configure does before it makes the keys
    assert knob.read_text() == "356\n"  # 100 daemons + 256
    driver._raise_inotify(30 + len(hosts))  # 30 client pods later: raised again, journaled again
    assert knob.read_text() == "386\n" and [a[1] for a in j.added] == ["128", "356"]

    def stop(host: Host) -> None:
        raise RuntimeError("a daemon would not die")

    driver.stop = stop  # type: ignore[method-assign]
    mesh = Mesh(driver)
    with pytest.raises(RuntimeError):
        mesh.stop()
    assert knob.read_text() == "128\n"  # last raise undone first, then the first: the value before the run
    assert len(j.released) == 2 and mesh.layer_leftovers == []


def test_a_small_mesh_leaves_the_limit_alone(knob, tmp_path):
    j = ListJournal(knob)
    hosts: list[Host] = [FakeHost(f"h{i}", tmp_path / f"h{i}", j) for i in range(1, 11)]
    WireguardGo(MeshSpec(hosts=hosts, tag="tbrais", workdir=tmp_path))._raise_inotify(10)
    assert knob.read_text() == "128\n" and j.added == []
