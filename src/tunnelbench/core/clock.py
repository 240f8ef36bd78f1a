"""The wall clock, watched. ping -D stamps its replies with the wall clock (CLOCK_REALTIME), so the outage and
reconnect times read off them are wall-clock differences: a step of that clock (NTP, an administrator) between
two stamps would enter the result. A measurement that must use those stamps notes the wall clock's offset from
the monotonic clock at its start and checks it at its end: a step shows as a changed offset."""

from __future__ import annotations

import time
from collections.abc import Callable

# NTP slews at most 500 ppm (adjtimex's limit); anything beyond that, plus the two reads' own spread, is a step
SLEW_PPM = 500
READ_SPREAD_S = 0.005


class WallClockStep(RuntimeError):
    """The wall clock stepped during a measurement that reads wall-clock stamps."""


class WallClockWatch:
    def __init__(
        self, wall: Callable[[], float] | None = None, mono: Callable[[], float] | None = None
    ) -> None:
        # looked up at each read (not bound at import), so a test can step the process's wall clock
        self._wall = wall or (lambda: time.time())
        self._mono = mono or (lambda: time.monotonic())
        self.start_mono = self._mono()
        self.offset = self._wall() - self.start_mono

    def step_s(self) -> float:
        """How far the wall clock moved against the monotonic clock since the start (0 when it did not)."""
        return (self._wall() - self._mono()) - self.offset

    def check(self, what: str) -> None:
        """Raise WallClockStep when the wall clock moved more than a slew could have since the start."""
        step = self.step_s()
        allowed = READ_SPREAD_S + SLEW_PPM * 1e-6 * (self._mono() - self.start_mono)
        if abs(step) > allowed:
            raise WallClockStep(
                f"the wall clock stepped by {step:+.3f} s during {what} (ping's reply stamps are wall-clock "
                "times): its timings are not trusted; measure again with the clock left alone"
            )
