"""The wall-clock watch (core/clock.py) against a hand-driven pair of clocks."""

from __future__ import annotations

import pytest

from tunnelbench.core.clock import WallClockStep, WallClockWatch


class Clocks:
    def __init__(self) -> None:
        self.mono, self.wall = 100.0, 1_700_000_000.0

    def advance(self, s: float, wall_extra: float = 0.0) -> None:
        self.mono += s
        self.wall += s + wall_extra


def test_a_step_is_named_with_its_size_and_a_slew_or_no_change_passes():
    c = Clocks()
    w = WallClockWatch(lambda: c.wall, lambda: c.mono)
    c.advance(60, wall_extra=0.025)  # 417 ppm over a minute: NTP's slew can do that
    w.check("a minute of slewing")
    assert w.step_s() == pytest.approx(0.025, abs=1e-6)
    c.advance(1, wall_extra=-2.0)  # an administrator set the clock back 2 s
    with pytest.raises(WallClockStep, match=r"stepped by -1\.975 s during the test"):
        w.check("the test")


def test_a_small_step_early_is_caught_where_a_long_slew_allowance_would_hide_it():
    c = Clocks()
    w = WallClockWatch(lambda: c.wall, lambda: c.mono)
    c.advance(2, wall_extra=0.05)  # 50 ms in 2 s: 25,000 ppm, a step
    with pytest.raises(WallClockStep):
        w.check("two seconds")
