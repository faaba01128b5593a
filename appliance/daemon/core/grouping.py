"""The daemon's initiator groups: [groups.NAME] handed to the controller (controller/groups.py).

What it owns
    Which resources are grouped (those a group names in `resources`; for a
    group that names none, every resource its members load; a grouped
    resource is controlled without a threshold), who is in which group
    (GroupMap, over the initiators discovery knows, by the names they logged
    in with, else by address), the groups' targets and priorities (the
    file's, under the runtime overrides of `santhrottle group set`,
    daemon/core/group_overrides.py), and the sensors' IoSamples of each
    convergence, passed to decide() at the next tick. Nothing here changes a
    class: the controller does, at its convergence.

When
    At start and at every reload (a new GroupMap: a host name that no longer
    resolves refuses the reload), at every convergence (new initiators, the
    names they logged in with; the sensors' IoSamples), and at every
    `group set` / `group reset`.

Sensors (core/sensors.py)
    The sensors' `io_samples` feed the groups (bridge mode: the wire's IOs
    per initiator; a target host: each LUN's device, LIO's ACL counters,
    appliance/sensing/initiator_io.py); their `io_span_s`, the time the last
    samples cover, scales them to one convergence.  PendingIos keeps them
    until the next tick, with how many convergences they are: the controller
    holds the groups and levels at a convergence of its own that got none
    (controller/decide.py, Samples.io_batches).  initiator_names()
    (address -> the IQNs / NQNs it logged in with: the wire's logins on a
    bridge, LIO's ACLs and nvmet's debugfs on a target host) lets a group
    name its members by those; for an initiator it names nothing for,
    members match by address, and a failing initiator_names() is a warning:
    that refresh matches by address.  want_io_samples() is told the grouped
    resources at every refresh: the sensors make IoSamples for those only
    (none without groups: a target host's 10,000 initiators cost nothing then).

Worked example
    [groups.db] members = ["iqn.2024-01.com.example:db1"]; the target's LIO
    ACL of that IQN has a session from 10.0.1.7, which loads vg0:
    initiator_names() gives {"10.0.1.7": ("iqn.2024-01.com.example:db1",)},
    so 10.0.1.7 is in db, vg0 is grouped (db names no resources), and
    10.0.1.7's IoSamples count for db at the next convergence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from santhrottle.appliance.config.parse import Config, GroupConfig
from santhrottle.appliance.daemon.core.group_overrides import GroupOverride, overlay
from santhrottle.appliance.daemon.core.groupmap import GroupMap, resolve_host
from santhrottle.appliance.daemon.core.sensors import Discovery, Sensors
from santhrottle.controller.domain import IoSample
from santhrottle.controller.groups import Group
from santhrottle.controller.restate import configure_groups
from santhrottle.controller.state import ControllerState

log = logging.getLogger("santhrottled")


def build(config: Config, resolve: Callable[[str], list[str]] | None = None) -> GroupMap:
    """The configured groups' map (GroupMapError: a host that does not resolve)."""
    return GroupMap(config.groups, resolve or resolve_host)


def specs(config: Config, overrides: Mapping[str, GroupOverride] | None = None) -> list[Group]:
    """The configured groups as the controller takes them, each with its runtime
    override (`santhrottle group set`, daemon/core/group_overrides.py) over the file's values."""
    out = []
    for g in config.groups.values():
        g = overlay(g, (overrides or {}).get(g.name))
        out.append(
            Group(
                g.name,
                g.priority,
                g.latency_target_s,
                g.throughput_target_bps,
                g.throughput_target_iops,
                g.utilization_target,
                g.levels,
            )
        )
    return out


def grouped_resources(
    config: Config,
    known: Iterable[str],
    group_of: Mapping[str, str],
    loads: Mapping[str, Iterable[str]],
) -> set[str]:
    """The resources the groups are arbitrated on, among `known`: those a group names,
    and for a group that names none, every resource its members load (`group_of`:
    initiator -> group; `loads`: initiator -> the resources discovery sees it load).
    A resource no group reaches keeps its threshold and PID, as without groups."""
    targeted = {n: g for n, g in config.groups.items() if _targeted(g)}  # levels alone cap
    if not targeted:
        return set()
    named = {r for g in targeted.values() for r in g.resources}
    free = {n for n, g in targeted.items() if not g.resources}
    loaded = {r for ini, g in group_of.items() if g in free for r in loads.get(ini, ())}
    return set(known) & (named | loaded)


