"""CLI commands that talk to santhrottled through its control socket.

What it owns
    status, threshold show|set|reset, pause, resume, reload, top.  The socket is
    --socket, else daemon.control_socket of the configuration.  call() is the
    one way to the daemon: a daemon that is not running, does not answer within
    --timeout or breaks the connection is NoDaemon (exit 3), a refusal is
    Failed (exit 1); a bad value never reaches the socket (exit 2).

Worked example
    `santhrottle threshold show` against a daemon with an override prints
    "vg0              15.00ms (override; file: 30.00ms)"; `threshold reset vg0`
    sends {"cmd": "threshold_reset", "args": {"resource": "vg0"}} and prints
    "vg0: threshold 30.00ms (the file's)".
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from santhrottle.appliance.cli.common import (
    EXIT_OK,
    JSON_HELP,
    CliError,
    Failed,
    NoDaemon,
    emit,
    envelope,
    ip_address,
    number,
    path_arg,
    verb,
)
from santhrottle.appliance.cli.completion import THRESHOLD_OPERAND, complete_names
from santhrottle.appliance.cli.statusview import (
    describe_threshold,
    fmt_threshold,
    print_status,
    print_why,
    read_threshold,
)
from santhrottle.appliance.config import DEFAULT_PATH, ConfigError, defaults, load_config
from santhrottle.appliance.config.kinds import KindError
from santhrottle.appliance.config.schema import key
from santhrottle.appliance.daemon.control.client import CLIENT_TIMEOUT_S, request
from santhrottle.appliance.daemon.control.requests import (
    DaemonAbsent,
    DaemonUnavailable,
    RemoteError,
)

EPILOG = """\
examples:
  santhrottle status                       # resources, thresholds, classes, initiators, groups
  santhrottle status --json | jq '.data.resources[] | {resource, read_latency_ewma_s}'
  santhrottle threshold set vg_aic 15ms    # takes effect at the next tick (100 ms)
  santhrottle threshold show
  santhrottle pause                        # remove every delay, keep measuring
  santhrottle resume
  santhrottle top 1 10                     # a live view: every 1 s, 10 times
  santhrottle reload                       # re-read the config (SIGHUP does the same)

--json prints {"protocol": N, "data": ...}: N is the control protocol's version,
data the daemon's answer (top --json: one such object per line and view).
"""
# The longest interval `top` sleeps between two views.
MAX_TOP_INTERVAL_S = 86_400.0

THRESHOLD_EPILOG = """\
examples:
  santhrottle threshold show
  santhrottle threshold show --json
  santhrottle threshold set vg_aic 15ms    # takes effect at the next tick (100 ms)
  santhrottle threshold set vg_aic 2.5ms
  santhrottle threshold reset vg_aic       # back to the configuration's value

A threshold set here is an override: `threshold show` says so and names the
file's value, and `threshold reset` returns to it.  Put it in the
configuration ([resources.NAME] threshold) to make it the file's.  --json
prints {"protocol": N, "data": ...}: N is the control protocol's version; show's
data is per resource {"threshold_s", "configured_s", "override", "in_force_s",
"setpoint_fraction", "fit"}, the object status --json shows as a resource's
"threshold".
"""


def _socket(args: argparse.Namespace) -> str:
    """--socket, else the configuration's daemon.control_socket; the default socket
    only when the default configuration file does not exist.  A file that is there
    but does not load is a CliError (exit 2): a socket guessed behind the admin's back
    could be another daemon's."""
    if args.socket:
        return str(args.socket)
    if args.config == DEFAULT_PATH and not os.path.lexists(DEFAULT_PATH):
        return defaults().control_socket
    try:
        return load_config(args.config).control_socket
    except ConfigError as e:
        raise CliError(f"{e} (or give --socket)") from None


def call(
    args: argparse.Namespace,
    cmd: str,
    *,
    path: str | None = None,
    absent_ok: bool = False,
    **kw: Any,
) -> Any:
    """One request to the daemon on `path` (default: _socket(args)): NoDaemon (exit 3)
    when it does not run or answer within --timeout, Failed (exit 1) when it refuses or
    answers something that is not a reply.  absent_ok: None when nobody listens there
    (pin and unpin then go to the kernel); a daemon that does not answer is NoDaemon."""
    path = path or _socket(args)
    try:
        return request(path, cmd, timeout_s=args.timeout, **kw)
    except DaemonAbsent as e:
        if absent_ok:
            return None
        raise NoDaemon(str(e)) from None
    except DaemonUnavailable as e:  # there, but silent: never behind its back
        raise NoDaemon(str(e)) from None
    except RemoteError as e:
        raise Failed(str(e)) from None
    except TimeoutError:  # before OSError: it is one
        raise NoDaemon(f"santhrottled does not answer on {path} within {args.timeout:g}s") from None
    except OSError as e:
        raise NoDaemon(f"santhrottled does not answer on {path}: {e.strerror or e}") from None
    except ValueError as e:  # a reply that is not JSON
        raise Failed(f"santhrottled sent a reply that is not JSON on {path}: {e}") from None


