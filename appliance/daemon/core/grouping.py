"""The daemon's initiator groups: [groups.NAME] handed to the controller (controller/groups.py).

What it owns
    Which resources are grouped (those a group names in `resources`; for a
    group that names none, every resource its members load; a grouped
    resource is controlled without a threshold), who is in which group
    (GroupMap, over the initiators discovery knows, by the names they logged
    in with, else by address), the groups' targets and priorities (the
    file's, under the runtime overrides of `santhrottle group set`,
    daemon/core/group_overrides.py), and the sensors' IoSamples of each
    convergence, passed to step() at the next tick. Nothing here changes a
    class: the controller does, at its convergence.

When
    At start and at every reload (a new GroupMap: a host name that no longer
    resolves refuses the reload), at every convergence (new initiators, the
    names they logged in with; the sensors' IoSamples), and at every
    `group set` / `group reset`.

Sensors
    A sensor with an `io_samples` attribute feeds the groups (bridge mode:
    the wire's IOs per initiator; a target host: each LUN's device, LIO's
    ACL counters, appliance/sensing/initiator_io.py); without one the
    grouped resources get no samples and their groups hold; its `io_span_s`,
    the time its last samples cover, scales them to one convergence. A sensor
    with initiator_names() (address -> the IQNs / NQNs it logged in with: the
    wire's logins on a bridge, LIO's ACLs and nvmet's debugfs on a target
    host) lets a group name its members by those; without it, or for an
    initiator it names nothing for, members match by address. A failing
    initiator_names() is a warning: that refresh matches by address. A
    sensor with want_io_samples() is told the grouped resources at every
    refresh, and makes IoSamples for those only (none without groups: a
    target host's 10,000 initiators cost nothing then).

Worked example
    [groups.db] members = ["iqn.2024-01.com.example:db1"]; the target's LIO
    ACL of that IQN has a session from 10.0.1.7, which loads vg0:
    initiator_names() gives {"10.0.1.7": ("iqn.2024-01.com.example:db1",)},
    so 10.0.1.7 is in db, vg0 is grouped (db names no resources), and
    10.0.1.7's IoSamples count for db at the next convergence.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from santhrottle.appliance.config.parse import Config
from santhrottle.appliance.daemon.core.group_overrides import GroupOverride, overlay
from santhrottle.appliance.daemon.core.groupmap import GroupMap, resolve_host
from santhrottle.controller.domain import IoSample
from santhrottle.controller.groups import Group
from santhrottle.controller.restate import configure_groups

log = logging.getLogger("santhrottled")


def build(config: Config, resolve: Any = None) -> GroupMap:
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
    if not config.groups:
        return set()
    named = {r for g in config.groups.values() for r in g.resources}
    free = {n for n, g in config.groups.items() if not g.resources}
    loaded = {r for ini, g in group_of.items() if g in free for r in loads.get(ini, ())}
    return set(known) & (named | loaded)


def initiator_names(sensors: Any) -> dict[str, Iterable[str]]:
    """address -> the names it logged in with, from the sensors (none without)."""
    names_of = getattr(sensors, "initiator_names", None)
    if not callable(names_of):
        return {}
    try:
        return dict(names_of())
    except Exception as e:  # a sensor failure must not stop the tick
        log.warning("groups: initiator names: %s; matching by address", e)
        return {}


def membership(daemon: Any) -> tuple[dict[str, str], dict[str, set[str]]]:
    """(initiator -> group, initiator -> the resources it loads) over the initiators
    the daemon's discovery knows."""
    d = daemon.state.discovery
    if d is None or not daemon.config.groups:
        return {}, {}
    loads = {ip: set(v.resources) for ip, v in d.initiators.items()}
    return daemon.group_map.group_of_all(loads, initiator_names(daemon.sensors)), loads


Membership = tuple[dict[str, str], dict[str, set[str]]]


def grouped_of(daemon: Any, known: Iterable[str], member: Membership | None = None) -> set[str]:
    """The daemon's grouped resources among `known` (a grouped resource needs no
    threshold: the controller has it, its PID observing, math.inf, for its groups);
    `member`: membership(daemon), when the caller has it already."""
    group_of, loads = member if member is not None else membership(daemon)
    return grouped_resources(daemon.config, known, group_of, loads)


def refresh(daemon: Any, member: Membership | None = None) -> None:
    """The daemon's groups (with their overrides), their members among the initiators
    its discovery knows, and the grouped resources, into its controller (under the
    daemon's lock); the sensors are told which resources want IoSamples. `member`:
    membership(daemon), when the caller has it already (one pass per discovery)."""
    ctl, config = daemon.ctl, daemon.config
    if config.groups or ctl.grouped:
        group_of, loads = member if member is not None else membership(daemon)
        grouped = grouped_resources(config, ctl.resources, group_of, loads)
        overrides = daemon.state.group_overrides
        changed = configure_groups(ctl, specs(config, overrides), group_of, grouped)
        if changed:
            log.info("groups: %d initiator class(es) changed", len(changed))
    want = getattr(daemon.sensors, "want_io_samples", None)
    if callable(want):  # only the grouped resources' (none: nothing computed)
        want(ctl.grouped)


def io_samples(sensors: Any, converge_s: float) -> list[IoSample]:
    """The sensors' IoSamples of the convergence just made (none without), their counts
    scaled to one convergence of converge_s: the controller reads them as one interval's,
    and on a loaded host a sensor's convergence can span more (`io_span_s`, the time its
    counts cover: 1.2 s counted as 1 s would overstate every group's throughput by 20 %)."""
    got = getattr(sensors, "io_samples", None)
    if not isinstance(got, list):
        return []
    span = getattr(sensors, "io_span_s", None)
    if not isinstance(span, int | float) or span <= 0.0 or span == converge_s:
        return list(got)
    k = converge_s / span
    return [s._replace(ios=s.ios * k, bytes=s.bytes * k, reads=s.reads * k) for s in got]
