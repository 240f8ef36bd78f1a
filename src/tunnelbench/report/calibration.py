"""`tunnelbench calibrate`'s table: per profile and quantity, the configured value and each backend's measured
one, with the check's detail and verdict."""

from __future__ import annotations

from rich.table import Table

from tunnelbench.impair.calibrate import Calibration
from tunnelbench.impair.profiles import Profile
from tunnelbench.report.fmt import num


def calibration_table(results: list[Calibration], names: list[str], known: dict[str, Profile]) -> Table:
    """One column of measured values per backend, next to the configured value, per profile and quantity."""
    backends = list(dict.fromkeys(c.backend for c in results))
    t = Table(title=f"calibration ({' vs '.join(backends)}), h1 -> h2 over the router", title_justify="left")
    for c in ("profile", "quantity", "configured", *(f"{b} measured" for b in backends), "detail", "ok"):
        t.add_column(c)
    for n in names:
        cals = {c.backend: c for c in results if c.profile == known[n].name or c.profile == n}
        quantities = list(dict.fromkeys(ch.quantity for c in cals.values() for ch in c.checks))
        t.add_section()
        for i, q in enumerate(quantities):
            checks = {
                b: next((ch for ch in cals[b].checks if ch.quantity == q), None)
                for b in backends
                if b in cals
            }
            first = next(ch for ch in checks.values() if ch is not None)
            oks = [
                ("" if ch is None or ch.ok is None else "yes" if ch.ok else "NO") for ch in checks.values()
            ]
            detail = " | ".join(
                f"{b}: {ch.detail}" for b, ch in checks.items() if ch is not None and ch.detail
            )
            t.add_row(
                f"{n}\n{known[n].summary()}" if i == 0 else "",
                f"{q} [{first.unit}]",
                num(first.configured),
                *(num(ch.measured) if ch is not None else "–" for ch in checks.values()),
                detail,
                "/".join(oks),
            )
    return t
