"""Live changes to a running controller's state: new parameters, a restart, groups.

Each is a change between two calls of decide() (controller/decide.py), made by
the daemon (a reload, a restart, a resource that goes, a group set) or the
simulator; decide() itself never calls them.

reconfigure(state, config)
    New gains, EWMA time constants, write-heavy thresholds or cadences keep
    every resource's class (the PID continues from it: bumpless), its
    latency EWMA and the write-heavy sets, so a reload moves no initiator.
seed_class(state, name, k)
    Starts a resource at class k (a restarted daemon continues its last
    decision); for restarts only.
set_class(state, name, k)
    A class decided outside the resource's PID: the PID continues from k
    and the members' effective classes follow it through the ramp
    (effective.py). seed_class is one (a restart's last class); the others
    are a fleet follower's move toward its leader's class (fleet.follow,
    one tick's move at most: ramp.move_toward) and the simulator's oracle
    (the class it knows holds the threshold, every tick).
remove_resource(state, name)
    Forgets a resource and its groups' classes; its members' classes fall
    to what their other resources want.
configure_groups(state, groups, group_of, grouped)
    Groups, membership and the grouped resources (controller/groups.py);
    a resource that joins the groups hands its initiators from its PID to
    their groups' classes, one that leaves gives them back. The groups'
    levels (controller/levels.py) with them: a group whose levels are
    unchanged keeps its level.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .domain import ControllerConfig
from .effective import recompute_effective
from .groups import Group, regroup
from .state import ControllerState, write_heavy_sets


def set_class(state: ControllerState, name: str, delay_class: int) -> dict[str, int]:
    """Resource `name` at delay_class (in [0, max_class]), its PID continuing from it;
    returns the initiators whose effective class changed (through the ramp)."""
    rs = state.resources[name]
    rs.delay_class = delay_class
    rs.pid.follow(delay_class)
    return recompute_effective(state, set(state.members(name)))


def seed_class(state: ControllerState, name: str, delay_class: int) -> None:
    """Start resource `name` at delay_class, clamped to the ladder (a restart)."""
    set_class(state, name, max(0, min(delay_class, state.config.max_class)))


def remove_resource(state: ControllerState, name: str) -> dict[str, int]:
    """Forget a resource (and its groups' classes); returns the initiators whose
    class changed."""
    state.resources.pop(name, None)
    gr = state.groups.resources.pop(name, None)
    affected = state.write_sets.forget_resource(name)
    if gr is not None:
        affected = set(affected).union(*(gs.members for gs in gr.groups.values()))
    return recompute_effective(state, affected)


def reconfigure(state: ControllerState, config: ControllerConfig) -> ControllerState:
    """The same resources, classes, EWMAs and write-heavy sets under new parameters."""
    sets = state.write_sets
    fresh = write_heavy_sets(config)  # validates the thresholds
    sets.tau_s, sets.enter_bps, sets.leave_bps = fresh.tau_s, fresh.enter_bps, fresh.leave_bps
    sets.share, sets.away_hold_s = fresh.share, fresh.away_hold_s
    sets.clear_alpha_cache()
    out = ControllerState(
        config,
        sets=sets,
        effective=state.effective,
        rising=state.rising,
        next_tick_s=state.next_tick_s,
        next_converge_s=state.next_converge_s,
        late_ticks_total=state.late_ticks_total,
        groups=state.groups,
        grouped=state.grouped,
        ios=state.ios,
        io_batches=state.io_batches,
        levels=state.levels,
        utilization=state.utilization,
    )
    for name, rs in state.resources.items():
        out.set_resource(rs.resource)
        new = out.resources[name]
        new.ewma.value, new.ewma.last_s = rs.ewma.value, rs.ewma.last_s
        new.last_read_s = rs.last_read_s
        new.lq = rs.lq
        new.noise, new.write_rate = rs.noise, rs.write_rate
        new.drop_hold_until_s, new.drop_ticks = rs.drop_hold_until_s, rs.drop_ticks
        new.quiet_ticks, new.floor_ticks, new.rhythm = rs.quiet_ticks, rs.floor_ticks, rs.rhythm
        new.hold_base = rs.hold_base
        new.delay_class = min(rs.delay_class, config.max_class)
        new.pid.follow(new.delay_class)
    recompute_effective(out, set(out.effective) | set(out.rising))
    return out


def configure_groups(
    state: ControllerState,
    groups: Sequence[Group],
    group_of: Mapping[str, str],
    grouped: Iterable[str],
    default_priority: float = 1.0,
) -> dict[str, int]:
    """Groups, membership and the grouped resources, live; returns the initiators
    whose effective class changed (a resource that leaves the groups gives its
    initiators back to its PID, one that joins them hands its class to them)."""
    new = frozenset(grouped)
    affected = regroup(state.groups, groups, group_of, state.grouped - new, default_priority)
    affected |= state.levels.configure({g.name: g.levels for g in groups})  # levels.py
    for name in new - state.grouped:  # the groups take over from the PID
        rs = state.resources.get(name)
        if rs is not None and rs.delay_class:
            rs.delay_class = 0
            rs.pid.reset()
            affected.update(state.members(name))
    state.grouped = new
    return recompute_effective(state, affected)
