"""Utilization: how busy a resource's device is, a saturation signal beside its latency.

Problem
    The read latency says how long IOs wait; it does not say how much of the
    device is left. A device busy 100 % of the time is full whatever its
    latency says (Fahrrad: disk time is what a device has to give), and
    IOTune promotes a tenant only while the device it sits on is busy less
    than a threshold.

Measured signal (UtilizationSample, every tick)
    The share of the sensor interval the resource's device had at least one
    IO in flight: diskstats' io_ticks delta / interval on a target host
    (iostat's %util), on a bridge the share of time a volume has a command
    in flight, from the wire; of a resource of several devices, the busiest.

Law, per resource, at every convergence
    U = the mean of its ticks' utilization since the last convergence
        (unknown without samples)
    saturated  when U > Resource.utilization_threshold (None: never)
    Until the next convergence a saturated resource's PID sees its latency
    as at least its threshold: e = max(EWMA, T) / T - setpoint >= 1 -
    setpoint > 0, so its class rises (by the ramp) until the next
    convergence finds U under the trigger; then the latency alone acts
    again and the class comes down past the hysteresis as usual. A resource
    decided by its groups (controller/groups.py) has no PID to push; there
    U marks a group's time as wanted (disktime.py).
Headroom (levels.py's promotions): U under
    ControllerConfig.promote_below_utilization (an unknown U does not stop a
    promotion) and the latency EWMA under the threshold in force.

Bounds
    U is clamped to [0, 1]; a sample outside it (a sensor's rounding) counts
    as its bound.

Idle behaviour
    A resource without samples in a convergence has no U: not saturated,
    and no utilization stops a promotion.

How to watch it
    UtilizationState.last (resource -> U), .saturated; the daemon shows U in
    `santhrottle status` and `resources` and exports
    santhrottle_resource_utilization_ratio.

Worked example
    utilization_threshold = 0.95; ten ticks read 0.97, 0.99, 1.0, ... mean
    0.98 > 0.95: saturated. The EWMA is 8 ms against T = 10 ms (setpoint
    0.9): the PID sees 10 ms, e = +0.1, and the class rises; at the next
    convergence U = 0.93: not saturated, e = 8 / 10 - 0.9 = -0.1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from .domain import Resource, UtilizationSample


class _HasResource(Protocol):
    @property
    def resource(self) -> Resource: ...


@dataclass(slots=True)
class UtilizationState:
    sums: dict[str, float] = field(default_factory=dict)  # since the last convergence
    counts: dict[str, int] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)  # resource -> U, last convergence
    saturated: frozenset[str] = frozenset()


def observe(st: UtilizationState, samples: Iterable[UtilizationSample]) -> None:
    """One tick's samples folded into the convergence's means."""
    sums, counts = st.sums, st.counts
    for name, u in samples:
        u = 0.0 if not u > 0.0 else min(u, 1.0)  # NaN counts as idle
        sums[name] = sums.get(name, 0.0) + u
        counts[name] = counts.get(name, 0) + 1


def close(st: UtilizationState, resources: Mapping[str, _HasResource]) -> None:
    """At a convergence: each resource's U over it, and which are saturated."""
    st.last = {name: st.sums[name] / n for name, n in st.counts.items() if n}
    st.sums, st.counts = {}, {}
    sat = set()
    for name, u in st.last.items():
        rs = resources.get(name)
        trig = None if rs is None else rs.resource.utilization_threshold
        if trig is not None and u > trig:
            sat.add(name)
    st.saturated = frozenset(sat)
