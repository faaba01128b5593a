"""Single-sided incremental PID: read-latency error -> delay class on the ladder.

Problem
    Keep a resource's read latency at or under a threshold set by the
    admin by delaying the packets sent to the initiators that write to it.
    The actuator is a ladder of netem classes (controller/ladder.py):
    class 0 is no delay, class k delays by ladder.delay(k). More delay ->
    fewer writes in the device -> lower read latency (paper 3.3).

Measured signal
    The EWMA of the resource's mean read latency (controller/ewma.py), one
    value per controller tick T (100 ms), divided by the threshold:
    decide() passes relative latencies, so e is a relative error.

Law "paper" (appendix, eq. 2: the discrete PID in velocity form) on the
class index, SingleSidedPid
    e_k = measured_k - setpoint                 (> 0 means too slow)
    u_k = u_{k-1} + Kp * [ (e_k - e_{k-1})                   proportional
                           + (T / Ti) * e_k                    integral
                           + (Td / T) * (e_k - 2 e_{k-1} + e_{k-2}) ]  derivative
    u_k = min(max(u_k, 0), max_class)            clamp after EVERY update
    class_k = ceil(u_k)
    Kp is in classes per unit of relative error, so the loop's speed
    depends on how many classes the array happens to need: 15 classes is
    everything on a plant that needs 10, and a crawl on one that needs 100.

Law "log" (the default), LogPid: the same increments on w = ln(delay + offset)
    w_k = w_{k-1} + Kp * [ same bracket ]      offset = offset_x_threshold x T
    v_k = ln(e^w_k - offset)                   (v = ln(delay); -inf if <= 0)
    v_k = min(max(v_k, ln(d_1 / 2)), ln(d_max))
    class_k = 0 if v_k is at its floor, else the smallest class whose delay
              is >= e^v_k
    Kp is in natural-log units per unit of relative error: every update of
    the PID is a multiplication of the delay. Why that makes the speed
    independent of the array: where the writers' delay d dominates their
    IO time, a closed-loop writer keeps q * L / (L + d) IOs in the device,
    so the reader's latency L falls as a power of d and its elasticity
    -dln(L)/dln(d) stays between 0 and 1 whatever C, m or the needed delay
    are; the loop gain Kp * (T/Ti) * elasticity is then bounded the same on
    an array that needs 2 ms and one that needs 200 ms. A linear law's
    gain is instead proportional to dL/dd, which varies by the same factor
    100 between those arrays.
    The offset: a writer's IO takes about the device's latency plus its
    delay, and at the setpoint the latency is about the threshold T (the
    caller passes it in seconds). Where d is short against T, a change of
    ln(d) alone hardly changes the writers' rate (its elasticity is near 0),
    and a delay that starts at 0.5 ms and needs 25 ms would take some 100
    ticks to get there; on ln(d + T/2) the same change moves d by a share of T.
    Where d is long against T, ln(d + T/2) ~ ln(d). offset 0: plain ln(d).

Both
    The velocity form only ever adds increments to the previous output, so
    clamping the output is the anti-windup: the integral cannot accumulate
    beyond the ladder, and a negative error winds the output back down to
    its floor instead of below it ("single-sided": it throttles only when
    the latency is above the setpoint, and stops once it is below for long
    enough to unwind). e_{-1} = e_{-2} = 0 before the first update.
    track(k) pulls the output down to class k when the actuator applied
    less (a rate limit), follow(k) continues from class k (bumpless start
    or reconfiguration).

Rounding
    ceil (paper) / the class at or above e^v (log): any positive output
    means at least class 1, and the controller never under-delivers the
    delay it asked for.

Idle behaviour
    Not here: a resource without reads in an interval has no measurement;
    the caller (controller/decide.py) holds the class, and releases it after
    a configured idle time.

Watching it
    `santhrottle-simulate` prints and plots the class against the latency;
    the daemon exports santhrottle_resource_delay_class and _delay_seconds.

Worked example, law "paper"
    Kp = 400 classes per second of error (absolute units here; decide() passes
    relative ones), Ti = 0.5 s, Td = 0, T = 0.1 s, max_class = 100,
    threshold 10 ms, measurements 14, 12, 9, 5 ms:
        k=0  e=+0.004  u = 0    + 400*(0.004 - 0     + 0.2*0.004)  = 1.92 -> class 2
        k=1  e=+0.002  u = 1.92 + 400*(0.002 - 0.004 + 0.2*0.002)  = 1.28 -> class 2
        k=2  e=-0.001  u = 1.28 + 400*(-0.001 - 0.002 - 0.2*0.001) ~ 0   -> clamped to 0, class 0
        k=3  e=-0.005  u = 0    + 400*(-0.005 + 0.001 - 0.001)     = -2.0 -> clamped 0, class 0

Worked example, law "log"
    Kp = 1, Ti = 0.5 s, T = 0.1 s, the default ladder (0.5 ms steps to
    10 ms, x1.05 above), relative latencies 1.5, 1.2, 1.0 against a
    setpoint 0.9, starting at class 40 (25 ms, v = ln 0.025 = -3.689):
        k=0  e=0.6  v = -3.689 + (0.6 - 0   + 0.2*0.6) = -2.969 -> 51.4 ms: class 55 (52 ms)
        k=1  e=0.3  v = -2.969 + (0.3 - 0.6 + 0.2*0.3) = -3.209 -> 40.4 ms: class 50 (41 ms)
        k=2  e=0.1  v = -3.209 + (0.1 - 0.3 + 0.2*0.1) = -3.389 -> 33.7 ms: class 47 (35 ms)
    The same errors move 24 ms or 240 ms by the same factors (offset 0). With
    offset 0.5 (the default) and a threshold of 10 ms, the first update from
    25 ms is (25 + 5) * e^0.72 - 5 = 56.6 ms: class 57 (57 ms); from 1 ms,
    (1 + 5) * e^0.72 - 5 = 7.3 ms: class 15 (7.5 ms), where offset 0 gives
    1 * e^0.72 = 2.05 ms: class 5 (2.5 ms).
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_left
from math import exp, log
from typing import Final

from .domain import OFFSET_X_THRESHOLD_MAX, ControllerConfig
from .ladder import Ladder

# Law "log": the output's floor is half the first class's delay; at the floor
# the class is 0 (no delay), anywhere above it at least class 1.
OFF_FRACTION: Final = 0.5
# v within this of a class's ln(delay) is that class (float rounding of ln/exp).
LOG_TOLERANCE: Final = 1e-9


@functools.lru_cache(maxsize=16)
def log_delays(ladder: Ladder) -> tuple[float, ...]:
    """ln of each class's delay, class k at index k - 1: one table per ladder, shared by
    every resource's LogPid. A tick bisects it once per resource, and a table of its own
    per PID (88 float objects each on the default ladder, 1,000 PIDs) is a cache miss
    per step of the bisection."""
    return tuple(math.log(ladder.delay_s(k)) for k in range(1, ladder.max_class + 1))


class SingleSidedPid:
    """The paper's incremental PID with output clamp and ceil."""

    __slots__ = ("_d_over_t", "_e1", "_e2", "_i_over_t", "kp", "max_class", "u")

    def __init__(
        self,
        kp: float,
        ti_s: float,
        td_s: float,
        interval_s: float,
        max_class: int,
    ) -> None:
        if interval_s <= 0.0:
            raise ValueError(f"PID sample interval must be > 0 s, got {interval_s}")
        if ti_s <= 0.0:
            raise ValueError(f"PID integral time Ti must be > 0 s, got {ti_s}")
        if td_s < 0.0:
            raise ValueError(f"PID derivative time Td must be >= 0 s, got {td_s}")
        if kp < 0.0:
            raise ValueError(f"PID gain Kp must be >= 0, got {kp}")
        if max_class < 0:
            raise ValueError(f"max_class must be >= 0, got {max_class}")
        self.kp = kp
        self._i_over_t = interval_s / ti_s
        self._d_over_t = td_s / interval_s
        self.max_class = max_class
        self.u = 0.0
        self._e1 = 0.0
        self._e2 = 0.0

    def update(self, measured_s: float, threshold_s: float, scale_s: float = 0.0) -> int:
        """scale_s: unused (law "log"'s offset; the class index has no scale)."""
        e = measured_s - threshold_s
        du = self.kp * (
            (e - self._e1) + self._i_over_t * e + self._d_over_t * (e - 2.0 * self._e1 + self._e2)
        )
        u = self.u + du
        if u < 0.0:
            u = 0.0  # single-sided: never "negative delay"
        elif u > self.max_class:
            u = float(self.max_class)  # anti-windup
        self.u = u
        self._e2 = self._e1
        self._e1 = e
        return self.delay_class

    def track(self, applied_class: int) -> None:
        """The actuator applied less than asked (a rate limit): continue from there.

        In the velocity form the next increment is added to u; leaving u
        above what was applied would integrate an error the actuator
        could not act on (windup), and the class would overshoot later.
        """
        if self.u > applied_class:
            self.u = float(applied_class)

    def track_up(self, delay_class: int) -> None:
        """Nothing: the paper's form does not track the decrease limit (kept as
        published, for comparison); LogPid.track_up does."""

    @property
    def delay_class(self) -> int:
        return math.ceil(self.u)

    def class_with_margin(self, margin: float, delay_class: int | None = None) -> int:
        """The class the output would be `margin` classes higher (hysteresis).
        delay_class: unused (LogPid's shortcut: the output's class, known)."""
        return math.ceil(self.u + margin)

    def follow(self, delay_class: int) -> None:
        """Continue from delay_class (a seeded or reconfigured resource: bumpless)."""
        self.u = float(max(0, min(delay_class, self.max_class)))

    def reset(self) -> None:
        self.u = 0.0
        self._e1 = 0.0
        self._e2 = 0.0


