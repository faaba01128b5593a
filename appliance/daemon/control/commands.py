"""The control socket's commands: what each does to the daemon's state, and its answer.

A command changes only the daemon's state (pins, pause, thresholds, the groups'
overrides, the configuration); the kernel follows at the next tick, from the tick's thread.
Every request's arguments are checked first (daemon/control/requests.py: the one
table of commands and arguments, the config's rules) against this daemon's
configuration, under the daemon's lock; nothing unchecked reaches the state.
A request that cannot be done raises CommandError with one line for the admin.
The answer is built from fresh objects: the control server encodes it after
the lock is released, while the tick may change the state.

Answers of the threshold commands (seconds; None: no threshold, observed)
    threshold_show  {"vg0": {"threshold_s": 0.012, "configured_s": 0.01,
                     "override": true}, "vg1": {"threshold_s": null,
                     "configured_s": null, "override": false}}
    threshold_set   {"resource": "vg0", "threshold_s": 0.012, "configured_s": 0.01,
                     "override": true}
    threshold_reset {"resource": "vg0", "threshold_s": 0.01, "configured_s": 0.01,
                     "override": false, "removed_s": 0.012}  (removed_s: the
                     override it dropped, null when there was none)

The group commands (group_list, group_show, group_set, group_reset) and their
answers are daemon/control/group_commands.py's.

Worked example
    handle(d, "pin", {"initiator": "10.0.0.3", "class": 10, "mode": "all"})
    -> {"initiator": "10.0.0.3", "class": 10, "delay_s": 0.005, "mode": "all"};
    the next tick puts 10.0.0.3 into class 10.
    handle(d, "pin", {"initiator": "bogus", "class": 5, "mode": "all"})
    -> CommandError "pin: initiator: 'bogus' is not an IPv4 or IPv6 address";
    handle(d, "pin", {"initiator": "FD00::2", "class": 10, "mode": "all"}) pins
    "fd00::2" (the data path's form, daemon/control/requests.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from santhrottle.appliance.daemon.control import group_commands
from santhrottle.appliance.daemon.control.requests import CommandError, Context, RequestError, check
from santhrottle.appliance.daemon.status import build as view

if TYPE_CHECKING:
    from santhrottle.appliance.daemon.core.loop import Daemon

# Pins share the mode sets with the controller's members (datapath MAXELEM
# 65,536 per set): a bound far below it, so pins can never fill a set.
MAX_PINS = 4096


# Commands that only read: no state to save, the status cache stays.
READ_ONLY = frozenset(
    {"ping", "status", "resources", "initiators", "volumes", "threshold_show", "fleet_status"}
    | group_commands.READ_ONLY
)


def _threshold(daemon: Daemon, name: str) -> dict[str, Any]:
    """threshold_s: what is asked for (seconds, "auto", None); in_force_s: what the
    PID regulates to now (auto: the fitted one, or the fallback; None: observed)."""
    return {
        "threshold_s": daemon.threshold_of(name),
        "configured_s": daemon.config.threshold_of(name),
        "override": name in daemon.state.thresholds,
        **view.threshold_view(daemon, name),
    }


def handle(daemon: Daemon, cmd: str, args: dict[str, Any]) -> Any:
    """One request; raises CommandError with the line for the admin."""
    if cmd == "reload":  # reads the file outside the lock (Daemon.reload)
        _checked(daemon, cmd, args)
        return daemon.reload()
    with daemon.lock:
        a = _checked(daemon, cmd, args)
        if cmd == "ping":
            return {"pong": True}
        if cmd == "status":
            return daemon.status()
        if cmd == "resources":
            return daemon.status()["resources"]
        if cmd == "initiators":
            return daemon.status()["initiators"]
        if cmd == "volumes":
            rows = view.volumes(daemon)
            if rows is None:
                raise CommandError("volumes: santhrottled runs in target mode (no wire sensor)")
            return rows
        if cmd == "fleet_status":
            if daemon.fleet is None:
                raise CommandError("fleet status: santhrottled runs alone (no [fleet] endpoints)")
            return daemon.fleet.status()
        if cmd == "threshold_show":
            return {n: _threshold(daemon, n) for n in sorted(daemon.known_resources())}
        if cmd == "threshold_set":
            name = a["resource"]
            daemon.state.thresholds[name] = a["threshold_s"]
            daemon._reconcile_resources()
            return {"resource": name, **_threshold(daemon, name)}
        if cmd == "threshold_reset":
            name = a["resource"]
            removed = daemon.state.thresholds.pop(name, None)
            daemon._reconcile_resources()
            return {"resource": name, **_threshold(daemon, name), "removed_s": removed}
        if cmd == "pin":
            ip, k, mode = a["initiator"], a["class"], a["mode"]
            pins = daemon.state.pins
            if ip not in pins and len(pins) >= MAX_PINS:
                raise CommandError(f"pin: {len(pins)} initiators pinned already (at most "
                                   f"{MAX_PINS}): unpin some first")  # fmt: skip
            pins[ip] = (k, mode)  # applied by the next tick
            return {
                "initiator": ip,
                "class": k,
                "delay_s": daemon.config.ladder.delay_s(k),
                "mode": mode,
            }
        if cmd == "unpin":
            ip = a["initiator"]
            if ip not in daemon.state.pins:
                raise CommandError(f"{ip!r} is not pinned")
            del daemon.state.pins[ip]
            return {"initiator": ip, "unpinned": True}
        if cmd in group_commands.COMMANDS:  # daemon/control/group_commands.py
            return group_commands.handle(daemon, cmd, a)
        if cmd in ("pause", "resume"):
            daemon.state.paused = cmd == "pause"
            return {"paused": daemon.state.paused}
    raise CommandError(f"unknown command {cmd!r}")  # in requests.COMMANDS, not here: a bug


def _checked(daemon: Daemon, cmd: str, args: dict[str, Any]) -> dict[str, Any]:
    with daemon.lock:
        ctx = Context(
            daemon.config.max_class,
            frozenset(daemon.known_resources()),
            frozenset(daemon.config.groups),
        )
    try:
        return check(cmd, args, ctx)
    except RequestError as e:
        raise CommandError(str(e)) from None
