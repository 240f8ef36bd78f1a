"""Impairment on real (SSH) hosts without a lab: the commands the backends send through the Host API.

The kernel here has no netem or prio qdisc, so the egress placement and netem on a router host are checked
by the commands they issue (the SSH lab test exercises the native engine on a router host for real)."""

from __future__ import annotations

from pathlib import Path

from tunnelbench.impair.backend import (
    NETEM_PER_WIRE,
    NETEM_WHOLE,
    EgressNetemBackend,
    NativeBackend,
    NetemBackend,
)
from tunnelbench.impair.profiles import Profile
from tunnelbench.lab.host import Result


class FakeJournal:
    def __init__(self):
        self.open: list[dict] = []

    def add(self, e: dict) -> dict:
        self.open.append(e)
        return e

    def release(self, e: dict) -> None:
        self.open.remove(e)


class FakeHost:
    remote = True

    def __init__(self, name: str, ip: str, dev: str = "eth0"):
        self.name, self.underlay_ip, self.underlay_if = name, ip, dev
        self.workdir = Path(f"/var/tmp/tunnelbench/r/{name}")
        self.journal = FakeJournal()
        self.cmds: list[list[str]] = []
        self.root = "qdisc mq 0: root"

    def run(self, argv, **kw) -> Result:
        argv = list(argv)
        self.cmds.append(argv)
        out = ""
        if argv[:3] == ["tc", "qdisc", "replace"] and "prio" in argv:
            self.root = "qdisc prio 7462: root refcnt 2 bands 4"
        elif argv[:3] == ["tc", "qdisc", "show"]:
            out = self.root
        elif argv[:3] == ["tc", "qdisc", "del"]:
            self.root = "qdisc mq 0: root"
        elif argv[:4] == ["ip", "-o", "link", "show"]:
            out = f"2: {argv[-1]}: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc mq state UP mode DEFAULT"
        return Result(argv, 0, out, "", 0.0)


