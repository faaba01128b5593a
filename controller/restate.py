"""Live changes to a running controller's state: new parameters, a restart, groups.

reconfigure(state, config)
    New gains, EWMA time constants, write-heavy thresholds or cadences keep
    every resource's class (the PID continues from it: bumpless), its
    latency EWMA and the write-heavy sets, so a reload moves no initiator.
seed_class(state, name, k)
    Starts a resource at class k (a restarted daemon continues its last
    decision).
configure_groups(state, groups, group_of, grouped)
    Groups, membership and the grouped resources (controller/groups.py);
    a resource that joins the groups hands its initiators from its PID to
    their groups' classes, one that leaves gives them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .domain import ControllerConfig
from .effective import recompute_effective
from .groups import Group, regroup
from .step import PAUSE_HOLD_S, ControllerState
from .writeheavy import WriteHeavySets


def seed_class(state: ControllerState, name: str, delay_class: int) -> None:
    """Start resource `name` at delay_class (the PID continues from it)."""
    rs = state.resources[name]
    rs.delay_class = max(0, min(delay_class, state.config.max_class))
    rs.pid.follow(rs.delay_class)
    recompute_effective(state, set(state.members(name)))


def reconfigure(state: ControllerState, config: ControllerConfig) -> ControllerState:
    """The same resources, classes, EWMAs and write-heavy sets under new parameters."""
    sets = state.write_sets
    fresh = WriteHeavySets(
        config.write_ewma_tau_s,
        config.write_heavy_enter_bps,
        config.write_heavy_leave_bps,
        config.write_heavy_share,
        PAUSE_HOLD_S if config.write_heavy_share else 0.0,
    )  # validates the thresholds
    sets.tau_s, sets.enter_bps, sets.leave_bps = fresh.tau_s, fresh.enter_bps, fresh.leave_bps
    sets.share, sets.pause_hold_s = fresh.share, fresh.pause_hold_s
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
    )
    for name, rs in state.resources.items():
        out.set_resource(rs.resource)
        new = out.resources[name]
        new.ewma.value, new.ewma.last_s = rs.ewma.value, rs.ewma.last_s
        new.last_read_s = rs.last_read_s
        new.lq = rs.lq
        new.noise, new.write_rate = rs.noise, rs.write_rate
        new.drop_hold_until_s, new.drop_ticks = rs.drop_hold_until_s, rs.drop_ticks
        new.quiet_ticks = rs.quiet_ticks
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
    for name in new - state.grouped:  # the groups take over from the PID
        rs = state.resources.get(name)
        if rs is not None and rs.delay_class:
            rs.delay_class = 0
            rs.pid.reset()
            affected.update(state.members(name))
    state.grouped = new
    return recompute_effective(state, affected)
