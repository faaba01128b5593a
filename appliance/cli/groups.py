"""CLI commands for the initiator groups: `santhrottle group list|show|set|reset`.

What it owns
    The group verbs, through the daemon's control socket (cli/daemon.py's
    call(): exit 3 without a daemon, 1 for a refusal).  A value is checked
    here with the configuration file's own Kinds (config/schema.py's
    groups.NAME keys: a duration for the latency target, "200MB/s" or
    "5000iops" for the throughput target, a number within 0.001..1000 for
    the priority) before it is sent: a bad one is argparse's error naming
    the option, exit 2.  The daemon checks again (an unknown group: exit 1).
    The output is cli/groupview.py's.

Worked example
    `santhrottle group set db --priority 4 --throughput-target 5000iops` sends
    {"cmd": "group_set", "args": {"group": "db", "priority": 4.0,
    "latency_target_s": null, "throughput_target_bps": null,
    "throughput_target_iops": 5000.0}} and prints "db: priority 4 (file: 2),
    latency target 10.00ms, throughput target 5000iops (file: none)";
    `group set db --latency-target 5` exits 2 with "argument --latency-target:
    '5' is not a duration: ...".
"""

from __future__ import annotations

import argparse
from typing import Any

from santhrottle.appliance.cli.common import (
    JSON_HELP,
    CliError,
    emit,
    name_arg,
    number,
    parsed,
    verb,
)
from santhrottle.appliance.cli.completion import complete_names
from santhrottle.appliance.cli.daemon import call, socket_options
from santhrottle.appliance.cli.groupview import print_list, print_show, targets
from santhrottle.appliance.config.kinds import IOPS_SUFFIX, KindError
from santhrottle.appliance.config.schema import key

EPILOG = """\
examples:
  santhrottle group list                              # every group, per grouped resource
  santhrottle group show db                           # the whole of one group
  santhrottle group set db --latency-target 5ms       # live, until group reset
  santhrottle group set backup --priority 0.5 --throughput-target 100MB/s
  santhrottle group set tenant-a --throughput-target 5000iops
  santhrottle group reset db                          # back to the file's values
  santhrottle group list --json | jq '.data[] | {group, priority, override}'

A value set here is an override, like `threshold set`: in force from the next
convergence (1 s), kept across reloads (while the group is in the file) and
restarts, marked "*" by `group list` and status, until `group reset NAME`.  The
values follow the file's rules ([groups.NAME]: latency_target, throughput_target,
priority; docs/groups.md).  --json prints {"protocol": N, "data": ...}: N is the
control protocol's version; list's data is a list of show's: per group its
priority and targets in force, "configured" (the file's), "override" (what was
set here), its members and, per grouped resource, what it measured and got.
"""
PRIORITY_KIND = key("groups.NAME.priority").kind
_AS_NUMBER = number("--priority")


def _priority(text: str) -> float:
    """--priority: ASCII decimal, then the file's bounds."""
    v = _AS_NUMBER(text)
    try:
        return float(PRIORITY_KIND.parse(v))
    except KindError as e:  # the Kind quotes the float: quote what was written
        raise argparse.ArgumentTypeError(str(e).replace(repr(v), repr(text), 1)) from None


_priority.__name__ = "priority"


def cmd_list(args: argparse.Namespace) -> int:
    return emit(args, call(args, "group_list"), print_list)


def cmd_show(args: argparse.Namespace) -> int:
    return emit(args, call(args, "group_show", group=args.group), print_show)


def cmd_set(args: argparse.Namespace) -> int:
    if args.priority is None and args.latency_target is None and args.throughput_target is None:
        raise CliError(
            f"group set {args.group}: nothing to set: give --priority, --latency-target "
            "or --throughput-target"
        )
    bps = iops = None
    if args.throughput_target is not None:
        value, unit = args.throughput_target
        bps, iops = (None, value) if unit == IOPS_SUFFIX else (value, None)
    data = call(
        args,
        "group_set",
        group=args.group,
        priority=args.priority,
        latency_target_s=args.latency_target,
        throughput_target_bps=bps,
        throughput_target_iops=iops,
    )
    return emit(args, data, lambda g: print(f"{g['group']}: {targets(g)}"))


def _print_reset(g: dict[str, Any]) -> None:
    if g.get("removed"):
        print(f"{g['group']}: the file's values again: {targets(g)}")
    else:
        print(f"{g['group']}: nothing set at run time; {targets(g)}")


def cmd_reset(args: argparse.Namespace) -> int:
    return emit(args, call(args, "group_reset", group=args.group), _print_reset)


def _common(p: argparse.ArgumentParser, group: bool = True) -> argparse.ArgumentParser:
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    if group:
        complete_names(
            p.add_argument(
                "group", metavar="GROUP", type=name_arg("group"), help="the group, as [groups.NAME]"
            ),
            "groups",
        )
    return socket_options(p)


def add_commands(sub: Any) -> None:
    g = verb(sub, "group", "show the initiator groups; set their targets live", EPILOG)
    gsub = g.add_subparsers(dest="group_command", metavar="ACTION", required=True)
    _common(
        verb(gsub, "list", "every group: targets, priority, what it gets per resource", EPILOG),
        group=False,
    ).set_defaults(func=cmd_list)
    _common(
        verb(gsub, "show", "the whole of one group: members, targets, measures, share", EPILOG)
    ).set_defaults(func=cmd_show)
    s = _common(verb(gsub, "set", "override a group's targets or priority until reset", EPILOG))
    s.add_argument(
        "--priority",
        type=_priority,
        metavar="P",
        help="how much its shortfall weighs against the others' (0.001..1000)",
    )
    s.add_argument(
        "--latency-target",
        type=parsed("--latency-target", key("groups.NAME.latency_target").kind.parse),
        metavar="DURATION",
        help="the mean read latency its initiators should see, delay included (e.g. 5ms)",
    )
    s.add_argument(
        "--throughput-target",
        type=parsed("--throughput-target", key("groups.NAME.throughput_target").kind.parse),
        metavar="RATE",
        help='what it should move: a byte rate ("200MB/s") or IOs per second ("5000iops")',
    )
    s.set_defaults(func=cmd_set)
    _common(
        verb(gsub, "reset", "drop a group's overrides: the file's values again", EPILOG)
    ).set_defaults(func=cmd_reset)
