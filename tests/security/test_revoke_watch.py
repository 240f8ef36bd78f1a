"""How the revoke workload reads its probe (workloads/revoke.py, Revoke._watch), on a fake clock and a probe
whose echo replies are written here: the last reply after the revoke call, None only when none came after
it, and the first reply past the cap as soon as one comes (the case then fails as "still reachable")."""

from __future__ import annotations

import pytest

from tunnelbench.workloads import revoke as rv

T_CALL, T_RET = 1000.0, 1000.2  # the revoke call and its return (time.time())


class Clock:
    def __init__(self) -> None:
        self.now = T_RET

    def time(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class Probe:
    """Echo replies at the given wall-clock times, each seen once the clock has passed it."""

    def __init__(self, clock: Clock, stamps: list[float]) -> None:
        self.clock, self.stamps = clock, stamps

    def replies(self) -> list[float]:
        return [ts for ts in self.stamps if ts <= self.clock.now]


@pytest.mark.parametrize(
    ("stamps", "want"),
    [
        ([T_CALL - 0.5, T_CALL - 0.1], None),  # cut off before the call returned: no reply after it
        ([T_CALL - 0.1, T_CALL + 0.1, T_RET + 0.3, T_RET + 0.6], T_RET + 0.6),  # the last one after the call
        ([T_CALL - 0.1, *(T_RET + 0.5 * k for k in range(40))], T_RET + 10.5),  # the first one past the cap
    ],
    ids=["none-after-the-call", "last-after-the-call", "past-the-cap"],
)
def test_watch_returns_the_last_reply_after_the_call(monkeypatch, stamps, want):
    clock = Clock()
    monkeypatch.setattr(rv, "time", clock)
    wl = rv.Revoke(rv.RevokeParams(cap_s=10, quiet_s=3))
    got = wl._watch(Probe(clock, stamps), T_CALL, T_RET)  # type: ignore[arg-type]
    assert got == (None if want is None else pytest.approx(want)), got
    # it waited for quiet_s of silence after the last reply (or the return), not longer than one poll
    if want is None:
        assert T_RET + 3 <= clock.now < T_RET + 3 + 0.06
    elif want - T_RET <= 10:
        assert want + 3 <= clock.now < want + 3 + 0.06
