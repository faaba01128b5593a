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
    (ReadSample), and the latency EWMA before the tick, ewma. The
    difference of two consecutive ticks cancels what moves slower than a
    tick (the plant, the loop); what remains is the reads' own scatter:
        Var(x_k - x_{k-1}) = s^2 ewma^2 (1/n_k + 1/n_{k-1})
    so each tick gives a sample of the per-read relative sd s,
        d_k = |x_k - x_{k-1}| / ewma / sqrt(1/n_k + 1/n_{k-1}),
    clipped at SPREAD_CLIP x the spread so far (a writer switching on makes
    one huge difference, a transient, not noise) and averaged by an EWMA
    (SPREAD_TAU_S) into spread = mean |d| (mean absolute deviation: for a
    normal scatter, sd x sqrt(2/pi)). The read rate is an EWMA of n_k / tick.

Law
    cv_1s    = spread / sqrt(2/pi) / sqrt(reads per second x 1 s)
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
    SPREAD_TAU_S of quiet ticks to allow more. Ticks without reads are
    skipped; one with reads after a gap is compared with the last one.

Idle behaviour
    No reads: nothing changes. The gauge survives a release of the class:
    the noise is a property of the resource and its reader, not of a burst.

Worked example
    setpoint_fraction 0.9, quiet 0.97, z 2.33, 200 reads per second:
    per-read sd 0.1 (spread 0.08): cv_1s = 0.1 / sqrt(200) = 0.0071,
    setpoint 1 - 2.33 x 0.0071 = 0.983 -> 0.97. Per-read sd 0.5: cv_1s =
    0.035, setpoint 0.918. Per-read sd 1: 0.835 -> 0.9.
"""

from __future__ import annotations

import math

from .ewma import alpha_for

# The spread's time constant, and the read rate's.
SPREAD_TAU_S = 10.0
# A difference over this many spreads is clipped (a transient, not noise).
SPREAD_CLIP = 3.0
# For a normal scatter, mean |x - mu| = sqrt(2/pi) sd.
MEAN_ABS_DEV_PER_SD = math.sqrt(2.0 / math.pi)
# Until measured: a per-read relative sd of 1.
PRIOR_SPREAD = 1.0 * MEAN_ABS_DEV_PER_SD
# The admin's judged signal: the mean over this window.
JUDGED_WINDOW_S = 1.0


class NoiseGauge:
    """The scatter of a resource's read latency, and the setpoint it allows."""

    __slots__ = ("_last", "last_s", "reads_per_s", "spread")

    def __init__(self) -> None:
        self.spread = PRIOR_SPREAD
        self.reads_per_s = 0.0
        self.last_s: float | None = None
        self._last: tuple[int, float] | None = None  # the previous tick's reads, mean

    def observe(self, reads: int, latency_s: float, level_s: float | None, now_s: float) -> None:
        """One tick's reads and their mean latency; level_s: the latency EWMA before it."""
        if reads <= 0 or not latency_s > 0.0:
            return
        last, self._last = self._last, (reads, latency_s)
        if last is None or level_s is None or not level_s > 0.0 or self.last_s is None:
            self.last_s = now_s
            return
        d = abs(latency_s - last[1]) / level_s / math.sqrt(1.0 / reads + 1.0 / last[0])
        dt = now_s - self.last_s
        a = alpha_for(dt, SPREAD_TAU_S)
        self.spread += a * (min(d, SPREAD_CLIP * self.spread) - self.spread)
        rate = reads / dt if dt > 0.0 else 0.0
        self.reads_per_s = (
            rate if not self.reads_per_s else self.reads_per_s + a * (rate - self.reads_per_s)
        )
        self.last_s = now_s

    @property
    def cv(self) -> float:
        """The relative standard deviation of the judged (1 s) mean latency."""
        n = self.reads_per_s * JUDGED_WINDOW_S
        if n <= 0.0:
            return math.inf
        return self.spread / MEAN_ABS_DEV_PER_SD / math.sqrt(n)

    def setpoint(self, floor: float, ceiling: float, z: float) -> float:
        """The setpoint this scatter allows, as a fraction of the threshold."""
        if ceiling <= floor:
            return floor
        return min(ceiling, max(floor, 1.0 - z * self.cv))
