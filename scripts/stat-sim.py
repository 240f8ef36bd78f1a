#!/usr/bin/env python3
"""The simulation that chose the run's comparison method (analysis/blocked.py): known effects, injected
drift, the product's own code for each method, counted.

Data: k VPNs x n rounds, value = effect x round drift x noise. Noise: lognormal (CV ~10%), heavy-tailed
(t with 2 df on the log scale), or outliers (10% of values x3). Drift: none; multiplicative (each round x
exp(N(0, 0.3)): a machine that is busier in some rounds); a step (the second half of the rounds at 0.35x, as
a default run on this machine did when a load came); additive (each round +N(0, 0.3) x the mean). Effects:
all equal (the null), one VPN 1.3x or 2x the others, or graded (1, 1.15, 1.3, 1.6, ...).

Counted per method: the family-wise false-positive rate (any pair of equal VPNs separated after Holm, the
null's and the effect's equal pairs alike) and the power (the share of truly different pairs separated).
A method keeps its rate when it stays at or below alpha = 0.05 (within the simulation's error, about
+-0.02 at 400 runs).

    .venv/bin/python scripts/stat-sim.py [--sims 400] [--rounds 6] [--vpns 4] [--seed 1]

Methods: "today" = Mann-Whitney U unpaired + Holm (the product before the change); "model" = the two-way
model alone; "ranks" = Friedman + Conover alone; "product" = the product's choice (analysis/blocked.py:
the model, or ranks when its residuals fail Shapiro-Wilk)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from itertools import combinations

import numpy as np

from tunnelbench.analysis import blocked as B

Method = Callable[[np.ndarray], list[float]]  # k x n values -> Holm p per pair


def _as_groups(y: np.ndarray) -> dict[str, dict[int, float]]:
    return {f"v{i}": {r: float(y[i, r]) for r in range(y.shape[1])} for i in range(y.shape[0])}


def today(y: np.ndarray) -> list[float]:
    return [p.p_holm for p in B.unpaired({k: list(v.values()) for k, v in _as_groups(y).items()}, "").pairs]


def product(y: np.ndarray) -> list[float]:
    return [p.p_holm for p in B.blocked(_as_groups(y)).pairs]


def model(y: np.ndarray) -> list[float]:
    saved = B.NORMALITY_ALPHA
    B.NORMALITY_ALPHA = -1.0  # never the ranks
    try:
        return product(y)
    finally:
        B.NORMALITY_ALPHA = saved


def ranks(y: np.ndarray) -> list[float]:
    p, _ = B.conover(y.T)
    k = y.shape[0]
    return B.holm([float(p[i, j]) for i, j in combinations(range(k), 2)])


METHODS: dict[str, Method] = {"today": today, "model": model, "ranks": ranks, "product": product}


def data(rng: np.random.Generator, mu: list[float], n: int, noise: str, drift: str) -> np.ndarray:
    k = len(mu)
    if noise == "lognormal":
        e = rng.normal(0, 0.1, (k, n))
    elif noise == "heavy":
        e = 0.1 * rng.standard_t(2, (k, n))
    else:  # outliers
        e = rng.normal(0, 0.1, (k, n))
        e[rng.random((k, n)) < 0.1] += np.log(3)
    y = np.asarray(mu)[:, None] * np.exp(e)
    if drift == "mult":
        y = y * np.exp(rng.normal(0, 0.3, n))[None, :]
    elif drift == "step":
        f = np.ones(n)
        f[n // 2 :] = 0.35
        y = y * f[None, :]
    elif drift == "additive":
        base = float(np.mean(mu))
        y = np.maximum(y + (rng.normal(0, 0.3, n) * base)[None, :], 1e-3 * base)
    return y


def count(method: Method, mu: list[float], n: int, noise: str, drift: str, sims: int, seed: int) -> tuple[float, float]:
    """(family-wise false-positive rate, power) of one method in one condition."""
    rng = np.random.default_rng(seed)
    pairs = list(combinations(range(len(mu)), 2))
    differs = np.array([mu[a] != mu[b] for a, b in pairs])
    fw = detected = 0
    for _ in range(sims):
        sig = np.array(method(data(rng, mu, n, noise, drift))) < 0.05
        fw += bool((sig & ~differs).any())
        detected += int((sig & differs).sum())
    return fw / sims, detected / max(1, int(differs.sum()) * sims)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--vpns", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    k, n = a.vpns, a.rounds
    effects = {
        "null": [1.0] * k,
        "1.3x": [1.0] * (k - 1) + [1.3],
        "2x": [1.0] * (k - 1) + [2.0],
        "graded": [1.0, 1.15, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0][:k],
    }
    t0 = time.monotonic()
    print(f"{k} VPNs x {n} rounds, {a.sims} simulated runs per cell, seed {a.seed}; FWER = family-wise false-positive rate under the null; power = share of truly different pairs separated (Holm, alpha 0.05)")
    head = f"| noise | drift | {' | '.join(f'{m} FWER | {m} power 1.3x | {m} power 2x | {m} power graded' for m in METHODS)} |"
    print(head)
    print("|" + "---|" * (2 + 4 * len(METHODS)))
    for noise in ("lognormal", "heavy", "outliers"):
        for drift in ("none", "mult", "step", "additive"):
            cells = []
            for m, f in METHODS.items():
                fw, _ = count(f, effects["null"], n, noise, drift, a.sims, a.seed)
                p13 = count(f, effects["1.3x"], n, noise, drift, a.sims, a.seed)[1]
                p2 = count(f, effects["2x"], n, noise, drift, a.sims, a.seed)[1]
                pg = count(f, effects["graded"], n, noise, drift, a.sims, a.seed)[1]
                cells += [f"{fw:.3f}", f"{p13:.2f}", f"{p2:.2f}", f"{pg:.2f}"]
            print(f"| {noise} | {drift} | {' | '.join(cells)} |", flush=True)
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
