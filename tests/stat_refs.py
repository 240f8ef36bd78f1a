"""References the tests compute with scipy, never with the product's code: one definition each."""

from __future__ import annotations

import numpy as np
import scipy.stats as sst

from tunnelbench.analysis.stats import N_RESAMPLES, SEED


def ratio_ref(x: list[float], base: list[float]) -> tuple[float, float, float]:
    """median(x) / median(base) and scipy's percentile interval, both samples resampled independently (the
    product's seed and resample count: the same resamples)."""

    def stat(a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
        return np.median(a, axis=axis) / np.median(b, axis=axis)

    r = sst.bootstrap(
        (np.asarray(x), np.asarray(base)),
        stat,
        paired=False,
        method="percentile",
        n_resamples=N_RESAMPLES,
        rng=np.random.default_rng(SEED),
    )
    ci = r.confidence_interval
    return float(np.median(x) / np.median(base)), float(ci.low), float(ci.high)
