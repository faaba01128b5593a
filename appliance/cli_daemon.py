"""CLI commands that talk to santhrottled through its control socket.

status, threshold set|show, pause, resume, top, reload; cleanup acts on
the kernel directly (it must work when the daemon is dead: systemd's
ExecStopPost runs `santhrottle cleanup --delays-only`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from santhrottle.appliance.config import DEFAULT_PATH, Config, ConfigError, load_config
from santhrottle.appliance.control import DaemonUnavailable, RemoteError, request
from santhrottle.appliance.errors import CliError
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
  santhrottle cleanup --delays-only        # without the daemon: nobody stays delayed
"""


def _socket(args: argparse.Namespace) -> str:
    if args.socket:
        return str(args.socket)
    try:
        return load_config(args.config).control_socket
    except ConfigError:
        return Config.control_socket  # the default path; the daemon will say the rest


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
    st = call(args, "status")
    if args.json:
        json.dump(st, sys.stdout, indent=1)
        print()
    else:
        print_status(st)
    return 0


def _split_operands(args: argparse.Namespace) -> list[str]:
    """Operands after `threshold set`, with --json/--socket/--config taken out."""
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


def cmd_threshold(args: argparse.Namespace) -> int:
    operands = _split_operands(args)
    if args.action == "show":
        data = call(args, "threshold_show")
        if args.json:
            json.dump(data, sys.stdout, indent=1)
            print()
        else:
            for name, thr in data.items():
                print(f"{name:<16} {fmt_ms(thr) if thr is not None else 'none (observe only)'}")
        return 0
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
    if args.json:
        json.dump(data, sys.stdout)
        print()
    else:
        print(f"{data['resource']}: threshold {fmt_ms(data['threshold_s'])}")
    return 0


def cmd_simple(args: argparse.Namespace) -> int:
    data = call(args, args.command)
    if args.json:
        json.dump(data, sys.stdout)
        print()
    else:
        print(", ".join(f"{k} {v}" for k, v in data.items()))
    return 0


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


def cmd_cleanup(args: argparse.Namespace) -> int:
    from santhrottle.appliance.datapath import DatapathError
    from santhrottle.appliance.santhrottled import build_datapaths

    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        raise CliError(str(e)) from None
    acts = build_datapaths(cfg)
    try:
        if args.delays_only:  # class 0 takes a member out of whichever set holds it
            # unordered: this process exits now, nobody would settle a glide leaf
            acts.set_classes(dict.fromkeys(acts.datapaths[0].current(), 0), ordered=False)
            print("no initiator is delayed any more; the static state stays")
        else:
            for r in acts.cleanup():
                print(r.summary())
    except DatapathError as e:
        raise CliError(str(e)) from None
    return 0


def add_commands(sub: Any) -> None:
    def parser(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--json", action="store_true", help="print JSON")
        p.add_argument("--config", default=str(DEFAULT_PATH), help=argparse.SUPPRESS)
        p.add_argument("--socket", help="control socket (default: from the config)")
        return p

    parser("status", "resources, thresholds, delay classes and initiators").set_defaults(
        func=cmd_status
    )
    t = parser("threshold", "show or set a resource's read-latency threshold")
    t.add_argument("action", choices=["set", "show"])
    # REMAINDER: "-5ms" must reach the unit parser (one clear error), not argparse
    t.add_argument(
        "operands",
        nargs=argparse.REMAINDER,
        metavar="RESOURCE VALUE",
        help="for set: the resource and a duration with its unit (15ms, 2.5ms, 500us)",
    )
    t.set_defaults(func=cmd_threshold)
    for name, help_ in (
        ("pause", "stop throttling (every delay removed), keep measuring"),
        ("resume", "throttle again"),
        ("reload", "re-read the config; the running one stays if the file is invalid"),
    ):
        parser(name, help_).set_defaults(func=cmd_simple)
    top = parser("top", "a live view of status, like iostat: [interval] [count]")
    top.add_argument("interval", nargs="?", type=float, default=1.0)
    top.add_argument("count", nargs="?", type=int)
    top.set_defaults(func=cmd_top)
    c = parser("cleanup", "remove what santhrottle put in the kernel (works without the daemon)")
    c.add_argument("--delays-only", action="store_true", help="empty the sets, keep tc/rules")
    c.set_defaults(func=cmd_cleanup)
