"""The control socket's commands: what each does to the daemon's state, and its answer.

A command changes only the daemon's state (pins, pause, thresholds, the
configuration); the kernel follows at the next tick, from the tick's thread.
A request that cannot be done raises CommandError with one line for the admin.

Worked example
    handle(d, "pin", {"initiator": "10.0.0.3", "class": 10, "mode": "all"})
    -> {"initiator": "10.0.0.3", "class": 10, "delay_s": 0.005, "mode": "all"};
    the next tick puts 10.0.0.3 into class 10.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from santhrottle.appliance.config.schema import PIN_MODES

if TYPE_CHECKING:
    from santhrottle.appliance.daemon.loop import Daemon


class CommandError(Exception):
    """A control-socket request that cannot be done; the message goes to the admin."""


def handle(daemon: Daemon, cmd: str, args: dict[str, Any]) -> Any:
    """One request; raises CommandError with the line for the admin."""
    with daemon.lock:
        if cmd == "ping":
            return {"pong": True}
        if cmd == "status":
            return daemon.status()
        if cmd == "resources":
            return daemon.status()["resources"]
        if cmd == "initiators":
            return daemon.status()["initiators"]
        if cmd == "threshold_show":
            return {n: daemon.threshold_of(n) for n in sorted(daemon.known_resources())}
        if cmd == "threshold_set":
            name = args.get("resource")
            thr = args.get("threshold_s")
            if name not in daemon.known_resources():
                raise CommandError(
                    f"unknown resource {name!r}; known: "
                    f"{', '.join(sorted(daemon.known_resources())) or 'none'}"
                )
            if not isinstance(thr, int | float) or isinstance(thr, bool) or not thr > 0:
                raise CommandError("threshold must be a positive duration")
            daemon.state.thresholds[name] = float(thr)
            daemon._reconcile_resources()
            return {"resource": name, "threshold_s": float(thr)}
        if cmd == "pin":
            ip, k, mode = args.get("initiator"), args.get("class"), args.get("mode")
            if not isinstance(ip, str) or not isinstance(k, int) or mode not in PIN_MODES:
                raise CommandError("pin needs initiator, class and mode (all|ack|read)")
            if not 0 <= k <= daemon.config.max_class:
                raise CommandError(f"class {k} outside 0..{daemon.config.max_class}")
            daemon.state.pins[ip] = (k, mode)  # applied by the next tick
            return {
                "initiator": ip,
                "class": k,
                "delay_s": k * daemon.config.step_s,
                "mode": mode,
            }
        if cmd == "unpin":
            ip = args.get("initiator")
            if ip not in daemon.state.pins:
                raise CommandError(f"{ip!r} is not pinned")
            del daemon.state.pins[ip]
            return {"initiator": ip, "unpinned": True}
        if cmd in ("pause", "resume"):
            daemon.state.paused = cmd == "pause"
            return {"paused": daemon.state.paused}
    if cmd == "reload":
        return daemon.reload()
    raise CommandError(f"unknown command {cmd!r}")
