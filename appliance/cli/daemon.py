"""CLI commands that talk to santhrottled through its control socket.

status, threshold set|show, pause, resume, reload, top.  The socket is
--socket, else daemon.control_socket of the configuration.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from santhrottle.appliance.cli.common import CliError, emit, verb
from santhrottle.appliance.config import DEFAULT_PATH, ConfigError, defaults, load_config
from santhrottle.appliance.daemon.control import DaemonUnavailable, RemoteError, request
from santhrottle.appliance.units import UnitError, fmt_duration, fmt_mb, fmt_ms, parse_duration_s

EPILOG = """\
examples:
  santhrottle status                       # resources, thresholds, classes, initiators
  santhrottle status --json | jq '.resources[] | {resource, read_latency_ewma_s}'
  santhrottle threshold set vg_aic 15ms    # takes effect at the next tick (100 ms)
  santhrottle threshold show
  santhrottle pause                        # remove every delay, keep measuring
  santhrottle resume
  santhrottle top 1 10                     # a live view: every 1 s, 10 times
  santhrottle reload                       # re-read the config (SIGHUP does the same)
"""

THRESHOLD_EPILOG = """\
examples:
  santhrottle threshold show
  santhrottle threshold show --json
  santhrottle threshold set vg_aic 15ms    # takes effect at the next tick (100 ms)
  santhrottle threshold set vg_aic 2.5ms

A threshold set here lives until the daemon restarts; put it in the
configuration ([resources.NAME] threshold) to keep it.
"""


def _socket(args: argparse.Namespace) -> str:
    if args.socket:
        return str(args.socket)
    try:
        return load_config(args.config).control_socket
    except ConfigError:
        return defaults().control_socket  # the default path; the daemon will say the rest


def call(args: argparse.Namespace, cmd: str, **kw: Any) -> Any:
    try:
        return request(_socket(args), cmd, **kw)
    except (DaemonUnavailable, RemoteError) as e:
        raise CliError(str(e)) from None


def print_status(st: dict[str, Any]) -> None:
    c = st["counters"]
    print(
        f"{'PAUSED' if st['paused'] else 'running'}; tick {fmt_duration(st['tick_s'])}, "
        f"step {fmt_duration(st['step_s'])}, write mode {st['write_mode']}; "
        f"ticks {c['ticks']}, late {c['tick_overruns']}, sensor errors {c['sensor_errors']}, "
        f"actuator errors {c['actuator_errors']}"
    )
    print(
        f"{'RESOURCE':<16} {'MODE':<8} {'THRESHOLD':>9} {'LAT_EWMA':>9} {'LAST':>9} "
        f"{'CLASS':>5} {'DELAY':>8}  MEMBERS"
    )
    for r in st["resources"]:
        print(
            f"{r['resource']:<16} {r['mode']:<8} {fmt_ms(r['threshold_s']):>9} "
            f"{fmt_ms(r['read_latency_ewma_s']):>9} {fmt_ms(r['read_latency_s']):>9} "
            f"{r['delay_class']:>5} {fmt_ms(r['delay_s']):>8}  {','.join(r['members']) or '-'}"
        )
    print(f"{'INITIATOR':<18} {'RESOURCES':<20} {'WR_MB/s':>8} {'CLASS':>5} {'DELAY':>8} MODE")
    for i in st["initiators"]:
        rate = sum(v for v in i["write_bytes_per_second"].values() if v is not None)
        pinned = " (pinned)" if i["pinned"] else ""
        print(
            f"{i['initiator']:<18} {','.join(i['resources']) or '-':<20} {fmt_mb(rate):>8} "
            f"{i['class']:>5} {fmt_ms(i['delay_s']):>8} {i['mode']}{pinned}"
        )


def cmd_status(args: argparse.Namespace) -> int:
    return emit(args, call(args, "status"), print_status)


def _split_operands(args: argparse.Namespace) -> list[str]:
    """Operands after `threshold set`, with --json/--socket/--config taken out
    (REMAINDER: "-5ms" must reach the unit parser, one clear error, not argparse)."""
    rest: list[str] = []
    it = iter(args.operands)
    for a in it:
        if a == "--json":
            args.json = True
        elif a in ("--socket", "--config"):
            setattr(args, a[2:], next(it, None))
        else:
            rest.append(a)
    return rest


def _print_thresholds(data: dict[str, float | None]) -> None:
    for name, thr in data.items():
        print(f"{name:<16} {fmt_ms(thr) if thr is not None else 'none (observe only)'}")


def cmd_threshold_show(args: argparse.Namespace) -> int:
    return emit(args, call(args, "threshold_show"), _print_thresholds)


def cmd_threshold_set(args: argparse.Namespace) -> int:
    operands = _split_operands(args)
    if len(operands) != 2:
        raise CliError("usage: santhrottle threshold set RESOURCE VALUE (e.g. 15ms)")
    resource, value = operands
    try:
        thr = parse_duration_s(value)
    except UnitError as e:
        raise CliError(f"threshold: {e}") from None
    if thr <= 0:
        raise CliError("threshold: must be above 0")
    data = call(args, "threshold_set", resource=resource, threshold_s=thr)
    return emit(
        args, data, lambda d: print(f"{d['resource']}: threshold {fmt_ms(d['threshold_s'])}")
    )


def cmd_simple(args: argparse.Namespace) -> int:
    data = call(args, args.command)
    return emit(args, data, lambda d: print(", ".join(f"{k} {v}" for k, v in d.items())))


def cmd_top(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise CliError("top: interval must be above 0 s")
    n = 0
    while args.count is None or n < args.count:
        if n:
            time.sleep(args.interval)
        st = call(args, "status")
        if args.json:
            print(json.dumps(st), flush=True)
        else:
            print(time.strftime("%H:%M:%S"))
            print_status(st)
            print(flush=True)
        n += 1
    return 0


def _common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--config", default=DEFAULT_PATH, help="where the socket's path is read from")
    p.add_argument("--socket", help="control socket (default: the configuration's)")
    return p


def add_commands(sub: Any) -> None:
    _common(verb(sub, "status", "resources, thresholds, delay classes and initiators", EPILOG))
    sub.choices["status"].set_defaults(func=cmd_status)
    t = verb(sub, "threshold", "show or set a resource's read-latency threshold",
             THRESHOLD_EPILOG)  # fmt: skip
    tsub = t.add_subparsers(dest="threshold_command", metavar="ACTION", required=True)
    _common(verb(tsub, "show", "print every resource's threshold", THRESHOLD_EPILOG))
    tsub.choices["show"].set_defaults(func=cmd_threshold_show)
    ts = _common(verb(tsub, "set", "set a resource's threshold until the daemon restarts",
                      THRESHOLD_EPILOG))  # fmt: skip
    ts.add_argument(
        "operands",
        nargs=argparse.REMAINDER,
        metavar="RESOURCE VALUE",
        help="the resource and a duration with its unit (15ms, 2.5ms, 500us)",
    )
    ts.set_defaults(func=cmd_threshold_set)
    for name, help_ in (
        ("pause", "stop throttling (every delay removed), keep measuring"),
        ("resume", "throttle again"),
        ("reload", "re-read the config; the running one stays if the file is invalid"),
    ):
        _common(verb(sub, name, help_, EPILOG)).set_defaults(func=cmd_simple)
    top = _common(
        verb(sub, "top", "a live view of status, like iostat: [interval] [count]", EPILOG)
    )
    top.add_argument("interval", nargs="?", type=float, default=1.0, help="seconds (default 1)")
    top.add_argument("count", nargs="?", type=int, help="views to print (default: until ^C)")
    top.set_defaults(func=cmd_top)
