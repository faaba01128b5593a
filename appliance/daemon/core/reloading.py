"""Reload (SIGHUP, `santhrottle reload`): the new file read and checked before anything changes.

read() loads the file with the loader the start used (daemon/main.py
load_daemon_config: the configuration's checks and the devices a daemon
needs), then resolves its groups' hosts (core/groupmap.py) and its
[hosts.NAME] map, all outside the daemon's lock.  A file that fails any of
it is refused with one line (ConfigError, or GroupMapError, one of them) and
the running configuration stays: an empty or truncated file is refused
exactly as at start.  The daemon applies a good one (core/loop.py reload):
at once, except the restart keys (config/schema.py, Key.restart), which keep
their running values and are listed in status' restart_needed until the next
start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from santhrottle.appliance.config import Config
from santhrottle.appliance.daemon.core import grouping
from santhrottle.appliance.daemon.core.groupmap import GroupMap
from santhrottle.appliance.daemon.core.hosts import HostMap

log = logging.getLogger("santhrottled")


@dataclass(frozen=True)
class NewConfig:
    config: Config
    group_map: GroupMap
    hosts: HostMap


def read(load: Callable[[str], Config], path: str) -> NewConfig:
    """The file at path, checked whole; ConfigError (one line) when it is not good."""
    new = load(path)
    return NewConfig(new, grouping.build(new), HostMap.of(new.hosts))


def log_reloaded(path: str, restart_pending: list[str]) -> None:
    if restart_pending:
        keys = ", ".join(restart_pending)
        log.warning("reloaded %s; %s changed and take effect at the next restart", path, keys)
    else:
        log.info("reloaded %s", path)
