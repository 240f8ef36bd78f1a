"""What a case yields: samples and time series of declared metrics, and the artifacts kept beside them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tunnelbench.core.metrics import declared


@dataclass
class Sample:
    name: str
    value: float
    unit: str
    host: str | None = None


@dataclass
class Series:
    name: str
    unit: str
    points: list[tuple[float, float]]  # (seconds since case start, value)
    host: str | None = None


@dataclass
class Outcome:
    samples: list[Sample] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    artifacts: list[Path] = field(default_factory=list)
    measure_s: float = 0.0  # seconds spent measuring (tool running), for the run's time budget

    def add(self, name: str, value: float | None, host: str | None = None) -> None:
        """One sample of a declared metric, in the unit its MetricSpec gives (None: not measured, left out)."""
        if value is not None:
            self.samples.append(Sample(name, float(value), declared(name).unit, host))


class WorkloadError(RuntimeError):
    """A case could not be measured (a tool failed, timed out, printed nothing usable). Raised by workloads and
    by the instruments they drive; `outcome`: what a failing case measured, when it set one (the runner
    stores its metrics)."""

    outcome: Outcome
