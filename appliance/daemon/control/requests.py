"""Control-socket requests: every command's arguments, checked with the config's rules.

What it owns
    COMMANDS, the one table of the control protocol's commands and, for each,
    its arguments and the Kind that checks each (appliance/config/schema.py's
    Kinds and bounds: the same rules as the configuration file).  Every
    argument of a command is required (group_set's targets and priority may
    be null: unchanged) and no other is accepted.  check()
    turns a parsed request into its normalised arguments, or raises
    RequestError with one line naming the command, the field and the problem.

Two passes
    The control server (daemon/control/server.py) checks every request without the
    daemon (types, finite numbers, addresses, modes, class <= MAX_CLASSES)
    before it calls the daemon; the daemon's command handler (commands.py)
    checks again with a Context (this configuration's max_class, the known
    resources and its groups) under its lock.  So nothing unchecked ever reaches the state.

Initiators are checked by appliance/addresses.py, the check every entry uses:
IPv4 or IPv6 unicast addresses an initiator can have (not 0.0.0.0, ::,
loopback, multicast, broadcast, link-local), in the data path's canonical form
("FD00:0::2" is "fd00::2", "::ffff:10.0.0.3" is 10.0.0.3): the form the
kernel's sets print and the sensors report, so a pin and the initiator it
names are one key.

Worked example
    check("pin", {"initiator": "10.0.0.3", "class": 10, "mode": "all"})
    -> {"initiator": "10.0.0.3", "class": 10, "mode": "all"}
    check("pin", {"initiator": "bogus", "class": 5, "mode": "all"})
    -> RequestError "pin: initiator: 'bogus' is not an IPv4 or IPv6 address"
    check("unpin", {"initiator": "FD00:0::2"}) -> {"initiator": "fd00::2"}
    check("pin", {"initiator": "0.0.0.0", "class": 5, "mode": "all"})
    -> RequestError "pin: initiator: '0.0.0.0' is unspecified: not an initiator's address"
    check("threshold_set", {"resource": "vg0", "threshold_s": 0.015},
          Context(max_class=100, resources=frozenset({"vg0"})))
    -> {"resource": "vg0", "threshold_s": 0.015}
    check("group_set", {"group": "db", "priority": 0, "latency_target_s": None,
          "throughput_target_bps": None, "throughput_target_iops": None})
    -> RequestError "group_set: priority: 0 must be above 0"
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from santhrottle.appliance.addresses import AddressError, initiator_address
from santhrottle.appliance.config.kinds import (
    AUTO,
    KindError,
    choice,
    name,
    positive_number,
    quote,
)
from santhrottle.appliance.config.schema import MAX_CLASSES, PIN_MODES, key
from santhrottle.appliance.daemon.core.audit import Caller
from santhrottle.appliance.daemon.core.errors import CommandError
from santhrottle.appliance.daemon.core.group_overrides import (
    check_latency_target_s,
    check_priority,
    check_throughput_bps,
    check_throughput_iops,
)
from santhrottle.controller.groups import DEFAULT_GROUP

log = logging.getLogger("santhrottled.control")

# The control protocol's version: in every reply ("protocol") and in the CLI's --json.
PROTOCOL_VERSION = 2
# The configuration key whose rules a runtime threshold follows.
THRESHOLD_KEY = key("resources.NAME.threshold")
NS_PER_S = 10**9
# An error line is cut to this many characters.
MAX_ERROR_CHARS = 400


class DaemonUnavailable(Exception):
    """No daemon answers on the control socket."""


class DaemonAbsent(DaemonUnavailable):
    """Nobody listens on the control socket: no daemon runs (the CLI's pin and
    unpin may then go to the kernel; never when a daemon is there but silent)."""


class RemoteError(Exception):
    """The daemon refused the request; the message is its one line."""


# (command, checked arguments, who asked: the socket's peer credentials) -> the answer
Handler = Callable[[str, dict[str, Any], Caller | None], Any]
# (command, the arguments as sent, why refused, who asked): a refusal for the audit trail
Refused = Callable[[str, Any, str, Caller | None], None]


class RequestError(Exception):
    """A request refused: one line naming the command and field."""


# What a refusal is: the request's (checked here) or the daemon's (core/errors.py).
REFUSALS = (RequestError, CommandError)


@dataclass(frozen=True)
class Context:
    """What only the running daemon knows: its configuration's bounds."""

    max_class: int
    resources: frozenset[str]
    groups: frozenset[str] = frozenset()  # [groups.NAME] of the configuration


Spec = Callable[[Any, Context | None], Any]


def _initiator(v: Any, _ctx: Context | None) -> str:
    try:
        return initiator_address(v)
    except AddressError as e:
        raise KindError(str(e)) from None


