"""The router's drops per VPN session (security/drops.py), on a fake lab whose counters are set by hand: each
session's growth goes to its VPN, a VPN's sessions add up, the run's total includes what an earlier process
of a resumed run counted, and a counter the lab does not keep (-1: SSH has no `offlab`) is left out."""

from __future__ import annotations

from tunnelbench.security.drops import DropLedger


class FakeLab:
    def __init__(self) -> None:
        self.c = {"offlab": 0, "tunnel_leak": 0}
        self.dests: dict[str, int] = {}

    def offlab_drops(self, counter: str = "offlab") -> int:
        return self.c[counter]

    def offlab_destinations(self) -> dict[str, int]:
        return dict(self.dests)


def test_each_session_s_growth_goes_to_its_vpn_and_the_shares_add_up():
    lab, d = FakeLab(), DropLedger()
    lab.c = {"offlab": 10, "tunnel_leak": 1}  # before the first session: not anybody's
    d.begin(lab)  # type: ignore[arg-type]
    lab.c = {"offlab": 15, "tunnel_leak": 3}
    lab.dests = {"8.8.8.8": 4}
    assert d.attribute(lab, "a") == {  # type: ignore[arg-type]
        "offlab_drops.a": 5, "tunnel_leak_drops.a": 2, "offlab_dests.a": {"8.8.8.8": 4}}  # fmt: skip
    d.begin(lab)  # type: ignore[arg-type]
    lab.c = {"offlab": 16, "tunnel_leak": 3}
    assert d.attribute(lab, "b") == {"offlab_drops.b": 1, "tunnel_leak_drops.b": 0}  # type: ignore[arg-type]
    d.begin(lab)  # type: ignore[arg-type]  # a's second session
    lab.c = {"offlab": 20, "tunnel_leak": 3}
    lab.dests = {"8.8.8.8": 4, "1.1.1.1": 2}
    got = d.attribute(lab, "a")  # type: ignore[arg-type]
    assert got["offlab_drops.a"] == 9 and got["offlab_dests.a"] == {"8.8.8.8": 4, "1.1.1.1": 2}
    assert d.attribute(lab, "a") == {}  # type: ignore[arg-type]  # no session open: nothing attributed twice
    assert d.totals(lab) == {"router.offlab_drops": 20, "router.tunnel_leak_drops": 3}  # type: ignore[arg-type]


def test_a_resumed_run_keeps_earlier_shares_and_counts_them_in_the_total():
    env = {"offlab_drops.a": "7", "tunnel_leak_drops.a": "1", "router.offlab_drops": "9",
           "offlab_dests.a": '{"8.8.8.8": 7}'}  # fmt: skip
    lab, d = FakeLab(), DropLedger()
    d.resume(env)
    d.begin(lab)  # type: ignore[arg-type]  # the new process's lab counts from 0
    lab.c = {"offlab": 3, "tunnel_leak": -1}  # -1: a counter this lab does not keep
    assert d.attribute(lab, "a") == {  # type: ignore[arg-type]
        "offlab_drops.a": 10, "tunnel_leak_drops.a": 1, "offlab_dests.a": {"8.8.8.8": 7}}  # fmt: skip
    # the stored total (9) stands for the earlier process; a killed one stored none: its shares (1) stand
    assert d.totals(lab) == {"router.offlab_drops": 12, "router.tunnel_leak_drops": -1}  # type: ignore[arg-type]
    d2 = DropLedger()
    d2.resume({"tunnel_leak_drops.a": "1"})
    assert d2.base == {"offlab": 0, "tunnel_leak": 1}
