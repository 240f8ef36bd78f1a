"""Numbers in a scenario mean something: a count, a duration, a size, a rate. Hypothesis throws every kind of
number (NaN, the infinities, 1e300, negatives, 2**70) at every number field of the schema, and every scenario
the parser accepts is checked for meaning, not only for the absence of a crash: each number it holds,
in the scenario and in each workload it builds, is finite, not negative (no field of the schema is a signed
quantity) and within the range its field declares."""

from __future__ import annotations

import math
import tomllib
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from tunnelbench.catalog import WORKLOADS
from tunnelbench.core.schema import Strict
from tunnelbench.impair.profiles import Profile
from tunnelbench.lab.spec import LabCfg
from tunnelbench.scenario import CpuCfg, Fairness, ImpairCfg, RunCfg, Scenario, ScenarioError, parse_scenario


def number_fields(model: type[BaseModel]) -> list[str]:
    return [
        name
        for name, f in model.model_fields.items()
        if any(a in (int, float) for a in (f.annotation, *typing.get_args(f.annotation)))
    ]


def held_numbers(obj: Any, where: str = "") -> Iterator[tuple[str, float, Any]]:
    """(field path, value, FieldInfo) for every number an accepted model holds, nested models included."""
    if isinstance(obj, BaseModel):
        for name, f in type(obj).model_fields.items():
            v = getattr(obj, name)
            if isinstance(v, int | float) and not isinstance(v, bool):
                yield f"{where}{name}", v, f
            else:
                yield from held_numbers(v, f"{where}{name}.")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from held_numbers(v, f"{where}{k}.")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from held_numbers(v, f"{where}{i}.")


def within(v: float, f: Any) -> bool:
    """`v` against the bounds its field declares (annotated_types' Ge, Gt, Le, Lt)."""
    checks = {"ge": v.__ge__, "gt": v.__gt__, "le": v.__le__, "lt": v.__lt__}
    return all(checks[k](getattr(m, k)) for m in f.metadata for k in checks if hasattr(m, k))


numbers = st.one_of(
    st.integers(min_value=-1000, max_value=-1),  # a negative value within most fields' magnitude
    st.floats(min_value=-1000, max_value=-1e-9),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(min_value=0, max_value=1e5),
    st.sampled_from([-math.inf, -1e300, 2**63, 2**64 - 1, 0, -0.0, 5e-324]),
)
TABLES = {"run": RunCfg, "lab": LabCfg, "fairness": Fairness, "cpu": CpuCfg, "impair": ImpairCfg}
# every number field a scenario file sets: (table or "workloads" or "profile", workload, field)
FIELDS = [
    *(("workloads", wl, f) for wl in sorted(WORKLOADS) for f in number_fields(WORKLOADS[wl].Params)),
    *((table, "ping", f) for table, model in TABLES.items() for f in number_fields(model)),
    *(("profile", "ping", f) for f in number_fields(Profile)),
]


def scenario_with(where: str, wl: str, field: str, value: Any) -> dict[str, Any]:
    """A valid scenario but for `field` = `value`, in its table, its workload or a user profile."""
    w: dict[str, Any] = {"name": wl}
    data: dict[str, Any] = {"vpns": ["internal"], "workloads": [w]}
    if where == "workloads":
        w[field] = value
    elif where == "profile":
        data["impair"] = {"profiles": {"p": {field: value}}}
        data["profiles"] = ["p"]
    else:
        data[where] = {field: value}
    return data


@pytest.mark.parametrize("where, wl, field", FIELDS, ids=[f"{a}.{b}.{c}" for a, b, c in FIELDS])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=numbers)
@example(value=math.nan)  # the values that slipped through before, tried on every field first
@example(value=math.inf)
@example(value=-1)
@example(value=1e300)
@example(value=2**70)
def test_every_number_of_an_accepted_scenario_is_finite_not_negative_and_in_its_declared_range(
    where, wl, field, value
):
    try:
        sc = parse_scenario(scenario_with(where, wl, field, value), "fuzz.toml")
    except ScenarioError:
        return
    held = list(held_numbers(sc, "scenario."))
    for w, built in zip(sc.workloads, sc.build_workloads(), strict=True):
        held += held_numbers(built.params, f"workloads.{w.name}.")
    assert any(h.endswith(f".{field}") for h, _, _ in held), (field, held)  # the walk reaches it
    for at, v, f in held:
        assert math.isfinite(v), (at, v)
        assert v >= 0, (at, v)  # counts, durations, sizes, rates, percentages: none is signed
        assert within(v, f), (at, v, f.metadata)


@pytest.mark.parametrize(
    "table, said",
    [
        ("[run]\ncase_timeout_s = inf", "run.case_timeout_s: Input should be a finite number"),
        ("[run]\ncase_timeout_s = nan", "run.case_timeout_s: Input should be a finite number"),
        ("[run]\ncase_timeout_s = 1e300", "run.case_timeout_s: Input should be less than or equal to 86400"),
        ("[run]\nseed = 99999999999999999999", "run.seed: Input should be less than or equal to 4294967295"),
        ("[run]\ntarget_ci_pct = nan", "run.target_ci_pct: Input should be a finite number"),
    ],
)
def test_an_infinite_or_unbounded_number_in_the_schema_names_its_field(table, said):
    text = f'vpns = ["internal"]\n[[workloads]]\nname = "ping"\n{table}\n'
    with pytest.raises(ScenarioError) as e:
        parse_scenario(tomllib.loads(text), "s.toml")
    assert said in str(e.value)


def test_a_schema_class_with_an_unbounded_number_is_refused_when_it_is_made():
    with pytest.raises(TypeError, match=r"Loose: number field\(s\) a, c need a lower and an upper bound"):

        class Loose(Strict):
            a: float = Field(1.0, gt=0)
            b: int = Field(1, ge=0, le=2)
            c: int | None = None
            d: bool = False

    class Bounded(Strict):
        a: float = Field(1.0, gt=0, le=5)

    with pytest.raises(ValueError, match="finite number"):
        Bounded(a=math.nan)


def test_every_schema_model_is_strict():
    """The scenario's tables and every workload's parameters share the base: unknown keys refused, NaN and
    infinities refused, bounds declared (a model outside it would skip all three)."""
    models = [Scenario, *TABLES.values(), *(w.Params for w in WORKLOADS.values())]
    assert [m.__name__ for m in models if not issubclass(m, Strict)] == []
