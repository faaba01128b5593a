"""The daemon's initiator groups: [groups.NAME] handed to the controller (controller/groups.py).

What it owns
    Which resources are grouped (those a group names in `resources`, or
    every controlled resource when a group names none), who is in which
    group (GroupMap, over the initiators discovery knows), and the sensors'
    IoSamples of each convergence, passed to step() at the next tick.
    Nothing here changes a class: the controller does, at its convergence.

When
    At start and at every reload (a new GroupMap: a host name that no longer
    resolves refuses the reload), and at every convergence (new initiators,
    the names they logged in with; the sensors' IoSamples).

Sensors
    A sensor with an `io_samples` attribute feeds the groups (bridge mode:
    the wire's reads per initiator; a target host: each LUN's device, LIO's
    ACL counters, appliance/sensing/initiator_io.py); without one the
    grouped resources get no samples and their groups hold. A sensor with
    initiator_names() (address -> the IQNs / NQNs it logged in with) lets a
    group name its members by those; without it, or for an initiator it
    names nothing for, members match by address. A failing initiator_names()
    is a warning: that refresh matches by address. A sensor with
    want_io_samples() is told the grouped resources at every refresh, and
    makes IoSamples for those only (none without groups: a target host's
    10,000 initiators cost nothing then).

Worked example
    [groups.db] members = ["iqn.2024-01.com.example:db1"]; the target's LIO
    ACL of that IQN has a session from 10.0.1.7: initiator_names() gives
    {"10.0.1.7": ("iqn.2024-01.com.example:db1",)}, so 10.0.1.7 is in db, and
    its IoSamples count for db at the next convergence.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from santhrottle.appliance.config.parse import Config
from santhrottle.appliance.daemon.groupmap import GroupMap, resolve_host
from santhrottle.controller.domain import IoSample
from santhrottle.controller.groups import Group
from santhrottle.controller.restate import configure_groups
from santhrottle.controller.step import ControllerState

log = logging.getLogger("santhrottled")


def build(config: Config, resolve: Any = None) -> GroupMap:
    """The configured groups' map (GroupMapError: a host that does not resolve)."""
    return GroupMap(config.groups, resolve or resolve_host)


def specs(config: Config) -> list[Group]:
    return [
        Group(
            g.name,
            g.priority,
            g.latency_target_s,
            g.throughput_target_bps,
            g.throughput_target_iops,
        )
        for g in config.groups.values()
    ]


def grouped_resources(config: Config, controlled: Iterable[str]) -> set[str]:
    """The resources the groups are arbitrated on."""
    if not config.groups:
        return set()
    controlled = set(controlled)
    if any(not g.resources for g in config.groups.values()):
        return controlled
    return controlled & {r for g in config.groups.values() for r in g.resources}


def apply(
    ctl: ControllerState, config: Config, gmap: GroupMap, initiators: Iterable[str]
) -> dict[str, int]:
    """Groups, membership and grouped resources into the controller; returns the
    initiators whose effective class changed."""
    if not config.groups and not ctl.grouped:
        return {}
    return configure_groups(
        ctl,
        specs(config),
        gmap.group_of_all(initiators),
        grouped_resources(config, ctl.resources),
    )


def refresh(daemon: Any) -> None:
    """The daemon's groups, their members among the initiators its discovery knows
    (by the names they logged in with, when the sensors give them, else by address),
    and the grouped resources, into its controller (under the daemon's lock)."""
    ctl, config, sensors = daemon.ctl, daemon.config, daemon.sensors
    if config.groups or ctl.grouped:
        d = daemon.state.discovery
        known = set(d.initiators) if d is not None else set()
        names: dict[str, Iterable[str]] = {}
        names_of = getattr(sensors, "initiator_names", None)
        if callable(names_of):
            try:
                names = dict(names_of())
            except Exception as e:  # a sensor failure must not stop the tick
                log.warning("groups: initiator names: %s; matching by address", e)
        changed = configure_groups(
            ctl,
            specs(config),
            daemon.group_map.group_of_all(known, names),
            grouped_resources(config, ctl.resources),
        )
        if changed:
            log.info("groups: %d initiator class(es) changed", len(changed))
    want = getattr(sensors, "want_io_samples", None)
    if callable(want):  # only the grouped resources' (none: nothing computed)
        want(ctl.grouped)


def io_samples(sensors: Any) -> list[IoSample]:
    """The sensors' IoSamples of the convergence just made (none without)."""
    got = getattr(sensors, "io_samples", None)
    return list(got) if isinstance(got, list) else []