def cmd_status(args: argparse.Namespace) -> int:
    return emit(args, call(args, "status"), print_status)


_REMAINDER_OPTIONS = ("--socket", "--config", "--timeout")


def _split_operands(args: argparse.Namespace) -> list[str]:
    """Operands after `threshold set`, with --json/--socket/--config/--timeout taken
    out (REMAINDER: "-5ms" must reach the unit parser, one clear error, not argparse).
    An option's value is checked as argparse would have."""
    rest: list[str] = []
    it = iter(args.operands)
    for a in it:
        name, eq, inline = a.partition("=")
        if a == "--json":
            args.json = True
        elif name in _REMAINDER_OPTIONS:
            value = inline if eq else next(it, None)
            if value is None:
                raise CliError(f"{name} needs a value")
            try:
                parsed = _OPTION_TYPES[name](value)
            except argparse.ArgumentTypeError as e:
                raise CliError(str(e)) from None
            setattr(args, name[2:], parsed)
        else:
            rest.append(a)
    return rest


def _print_thresholds(data: Any) -> None:
    """Per resource: its threshold, marked when it is an override."""
    if not isinstance(data, dict):
        raise Failed("santhrottled's threshold_show answer is not an object")
    for name, v in data.items():
        print(f"{name:<16} {describe_threshold(read_threshold(v, name))}")


def cmd_threshold_show(args: argparse.Namespace) -> int:
    return emit(args, call(args, "threshold_show"), _print_thresholds)


def _threshold_value(value: str) -> float | str:
    """The configuration's own rules for a threshold (a duration > 0, at most 60 s,
    or "auto")."""
    try:
        thr: float | str = key("resources.NAME.threshold").kind.parse(value)
    except KindError as e:
        raise CliError(f"threshold: {e}") from None
    return thr


def cmd_threshold_set(args: argparse.Namespace) -> int:
    operands = _split_operands(args)
    if len(operands) != 2:
        raise CliError("usage: santhrottle threshold set RESOURCE VALUE (e.g. 15ms)")
    resource, value = operands
    _check_resource(resource)
    thr = _threshold_value(value)
    data = call(args, "threshold_set", resource=resource, threshold_s=thr)
    return emit(
        args,
        data,
        lambda d: print(f"{d['resource']}: threshold {_in_force(d)}"),
    )


def _in_force(d: dict[str, Any]) -> str:
    """A threshold_set / threshold_reset answer's threshold (its ThresholdView fields)."""
    th = read_threshold({k: v for k, v in d.items() if k not in ("resource", "removed_s")})
    return fmt_threshold(th.threshold_s, th.in_force_s)


def _print_reset(d: dict[str, Any]) -> None:
    if d.get("threshold_s") is None:
        print(f"{d['resource']}: no threshold (observe only), as in the configuration")
    else:
        print(f"{d['resource']}: threshold {_in_force(d)} (the configuration's)")


def cmd_threshold_reset(args: argparse.Namespace) -> int:
    _check_resource(args.resource)
    return emit(args, call(args, "threshold_reset", resource=args.resource), _print_reset)


def _check_resource(name: str) -> None:
    if not name.strip() or not name.isprintable():
        raise CliError(f"bad resource name {name!r}: give the name status shows, e.g. vg0")


def _print_simple(d: dict[str, Any]) -> None:
    if "paused" in d:
        print("paused: every delay is removed at the next tick" if d["paused"] else "resumed")
    elif "reloaded" in d:
        pending = d.get("restart_needed") or []
        print(f"reloaded {d['reloaded']}")
        if pending:
            print(f"these keys changed and take effect at the next restart: {', '.join(pending)}")
    else:
        print(", ".join(f"{k} {v}" for k, v in d.items()))


def cmd_simple(args: argparse.Namespace) -> int:
    return emit(args, call(args, args.command), _print_simple)


def cmd_top(args: argparse.Namespace) -> int:
    n = 0
    try:
        while args.count is None or n < args.count:
            if n:
                time.sleep(args.interval)
            st = call(args, "status")
            if args.json:
                print(json.dumps(envelope(st), allow_nan=False), flush=True)
            else:
                print(time.strftime("%H:%M:%S"))
                print_status(st)
                print(flush=True)
            n += 1
    except KeyboardInterrupt:  # the way to end `top` without a count
        print(flush=True)
    return EXIT_OK