def _class(v: Any, ctx: Context | None) -> int:
    """A whole number (not a bool) within 0..max_class (MAX_CLASSES before the daemon)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise KindError(f"{quote(v)} is not a whole number")
    hi = MAX_CLASSES if ctx is None else ctx.max_class
    if not 0 <= v <= hi:
        raise KindError(f"{quote(v)} is outside 0..{hi}")
    return v


_MODE = choice(PIN_MODES)


def _mode(v: Any, _ctx: Context | None) -> str:
    try:
        return str(_MODE.parse(v))
    except KindError:
        raise KindError(f"{quote(v)} must be one of {', '.join(PIN_MODES)}") from None


_RESOURCE = name("resource")


def _resource(v: Any, ctx: Context | None) -> str:
    try:
        n = str(_RESOURCE.parse(v))
    except KindError:
        raise KindError(f"{quote(v)} is not a resource name") from None
    if ctx is not None and n not in ctx.resources:
        raise KindError(
            f"unknown resource {quote(n)}; known: {', '.join(sorted(ctx.resources)) or 'none'}"
        )
    return n


def _threshold_s(v: Any, _ctx: Context | None) -> float | str:
    """Seconds, finite and > 0, rounded to whole ns, within the config key's bounds;
    or "auto" (the threshold the daemon fits itself)."""
    if v == AUTO:
        return AUTO
    s = positive_number(v, "a number of seconds")
    ns = int((Decimal(repr(s)) * NS_PER_S).to_integral_value())
    if ns <= 0:
        raise KindError(f"{quote(v)} is below 1ns")
    # the file's rules, through the file's own Kind (its bounds, if it gets any)
    try:
        return float(THRESHOLD_KEY.kind.parse(f"{ns}ns"))
    except KindError as e:  # the Kind quotes the nanoseconds: quote what was sent
        raise KindError(str(e).replace(f"'{ns}ns'", f"{quote(v)} s", 1)) from None


_GROUP = name("group")


def _group_name(v: Any, ctx: Context | None, also: frozenset[str]) -> str:
    try:
        n = str(_GROUP.parse(v))
    except KindError:
        raise KindError(f"{quote(v)} is not a group name") from None
    if ctx is not None and n not in ctx.groups | also:
        known = ", ".join(sorted(ctx.groups)) or "none ([groups.NAME] in the configuration)"
        raise KindError(f"unknown group {quote(n)}; known: {known}")
    return n


def _group(v: Any, ctx: Context | None) -> str:
    """A configured group (its targets are the file's, so they can be overridden)."""
    return _group_name(v, ctx, frozenset())


def _group_shown(v: Any, ctx: Context | None) -> str:
    """A configured group, or "default" (the initiators in no group)."""
    return _group_name(v, ctx, frozenset({DEFAULT_GROUP}))


def _unset_or(check: Callable[[Any], float]) -> Spec:
    """null (leave the value as it is) or a value check() accepts."""

    def spec(v: Any, _ctx: Context | None) -> float | None:
        return None if v is None else check(v)

    return spec


NO_ARGS: dict[str, Spec] = {}
COMMANDS: dict[str, dict[str, Spec]] = {
    "ping": NO_ARGS,
    "status": NO_ARGS,
    "resources": NO_ARGS,
    "initiators": NO_ARGS,
    "volumes": NO_ARGS,
    "threshold_show": NO_ARGS,
    "fleet_status": NO_ARGS,
    "threshold_set": {"resource": _resource, "threshold_s": _threshold_s},
    "threshold_reset": {"resource": _resource},
    "group_list": NO_ARGS,
    "group_show": {"group": _group_shown},
    # null: unchanged (the earlier override's, else the file's); daemon/core/group_overrides.py
    "group_set": {
        "group": _group,
        "priority": _unset_or(check_priority),
        "latency_target_s": _unset_or(check_latency_target_s),
        "throughput_target_bps": _unset_or(check_throughput_bps),
        "throughput_target_iops": _unset_or(check_throughput_iops),
    },
    "group_reset": {"group": _group},
    "pin": {"initiator": _initiator, "class": _class, "mode": _mode},
    "unpin": {"initiator": _initiator},
    "pause": NO_ARGS,
    "resume": NO_ARGS,
    "reload": NO_ARGS,
    "why": {"initiator": _initiator},
}
# The commands that change the daemon's state: each goes to the audit trail.
CHANGES = frozenset(
    {
        "threshold_set",
        "threshold_reset",
        "group_set",
        "group_reset",
        "pin",
        "unpin",
        "pause",
        "resume",
        "reload",
    }
)


def one_line(msg: str) -> str:
    """msg on one line of at most MAX_ERROR_CHARS."""
    line = " ".join(msg.split())
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 3] + "..."


