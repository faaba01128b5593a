"""Reload (SIGHUP, `santhrottle reload`): the new file validated first, the last good kept.

The new file is read and checked (its groups' hosts resolved) outside the
daemon's lock; a bad one is refused with one line and the running config
stays.  A good one takes effect at once, except the restart keys
(config/schema.py, Key.restart), which keep their running values and are
listed in status' restart_needed until the next start.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from santhrottle.appliance.config import ConfigError
from santhrottle.appliance.daemon.control.commands import CommandError
from santhrottle.appliance.daemon.core import grouping
from santhrottle.appliance.daemon.core.group_overrides import prune
from santhrottle.appliance.daemon.core.hosts import HostMap
from santhrottle.controller.restate import reconfigure

if TYPE_CHECKING:
    from santhrottle.appliance.daemon.core.loop import Daemon

log = logging.getLogger("santhrottled")


def reload(d: Daemon) -> dict[str, Any]:
    if d._load_config is None:
        raise CommandError("this daemon was started without a config file")
    try:
        new = d._load_config(d.config.path)
        gmap = grouping.build(new)  # a group's host that does not resolve: ConfigError
    except ConfigError as e:
        d.counters.reload_failures += 1
        raise CommandError(f"reload refused, keeping the running config: {e}") from None
    with d.lock:
        d.group_map = gmap
        d.hosts = HostMap.of(new.hosts)
        old = d.config
        # restart keys keep their running values; the rest takes effect now
        d.restart_pending = new.restart_changes(old)
        d.config = new.keeping_restart_keys_of(old)
        prune(d.state.group_overrides, d.config.groups, "reload")  # logged
        if d.config.controller != old.controller:
            d.ctl = reconfigure(d.ctl, d.config.controller)
        if d.config.bridge_mode and hasattr(d.sensors, "reconfigure"):
            d.sensors.reconfigure(d.config.volumes())  # the resources' volumes
        d._resources_dirty = True
        d.counters.reloads += 1
    if d.restart_pending:
        log.warning(
            "reloaded %s; %s changed and take effect at the next restart",
            new.path,
            ", ".join(d.restart_pending),
        )
    else:
        log.info("reloaded %s", new.path)
    return {"reloaded": new.path, "restart_needed": list(d.restart_pending)}
