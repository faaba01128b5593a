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
    column_width,
    emit,
    envelope,
    ip_key,
    number,
    path_arg,
    verb,
)
from santhrottle.appliance.cli.groupview import print_status_groups
from santhrottle.appliance.config import DEFAULT_PATH, ConfigError, defaults, load_config
from santhrottle.appliance.config.kinds import KindError
from santhrottle.appliance.config.schema import key
from santhrottle.appliance.daemon.control.client import CLIENT_TIMEOUT_S, request
from santhrottle.appliance.daemon.control.requests import (
    DaemonAbsent,
    DaemonUnavailable,
    RemoteError,
)
from santhrottle.appliance.daemon.status.views import (
    FitView,
    InitiatorView,
    QuarantineView,
    StatusView,
    ThresholdView,
    ViewError,
    WireView,
    from_json,
    to_json,
)
from santhrottle.appliance.units import fmt_duration, fmt_mb, fmt_ms

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


def read_status(data: Any) -> StatusView:
    """The daemon's status answer as its typed view; Failed when it is not one."""
    try:
        return from_json(StatusView, data, "status")
    except ViewError as e:
        raise Failed(f"santhrottled's status answer does not read: {e}") from None


def print_status(data: Any) -> None:
    st = read_status(data)
    c = st.counters
    print(
        f"{'PAUSED' if st.paused else 'running'}; tick {fmt_duration(st.tick_s)}, "
        f"step {fmt_duration(st.step_s)}, write mode {st.write_mode}; "
        f"ticks {c.ticks}, late {c.tick_overruns}, sensor errors {c.sensor_errors}, "
        f"actuator errors {c.actuator_errors}"
    )
    if st.restart_needed:
        print(f"restart needed for: {', '.join(st.restart_needed)} (the file changed them)")
    if st.wire is not None:
        print(describe_wire(st.wire))
    names = {i.initiator: i.host for i in st.initiators if i.host}
    print(
        f"{'RESOURCE':<16} {'MODE':<8} {'THRESHOLD':>13} {'SETPT':>5} {'LAT_EWMA':>9} {'LAST':>9} "
        f"{'CLASS':>5} {'DELAY':>8}  MEMBERS"
    )
    for r in st.resources:
        th = r.threshold
        thr = fmt_threshold(th.threshold_s, th.in_force_s) + ("*" if th.override else "")
        sp = th.setpoint_fraction
        members = ",".join(names.get(m, m) for m in r.members) or "-"  # a host by its name
        print(
            f"{r.resource:<16} {r.mode:<8} {thr:>13} {'-' if sp is None else f'{sp:.2f}':>5} "
            f"{fmt_ms(r.read_latency_ewma_s):>9} {fmt_ms(r.read_latency_s):>9} "
            f"{r.delay_class:>5} {fmt_ms(r.delay_s):>8}  {members}"
        )
    print_initiators(st.initiators)
    for q in st.quarantine:  # what the kernel refused (docs/troubleshoot.md)
        print(describe_quarantine(q))
    if any(r.threshold.override for r in st.resources):
        print("* a threshold set at run time (threshold reset returns to the file's)")
    for r in st.resources:
        if r.threshold.threshold_s == "auto":
            print(f"{r.resource}: {describe_fit(r.threshold.fit, r.threshold.in_force_s)}")
    if st.groups:  # [groups.NAME]: per grouped resource and group (cli/groupview.py)
        print_status_groups([to_json(g) for g in st.groups])


def print_initiators(initiators: list[InitiatorView]) -> None:
    """The daemon's initiators, one row each (a [hosts.NAME] once: its addresses, and
    its name under HOST, a column shown with [hosts] only), IPv4 then IPv6; the
    address and resource columns as wide as their content (an IPv6 address is up to
    39 characters)."""
    rows = sorted(initiators, key=lambda i: ip_key(i.initiator))
    addrs = [",".join(i.addresses or [i.initiator]) for i in rows]
    res = [",".join(i.resources) or "-" for i in rows]
    hosts = [i.host or "-" for i in rows]
    wa, wr = column_width(addrs, "INITIATOR", 18), column_width(res, "RESOURCES", 20)
    wh = column_width(hosts, "HOST") if any(i.host for i in rows) else None
    head = f"{'INITIATOR':<{wa}} " + ("" if wh is None else f"{'HOST':<{wh}} ")
    print(f"{head}{'RESOURCES':<{wr}} {'WR_MB/s':>8} {'CLASS':>5} {'DELAY':>8} MODE")
    for i, a, r, h in zip(rows, addrs, res, hosts, strict=True):
        rate = sum(v for v in i.write_bytes_per_second.values() if v is not None)
        pinned = " (pinned)" if i.pinned else " (adopted)" if i.adopted else ""
        lead = f"{a:<{wa}} " + ("" if wh is None else f"{h:<{wh}} ")
        print(
            f"{lead}{r:<{wr}} {fmt_mb(rate):>8} {i.klass:>5} "
            f"{fmt_ms(i.delay_s):>8} {i.mode}{pinned}"
        )


