"""Effective classes: each initiator's class, the max over the resources it writes to.

Problem
    A resource's PID picks a class for its write-heavy members; an initiator
    that is a member of several resources gets one class, and it must not
    jump to a long delay in one tick (the target's tail-loss probe, decide.py).

Law (per initiator whose resources' classes or memberships changed)
    want  = max(the classes of the resources it is a member of, its groups' class,
                its groups' level class)
    class = want, or rise(class) when want is above it ("the ramp": the
            initiator is then `rising`, and recomputed every tick until there)
    A member of one resource only, without groups, is that resource's class
    through the same ramp: follow_resources() gives it without the max (the
    write-heavy sets keep the members of two or more apart, WriteHeavySets.multi).

Performance
    O(initiators given). A tick of the open-loop bench moves 7,548 of its
    10,999 members; follow_resources() takes each member of one resource with
    one lookup (its class; two more while some initiators are rising or
    already affected) where recompute_effective() takes six or more: the
    write-heavy sets keep each resource's members split into those of it
    alone and those of several (WriteHeavySets.split, rebuilt when a member
    joins or leaves a set), so a tick neither tests `multi` nor walks a set.

Worked example
    Resource vg1 at class 4, vg2 at class 10; A is a member of both, B of vg1
    only, both at class 4 before; ramp rise(4) = 6: A -> 6 (rising), B stays
    4 (nothing changes); the next tick A -> rise(6), and so on up to 10.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from itertools import chain

from .levels import highest_class
from .state import ControllerState


def follow_resources(
    state: ControllerState, resources: AbstractSet[str], affected: set[str]
) -> dict[str, int]:
    """The members of the given resources that are members of no other resource,
    neither rising nor in `affected`, take their resource's class through the ramp
    (recompute_effective's result for them, without its max over resources: a tick
    of 1,000 resources moves thousands); the other members are added to `affected`.
    Returns those that changed. Without groups only (a group's class may apply)."""
    sets = state.write_sets
    members_of, eff, rising, rise_to = sets.members, state.effective, state.rising, state.rise_to
    # Most ticks start with `affected` and `rising` empty: a member of one resource is
    # then in neither when the loop meets it (it is met once: `resources` is a set, and
    # the loop adds only multi's members to `affected`, only members it has met to
    # `rising`), and no lookup precedes its class's. The split of each resource's
    # members (WriteHeavySets.split) is kept from tick to tick: no `multi` test per
    # member, and a tuple to walk rather than a set's table.
    held = bool(affected) or bool(rising)
    changed: dict[str, int] = {}
    for name in resources:
        if not members_of.get(name):
            continue
        alone, shared = sets.split(name)
        if shared:
            affected.update(shared)
        if not alone:
            continue
        rs = state.resources.get(name)
        cls = 0 if rs is None else rs.delay_class
        for ini in alone:
            if held and (ini in affected or ini in rising):
                affected.add(ini)
                continue
            old = eff.get(ini, 0)
            if old == cls:
                continue
            k = cls  # the ramp and the write-back inline, as in recompute_effective:
            # a call per member would cost what skipping the max saves
            if k > old and k > (top := rise_to[old]):  # ramp
                k = top
                rising.add(ini)
            changed[ini] = k
            if k:
                eff[ini] = k
            else:
                del eff[ini]
    return changed


def recompute_effective(state: ControllerState, initiators: set[str]) -> dict[str, int]:
    """Effective class of each given initiator; returns those that changed."""
    member_of = state.write_sets.member_of
    eff = state.effective
    rising = state.rising
    rise_to = state.rise_to
    # each resource's class once (a tick recomputes thousands of members)
    class_of = {name: rs.delay_class for name, rs in state.resources.items()}
    # groups' classes (controller/groups.py) and their levels' (levels.py), both
    # ceilings, so the max; None without: a tick without groups pays one `is None` per
    # initiator, not a lookup
    group_class = (
        highest_class(chain(state.groups.classed_members(), state.levels.classed_members()))
        if state.groups.resources or state.levels.groups
        else None
    )
    changed: dict[str, int] = {}
    for ini in initiators:
        cls = 0 if group_class is None else group_class.get(ini, 0)
        for name in member_of.get(ini, ()):  # max-over-resources
            k = class_of.get(name, 0)
            if k > cls:
                cls = k
        old = eff.get(ini, 0)
        if cls > old and cls > (top := rise_to[old]):  # ramp
            cls = top
            rising.add(ini)
        elif rising:
            rising.discard(ini)
        if old != cls:
            changed[ini] = cls
            if cls:
                eff[ini] = cls
            else:
                del eff[ini]
    return changed
