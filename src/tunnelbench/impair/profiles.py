"""Impairment profiles (netem's vocabulary, in ms and percent) and the built-in library.

A profile impairs every underlay packet the router forwards between selected hosts, once per direction:
the same as netem on every host's egress, as the seeds did. `delay_ms` is therefore one-way; a ping over
a profile with delay D sees an RTT of 2 D plus the base RTT. `hosts` limits it to packets to or from the
named hosts (one lossy edge site); `pairs` to packets between named host pairs."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

Pct = Field(0.0, ge=0, le=100)


class GilbertElliott(BaseModel):
    """netem `loss gemodel p r 1-h 1-k`: p = good->bad, r = bad->good, loss 1-h in bad, 1-k in good (percent)."""

    model_config = ConfigDict(extra="forbid")
    p_pct: float = Field(ge=0, le=100)
    r_pct: float = Field(100.0, ge=0, le=100)
    bad_loss_pct: float = Field(100.0, ge=0, le=100, description="1-h")
    good_loss_pct: float = Field(0.0, ge=0, le=100, description="1-k")

    def expected_loss(self) -> float:
        p, r = self.p_pct / 100, self.r_pct / 100
        if p + r == 0:
            return self.good_loss_pct / 100
        pi_bad = p / (p + r)
        return pi_bad * self.bad_loss_pct / 100 + (1 - pi_bad) * self.good_loss_pct / 100

    def expected_burst(self) -> float | None:
        """Mean run of consecutive losses when only the bad state loses everything (h = 0, k = 1)."""
        if self.bad_loss_pct == 100 and self.good_loss_pct == 0 and self.r_pct > 0:
            return 100 / self.r_pct
        return None

    def burst_sd(self) -> float | None:
        """Standard deviation of that run length: geometric with success probability r, sqrt(1 - r) / r."""
        if self.expected_burst() is None:
            return None
        r = self.r_pct / 100
        return math.sqrt(1 - r) / r


class FourState(BaseModel):
    """netem `loss state p13 p31 p32 p23 p14` (percent)."""

    model_config = ConfigDict(extra="forbid")
    p13: float = Field(ge=0, le=100)
    p31: float = Field(100.0, ge=0, le=100)
    p32: float = Field(0.0, ge=0, le=100)
    p23: float = Field(100.0, ge=0, le=100)
    p14: float = Field(0.0, ge=0, le=100)


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = ""
    description: str = ""
    delay_ms: float = Field(0.0, ge=0, le=60_000, description="one-way delay added per direction")
    jitter_ms: float = Field(0.0, ge=0, le=60_000)
    distribution: Literal["uniform", "normal", "pareto", "paretonormal"] = "uniform"
    delay_correlation_pct: float = Pct
    loss_pct: float = Pct
    loss_correlation_pct: float = Pct
    gemodel: GilbertElliott | None = None
    loss_state: FourState | None = None
    reorder_pct: float = Pct
    reorder_correlation_pct: float = Pct
    duplicate_pct: float = Pct
    duplicate_correlation_pct: float = Pct
    corrupt_pct: float = Pct
    # how a *_correlation_pct acts: "markov" keeps the configured rate (P(loss) = loss_pct, and a loss makes
    # the next one likelier by the correlation); "netem" reproduces netem's get_crandom, which at low rates
    # loses far fewer packets than configured (1% at 50% correlation drops well under 0.5%)
    correlation_model: Literal["markov", "netem"] = "markov"
    rate_mbit: float | None = Field(None, gt=0, le=100_000, description="bottleneck rate per direction")
    hosts: list[str] = Field(
        default_factory=list, description="only packets to/from these hosts; empty = all"
    )
    pairs: list[tuple[str, str]] = Field(default_factory=list, description="only packets between these pairs")

    @model_validator(mode="after")
    def _check(self) -> Profile:
        models = [self.loss_pct > 0, self.gemodel is not None, self.loss_state is not None]
        if sum(models) > 1:
            raise ValueError("choose one loss model: loss_pct, gemodel or loss_state")
        if self.reorder_pct > 0 and self.delay_ms == 0:
            raise ValueError("reorder_pct needs delay_ms > 0 (netem: reordered packets skip the delay)")
        if self.hosts and self.pairs:
            raise ValueError("give hosts or pairs, not both")
        return self

    @property
    def is_baseline(self) -> bool:
        return not (self.needs_engine or self.rate_mbit)

    @property
    def per_wire(self) -> bool:
        """Does the profile decide per wire packet (loss, reorder, duplicate, corrupt)? If not (delay, jitter
        and rate only), the engine may take GSO/GRO super-packets whole, as kernel netem does."""
        return bool(
            self.loss_pct
            or self.gemodel
            or self.loss_state
            or self.reorder_pct
            or self.duplicate_pct
            or self.corrupt_pct
        )

    @property
    def needs_engine(self) -> bool:
        """Anything beyond a rate limit needs netem or the native engine."""
        return bool(
            self.delay_ms
            or self.jitter_ms
            or self.loss_pct
            or self.gemodel
            or self.loss_state
            or self.reorder_pct
            or self.duplicate_pct
            or self.corrupt_pct
        )

    def expected_loss(self) -> float:
        """Long-run loss fraction the profile should produce."""
        if self.gemodel:
            return self.gemodel.expected_loss()
        if self.loss_state:
            s = self.loss_state
            # stationary loss of netem's 4-state model (states 1: good rx, 2: burst rx, 3: burst loss, 4: isolated loss)
            p13, p31, p32, p23, p14 = (x / 100 for x in (s.p13, s.p31, s.p32, s.p23, s.p14))
            if p31 == 0 and p32 == 0:
                return 1.0
            # solve pi = pi P for the 4-state chain
            P = np.zeros((4, 4))
            P[0] = [1 - p13 - p14, 0, p13, p14]
            P[1] = [0, 1 - p23, p23, 0]
            P[2] = [p31, p32, 1 - p31 - p32, 0]
            P[3] = [1, 0, 0, 0]
            w, v = np.linalg.eig(P.T)
            pi = np.real(v[:, np.argmin(abs(w - 1))])
            pi = pi / pi.sum()
            return float(pi[2] + pi[3])
        return self.loss_pct / 100

    def summary(self) -> str:
        parts = []
        if self.delay_ms or self.jitter_ms:
            d = f"delay {self.delay_ms:g} ms"
            if self.jitter_ms:
                d += f" ± {self.jitter_ms:g} ms {self.distribution}"
            if self.delay_correlation_pct:
                d += f" {self.delay_correlation_pct:g}% corr"
            parts.append(d)
        if self.loss_pct:
            parts.append(
                f"loss {self.loss_pct:g}%"
                + (f" {self.loss_correlation_pct:g}% corr" if self.loss_correlation_pct else "")
            )
        if self.gemodel:
            g = self.gemodel
            parts.append(f"loss gemodel p {g.p_pct:g}% r {g.r_pct:g}% (≈{100 * g.expected_loss():.2g}%)")
        if self.loss_state:
            parts.append(f"loss 4-state (≈{100 * self.expected_loss():.2g}%)")
        if self.reorder_pct:
            parts.append(
                f"reorder {self.reorder_pct:g}%"
                + (f" {self.reorder_correlation_pct:g}% corr" if self.reorder_correlation_pct else "")
            )
        if self.duplicate_pct:
            parts.append(f"duplicate {self.duplicate_pct:g}%")
        if self.corrupt_pct:
            parts.append(f"corrupt {self.corrupt_pct:g}%")
        if self.rate_mbit:
            parts.append(f"rate {self.rate_mbit:g} Mbit/s")
        scope = (
            f" [hosts {', '.join(self.hosts)}]"
            if self.hosts
            else f" [pairs {self.pairs}]"
            if self.pairs
            else ""
        )
        return (", ".join(parts) or "no impairment") + scope


def _library() -> dict[str, Profile]:
    lib = [
        Profile(name="baseline", description="no impairment: the raw namespace path"),
        # The ten-VPN thesis's per-host tc netem profiles. Low's jitter equals its delay: with uniform jitter the added
        # delay spans 0-4 ms, so packets overtake each other (jitter alone reorders, as in netem) on top of
        # the 0.5% explicit reordering; with a normal distribution netem would clamp negative delays to 0.
        Profile(
            name="low",
            description="the ten-VPN thesis Low: 2 ms ± 2 ms, 0.25% loss, 0.5% reorder, 25% correlation",
            delay_ms=2,
            jitter_ms=2,
            loss_pct=0.25,
            loss_correlation_pct=25,
            reorder_pct=0.5,
            reorder_correlation_pct=25,
        ),
        Profile(
            name="medium",
            description="the ten-VPN thesis Medium: 4 ms, 1% loss, 2.5% reorder, 50% correlation",
            delay_ms=4,
            loss_pct=1,
            loss_correlation_pct=50,
            reorder_pct=2.5,
            reorder_correlation_pct=50,
        ),
        Profile(
            name="high",
            description="the ten-VPN thesis High: 6 ms, 2.5% loss, 5% reorder, 50% correlation",
            delay_ms=6,
            loss_pct=2.5,
            loss_correlation_pct=50,
            reorder_pct=5,
            reorder_correlation_pct=50,
        ),
        Profile(
            name="edge-100",
            description="rate-limited edge uplink: 100 Mbit/s, 20 ms each way",
            rate_mbit=100,
            delay_ms=20,
        ),
        Profile(
            name="gemodel-1",
            description="bursty loss: Gilbert-Elliott p 0.5%, r 25% (≈2% loss, bursts of 4)",
            gemodel=GilbertElliott(p_pct=0.5, r_pct=25),
        ),
    ]
    # Kjorveziroski et al.: loss 1/5/10% and delay 50/250/350 ms (tc on the node interface)
    for loss in (1, 5, 10):
        lib.append(
            Profile(
                name=f"loss-{loss}",
                description=f"Kjorveziroski et al. loss sweep: {loss}% random loss",
                loss_pct=loss,
            )
        )
    for d in (50, 250, 350):
        lib.append(
            Profile(
                name=f"delay-{d}",
                description=f"Kjorveziroski et al. delay sweep: {d} ms each way",
                delay_ms=d,
            )
        )
    # Goethals et al.: loss 0-100% in 10% steps, latency 1000-5000 ms in 1000 ms steps (NetEm on the host interface)
    for loss in range(10, 101, 10):
        lib.append(
            Profile(
                name=f"xloss-{loss}",
                description=f"Goethals et al. extreme loss sweep: {loss}%",
                loss_pct=loss,
            )
        )
    for d in range(1000, 5001, 1000):
        lib.append(
            Profile(
                name=f"xdelay-{d}",
                description=f"Goethals et al. extreme latency sweep: {d} ms each way",
                delay_ms=d,
            )
        )
    return {p.name: p for p in lib}


PROFILES: dict[str, Profile] = _library()
