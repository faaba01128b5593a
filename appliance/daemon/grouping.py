"""The daemon's initiator groups: [groups.NAME] handed to the controller (controller/groups.py).

What it owns
    Which resources are grouped (those a group names in `resources`; for a
    group that names none, every resource its members load; a grouped
    resource is controlled without a threshold), who is in which
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
from santhrottle.appliance.daemon.groupmap import GroupMap, resolve_host
from santhrottle.controller.domain import IoSample
from santhrottle.controller.groups import Group
from santhrottle.controller.restate import configure_groups

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
    if not config.groups:
        return set()
    named = {r for g in config.groups.values() for r in g.resources}
    free = {n for n, g in config.groups.items() if not g.resources}
    loaded = {r for ini, g in group_of.items() if g in free for r in loads.get(ini, ())}
    return set(known) & (named | loaded)


def membership(daemon: Any) -> tuple[dict[str, str], dict[str, set[str]]]:
    """(initiator -> group, initiator -> the resources it loads) over the initiators
    the daemon's discovery knows."""
    d = daemon.state.discovery
    if d is None or not daemon.config.groups:
        return {}, {}
    loads = {ip: set(v.resources) for ip, v in d.initiators.items()}
    return daemon.group_map.group_of_all(loads), loads


def grouped_of(daemon: Any, known: Iterable[str]) -> set[str]:
    """The daemon's grouped resources among `known` (a grouped resource needs no
    threshold: the controller has it, its PID observing, math.inf, for its groups)."""
    group_of, loads = membership(daemon)
    return grouped_resources(daemon.config, known, group_of, loads)


def refresh(daemon: Any) -> None:
    """The daemon's groups, their members among the initiators its discovery knows,
    and the grouped resources, into its controller (under the daemon's lock)."""
    ctl, config = daemon.ctl, daemon.config
    if not config.groups and not ctl.grouped:
        return
    group_of, loads = membership(daemon)
    grouped = grouped_resources(config, ctl.resources, group_of, loads)
    changed = configure_groups(ctl, specs(config), group_of, grouped)
    if changed:
        log.info("groups: %d initiator class(es) changed", len(changed))


def io_samples(sensors: Any) -> list[IoSample]:
    """The sensors' IoSamples of the convergence just made (none without)."""
    got = getattr(sensors, "io_samples", None)
    return list(got) if isinstance(got, list) else []
