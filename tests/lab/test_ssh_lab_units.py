"""The SSH lab's build without SSH: fake hosts stand in for the machines. Reference: a barrier the fake
connections must all reach together (a serial build never gets the second host to it)."""

from __future__ import annotations

import threading
from pathlib import PurePosixPath

import pytest

from tunnelbench.lab.ssh_lab import SshLab


class FakeJournal:
    def __init__(self) -> None:
        self.entries: list[dict] = []
        self.lock = threading.Lock()

    def add(self, e: dict) -> dict:
        with self.lock:
            self.entries.append(e)
        return e


class FakeHost:
    def __init__(self, name: str, barrier: threading.Barrier, missing: tuple[str, ...] = ()):
        self.name, self.barrier, self.missing = name, barrier, missing
        self.workdir = PurePosixPath(f"/var/tmp/tunnelbench/run/{name}")
        self.journal = FakeJournal()
        self.inv = type(
            "Inv",
            (),
            {"describe": lambda _self: f"{name} (root@192.0.2.1:22)", "workdir_root": "/var/tmp/tunnelbench"},
        )()
        self.made: list[str] = []

    def connect(self) -> None:
        self.barrier.wait()  # raises BrokenBarrierError unless every host connects at the same time

    def which(self, tools) -> dict[str, str | None]:
        return {t: (None if t in self.missing else f"/usr/bin/{t}") for t in tools}

    def make_workdir(self) -> None:
        self.made.append(str(self.workdir))

    def run(self, argv, **_kw):
        if argv[:2] == ["sh", "-c"] and "TB-TAKEN" in argv[2]:  # the host's lock: free
            return type("R", (), {"stdout": "TB-TAKEN\n"})()
        return type("R", (), {"stdout": "1: lo: <LOOPBACK>\n2: eth0: <UP>\n"})()


RUN = "20261128-000000-tbunit"


def lab_of(hosts: list[FakeHost]) -> SshLab:
    lab = SshLab.__new__(SshLab)
    lab.hosts, lab.router, lab.relays, lab.control = hosts, None, [], None  # type: ignore[assignment]
    lab._entries, lab.tag = {}, "tbunit"
    lab.journal = type("J", (), {"run_id": RUN})()  # type: ignore[assignment]
    return lab


def test_every_host_is_connected_and_prepared_at_once():
    barrier = threading.Barrier(4, timeout=10)
    hosts = [FakeHost(f"h{i}", barrier) for i in range(1, 5)]
    lab = lab_of(hosts)
    lab.build_hosts()
    for h in hosts:
        assert h.made == [str(h.workdir)] and h.preexisting_links == frozenset({"lo", "eth0"})
        assert h.journal.entries == [
            {"kind": "remote_dir", "path": str(h.workdir)},
            {"kind": "ssh_lab_lock", "path": "/var/tmp/tunnelbench/lab.lock", "run_id": RUN},
            {"kind": "link_prefix", "prefix": "tbunit"},
        ]


def test_a_host_missing_tools_stops_the_build_naming_it():
    barrier = threading.Barrier(2, timeout=10)
    hosts = [FakeHost("h1", barrier), FakeHost("h2", barrier, missing=("iperf3",))]
    with pytest.raises(RuntimeError, match=r"h2 \(h2 \(root@192.0.2.1:22\)\) is missing iperf3"):
        lab_of(hosts).build_hosts()
    assert all(not h.made for h in hosts)  # nothing made on any host before every host passed
