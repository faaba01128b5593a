"""The daemon's initiator groups: [groups.NAME] handed to the controller (controller/groups.py).

What it owns
    Which resources are grouped (those a group names in `resources`, or
    every controlled resource when a group names none), who is in which
    group (GroupMap, over the initiators discovery knows), and the sensors'
    IoSamples of each convergence, passed to step() at the next tick.
    Nothing here changes a class: the controller does, at its convergence.

When
    At start and at every reload (a new GroupMap: a host name that no longer
    resolves refuses the reload), and at every convergence (new initiators;
    the sensors' IoSamples).

Sensors
    A sensor with an `io_samples` attribute (bridge mode: the wire's reads
    per initiator) feeds the groups; without one (the target host, today)
    the grouped resources get no samples and their groups hold.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from santhrottle.appliance.config.parse import Config
from santhrottle.appliance.daemon.group_overrides import GroupOverride, overlay
from santhrottle.appliance.daemon.groupmap import GroupMap, resolve_host
from santhrottle.controller.domain import IoSample
from santhrottle.controller.groups import Group
from santhrottle.controller.restate import configure_groups
from santhrottle.controller.step import ControllerState

log = logging.getLogger("santhrottled")


def build(config: Config, resolve: Any = None) -> GroupMap:
    """The configured groups' map (GroupMapError: a host that does not resolve)."""
    return GroupMap(config.groups, resolve or resolve_host)


def specs(config: Config, overrides: Mapping[str, GroupOverride] | None = None) -> list[Group]:
    """The configured groups as the controller takes them, each with its runtime
    override (`santhrottle group set`, daemon/group_overrides.py) over the file's values."""
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
            )
        )
    return out


def grouped_resources(config: Config, controlled: Iterable[str]) -> set[str]:
    """The resources the groups are arbitrated on."""
    if not config.groups:
        return set()
    controlled = set(controlled)
    if any(not g.resources for g in config.groups.values()):
        return controlled
    return controlled & {r for g in config.groups.values() for r in g.resources}


def apply(
    ctl: ControllerState,
    config: Config,
    gmap: GroupMap,
    initiators: Iterable[str],
    overrides: Mapping[str, GroupOverride] | None = None,
) -> dict[str, int]:
    """Groups (the file's, with the runtime overrides), membership and grouped
    resources into the controller; returns the initiators whose effective class changed."""
    if not config.groups and not ctl.grouped:
        return {}
    return configure_groups(
        ctl,
        specs(config, overrides),
        gmap.group_of_all(initiators),
        grouped_resources(config, ctl.resources),
    )


def refresh(daemon: Any) -> None:
    """The daemon's groups, their members among the initiators its discovery knows,
    and the grouped resources, into its controller (under the daemon's lock)."""
    d = daemon.state.discovery
    known = set(d.initiators) if d is not None else set()
    changed = apply(
        daemon.ctl, daemon.config, daemon.group_map, known, daemon.state.group_overrides
    )
    if changed:
        log.info("groups: %d initiator class(es) changed", len(changed))


def io_samples(sensors: Any) -> list[IoSample]:
    """The sensors' IoSamples of the convergence just made (none without)."""
    got = getattr(sensors, "io_samples", None)
    return list(got) if isinstance(got, list) else []
