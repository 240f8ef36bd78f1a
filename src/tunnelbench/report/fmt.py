"""Number formatting shared by the terminal and HTML views."""

from __future__ import annotations

import math


def num(v: float | None, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if unit == "ratio":
        return f"{v:.2e}" if 0 < abs(v) < 0.001 else f"{v:.4f}"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def spread(lo: float, hi: float, unit: str = "") -> str:
    return f"{num(lo, unit)}–{num(hi, unit)}"
