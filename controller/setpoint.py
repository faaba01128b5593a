"""Noise-aware setpoint: how close to its threshold a resource's latency is held.

Problem
    The PID holds the EWMA of the read latency at a setpoint below the
    threshold, because the admin judges the 1 s mean latency, and that
    scatters around the level the PID holds: a 1 s mean of N reads whose
    latencies spread by a relative sd s spreads by s / sqrt(N). A fixed
    setpoint of 0.9 T is right for a noisy resource (few reads, a heavy
    tail) and too low for a quiet one: its writers are throttled more than
    needed, and a constant delay an admin could pin by hand moves more.

Measured signal
    Per tick, the resource's reads n_k and their mean latency x_k
    (ReadSample). Over each WINDOW_S (1 s) of ticks, the scatter of the
    tick means around their mean xbar (one-way analysis of variance: the
    ticks are the groups) estimates the reads' own variance,
        s^2 = sum_k n_k (x_k - xbar)^2 / (K - 1),   K ticks, sum n_k = N,
    and s / xbar is one sample of the per-read relative sd. What moves
    slower than a second (the plant, the loop, writers coming and going)
    hardly shows within one. Each sample is clipped at SPREAD_CLIP x the
    spread so far (a writer switching on within the second is a transient,
    not noise) and averaged by an EWMA (SPREAD_TAU_S) into `spread`; the
    read rate N / window by the same EWMA.

Law
    cv_1s    = spread / sqrt(reads per second x 1 s)
    setpoint = clamp(1 - z x cv_1s, setpoint_fraction, setpoint_quiet_fraction)
    z (setpoint_noise_z, 2.33: the 99th percentile of a normal scatter)
    puts the 1 s mean's 99th percentile under the threshold. The floor is
    setpoint_fraction (0.9): a noisy resource is held where it always was;
    a quiet one up to setpoint_quiet_fraction (0.97), which leaves room for
    the loop's own ripple. A quiet fraction <= setpoint_fraction turns the
    adaptation off (the setpoint is fixed).

Bounds
    The spread starts at PRIOR_SPREAD (a per-read relative sd of 1: the
    floor for any resource under 100 reads per second) and takes a few
    SPREAD_TAU_S of quiet seconds to allow more. Ticks without reads are
    skipped; a window with fewer than two ticks of reads makes no sample.

Idle behaviour
    No reads: nothing changes. The gauge survives a release of the class:
    the noise is a property of the resource and its reader, not of a burst.

Performance
    Per tick three multiply-adds (the hot path: 1,000 resources every
    100 ms); the square roots and the EWMA once a second.

Worked example
    setpoint_fraction 0.9, quiet 0.97, z 2.33, 200 reads per second:
    per-read sd 0.1: cv_1s = 0.1 / sqrt(200) = 0.0071, setpoint 1 - 2.33 x
    0.0071 = 0.983 -> 0.97. Per-read sd 0.5: cv_1s = 0.035, setpoint
    0.918. Per-read sd 1: 0.835 -> 0.9.
"""

from __future__ import annotations

import math
from typing import Final

from .ewma import alpha_for

# One sample of the scatter per this much time of ticks.
WINDOW_S: Final = 1.0
# The spread's time constant, and the read rate's.
SPREAD_TAU_S: Final = 10.0
# A sample over this many spreads is clipped (a transient, not noise).
SPREAD_CLIP: Final = 3.0
# Until measured: a per-read relative sd of 1.
PRIOR_SPREAD: Final = 1.0
# The admin's judged signal: the mean over this window.
JUDGED_WINDOW_S: Final = 1.0


class NoiseGauge:
    """The scatter of a resource's read latency, and the setpoint it allows."""

    __slots__ = ("_k", "_n", "_s1", "_s2", "_since_s", "cv", "reads_per_s", "spread")

    def __init__(self) -> None:
        self.spread = PRIOR_SPREAD  # per-read relative sd
        self.reads_per_s = 0.0
        # the relative standard deviation of the judged (1 s) mean latency
        self.cv = math.inf  # until the first window's sample
        self._since_s: float | None = None  # this window's start
        self._k = 0  # ticks with reads in it, their reads, sum n x, sum n x^2
        self._n = 0
        self._s1 = 0.0
        self._s2 = 0.0

    def observe(self, reads: int, latency_s: float, now_s: float) -> None:
        """One tick's reads and their mean latency."""
        if reads <= 0 or not latency_s > 0.0:
            return
        if self._since_s is None:
            self._since_s = now_s
            return  # the window starts after this tick
        self._k += 1
        self._n += reads
        nx = reads * latency_s
        self._s1 += nx
        self._s2 += nx * latency_s
        if now_s - self._since_s + 1e-9 >= WINDOW_S:
            self._fold(now_s)

    def _fold(self, now_s: float) -> None:
        k, n, s1, s2 = self._k, self._n, self._s1, self._s2
        since = self._since_s
        self._k = self._n = 0
        self._s1 = self._s2 = 0.0
        self._since_s = now_s
        if k < 2 or since is None:
            return
        mean = s1 / n
        ss = s2 - s1 * mean  # sum n_k (x_k - mean)^2
        rel = math.sqrt(ss / (k - 1) if ss > 0.0 else 0.0) / mean
        dt = now_s - since
        rate = n / dt
        if self.cv == math.inf:  # the first sample seeds the read rate
            self.reads_per_s = rate
        a = alpha_for(dt, SPREAD_TAU_S)
        clip = SPREAD_CLIP * self.spread
        self.spread += a * ((rel if rel < clip else clip) - self.spread)
        self.reads_per_s += a * (rate - self.reads_per_s)
        self.cv = self.spread / math.sqrt(self.reads_per_s * JUDGED_WINDOW_S)

    def setpoint(self, floor: float, ceiling: float, z: float) -> float:
        """The setpoint this scatter allows, as a fraction of the threshold (every
        tick of every resource: comparisons, not min/max calls)."""
        if ceiling <= floor:
            return floor
        sp = 1.0 - z * self.cv
        return ceiling if sp > ceiling else floor if sp < floor else sp
