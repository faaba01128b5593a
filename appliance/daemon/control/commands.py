"""The control socket's commands: each one a call of the daemon's public methods, and its answer.

A command changes only the daemon's state (pins, pause, thresholds, the groups'
overrides, the configuration), through the daemon's public methods
(core/loop.py), which save it before they return; the kernel follows at the
next tick, from the tick's thread.  Every request's arguments are checked
first (control/requests.py: the one table of commands and arguments, the
config's rules) against this daemon's configuration; nothing unchecked reaches
the daemon.  A request that cannot be done raises CommandError with one line
for the admin.  The answer is built from fresh objects under the daemon's
lock and encoded by the control server after the lock is released.

Answers of the threshold commands: a ThresholdView each (status/views.py; the
same object as `status`'s resources' "threshold"; seconds, None: no threshold)
    threshold_show  {"vg0": {"threshold_s": 0.012, "configured_s": 0.01,
                     "override": true, "in_force_s": 0.012, "setpoint_fraction":
                     0.9, "fit": null}, ...}
    threshold_set   {"resource": "vg0", "threshold_s": 0.012, "configured_s": 0.01,
                     "override": true, ...}
    threshold_reset {"resource": "vg0", "threshold_s": 0.01, "configured_s": 0.01,
                     "override": false, ..., "removed_s": 0.012}  (removed_s: the
                     override it dropped, null when there was none)

The group commands (group_list, group_show, group_set, group_reset) and their
answers are control/group_commands.py's.

Worked example
    Commands(d).handle("pin", {"initiator": "10.0.0.3", "class": 10, "mode": "all"})
    -> {"initiator": "10.0.0.3", "class": 10, "delay_s": 0.005, "mode": "all"};
    the next tick puts 10.0.0.3 into class 10.
    handle("pin", {"initiator": "bogus", "class": 5, "mode": "all"})
    -> CommandError "pin: initiator: 'bogus' is not an IPv4 or IPv6 address";
    handle("pin", {"initiator": "FD00::2", "class": 10, "mode": "all"}) pins
    "fd00::2" (the data path's form, appliance/addresses.py).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from santhrottle.appliance.daemon.control import group_commands
from santhrottle.appliance.daemon.control.requests import (
    CHANGES,
    COMMANDS,
    Context,
    RequestError,
    check,
)
from santhrottle.appliance.daemon.control.server import MODE_ROOT, ControlServer
from santhrottle.appliance.daemon.control.why import why_answer
from santhrottle.appliance.daemon.core.audit import Caller
from santhrottle.appliance.daemon.core.errors import CommandError
from santhrottle.appliance.daemon.core.group_overrides import to_json as to_override_json
from santhrottle.appliance.daemon.status.build import StatusCache, threshold_view, volumes
from santhrottle.appliance.daemon.status.views import to_json

if TYPE_CHECKING:
    from santhrottle.appliance.daemon.core.loop import Daemon

__all__ = ["READ_ONLY", "CommandError", "Commands"]

# Commands that only read (the others change the state and are audited: CHANGES).
READ_ONLY = frozenset(COMMANDS) - CHANGES


class Commands:
    """The control server's dispatch for one daemon: handle(cmd, args) -> answer."""

    def __init__(self, daemon: Daemon, views: StatusCache | None = None) -> None:
        self.daemon = daemon
        self.views = views or StatusCache(daemon)

    def control_server(
        self, path: str, mode: int = MODE_ROOT, group: str | None = None, **kw: Any
    ) -> ControlServer:
        """The control socket of this daemon: each request's arguments checked against
        its configuration's bounds, each refused state change on the audit trail."""
        return ControlServer(
            path, self.handle, mode, group, refused=self.refused, context=self.context, **kw
        )

    def _threshold(self, name: str) -> dict[str, Any]:
        with self.daemon.lock:
            out: dict[str, Any] = to_json(threshold_view(self.daemon, name))
        return out

    def handle(self, cmd: str, args: dict[str, Any], caller: Caller | None = None) -> Any:
        """One request; raises CommandError with the line for the admin.  A command
        that changes the state goes to the audit trail (core/audit.py): who (the
        caller: the socket's peer credentials), what, before -> after, or refused."""
        d = self.daemon
        if cmd not in CHANGES:
            a = self._checked(cmd, args)
            with d.lock:
                return self._read(cmd, a)
        who = caller or Caller("socket")
        try:
            a = self._checked(cmd, args)
        except CommandError as e:
            self.refused(cmd, args, str(e), who)
            raise
        before = self._state(cmd, a)
        try:
            out = self._change(cmd, a)
        except CommandError as e:
            d.audit.command(who, cmd, a, before, None, refused=str(e))
            raise
        d.audit.command(who, cmd, a, before, self._state(cmd, a))
        return out

    def refused(self, cmd: str, args: Any, error: str, caller: Caller | None) -> None:
        """A state change the checks refused, with what was sent (cut short)."""
        sent = {str(k)[:40]: str(v)[:80] for k, v in args.items()} if isinstance(args, dict) else {}
        self.daemon.audit.command(caller or Caller("socket"), cmd, sent, None, None, error)

    def _state(self, cmd: str, a: dict[str, Any]) -> str:
        """What a change command changes, as it is now (the audit's before and after)."""
        d = self.daemon
        with d.lock:
            rt = d.runtime
            if cmd in ("pin", "unpin"):
                pin = rt.pins.get(a["initiator"])
                return "not pinned" if pin is None else f"class {pin[0]} {pin[1]}"
            if cmd in ("pause", "resume"):
                return "paused" if rt.paused else "running"
            if cmd.startswith("threshold_"):
                thr = d.threshold_of(a["resource"])
                over = " (override)" if a["resource"] in rt.thresholds else ""
                return f"{'none' if thr is None else thr}{over}"
            if cmd.startswith("group_"):
                return json.dumps(to_override_json(rt.group_overrides.get(a["group"])))
            return f"{d.config.path}, restart pending: {', '.join(d.restart_pending) or 'none'}"

    def _change(self, cmd: str, a: dict[str, Any]) -> Any:
        d = self.daemon
        if cmd == "reload":
            return {"reloaded": d.config.path, "restart_needed": d.reload()}
        if cmd == "threshold_set":
            d.set_threshold(a["resource"], a["threshold_s"])
            return {"resource": a["resource"], **self._threshold(a["resource"])}
        if cmd == "threshold_reset":
            removed = d.reset_threshold(a["resource"])
            return {
                "resource": a["resource"],
                **self._threshold(a["resource"]),
                "removed_s": removed,
            }
        if cmd == "pin":
            d.pin(a["initiator"], a["class"], a["mode"])
            return {
                "initiator": a["initiator"],
                "class": a["class"],
                "delay_s": d.config.ladder.delay_s(a["class"]),
                "mode": a["mode"],
            }
        if cmd == "unpin":
            d.unpin(a["initiator"])
            return {"initiator": a["initiator"], "unpinned": True}
        if cmd in ("pause", "resume"):
            d.set_paused(cmd == "pause")
            return {"paused": cmd == "pause"}
        return group_commands.handle(d, cmd, a)  # control/group_commands.py

    def _read(self, cmd: str, a: dict[str, Any]) -> Any:
        d = self.daemon
        if cmd in group_commands.READ_ONLY:
            return group_commands.handle(d, cmd, a)
        if cmd == "why":
            return why_answer(d, a["initiator"])
        if cmd == "ping":
            return {"pong": True}
        if cmd == "status":
            return to_json(self.views.status())
        if cmd == "resources":
            return to_json(self.views.status().resources)
        if cmd == "initiators":
            return to_json(self.views.status().initiators)
        if cmd == "volumes":
            rows = volumes(d)
            if rows is None:
                raise CommandError("volumes: santhrottled runs in target mode (no wire sensor)")
            return rows
        if cmd == "fleet_status":
            if d.fleet is None:
                raise CommandError("fleet status: santhrottled runs alone (no [fleet] endpoints)")
            return d.fleet.status()
        if cmd == "threshold_show":
            return {n: to_json(threshold_view(d, n)) for n in sorted(d.known_resources())}
        raise CommandError(f"unknown command {cmd!r}")  # in requests.COMMANDS, not here: a bug

    def context(self) -> Context:
        """What a request's arguments are checked against: this configuration's bounds."""
        d = self.daemon
        with d.lock:
            return Context(
                d.config.max_class, frozenset(d.known_resources()), frozenset(d.config.groups)
            )

    def _checked(self, cmd: str, args: dict[str, Any]) -> dict[str, Any]:
        try:
            return check(cmd, args, self.context())
        except RequestError as e:
            raise CommandError(str(e)) from None
