"""Exponentially weighted moving average as a time-constant low-pass filter.

Problem
    The controller reacts to a resource's read latency and to each
    initiator's write rate. Both are measured per sensor interval and are
    noisy: one slow read in a 100 ms interval with six reads moves the mean
    a lot. The method paper (section 2.2) smooths them with an EWMA "so that
    throttling only occurs as a result of persistent problems".

Law
    A first-order low-pass filter with time constant tau, discretised
    exactly for the interval that actually elapsed since the last sample:

        alpha_k = 1 - exp(-dt_k / tau)
        y_k     = y_{k-1} + alpha_k * (x_k - y_{k-1})

    Using dt instead of a fixed alpha keeps the filter's meaning (a step
    input reaches 63 % after tau seconds) when samples arrive late, early
    or are skipped, which a fixed-alpha EWMA silently gets wrong.

Bounds
    The first sample seeds the filter (y_0 = x_0), so it does not crawl up
    from zero. A sample with dt <= 0 (same timestamp, or a clock that went
    backwards in a replay) leaves the value unchanged: alpha is clamped to
    [0, 1].

Worked example
    tau = 0.5 s. Samples 10 ms at t=0, 20 ms at t=0.1, 20 ms at t=0.6:
        t=0.0  seed                  y = 10.000 ms
        t=0.1  alpha = 1-e^-0.2 = 0.1813    y = 10 + 0.1813*10 = 11.813 ms
        t=0.6  alpha = 1-e^-1.0 = 0.6321    y = 11.813 + 0.6321*8.187 = 16.988 ms
"""

from __future__ import annotations

import math
from typing import Final

# Intervals within this of the previous one reuse its alpha (float rounding of
# now - last; the alpha differs by ~1e-9 / tau).
DT_SAME_S: Final = 1e-9


def alpha_for(dt_s: float, tau_s: float) -> float:
    """Weight of a new sample taken dt_s after the previous one."""
    if dt_s <= 0.0:
        return 0.0
    if tau_s <= 0.0:
        return 1.0
    return 1.0 - math.exp(-dt_s / tau_s)


class Ewma:
    """Time-constant EWMA; time is passed in, never read."""

    __slots__ = ("_a", "_dt", "last_s", "tau_s", "value")

    def __init__(self, tau_s: float) -> None:
        if tau_s < 0.0:
            raise ValueError(f"EWMA time constant must be >= 0 s, got {tau_s}")
        self.tau_s = tau_s
        self.value: float | None = None
        self.last_s: float | None = None
        self._dt = math.nan  # the last interval and its alpha: one exp() per new interval
        self._a = 0.0

    def update(self, x: float, now_s: float) -> float:
        if self.value is None or self.last_s is None:
            self.value = x
        else:
            dt = now_s - self.last_s
            if not abs(dt - self._dt) <= DT_SAME_S:  # nan at first
                self._dt, self._a = dt, alpha_for(dt, self.tau_s)
            self.value += self._a * (x - self.value)
        self.last_s = now_s
        return self.value

    def reset(self) -> None:
        self.value = None
        self.last_s = None
