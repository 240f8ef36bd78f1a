"""Runs from before a fact was stored, read with this release's definitions: one adaptor per fact. Every reader
asks the run (analysis/analyze.py: `RunData`); only a run that stored nothing of a fact reaches these, so a
later release that redefines a metric or a driver does not rejudge a run that recorded its own."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from tunnelbench.case_metrics import CASE_METRICS
from tunnelbench.catalog import DRIVERS, WORKLOADS
from tunnelbench.core.metrics import MetricSpec, declared

Specs = Mapping[tuple[str, str], tuple[MetricSpec, int]]


@functools.cache
def legacy_specs() -> Specs:
    """(workload, metric) -> (spec, place among the workload's headline metrics, 0 = not one), as the runner
    stores them (runner/loop.py `_metric_specs`) for every workload of today's catalog; and ("", metric) for
    every declared name, as declared first (core/metrics.py): the runner's own metrics, and a workload's
    metric another workload stored."""
    out: dict[tuple[str, str], tuple[MetricSpec, int]] = {}
    for wl in WORKLOADS.values():
        for m in wl.metrics:
            out[(wl.name, m.name)] = (m, wl.headline.index(m.name) + 1 if m.name in wl.headline else 0)
    for name in [*(m.name for wl in WORKLOADS.values() for m in wl.metrics), *(m.name for m in CASE_METRICS)]:
        out.setdefault(("", name), (declared(name), 0))
    return MappingProxyType(out)


def legacy_capabilities(vpn: str) -> dict[str, Any] | None:
    """What the driver of this name can do today (`VpnDriver.capabilities`): for a run from before each VPN's
    record kept them; None when no driver has the name (a VPN key with a version, a driver since removed)."""
    cls = DRIVERS.get(vpn)
    return cls.capabilities() if cls is not None else None