def test_egress_netem_impairs_only_what_each_peer_sends_to_the_others():
    hosts = [FakeHost("h1", "192.0.2.1"), FakeHost("h2", "192.0.2.2", "enp1s0"), FakeHost("h3", "192.0.2.3")]
    be = EgressNetemBackend(hosts, Path("/tmp/x"))  # type: ignore[arg-type]
    be.apply(Profile(name="d5", delay_ms=5))
    h1 = hosts[0].cmds
    assert h1[0][:9] == ["tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "7462:", "prio"]
    # delay only: netem takes GSO super-packets whole (as the native engine's "gso" mode)
    assert h1[1] == ["tc", "qdisc", "add", "dev", "eth0", "parent", "7462:4", "handle", "7463:"] + [
        "netem",
        "delay",
        "5.0ms",
    ]
    dsts = [c[c.index("dst") + 1] for c in h1 if c[:3] == ["tc", "filter", "add"]]
    assert dsts == ["192.0.2.2/32", "192.0.2.3/32"]  # never its own address, never all traffic
    assert hosts[1].cmds[0][4] == "enp1s0"
    assert all(len(h.journal.open) == 1 and h.journal.open[0]["kind"] == "qdisc" for h in hosts)
    be.clear()
    assert all(
        h.journal.open == [] and ["tc", "qdisc", "del", "dev", h.underlay_if, "root"] in h.cmds for h in hosts
    )
    # a pair profile impairs only that pair, both ways
    for h in hosts:
        h.cmds.clear()
    be.apply(Profile(name="p", delay_ms=5, pairs=[("h1", "h3")]))
    assert not any(c[:3] == ["tc", "filter", "add"] for c in hosts[1].cmds)
    assert [c[c.index("dst") + 1] for c in hosts[2].cmds if c[:3] == ["tc", "filter", "add"]] == [
        "192.0.2.1/32"
    ]
    be.clear()


def test_netem_decides_per_wire_packet_where_the_profile_does():
    """Under loss (a per-wire decision) netem goes under a TBF whose largest packet is one wire packet (MTU 1500
    + 14): tbf_enqueue segments GSO super-packets and netem draws per segment. netem's queue counts wire packets
    (25 Gbit/s x (2 x 5 ms + 20 ms)). With a rate, that TBF is the rate limit (tbf_args) and a 1000gbit peak
    rate over a one-packet bucket sets its max size; netem's own rate is left out. gso = "segment" segments a
    delay-only profile too."""
    hosts = [FakeHost("h1", "192.0.2.1"), FakeHost("h2", "192.0.2.2")]
    be = EgressNetemBackend(hosts, Path("/tmp/x"))  # type: ignore[arg-type]
    loss = Profile(name="l", delay_ms=5, loss_pct=1)
    assert be.netem_mode(loss) == NETEM_PER_WIRE
    be.apply(loss)
    h1 = hosts[0].cmds
    assert h1[0] == ["ip", "-o", "link", "show", "dev", "eth0"]
    assert h1[2][:9] == ["tc", "qdisc", "add", "dev", "eth0", "parent", "7462:4", "handle", "7463:"]
    assert h1[2][9:] == ["tbf", "rate", "1000gbit", "burst", "1514", "limit", "1514000"]
    netem = ["netem", "limit", "61922", "delay", "5.0ms", "loss", "random", "1.0%"]
    assert h1[3] == ["tc", "qdisc", "add", "dev", "eth0", "parent", "7463:1", *netem]
    be.clear()
    hosts[0].cmds.clear()
    be.apply(Profile(name="r", rate_mbit=20, delay_ms=5, loss_pct=1))
    rate = ["tbf", "rate", "20.0mbit", "burst", "32000", "limit", "75000"]
    assert h1[2][9:] == [*rate, "peakrate", "1000gbit", "mtu", "1514"]
    assert h1[3][7:] == ["netem", "limit", "1000", "delay", "5.0ms", "loss", "random", "1.0%"]  # no `rate`
    be.clear()
    delay = Profile(name="d", delay_ms=5)
    assert be.netem_mode(delay) == NETEM_WHOLE and be.netem_mode(Profile(name="b")) is None
    be.gso_mode = "segment"
    assert be.netem_mode(delay) == NETEM_PER_WIRE
    router = FakeHost("router", "192.0.2.254")
    router.remote = False  # the namespace lab's router: a root TBF, netem under it
    rb = NetemBackend(router, hosts, Path("/tmp/x"))  # type: ignore[arg-type]
    rb.apply(loss)
    roots = [c for c in router.cmds if c[:3] == ["tc", "qdisc", "replace"]]
    assert roots[0][:9] == ["tc", "qdisc", "replace", "dev", "h1", "root", "handle", "7463:", "tbf"]
    assert ["tc", "qdisc", "add", "dev", "h1", "parent", "7463:1", *netem] in router.cmds


def test_router_netem_on_a_remote_router_steers_peer_packets_only_and_shares_an_interface():
    router = FakeHost("router", "192.0.2.254")
    peers = [FakeHost("h1", "192.0.2.1"), FakeHost("h2", "192.0.2.2")]
    be = NetemBackend(router, peers, Path("/tmp/x"), {"h1": "eth1", "h2": "eth1"})  # type: ignore[arg-type]
    be.apply(Profile(name="d5", delay_ms=5, loss_pct=1))
    roots = [c for c in router.cmds if c[:3] == ["tc", "qdisc", "replace"]]
    assert len(roots) == 1  # one prio root on the shared interface, both peers' filters under it
    filters = [c for c in router.cmds if c[:3] == ["tc", "filter", "add"]]
    assert [(c[c.index("src") + 1], c[c.index("dst") + 1]) for c in filters] == [
        ("192.0.2.2/32", "192.0.2.1/32"),
        ("192.0.2.1/32", "192.0.2.2/32"),
    ]
    be.clear()
    assert router.journal.open == []
    # someone else's root qdisc is never deleted
    router.root = "qdisc fq_codel 8001: root"
    router.cmds.clear()
    from tunnelbench.impair.backend import clear_filtered_root

    assert not clear_filtered_root(router, "eth1")  # type: ignore[arg-type]
    assert not any(c[:3] == ["tc", "qdisc", "del"] for c in router.cmds)


def test_native_engine_rules_on_a_remote_router_use_peer_addresses():
    router = FakeHost("router", "192.0.2.254")
    peers = [FakeHost("h1", "192.0.2.1"), FakeHost("h2", "192.0.2.2")]
    be = NativeBackend(
        router, peers, Path("/var/tmp/x"), Path("/var/tmp/x/impaird"), chain="TB_IMPAIR_tb1234"
    )  # type: ignore[arg-type]
    rules = be.rules(Profile(name="d5", delay_ms=5))
    assert [(r["src"], r["dst"]) for r in rules] == [
        ("0.0.0.0/0", "192.0.2.1/32"),
        ("0.0.0.0/0", "192.0.2.2/32"),
    ]
    rules = be.rules(Profile(name="p", delay_ms=5, pairs=[("h1", "h2")]))
    assert [(r["src"], r["dst"]) for r in rules] == [
        ("192.0.2.1/32", "192.0.2.2/32"),
        ("192.0.2.2/32", "192.0.2.1/32"),
    ]
