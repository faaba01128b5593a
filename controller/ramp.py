"""How far one tick may move a delay class: up by the ramp, down gradually (decide.py).

A delay that jumps past the target's tail-loss probe timer (2 x srtt + 2
jiffies) before srtt has followed makes a spurious probe, a retransmission;
so a class rises per tick at most to the highest class whose delay is within
max(d x class_increase_max_ratio_per_tick, d + delay_increase_min_s_per_tick)
of its delay d. Worked example (the default ladder, ratio 1.25, min 1 ms):
from class 2 (1 ms) to class 4 (2 ms), then 6 (3 ms), 8 (4 ms), 10 (5 ms),
12 (6.25 -> 6 ms).

A class goes down by at most class_decrease_max_per_tick per tick (0: no
limit): a lower delay lets an initiator's new packets overtake those still
queued at the old one, and the target's TCP fast-retransmits (decide.py,
"gradually"). move_toward() is both rules in one: a resource's class in
decide(), a group's (groups.py) and a follower's toward its leader's
(fleet.py) move by it. E.g. from class 20 toward 60 on the default ladder:
rise(20) = 25 (10 ms x 1.25 = 12.5 ms); from 20 toward 5 with a
limit of 1: 19.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from .domain import ControllerConfig


def rise(delay_class: int, c: ControllerConfig) -> int:
    """The highest class one tick may lead to from delay_class ("ramp")."""
    return rise_table(c)[delay_class]


@functools.lru_cache(maxsize=16)
def rise_table(c: ControllerConfig) -> tuple[int, ...]:
    """rise() of every class of c's ladder: the largest class whose delay is within
    max(d x ratio, d + delay_increase_min_s_per_tick) of class k's delay d."""
    lad = c.ladder
    if not c.class_increase_max_ratio_per_tick:
        return (lad.max_class,) * (lad.max_class + 1)
    out = []
    for k in range(lad.max_class + 1):
        d = lad.delay_s(k)
        top = max(d * c.class_increase_max_ratio_per_tick, d + c.delay_increase_min_s_per_tick)
        out.append(max(k + 1 if k < lad.max_class else k, lad.class_at_most(top)))
    return tuple(out)


def move_toward(cur: int, want: int, rise_to: Sequence[int], decrease_max: int) -> int:
    """The class one tick leads to from cur toward want: up at most to rise_to[cur]
    (the ramp, rise_table), down by at most decrease_max classes (0: no limit)."""
    if want > cur:
        top = rise_to[cur]
        return want if want <= top else top
    if decrease_max and want < cur - decrease_max:
        return cur - decrease_max
    return want
