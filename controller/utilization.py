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
    U = min(1, sum(u_i * span_i) / sum(span_i)) over its ticks since the last
        convergence: the busy time over the time, a ratio of sums as iostat's
        %util over the same span (a late tick weighs its length; a tick whose
        counter took a completed IO's whole time, above 1, and the one before
        it, below, add up to what the device did); unknown without samples.
        A sample without a span weighs 1.
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
    U is clamped to [0, 1] once, at the convergence; a sample below 0 or NaN
    counts as 0, a sample above 1 counts as it is (see the law).

Idle behaviour
    A resource without samples in a convergence has no U: not saturated,
    and no utilization stops a promotion.

How to watch it
    UtilizationState.last (resource -> U), .saturated; the daemon shows U in
    `santhrottle status` and `resources` and exports
    santhrottle_resource_utilization_ratio.

Worked example
    utilization_threshold = 0.95; ten 100 ms ticks read 0.97, 0.99, 1.0, ...:
    U = 0.98 > 0.95: saturated. The EWMA is 8 ms against T = 10 ms (setpoint
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
    # since the last convergence, per resource: busy time (u x span) and time (spans)
    sums: dict[str, float] = field(default_factory=dict)
    spans: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)  # resource -> U, last convergence
    saturated: frozenset[str] = frozenset()


def observe(st: UtilizationState, samples: Iterable[UtilizationSample]) -> None:
    """One tick's samples folded into the convergence's sums."""
    sums, spans = st.sums, st.spans
    for name, u, span in samples:
        w = span if span is not None and span > 0.0 else 1.0
        u = u if u > 0.0 else 0.0  # NaN counts as idle
        sums[name] = sums.get(name, 0.0) + u * w
        spans[name] = spans.get(name, 0.0) + w


def close(st: UtilizationState, resources: Mapping[str, _HasResource]) -> None:
    """At a convergence: each resource's U over it, and which are saturated."""
    st.last = {name: min(1.0, st.sums[name] / w) for name, w in st.spans.items() if w > 0.0}
    st.sums, st.spans = {}, {}
    sat = set()
    for name, u in st.last.items():
        rs = resources.get(name)
        trig = None if rs is None else rs.resource.utilization_threshold
        if trig is not None and u > trig:
            sat.add(name)
    st.saturated = frozenset(sat)