_OPTION_TYPES: dict[str, Any] = {
    "--socket": path_arg("--socket", socket=True),
    "--config": path_arg("--config"),
    "--timeout": number("--timeout", hi=3600.0, positive=True),
}


def socket_options(
    p: argparse.ArgumentParser, socket_help: str = "control socket (default: the configuration's)"
) -> argparse.ArgumentParser:
    """--config, --socket and --timeout: where the daemon is and how long to wait."""
    p.add_argument(
        "--config",
        default=DEFAULT_PATH,
        type=_OPTION_TYPES["--config"],
        help="where the socket's path is read from",
    )
    p.add_argument("--socket", type=_OPTION_TYPES["--socket"], help=socket_help)
    p.add_argument(
        "--timeout",
        type=_OPTION_TYPES["--timeout"],
        default=CLIENT_TIMEOUT_S,
        metavar="S",
        help="seconds to wait for the daemon's answer (default %(default)g); no answer: exit 3",
    )
    return p


def _common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    return socket_options(p)


WHY_EPILOG = """\
examples:
  santhrottle why 10.0.0.3                 # its delay now, and each change with its reason
  santhrottle why fd00::3 --json

The daemon keeps, per initiator, its last 64 class changes (the resource, from -> to
and why: write-heavy on a resource, its controller, a group's arbiter, a pin, a pause,
the fleet leader's decision, a previous run's member lowered) and the commands that
named it (pin, unpin: who), for the last 4,096 initiators that had one; the same
records are in its log (journalctl -u santhrottled SANTHROTTLE_INITIATOR=10.0.0.3).
--json prints {"protocol": N, "data": ...}.
"""


def cmd_why(args: argparse.Namespace) -> int:
    return emit(args, call(args, "why", initiator=args.initiator), print_why)


def add_commands(sub: Any) -> None:
    _common(verb(sub, "status", "resources, thresholds, delay classes and initiators", EPILOG))
    sub.choices["status"].set_defaults(func=cmd_status)
    w = _common(
        verb(sub, "why", "why an initiator is delayed as it is: its recent history", WHY_EPILOG)
    )
    complete_names(
        w.add_argument(
            "initiator",
            metavar="INITIATOR",
            type=ip_address,
            help="the initiator's IPv4 or IPv6 address",
        ),
        "initiators",
    )
    w.set_defaults(func=cmd_why)
    t = verb(
        sub, "threshold", "show, set or reset a resource's read-latency threshold", THRESHOLD_EPILOG
    )
    tsub = t.add_subparsers(dest="threshold_command", metavar="ACTION", required=True)
    _common(
        verb(
            tsub,
            "show",
            "print every resource's threshold; overrides as overrides",
            THRESHOLD_EPILOG,
        )
    )
    tsub.choices["show"].set_defaults(func=cmd_threshold_show)
    ts = _common(
        verb(
            tsub, "set", "override a resource's threshold until reset or restart", THRESHOLD_EPILOG
        )
    )
    complete_names(
        ts.add_argument(
            "operands",
            nargs=argparse.REMAINDER,
            metavar="RESOURCE VALUE",
            help="the resource and a duration with its unit (15ms, 2.5ms, 500us)",
        ),
        THRESHOLD_OPERAND,
    )
    ts.set_defaults(func=cmd_threshold_set)
    tr = _common(
        verb(
            tsub, "reset", "return a resource's threshold to the configuration's", THRESHOLD_EPILOG
        )
    )
    complete_names(
        tr.add_argument("resource", metavar="RESOURCE", help="the resource, as status names it"),
        "resources",
    )
    tr.set_defaults(func=cmd_threshold_reset)
    for name, help_ in (
        ("pause", "stop throttling (every delay removed), keep measuring"),
        ("resume", "throttle again"),
        ("reload", "re-read the config; the running one stays if the file is invalid"),
    ):
        _common(verb(sub, name, help_, EPILOG)).set_defaults(func=cmd_simple)
    top = _common(
        verb(sub, "top", "a live view of status, like iostat: [interval] [count]", EPILOG)
    )
    top.add_argument(
        "interval",
        nargs="?",
        type=number("interval", hi=MAX_TOP_INTERVAL_S, positive=True),
        default=1.0,
        help="seconds between views, above 0 (default 1)",
    )
    top.add_argument(
        "count",
        nargs="?",
        type=number("count", positive=True, integer=True),
        help="views to print, at least 1 (default: until ^C)",
    )
    top.set_defaults(func=cmd_top)
