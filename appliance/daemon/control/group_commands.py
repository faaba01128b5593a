"""The control socket's group commands: the view of a group, and its live overrides.

What it owns
    group_list, group_show, group_set and group_reset (their arguments are
    checked by control/requests.py, with the configuration's Kinds, before
    handle() is called), and group_view(), the
    answer's shape: a group's targets and priority in force, the file's, the
    override, its members (the file's entries and the initiators in it
    now) and, per grouped resource it is on, what the controller measured
    and decided (daemon/status/build.py's groups rows).  A set or reset changes the
    daemon's state through its public methods (set_group, reset_group: they
    save it, and hand the groups to the controller at once): the next
    convergence's arbitration uses the new targets, the next tick's classes
    follow.

Answers (seconds, bytes/s, IOs/s; null: none)
    group_show  {"group": "db", "priority": 4.0, "latency_target_s": 0.01,
                 "throughput_target_bps": null, "throughput_target_iops": 5000.0,
                 "configured": {"priority": 2.0, "latency_target_s": 0.01,
                   "throughput_target_bps": 200000000.0, "throughput_target_iops": null},
                 "override": {"priority": 4.0, "throughput_target_iops": 5000.0},
                 "configured_members": ["10.0.0.2"], "configured_resources": [],
                 "initiators": ["10.0.0.2"],
                 "resources": [{"resource": "vg0", "latency_s": 0.02, "io_latency_s":
                   0.02, "throughput_bps": 204800.0, "iops": 50.0, "y": 0.5,
                   "pwfte": 2.0, "share": 0.3, "demand": 0.1, "delay_class": 0,
                   "delay_s": 0.0, "target_class": 0, "members": ["10.0.0.2"],
                   "overloaded": true, "resource_latency_s": 0.02}]}
                "default" (the initiators in no group): configured null, override {}.
    group_list  [group_show's answer for each configured group, then "default"
                 where a grouped resource has it]
    group_set   group_show's answer after the change
    group_reset the same and "removed": the override it dropped (null: none)

Worked example
    handle(d, "group_set", {"group": "db", "priority": 4.0, "latency_target_s": None,
           "throughput_target_bps": None, "throughput_target_iops": None})
    -> db's view with "priority": 4.0, "override": {"priority": 4.0}; the
    controller's spec of db has priority 4 before the answer is sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from santhrottle.appliance.config.kinds import IOPS_SUFFIX
from santhrottle.appliance.config.parse import GroupConfig
from santhrottle.appliance.daemon.core.errors import CommandError
from santhrottle.appliance.daemon.core.group_overrides import (
    BYTES_PER_S,
    GroupOverride,
    overlay,
    to_json,
)
from santhrottle.appliance.daemon.status import build, views
from santhrottle.controller.groups import DEFAULT_GROUP

if TYPE_CHECKING:
    from santhrottle.appliance.daemon.core.loop import Daemon

COMMANDS = frozenset({"group_list", "group_show", "group_set", "group_reset"})
READ_ONLY = frozenset({"group_list", "group_show"})
# The keys of a status groups row that are the group's, not its resource's.
GROUP_KEYS = frozenset(
    {
        "group",
        "priority",
        "latency_target_s",
        "throughput_target_bps",
        "throughput_target_iops",
        "override",
    }
)


def _targets(
    priority: float, lat: float | None, bps: float | None, iops: float | None
) -> dict[str, Any]:
    return {
        "priority": priority,
        "latency_target_s": lat,
        "throughput_target_bps": bps,
        "throughput_target_iops": iops,
    }


def _file_targets(g: GroupConfig) -> dict[str, Any]:
    return _targets(
        g.priority, g.latency_target_s, g.throughput_target_bps, g.throughput_target_iops
    )


def _rows(daemon: Daemon) -> dict[str, list[dict[str, Any]]]:
    """status' group rows (per resource x group, status/build.py groups) by group."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in build.groups(daemon):
        out.setdefault(r.group, []).append(views.to_json(r))
    return out


def group_view(daemon: Daemon, name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One group's answer (the module's header): rows are its view.groups rows."""
    cfg = daemon.config.groups.get(name)
    ov = daemon.runtime.group_overrides.get(name)
    per_resource = [{k: v for k, v in r.items() if k not in GROUP_KEYS} for r in rows]
    if cfg is None:  # "default": no file entry, the controller's default priority
        spec = daemon.ctl.groups.spec(name)
        return {
            "group": name,
            **_targets(spec.priority, None, None, None),
            "configured": None,
            "override": {},
            "configured_members": [],
            "configured_resources": [],
            "initiators": sorted({ini for r in rows for ini in r["members"]}),
            "resources": per_resource,
        }
    eff = overlay(cfg, ov)
    group_of = daemon.ctl.groups.group_of
    return {
        "group": name,
        **_file_targets(eff),
        "configured": _file_targets(cfg),
        "override": to_json(ov),
        "configured_members": list(cfg.members),
        "configured_resources": list(cfg.resources),
        "initiators": sorted(ip for ip, g in group_of.items() if g == name),
        "resources": per_resource,
    }


def _asked(a: dict[str, Any]) -> GroupOverride:
    """group_set's checked arguments as an override; CommandError for none or both units."""
    bps, iops = a["throughput_target_bps"], a["throughput_target_iops"]
    if bps is not None and iops is not None:
        raise CommandError(
            "group_set: throughput_target_bps, throughput_target_iops: one throughput "
            "target, in B/s or in IOs/s, not both"
        )
    if a["priority"] is None and a["latency_target_s"] is None and bps is None and iops is None:
        raise CommandError(
            "group_set: nothing to set: give priority, latency_target_s, "
            "throughput_target_bps or throughput_target_iops"
        )
    tp: tuple[float, str] | None = None
    if bps is not None:
        tp = (bps, BYTES_PER_S)
    elif iops is not None:
        tp = (iops, IOPS_SUFFIX)
    return GroupOverride(a["priority"], a["latency_target_s"], tp)


def handle(daemon: Daemon, cmd: str, a: dict[str, Any]) -> Any:
    """One group command, its arguments checked: a change through the daemon's public
    methods, then the answer under its lock."""
    if cmd == "group_set":
        daemon.set_group(a["group"], _asked(a))  # the controller's specs before it returns
    removed = daemon.reset_group(a["group"]) if cmd == "group_reset" else None
    with daemon.lock:
        rows = _rows(daemon)
        if cmd == "group_list":
            names = list(daemon.config.groups)
            if DEFAULT_GROUP in rows:
                names.append(DEFAULT_GROUP)
            return [group_view(daemon, n, rows.get(n, [])) for n in names]
        name = a["group"]
        out = group_view(daemon, name, rows.get(name, []))
    if cmd == "group_reset":
        return {**out, "removed": to_json(removed) if removed is not None else None}
    if cmd in COMMANDS:
        return out
    raise CommandError(f"unknown command {cmd!r}")  # in COMMANDS, not here: a bug
