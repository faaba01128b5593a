"""Levels and utilization inside decide(): headroom, the levels' decision, their classes.

Problem
    levels.py decides a group's level and cap from its IOs and whether the
    resources it loads have room; utilization.py turns the busy share into
    a saturation trigger. Both need what only the controller's state holds
    (the resources' latency EWMAs and thresholds, the initiators' classes in
    force, who is in which group), and decide() calls them at its cadences.

Law
    Every tick: the tick's UtilizationSamples are folded in (observe), and
    every group's level class moves one tick toward its target (ramp up,
    gradually down).
    Every convergence: the resources' utilization over it and which are
    saturated (utilization.close); then one levels.interval over the
    convergence's IoSamples, with
        headroom(r) = (r has no finite threshold, or its latency EWMA is
                      under the threshold in force) and (its utilization is
                      unknown or under promote_below_utilization; 1 turns
                      that gate off)
        delay_of(i) = the delay of initiator i's class in force
    (a resource the controller does not know has no latency to judge: its
    utilization alone decides).

Bounds, idle behaviour: levels.py and utilization.py.

How to watch it
    state.levels (LevelsState), state.utilization (UtilizationState).

Worked example
    vg0 at threshold 10 ms has an EWMA of 7 ms and a utilization of 0.95 over
    the convergence; promote_below_utilization = 0.9: no headroom, so a group
    at its cap on vg0 keeps its level (and its cap's delay).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .domain import UtilizationSample
from .levels import advance, interval
from .state import ControllerState
from .utilization import close, observe


def observe_utilization(state: ControllerState, samples: Sequence[UtilizationSample]) -> None:
    observe(state.utilization, samples)


def headroom(state: ControllerState, resource: str) -> bool:
    """May a group with levels that loads `resource` be promoted?"""
    c = state.config
    u = state.utilization.last.get(resource)
    gate = c.promote_below_utilization  # 1: no gate (a device is never busier than all the time)
    if u is not None and gate < 1.0 and u >= gate:
        return False
    rs = state.resources.get(resource)
    if rs is None or rs.ewma.value is None:
        return True
    thr = rs.threshold_s(c.auto_alpha)
    return not math.isfinite(thr) or rs.ewma.value < thr


def converge(state: ControllerState, fresh: bool = True) -> None:
    """At a convergence, before the IoSamples are cleared: utilization, then levels
    (fresh: the IoSamples of a sensor convergence arrived; without, the levels hold)."""
    close(state.utilization, state.resources)
    lv = state.levels
    if not lv.specs or not fresh:
        return
    c = state.config
    eff = state.effective
    ladder = c.ladder
    interval(
        lv,
        state.groups.group_of,
        state.ios,
        c.converge_s,
        ladder,
        lambda r: headroom(state, r),
        lambda i: ladder.delay_s(eff.get(i, 0)),
    )


def tick(state: ControllerState) -> set[str]:
    """Every tick: the groups' level classes move; returns the initiators touched."""
    if not state.levels.groups:
        return set()
    c = state.config
    return advance(state.levels, state.rise_to, c.class_decrease_max_per_tick)
