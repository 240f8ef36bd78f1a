"""The base of every file schema (scenario, suite, lab spec, a workload's parameters): unknown fields are
refused, never ignored, and every number is finite and in a declared range.

TOML reads `nan` and `inf` as floats, and a bound such as `gt=0` lets `inf` through; so NaN and the infinities
are refused for every float field (`allow_inf_nan=False`), and a schema class whose number field lacks a lower
or an upper bound is a programming error raised when the class is made (a test imports every schema)."""

from __future__ import annotations

import typing
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo


def _numeric(annotation: Any) -> bool:
    """int or float, alone or with None (bool is not a number here, and containers are checked by their items)."""
    if annotation in (int, float):
        return True
    args = typing.get_args(annotation)
    return typing.get_origin(annotation) in (typing.Union, _UnionType) and any(
        a in (int, float) for a in args
    )


_UnionType = type(int | None)


def bounds(field: FieldInfo) -> tuple[Any, Any]:
    """A field's declared (lower, upper) constraint objects (annotated_types Ge/Gt, Le/Lt), None where absent."""
    lo = next((m for m in field.metadata if isinstance(m, Ge | Gt)), None)
    hi = next((m for m in field.metadata if isinstance(m, Le | Lt)), None)
    return lo, hi


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        loose = [name for name, f in cls.model_fields.items() if _numeric(f.annotation) and None in bounds(f)]
        if loose:
            raise TypeError(
                f"{cls.__qualname__}: number field(s) {', '.join(loose)} need a lower and an upper bound "
                "(Field(ge=..., le=...)): an unbounded number lets a typo or 1e300 through to the run"
            )
