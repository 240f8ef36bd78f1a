"""Every number parameter of every workload refuses what no run can mean: -1, 0 where the field's lower bound
excludes it, NaN, the infinities and a huge value, each with an error naming the field (in the scenario's
words: workloads[0].<field>). A planted bug found the gap this closes: with udp's, streaming's and crr's
duration bounds removed, the fuzzers still passed, as they only checked that nothing crashed."""

from __future__ import annotations

import math
import typing

import pytest

from tunnelbench.catalog import WORKLOADS
from tunnelbench.scenario import ScenarioError, parse_scenario


def number_fields() -> list[tuple[str, str]]:
    return [
        (wl, name)
        for wl, cls in sorted(WORKLOADS.items())
        for name, f in cls.Params.model_fields.items()
        if any(a in (int, float) for a in (f.annotation, *typing.get_args(f.annotation)))
    ]


def refused_values(wl: str, field: str) -> list[object]:
    """-1, 0 where the field's declared lower bound excludes it, NaN, the infinities, huge values."""
    meta = WORKLOADS[wl].Params.model_fields[field].metadata
    zero_invalid = any(getattr(m, "gt", None) == 0 or (getattr(m, "ge", None) or 0) > 0 for m in meta)
    return [-1, *([0] if zero_invalid else []), math.nan, math.inf, -math.inf, 1e300, 2**70]


CASES = [(wl, field, v) for wl, field in number_fields() for v in refused_values(wl, field)]


def test_the_table_covers_the_durations_a_planted_bug_slipped_through():
    fields = set(number_fields())
    assert {("udp", "duration_s"), ("streaming", "duration_s"), ("crr", "duration_s")} <= fields
    assert len(fields) >= 80, len(fields)  # every workload's numbers, not a sample


@pytest.mark.parametrize("wl, field, value", CASES, ids=[f"{w}.{f}={v!r}" for w, f, v in CASES])
def test_a_number_no_run_can_mean_is_refused_naming_the_field(wl, field, value):
    with pytest.raises(ScenarioError) as e:
        parse_scenario({"vpns": ["internal"], "workloads": [{"name": wl, field: value}]}, "s.toml")
    assert f"workloads[0].{field}:" in str(e.value), str(e.value)