class LogPid:
    """The same incremental PI(D) on ln(delay + offset), quantized to the ladder (law "log")."""

    __slots__ = (
        "_d_over_t",
        "_e1",
        "_e2",
        "_hi",
        "_i_over_t",
        "_lo",
        "_logs",
        "_top",
        "kp",
        "ladder",
        "offset_x_threshold",
        "u",
    )

    def __init__(
        self,
        kp: float,
        ti_s: float,
        td_s: float,
        interval_s: float,
        ladder: Ladder,
        offset_x_threshold: float = 0.0,
    ) -> None:
        probe = SingleSidedPid(kp, ti_s, td_s, interval_s, ladder.max_class)  # validates
        if not 0.0 <= offset_x_threshold <= OFFSET_X_THRESHOLD_MAX:
            raise ValueError(
                f"PID offset must be within 0-{OFFSET_X_THRESHOLD_MAX:g} x the threshold, "
                f"got {offset_x_threshold}"
            )
        self.kp = kp
        self.offset_x_threshold = offset_x_threshold
        self._i_over_t = probe._i_over_t
        self._d_over_t = probe._d_over_t
        self.ladder = ladder
        self._lo = math.log(ladder.delay_s(1) * OFF_FRACTION)
        # ln of each class's delay (class k at index k - 1): the class of v by bisection
        self._logs = log_delays(ladder)
        self._hi = math.log(ladder.max_delay_s)
        self._top = ladder.max_class
        self.u = self._lo
        self._e1 = 0.0
        self._e2 = 0.0

    @property
    def max_class(self) -> int:
        return self.ladder.max_class

    def update(self, measured_s: float, threshold_s: float, scale_s: float = 0.0) -> int:
        """measured_s, threshold_s: relative (decide() divides by the threshold);
        scale_s: the threshold in force in seconds, the offset's unit."""
        e = measured_s - threshold_s
        e1 = self._e1
        du = self.kp * ((e - e1) + self._i_over_t * e + self._d_over_t * (e - 2.0 * e1 + self._e2))
        offset_s = self.offset_x_threshold * scale_s
        if offset_s > 0.0:  # the increment acts on ln(delay + offset)
            # exp, log, bisect_left imported by name: Debian 12's mypyc (1.0.1) reads a
            # name from the module's dict, `math.exp` as an attribute of the module
            # (slower); a newer mypyc calls C's exp() and log() either way
            d = (exp(self.u) + offset_s) * exp(du) - offset_s
            u = log(d) if d > 0.0 else self._lo
        else:
            u = self.u + du
        # single-sided, anti-windup (comparisons: every tick of every resource)
        u = self._lo if u < self._lo else self._hi if u > self._hi else u
        self.u = u
        self._e2 = e1
        self._e1 = e
        if u <= self._lo:  # self.delay_class, inline
            return 0
        k = bisect_left(self._logs, u - LOG_TOLERANCE) + 1
        return k if k < self._top else self._top

    def _v(self, delay_class: int) -> float:
        return self._lo if delay_class <= 0 else self._logs[delay_class - 1]

    def track(self, applied_class: int) -> None:
        """As SingleSidedPid.track: never above the class the actuator applied."""
        self.u = min(self.u, self._v(applied_class))

    def follow(self, delay_class: int) -> None:
        self.u = self._v(max(0, min(delay_class, self.ladder.max_class)))

    def track_up(self, delay_class: int) -> None:
        """The actuator kept more than asked (the decrease limit): never below
        delay_class, or the output runs to its floor while the class comes down one
        class a tick, and every new error starts from there (a sawtooth)."""
        self.u = max(self.u, self._v(max(0, delay_class)))

    @property
    def delay_class(self) -> int:
        if self.u <= self._lo:
            return 0
        return min(bisect_left(self._logs, self.u - LOG_TOLERANCE) + 1, self._top)

    def class_with_margin(self, margin: float, delay_class: int | None = None) -> int:
        """delay_class: the output's class when the caller has it (update()'s result,
        the output unchanged since): no second search of the ladder."""
        k = self.delay_class if delay_class is None else delay_class
        return min(self._top, k + math.ceil(margin))

    def reset(self) -> None:
        self.u = self._lo
        self._e1 = 0.0
        self._e2 = 0.0


Pid = SingleSidedPid | LogPid


def new_pid(config: ControllerConfig) -> Pid:
    """The PID of config.law with its gains."""
    if config.law == "paper":
        g = config.gains
        return SingleSidedPid(
            g.kp_class_per_rel_error, g.ti_s, g.td_s, config.tick_s, config.ladder.max_class
        )
    lg = config.log_gains
    return LogPid(
        lg.kp_log_per_rel_error,
        lg.ti_s,
        lg.td_s,
        config.tick_s,
        config.ladder,
        lg.offset_x_threshold,
    )