def describe_quarantine(q: QuarantineView) -> str:
    """One line per initiator or shared object the kernel refused."""
    what = q.object if q.kind == "member" else f"{q.object} ({q.kind})"
    if q.retry_in_s is None:
        when = "never sent"
    else:
        when = f"next try in {q.retry_in_s:.0f} s, {q.retries} tries so far"
    return f"QUARANTINED {what}: {q.error} ({when})"


def describe_wire(w: WireView) -> str:
    """Bridge mode: the wire sensor in one line (counts since the daemon's start)."""
    state = "capturing" if w.capturing else "NOT capturing (see the log)"
    where = " in the kernel" if w.sensor == "kernel" else ""
    n = w.counters
    lost = (
        f"{n.get('kernel_desyncs', 0)} desyncs, {n.get('kernel_gaps', 0)} gaps"
        if where
        else f"{n.get('capture_kernel_drops', 0)} dropped by a full ring"
    )
    return (
        f"bridge mode, wire {state}{where}: {n.get('commands', 0)} commands, "
        f"{n.get('completions', 0)} completed, {n.get('unmatched', 0)} unmatched, "
        f"{n.get('aged', 0)} aged out; {n.get('capture_frames', 0)} frames, {lost}"
    )


def fmt_threshold(thr: Any, in_force: float | None) -> str:
    """A threshold as asked for; "auto" with the one in force ("-": observed)."""
    if thr == "auto":
        return f"auto {fmt_ms(in_force) if in_force is not None else '-'}"
    return fmt_ms(thr)


def describe_fit(fit: FitView | None, in_force: float | None) -> str:
    """threshold "auto": the LQ fit (C, m, R^2, windows, Q seen) and what is in force."""
    force = f"in force {fmt_ms(in_force)}" if in_force is not None else "observed (no fallback)"
    if fit is None or not fit.windows:
        return f"LQ fit: no samples yet; {force} (the fallback)"
    line = (
        f"LQ fit L = {fmt_ms(fit.intercept_s)} + {fmt_ms(fit.slope_s_per_io)} x Q, "
        f"R^2 {_num(fit.r_squared)}, {fit.windows:.0f} windows, "
        f"Q {_num(fit.q_lo)}..{_num(fit.q_hi)} IOs"
    )
    if fit.fitted:
        return f"{line}; threshold C/(1-alpha) {force}"
    return f"{line}; not confident yet: {force} (the fallback)"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


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


def read_threshold(data: Any, where: str = "threshold") -> ThresholdView:
    """One resource's threshold in an answer (status/views.py ThresholdView)."""
    try:
        return from_json(ThresholdView, data, where)
    except ViewError as e:
        raise Failed(f"santhrottled's answer does not read: {e}") from None


def describe_threshold(th: ThresholdView) -> str:
    """The threshold in force, "auto" with its fit, an override with the file's."""
    thr = th.threshold_s
    text = fmt_threshold(thr, th.in_force_s) if thr is not None else "none (observe only)"
    if thr == "auto":
        text += f"; {describe_fit(th.fit, th.in_force_s)}"
    if th.override:
        conf = th.configured_s
        text += f" (override; file: {fmt_ms(conf) if conf is not None else 'none'})"
    return text


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


def add_commands(sub: Any) -> None:
    _common(verb(sub, "status", "resources, thresholds, delay classes and initiators", EPILOG))
    sub.choices["status"].set_defaults(func=cmd_status)
    t = verb(sub, "threshold", "show, set or reset a resource's read-latency threshold",
             THRESHOLD_EPILOG)  # fmt: skip
    tsub = t.add_subparsers(dest="threshold_command", metavar="ACTION", required=True)
    _common(verb(tsub, "show", "print every resource's threshold; overrides as overrides",
                 THRESHOLD_EPILOG))  # fmt: skip
    tsub.choices["show"].set_defaults(func=cmd_threshold_show)
    ts = _common(verb(tsub, "set", "override a resource's threshold until reset or restart",
                      THRESHOLD_EPILOG))  # fmt: skip
    ts.add_argument(
        "operands",
        nargs=argparse.REMAINDER,
        metavar="RESOURCE VALUE",
        help="the resource and a duration with its unit (15ms, 2.5ms, 500us)",
    )
    ts.set_defaults(func=cmd_threshold_set)
    tr = _common(verb(tsub, "reset", "return a resource's threshold to the configuration's",
                      THRESHOLD_EPILOG))  # fmt: skip
    tr.add_argument("resource", metavar="RESOURCE", help="the resource, as status names it")
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
