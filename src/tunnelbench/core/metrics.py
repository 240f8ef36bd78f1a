"""A metric's declaration (name with its unit, direction, description) and the registry of every declared
metric: one name has one unit in the store, the report and the CSV."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class MetricSpec:
    name: str  # one name everywhere: store, report, CSV; the unit is in the name
    unit: str
    better: Literal["higher", "lower", "none"]
    description: str


# every metric a case can store, by name: each workload's `metrics` (declared when its class is made) and
# the runner's own (case_metrics.py); one name has one unit everywhere
_DECLARED: dict[str, MetricSpec] = {}


def declare(specs: Iterable[MetricSpec], owner: str) -> None:
    """Declare metrics; a name declared again must keep its unit (store, report and CSV show one unit)."""
    for m in specs:
        prior = _DECLARED.setdefault(m.name, m)
        if prior.unit != m.unit:
            raise ValueError(f"{owner}: metric {m.name!r} in {m.unit!r}, declared before in {prior.unit!r}")


def declared(name: str) -> MetricSpec:
    """The declaration of a metric; KeyError naming the fix when nothing declares it."""
    if name not in _DECLARED:  # the workloads declare theirs when imported (tunnelbench.catalog imports all)
        raise KeyError(f"metric {name!r} is not declared: add a MetricSpec to its workload's `metrics`")
    return _DECLARED[name]
