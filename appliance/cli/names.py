"""`santhrottle names resources|groups|initiators`: the names the running daemon knows.

What it owns
    cmd_names: the daemon's resources (as status names them), groups (as
    group list shows them) or initiators (each address it knows, a
    [hosts.NAME]'s every address), sorted, one a line: what the shell
    completions offer (cli/completion.py), and a short list for scripts.
    Through the control socket: exit 3 without a daemon, as every verb that
    asks it.

Worked example
    $ santhrottle names initiators
    10.0.0.3
    10.0.0.7
    fd00::3
"""

from __future__ import annotations

import argparse
import ipaddress
from typing import Any

from santhrottle.appliance.cli.common import JSON_HELP, Failed, emit, verb
from santhrottle.appliance.cli.completion import KINDS
from santhrottle.appliance.cli.daemon import call, socket_options
from santhrottle.appliance.daemon.status.views import (
    InitiatorView,
    ResourceView,
    ViewError,
    from_json,
)

EPILOG = """\
examples:
  santhrottle names resources              # vg0, vg1, ...: what threshold set takes
  santhrottle names groups
  santhrottle names initiators --json

The bash and zsh completions of santhrottle call it to offer these names
(threshold RESOURCE, group GROUP, why, pin and unpin INITIATOR).  --json prints
{"protocol": N, "data": [...]}: the names, sorted.
"""


def _addresses_first(name: str) -> tuple[int, Any, str]:
    """IPv4 before IPv6, each in address order."""
    try:
        a = ipaddress.ip_address(name)
    except ValueError:
        return (2, 0, name)
    return (a.version, int(a), name)


def names_of(args: argparse.Namespace, kind: str) -> list[str]:
    """The daemon's names of `kind`, sorted; Failed when its answer does not read."""
    try:
        if kind == "resources":
            rows = from_json(list[ResourceView], call(args, "resources"), "resources")
            return sorted(r.resource for r in rows)
        if kind == "initiators":
            inis = from_json(list[InitiatorView], call(args, "initiators"), "initiators")
            found = {a for i in inis for a in (i.initiator, *i.addresses)}
            return sorted(found, key=_addresses_first)
        groups = call(args, "group_list")
        if not isinstance(groups, list) or not all(
            isinstance(g, dict) and isinstance(g.get("group"), str) for g in groups
        ):
            raise ViewError("group_list: a list of groups is needed")
        return sorted({g["group"] for g in groups})
    except ViewError as e:
        raise Failed(f"santhrottled's answer does not read: {e}") from None


def cmd_names(args: argparse.Namespace) -> int:
    return emit(
        args, names_of(args, args.kind), lambda names: print("\n".join(names)) if names else None
    )


def add_commands(sub: Any) -> None:
    p = verb(sub, "names", "the resources, groups or initiators the daemon knows", EPILOG)
    p.add_argument("kind", metavar="KIND", choices=KINDS, help=" | ".join(KINDS))
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    socket_options(p)
    p.set_defaults(func=cmd_names)