def reject_constant(name: str) -> Any:
    """json.loads' parse_constant: NaN and Infinity are not JSON numbers."""
    raise ValueError(f"{name} is not a JSON number")


def parse_line(line: bytes) -> tuple[str, dict[str, Any]]:
    """One request line -> (cmd, checked args), or RequestError (one line)."""
    cmd, args = decode_request(line)
    return cmd, check(cmd, args)


def decode_request(line: bytes) -> tuple[Any, Any]:
    """One request line -> (cmd, args) as sent (unchecked), or RequestError."""
    try:
        req = json.loads(line, parse_constant=reject_constant)
    except (ValueError, RecursionError) as e:  # JSON, UTF-8, nesting, int digits
        raise RequestError(one_line(f"bad request: {e}")) from None
    if not isinstance(req, dict) or "cmd" not in req:
        raise RequestError('bad request: a request is {"cmd": ..., "args": {...}}')
    extra = sorted(str(k) for k in req if k not in ("cmd", "args"))
    if extra:
        raise RequestError(f"bad request: unknown key {quote(extra[0])}")
    return req.get("cmd"), req.get("args", {})


def check(cmd: Any, args: Any, ctx: Context | None = None) -> dict[str, Any]:
    """The normalised arguments of one request, or RequestError (one line)."""
    if not isinstance(cmd, str) or cmd not in COMMANDS:
        raise RequestError(f"unknown command {quote(cmd)}; known: {', '.join(COMMANDS)}")
    if not isinstance(args, Mapping):
        raise RequestError(f"{cmd}: args must be an object, not {type(args).__name__}")
    spec = COMMANDS[cmd]
    extra = sorted(str(k) for k in args if k not in spec)
    if extra:
        expected = ", ".join(spec) or "none"
        raise RequestError(f"{cmd}: unknown argument {quote(extra[0])} (expected: {expected})")
    out: dict[str, Any] = {}
    for field, parse in spec.items():
        if field not in args:
            raise RequestError(f"{cmd}: {field}: missing")
        try:
            out[field] = parse(args[field], ctx)
        except KindError as e:
            raise RequestError(f"{cmd}: {field}: {e}") from None
    return out


def encode(obj: dict[str, Any]) -> bytes:
    """One reply line; an answer that cannot be encoded becomes a refusal."""
    obj = {"protocol": PROTOCOL_VERSION, **obj}
    try:
        return json.dumps(obj, allow_nan=False, default=str).encode() + b"\n"
    except (ValueError, TypeError, RecursionError) as e:
        err = {"ok": False, "protocol": PROTOCOL_VERSION, "error": f"cannot encode the answer: {e}"}
        return json.dumps(err).encode() + b"\n"


def answer(
    line: bytes,
    dispatch: Handler,
    caller: Caller | None = None,
    refused: Refused | None = None,
    context: Callable[[], Context] | None = None,
) -> dict[str, Any]:
    """The reply object to one request line (never raises).  The arguments are
    checked with the daemon's `context` (its max_class, resources, groups) when
    given.  A request of a command that changes the daemon's state refused by the
    checks: told to `refused` (the audit trail) with what was sent."""
    try:
        cmd, raw = decode_request(line)
        try:
            args = check(cmd, raw, None if context is None else context())
        except RequestError as e:
            if refused is not None and isinstance(cmd, str) and cmd in CHANGES:
                refused(cmd, raw, str(e), caller)
            raise
        return {"ok": True, "data": dispatch(cmd, args, caller)}
    except Exception as e:  # a one-line refusal, or a bug: never a crash
        if not isinstance(e, REFUSALS):
            log.exception("control: request failed")
        return {"ok": False, "error": one_line(str(e) or type(e).__name__)}


def parse_reply(line: bytes, path: str) -> Any:
    """The client's side: a reply line -> its data, or DaemonUnavailable / RemoteError."""
    try:
        resp = json.loads(line, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        raise DaemonUnavailable(f"santhrottled's reply on {path} is not JSON") from None
    if not isinstance(resp, dict) or not isinstance(resp.get("ok"), bool):
        raise DaemonUnavailable(f"santhrottled's reply on {path} is not an answer object")
    proto = resp.get("protocol")
    if proto != PROTOCOL_VERSION or isinstance(proto, bool):
        theirs = "no protocol version" if proto is None else f"protocol {one_line(repr(proto))}"
        raise RemoteError(
            f"santhrottled on {path} speaks {theirs}, this santhrottle speaks protocol "
            f"{PROTOCOL_VERSION}: restart santhrottled after an upgrade"
        )
    if not resp["ok"]:
        return_error = resp.get("error")
        raise RemoteError(one_line(str(return_error)) if return_error else "refused")
    return resp.get("data")