def _targeted(g: GroupConfig) -> bool:
    """A group with a target makes its resources arbitrated (controller/groups.py
    Group.targeted); one with levels alone caps itself on its resources' PIDs."""
    return Group(
        g.name,
        1.0,
        g.latency_target_s,
        g.throughput_target_bps,
        g.throughput_target_iops,
        g.utilization_target,
    ).targeted


def level_resources(
    config: Config, group_of: Mapping[str, str], loads: Mapping[str, Iterable[str]]
) -> set[str]:
    """The resources the groups with levels load (their IoSamples decide the levels)."""
    with_levels = {n for n, g in config.groups.items() if g.levels}
    return {r for ini, g in group_of.items() if g in with_levels for r in loads.get(ini, ())}


def initiator_names(sensors: Sensors) -> dict[str, Iterable[str]]:
    """address -> the names it logged in with, from the sensors (a failure: none)."""
    try:
        return dict(sensors.initiator_names())
    except Exception as e:  # a sensor failure must not stop the tick
        log.warning("groups: initiator names: %s; matching by address", e)
        return {}


# where each discovered initiator is: its group (initiator -> group) and the resources
# it loads (initiator -> resources)
Placement = tuple[dict[str, str], dict[str, set[str]]]


def placement(
    config: Config, discovery: Discovery | None, group_map: GroupMap, sensors: Sensors
) -> Placement:
    """(initiator -> group, initiator -> the resources it loads) over the initiators
    the discovery knows."""
    if discovery is None or not config.groups:
        return {}, {}
    loads = {ip: set(v.resources) for ip, v in discovery.initiators.items()}
    return group_map.group_of_all(loads, initiator_names(sensors)), loads


def refresh(
    ctl: ControllerState,
    config: Config,
    overrides: Mapping[str, GroupOverride],
    placement: Placement,
    sensors: Sensors,
) -> None:
    """The groups (with their overrides), their members (`placement`: placement()) and
    the grouped resources, into the controller (under the daemon's lock); the
    sensors are told which resources want IoSamples."""
    levels: set[str] = set()
    if config.groups or ctl.grouped or ctl.levels.specs:
        group_of, loads = placement
        grouped = grouped_resources(config, ctl.resources, group_of, loads)
        levels = level_resources(config, group_of, loads)
        changed = configure_groups(ctl, specs(config, overrides), group_of, grouped)
        if changed:
            log.info("groups: %d initiator class(es) changed", len(changed))
    # only the grouped resources' and the levels' (none: nothing computed)
    sensors.want_io_samples(set(ctl.grouped) | levels)


def io_samples(got: list[IoSample], span_s: float | None, converge_s: float) -> list[IoSample]:
    """A convergence's IoSamples (got, covering span_s; None: one convergence), their
    counts scaled to one convergence of converge_s: the controller reads them as one
    interval's, and on a loaded host a sensor's convergence can span more (1.2 s
    counted as 1 s would overstate every group's throughput by 20 %)."""
    if span_s is None or span_s <= 0.0 or span_s == converge_s:
        return list(got)
    k = converge_s / span_s
    return [
        s._replace(
            ios=s.ios * k,
            bytes=s.bytes * k,
            reads=s.reads * k,
            busy_s=None if s.busy_s is None else s.busy_s * k,
        )
        for s in got
    ]


class PendingIos:
    """The sensors' IoSamples of the convergences since the last tick's take(), each
    convergence's scaled to one (io_samples), and how many convergences they are."""

    def __init__(self) -> None:
        self.ios: list[IoSample] = []
        self.batches = 0

    def add(self, got: list[IoSample], span_s: float | None, converge_s: float) -> None:
        self.ios.extend(io_samples(got, span_s, converge_s))
        self.batches += 1

    def take(self) -> tuple[list[IoSample], int]:
        out, n = self.ios, self.batches
        self.ios, self.batches = [], 0
        return out, n
