"""Single-sided incremental PID: read-latency error -> integer delay class.

Problem
    Keep a resource's read latency at or under a threshold set by the
    admin by delaying the packets sent to the initiators that write to it.
    The actuator is a ladder of netem classes: class k delays by k * step
    (0.5 ms by default), class 0 is no delay. More delay -> fewer writes in
    the device -> lower read latency, close to linearly (paper 3.3).

Measured signal
    The EWMA of the resource's mean read latency (controller/ewma.py), one
    value per controller tick T (100 ms).

Law (paper, appendix, eq. 2: the discrete PID in velocity form)
    e_k = measured_k - threshold                (seconds; > 0 means too slow)
    u_k = u_{k-1} + Kp * [ (e_k - e_{k-1})                   proportional
                           + (T / Ti) * e_k                    integral
                           + (Td / T) * (e_k - 2 e_{k-1} + e_{k-2}) ]  derivative
    u_k = min(max(u_k, 0), max_class)            clamp after EVERY update
    class_k = ceil(u_k)

    Kp is in classes per unit of error; step() passes relative latencies
    (measured / threshold against setpoint_fraction), so there Kp is in
    classes per unit of relative error. The velocity form only ever adds
    increments to the previous output, so clamping u_k itself is the
    anti-windup: the integral cannot accumulate beyond the ladder, and a
    negative error winds u back down to 0 instead of going below it
    ("single-sided": it throttles only when the latency is above the
    threshold, and it stops throttling once it is below for long enough to
    unwind). e_{-1} = e_{-2} = 0 before the first update.

Rounding
    ceil, as in the paper: any positive output means at least class 1, so
    the controller never under-delivers the delay it asked for.

Idle behaviour
    Not here: a resource without reads in an interval has no measurement;
    the caller (controller/step.py) holds the class, and releases it after
    a configured idle time.

Watching it
    `santhrottle simulate` prints and plots u (as class) against the latency;
    the daemon exports santhrottle_resource_delay_class.

Worked example
    Kp = 400 classes per second of error (absolute units here; step() passes
    relative ones), Ti = 0.5 s, Td = 0, T = 0.1 s, max_class = 100,
    threshold 10 ms, measurements 14, 12, 9, 5 ms:
        k=0  e=+0.004  u = 0    + 400*(0.004 - 0     + 0.2*0.004)  = 1.92 -> class 2
        k=1  e=+0.002  u = 1.92 + 400*(0.002 - 0.004 + 0.2*0.002)  = 1.28 -> class 2
        k=2  e=-0.001  u = 1.28 + 400*(-0.001 - 0.002 - 0.2*0.001) ~ 0   -> clamped to 0, class 0
        k=3  e=-0.005  u = 0    + 400*(-0.005 + 0.001 - 0.001)     = -2.0 -> clamped 0, class 0
"""

from __future__ import annotations

import math


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

    def update(self, measured_s: float, threshold_s: float) -> int:
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

    @property
    def delay_class(self) -> int:
        return math.ceil(self.u)

    def reset(self) -> None:
        self.u = 0.0
        self._e1 = 0.0
        self._e2 = 0.0
