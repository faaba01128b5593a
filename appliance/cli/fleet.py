"""`santhrottle fleet status`: this appliance's view of its fleet ([fleet] in the config).

What it shows (from the daemon's control socket; exit 3 without a daemon,
1 when the daemon runs without [fleet])
    the array and this appliance's name; the mode: "fleet" (the leaders'
    classes apply) or "degraded" (the engine has not answered for a second:
    this appliance controls alone on its own samples) and why; the engine's
    revision and how long ago it last answered; the appliances; per resource its
    leader and epoch, and for the ones another appliance leads, the decision
    applied here (its seq, the etcd revision that wrote it, its class); per
    other appliance the seq of the
    samples it published last; the agent's counters.

Worked example
    $ santhrottle fleet status
    array1: gw-a in fleet mode, engine revision 4211 (answered 0.05 s ago)
    appliances: gw-a, gw-b
    vg0      leader gw-b  epoch 4017  following: seq 812 (revision 4203), class 15
    samples: gw-b tick 9021, convergence 903
    cycles 9034, failures 2, joins 1, leases lost 0, elections won 0, refused 0
"""

from __future__ import annotations

import argparse
from typing import Any

from santhrottle.appliance.cli.common import JSON_HELP, emit, verb
from santhrottle.appliance.cli.daemon import call, socket_options

EPILOG = """\
examples:
  santhrottle fleet status                  # appliances, leaders, epochs, the engine's lag
  santhrottle fleet status --json | jq .data.leaders

"fleet" mode: every resource's leader runs the controller on the samples of
all appliances, and each applies its classes.  "degraded": the engine has
not answered for a second (an outage or a partition); this appliance then
controls alone on what it sees, and rejoins by itself (docs/fleet.md).
--json prints {"protocol": N, "data": ...}.
"""


def print_status(s: dict[str, Any]) -> None:
    age = s["engine_age_s"]
    seen = "never answered" if age is None else f"answered {age:.2f} s ago"
    print(
        f"{s['array']}: {s['appliance']} in {s['mode']} mode, engine revision "
        f"{s['revision']} ({seen})"
    )
    if s["reason"]:
        print(f"  last failure: {s['reason']}")
    print(f"appliances: {', '.join(s['appliances']) or '(none seen)'}")
    width = max((len(r) for r in s["leaders"]), default=0)
    for r, lead in s["leaders"].items():
        line = f"{r:<{width}}  leader {lead['appliance']}  epoch {lead['epoch']}"
        f = s["following"].get(r)
        if r in s["leading"]:
            line += "  (this appliance)"
        elif f is not None:
            line += f"  following: seq {f['seq']} (revision {f['revision']}), class {f['class']}"
        print(line)
    parts = [
        f"{who} tick {p['tick_seq']}"
        + ("" if p["conv_seq"] is None else f", convergence {p['conv_seq']}")
        for who, p in s["parts"].items()
    ]
    print(f"samples: {'; '.join(parts) or '(no other appliance publishes)'}")
    c = s["counters"]
    print(", ".join(f"{k.replace('_', ' ')} {v}" for k, v in c.items()))


def cmd_status(args: argparse.Namespace) -> int:
    return emit(args, call(args, "fleet_status"), print_status)


def add_commands(sub: Any) -> None:
    f = verb(sub, "fleet", "the appliances of one array, their leaders and epochs", EPILOG)
    fsub = f.add_subparsers(dest="fleet_command", metavar="ACTION", required=True)
    s = verb(fsub, "status", "this appliance's view of its fleet", EPILOG)
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    socket_options(s).set_defaults(func=cmd_status)
