"""`santhrottle datapath apply|show`, `pin`, `unpin`, `cleanup`: the kernel state by hand.

For admins (throttle a named host by hand, see what is installed, remove
it) and for the lab.  pin/unpin go through santhrottled when it runs (it
owns the kernel state then), straight to the kernel otherwise; cleanup
always acts on the kernel (systemd's ExecStopPost runs `santhrottle
cleanup --delays-only` after the daemon died).  Option defaults come from
the configuration schema.  This module stays light: pyroute2 is imported
only when a command runs.  A bad value is exit 2, the kernel refusing 1, an
explicit --socket nobody answers on 3 (cli/common.py).

Worked example
    `santhrottle pin 10.0.0.3 --delay 1.2ms` on 500us steps: "santhrottle: delay
    1.2ms is not a multiple of the step 500us: use 1ms or 1.5ms", exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from santhrottle.appliance.cli.cleanup import cmd_cleanup
from santhrottle.appliance.cli.common import (
    JSON_HELP,
    CliError,
    Failed,
    emit,
    envelope,
    ip_address,
    name_arg,
    number,
    parsed,
    path_arg,
    verb,
)
from santhrottle.appliance.cli.completion import complete_names
from santhrottle.appliance.cli.datapathview import print_status
from santhrottle.appliance.config import DEFAULT_PATH, ConfigError, default, load_config
from santhrottle.appliance.config import defaults as config_defaults
from santhrottle.appliance.config.kinds import IFNAME_MAX_CHARS, parse_ports_text
from santhrottle.appliance.config.schema import MAX_GLIDE_LEAVES, PIN_MODES, WRITE_MODES
from santhrottle.appliance.units import (
    fmt_bit_rate,
    fmt_us,
    parse_bit_rate,
    parse_duration_us,
)
from santhrottle.controller.ladder import Ladder

DATAPATH_EPILOG = """\
examples:
  santhrottle datapath apply --device eth1
  santhrottle datapath apply --device eth1 --ports 3260 --step 500us --max-delay 50ms \\
      --link-speed 25gbit --write-mode all
  santhrottle datapath show
  santhrottle datapath show --json | jq '.data.members'
  santhrottle cleanup

apply is idempotent: it builds what is missing, changes what differs and
adopts what a previous run left; it refuses a root qdisc it did not create.
--json prints {"protocol": N, "data": ...}, N the control protocol's version:
apply's data is the ladder, ports and write mode applied and what changed
("report"), show's the installed state.
"""

_LADDER = Ladder()  # the default ladder, as [datapath] defines it
_LINEAR_US = round(_LADDER.step_us / (_LADDER.ratio - 1))  # where a ratio step passes a step
PIN_EPILOG = f"""\
examples:
  santhrottle pin 10.0.0.3 --delay 5ms                  # all its packets, 5 ms
  santhrottle pin 10.0.0.3 --delay 10ms --mode read     # its reads only
  santhrottle pin 10.0.0.3 --delay 2ms --device eth1    # apply on eth1 first if needed
  santhrottle pin fd00::3 --delay 5ms                   # an IPv6 initiator
  santhrottle unpin 10.0.0.3

The initiator is one IPv4 or IPv6 address (a zone such as %eth1 is dropped,
::ffff:10.0.0.3 is 10.0.0.3); a host with both pins each address by itself.

The delay must be one of the ladder's: by default {fmt_us(_LADDER.step_us)} steps up to \
{fmt_us(_LINEAR_US)},
then {_LADDER.ratio - 1:.0%} steps up to {fmt_us(_LADDER.max_delay_us)} \
(class {_LADDER.max_class}); anything else is refused with the two
nearest.  Modes: all (every packet from the storage ports: slows writes and reads), ack
(pure ACKs only: slows writes only when the initiator is window-limited), read
(payload packets: slows reads).
--json prints {{"protocol": N, "data": ...}}: the initiator, its class, delay_s
and mode, and "through": "santhrottled" or "kernel".
"""

CLEANUP_EPILOG = """\
examples:
  santhrottle cleanup                   # remove every qdisc, class, set and rule of santhrottle's
  santhrottle cleanup --delays-only     # nobody delayed any more; tree, sets and chain stay
  santhrottle cleanup --netns tgt       # in the target's network namespace

Works without the daemon.  Without --netns, the namespace is daemon.netns of
the configuration (if the file exists), else the current one.  --json prints
{"protocol": N, "data": ...}: per namespace what was removed, the daemon stopped
(--force), the warning about an invalid file.
"""


def _dp() -> Any:
    """The data path package, imported when a command runs (pyroute2 is heavy)."""
    from santhrottle.appliance import datapath

    return datapath


def _names() -> Any:
    return _dp().names


def _spec_from_args(args: argparse.Namespace) -> Any:
    """The spec `datapath apply` asks for (parsed strictly, one-line errors)."""
    dp = _dp()
    if args.max_delay < args.step:
        raise CliError(
            f"maximum delay {fmt_us(args.max_delay)} is below the step {fmt_us(args.step)}"
        )
    try:
        return dp.DatapathSpec(
            devices=(args.device,),
            ports=args.ports,
            step_us=args.step,
            max_delay_us=args.max_delay,
            ladder_ratio=args.ladder_ratio,
            link_bits_s=args.link_speed,
            write_mode=args.write_mode,
            glide_leaves=args.glide_leaves,
        )
    except dp.DatapathError as e:  # the spec's own bounds: a bad value, not the kernel
        raise CliError(str(e)) from None


def cmd_apply(args: argparse.Namespace) -> int:
    dp = _dp()
    try:
        spec = dp.with_gate(_spec_from_args(args), args.netns)
        with dp.Datapath(spec, netns=args.netns) as d:
            rep = d.apply()
    except dp.DatapathError as e:
        raise Failed(str(e)) from None
    lad = spec.ladder
    data = {
        "device": args.device,
        "netns": args.netns,
        "ladder": {
            "step_us": lad.step_us,
            "max_delay_us": lad.max_delay_us,
            "ratio": lad.ratio,
            "classes": lad.max_class,
        },
        "ports": list(spec.ports),
        "write_mode": spec.write_mode,
        "glide_leaves": spec.glide_leaves,
        "report": dataclasses.asdict(rep),
    }
    return emit(
        args,
        data,
        lambda _d: print(
            f"applied on {args.device}: {lad.describe()}, "
            f"ports {','.join(map(str, spec.ports))}, "
            f"write mode {spec.write_mode}; {rep.summary()}"
        ),
    )


def cmd_show(args: argparse.Namespace) -> int:
    dp = _dp()
    devices = (args.device,) if args.device else ()
    try:
        with dp.Datapath(dp.with_gate(dp.DatapathSpec(devices), args.netns), netns=args.netns) as d:
            st = dp.status(d)
    except dp.DatapathError as e:
        raise Failed(str(e)) from None
    if args.json:
        json.dump(envelope(st), sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print_status(st)
    return 0


def _discover_or_apply(args: argparse.Namespace) -> tuple[Any, str]:
    dp = _dp()
    note = ""
    try:
        d = dp.discover(netns=args.netns)
    except dp.NotApplied:
        if not args.device:
            raise
        d = dp.Datapath(dp.with_gate(dp.DatapathSpec((args.device,)), args.netns), netns=args.netns)
        d.apply()
        note = f"applied the data path on {args.device} (defaults); "
    if args.device and args.device not in d.spec.devices:
        d.close()
        raise dp.DatapathError(
            f"the data path is applied on {', '.join(d.spec.devices)}, not {args.device}"
        )
    return d, note


def _daemon_socket(args: argparse.Namespace) -> str:
    """--socket, else the configuration's daemon.control_socket, else the default."""
    if args.socket:
        return str(args.socket)
    if os.path.exists(args.config):
        try:
            return load_config(args.config).control_socket
        except ConfigError as e:
            raise CliError(f"{e} (give --socket)") from None
    return config_defaults().control_socket


def _daemon(args: argparse.Namespace, cmd: str, **kw: Any) -> Any:
    """Ask santhrottled when it runs (it owns the kernel state then); None if it does
    not.  An explicit --socket nobody answers on is NoDaemon (exit 3), a refusal
    Failed (exit 1): never behind the daemon's back to the kernel."""
    from santhrottle.appliance.cli.daemon import call

    path = _daemon_socket(args)
    if args.socket is None and not os.path.exists(path):
        return None  # no daemon: straight to the kernel
    return call(args, cmd, path=path, absent_ok=args.socket is None, **kw)


def _delay_class(delay_us: int, ladder: Ladder) -> int:
    """The class of a delay on this data path; a delay it has no class for is exit 2."""
    try:
        k: int = _names().delay_to_class(delay_us, ladder)
    except _dp().DatapathError as e:
        raise CliError(str(e)) from None
    return k


def cmd_pin(args: argparse.Namespace) -> int:
    dp = _dp()
    ip, delay_us = args.initiator, args.delay
    try:
        st = _daemon(args, "status")
        if st is not None:  # through the daemon: it would overwrite a pin behind its back
            lad = st["ladder"]
            ladder = Ladder(lad["step_us"], lad["max_delay_us"], lad["ratio"])
            k = _delay_class(delay_us, ladder)
            reply = _daemon(args, "pin", initiator=ip, mode=args.mode, **{"class": k})
            return emit(
                args,
                {**reply, "through": "santhrottled"},
                lambda _d: print(
                    f"pinned {ip} through santhrottled: {args.mode} packets delayed "
                    f"{fmt_us(ladder.delay_us(k))} (class {k}) from the next tick"
                ),
            )
        d, note = _discover_or_apply(args)
        with d:
            k = _delay_class(delay_us, d.spec.ladder)
            # ordered=False: this process exits now, nobody would advance a glide
            d.set_classes({ip: k}, mode=args.mode, ordered=False)
    except dp.DatapathError as e:
        raise Failed(str(e)) from None
    if d.spec.leaf != "netem":  # only the tests build pfifo leaves (kernels without netem)
        note += f"{d.spec.leaf} test leaves: classified, not delayed; "
    data = {
        "initiator": ip,
        "class": k,
        "delay_s": d.spec.delay_us(k) / 1e6,
        "mode": args.mode,
        "through": "kernel",
        "classid": _names().classid(k),
        "ports": list(d.spec.ports),
        "devices": list(d.spec.devices),
        "applied_on": args.device if note.startswith("applied") else None,
    }
    return emit(
        args,
        data,
        lambda _d: print(
            f"{note}pinned {ip}: {args.mode} packets from ports "
            f"{','.join(map(str, d.spec.ports))} delayed {fmt_us(d.spec.delay_us(k))} "
            f"(class {k}, {_names().classid(k)}) on {', '.join(d.spec.devices)}"
        ),
    )


def cmd_unpin(args: argparse.Namespace) -> int:
    dp = _dp()
    ip = args.initiator
    try:
        if _daemon(args, "ping") is not None:
            reply = _daemon(args, "unpin", initiator=ip)
            return emit(
                args,
                {**reply, "through": "santhrottled"},
                lambda _d: print(f"unpinned {ip} through santhrottled (from the next tick)"),
            )
        with dp.Datapath(dp.DatapathSpec(), netns=args.netns) as d:
            cur = d.current()
            m = cur.get(ip)
            if m is not None:
                d.set_classes({ip: 0}, ordered=False)
    except dp.DatapathError as e:
        raise Failed(str(e)) from None
    data = {
        "initiator": ip,
        "unpinned": m is not None,
        "through": "kernel",
        "was": None if m is None else {"mode": m.mode, "class": m.klass},
    }
    return emit(
        args,
        data,
        lambda _d: print(
            f"{ip} was not pinned or throttled"
            if m is None
            else f"unpinned {ip} (was {m.mode}, class {m.klass})"
        ),
    )


def _netns(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--netns",
        metavar="NAME",
        type=name_arg("--netns"),
        help="act inside this network namespace (/run/netns/NAME); default: the current one",
    )


def _socket(p: argparse.ArgumentParser) -> None:
    from santhrottle.appliance.cli.daemon import socket_options

    socket_options(
        p,
        "santhrottled's control socket (default: the configuration's); when the daemon "
        "runs, pins go through it, otherwise straight to the kernel",
    )


def add_commands(sub: Any) -> None:
    """Add `datapath`, `pin`, `unpin` and `cleanup` to the CLI's subparsers."""
    dpp = verb(
        sub,
        "datapath",
        "install or show the throttle data path (tc, ipset, iptables)",
        DATAPATH_EPILOG,
        "The kernel state that delays initiators: an HTB root with one netem class per "
        "delay step on the device facing the initiators, skbinfo ipsets (initiator -> "
        "class), static rules in the mangle chain SANTHROTTLE.",
    )
    dsub = dpp.add_subparsers(dest="datapath_command", metavar="ACTION", required=True)

    a = verb(dsub, "apply", "install or reconcile the data path on a device", DATAPATH_EPILOG)
    a.add_argument(
        "--device",
        required=True,
        metavar="IF",
        type=name_arg("--device", IFNAME_MAX_CHARS),
        help="egress device facing the initiators",
    )
    a.add_argument(
        "--ports",
        type=parsed("--ports", parse_ports_text),
        default=",".join(map(str, default("datapath.ports"))),
        help="storage ports, comma separated (default %(default)s)",
    )
    a.add_argument(
        "--step",
        type=parsed("--step", parse_duration_us, positive=True),
        default=fmt_us(default("datapath.step")),
        help="delay step (default %(default)s)",
    )
    a.add_argument(
        "--max-delay",
        type=parsed("--max-delay", parse_duration_us, positive=True),
        default=fmt_us(default("datapath.max_delay")),
        help="largest delay class (default %(default)s)",
    )
    a.add_argument(
        "--ladder-ratio",
        type=number("--ladder-ratio", lo=1.0, hi=2.0),
        default=default("datapath.ladder_ratio"),
        help="each class delays this much more than the one below, in whole steps; "
        "1.0: linear (default %(default)s)",
    )
    a.add_argument(
        "--link-speed",
        type=parsed("--link-speed", parse_bit_rate),
        default=fmt_bit_rate(default("datapath.link_speed")),
        help="link speed for HTB and netem sizing (default %(default)s)",
    )
    a.add_argument(
        "--write-mode",
        choices=WRITE_MODES,
        default=default("datapath.write_mode"),
        help="what the controller's writer classes delay (default %(default)s)",
    )
    a.add_argument(
        "--glide-leaves",
        type=number("--glide-leaves", lo=0, hi=MAX_GLIDE_LEAVES, integer=True),
        default=default("datapath.glide_leaves"),
        metavar="N",
        help="netem leaves whose delay is lowered in place so that an initiator's "
        "packets stay in order when its delay goes down (default %(default)s, 0 = none)",
    )
    a.add_argument("--json", action="store_true", help=JSON_HELP)
    _netns(a)
    a.set_defaults(func=cmd_apply)

    s = verb(dsub, "show", "print the installed state, members and counters", DATAPATH_EPILOG)
    s.add_argument(
        "--device",
        metavar="IF",
        type=name_arg("--device", IFNAME_MAX_CHARS),
        help="device (default: the one installed)",
    )
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    _netns(s)
    s.set_defaults(func=cmd_show)

    p = verb(
        sub,
        "pin",
        "delay one initiator by hand",
        PIN_EPILOG,
        "Put an initiator into a delay class by hand: through santhrottled when it runs, "
        "on the kernel directly otherwise.",
    )
    complete_names(
        p.add_argument(
            "initiator", metavar="INITIATOR", type=ip_address, help="initiator IPv4 or IPv6 address"
        ),
        "initiators",
    )
    p.add_argument(
        "--delay",
        required=True,
        type=parsed("--delay", parse_duration_us, positive=True),
        help="delay with a unit, above 0: 5ms, 500us (0: use unpin)",
    )
    p.add_argument(
        "--mode", choices=PIN_MODES, default="all", help="what to delay (default %(default)s)"
    )
    p.add_argument(
        "--device",
        metavar="IF",
        type=name_arg("--device", IFNAME_MAX_CHARS),
        help="apply the data path on IF first if it is not applied",
    )
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    _netns(p)
    _socket(p)
    p.set_defaults(func=cmd_pin)

    u = verb(sub, "unpin", "stop delaying an initiator", PIN_EPILOG)
    complete_names(
        u.add_argument(
            "initiator", metavar="INITIATOR", type=ip_address, help="initiator IPv4 or IPv6 address"
        ),
        "initiators",
    )
    u.add_argument("--json", action="store_true", help=JSON_HELP)
    _netns(u)
    _socket(u)
    u.set_defaults(func=cmd_unpin)

    c = verb(
        sub,
        "cleanup",
        "remove what santhrottle put in the kernel (works without the daemon)",
        CLEANUP_EPILOG,
    )
    c.add_argument(
        "--delays-only", action="store_true", help="only take every initiator out of the sets"
    )
    c.add_argument(
        "--config",
        default=DEFAULT_PATH,
        type=path_arg("--config"),
        help="where daemon.netns and daemon.control_socket are read from",
    )
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    _netns(c)
    c.add_argument(
        "--socket",
        type=path_arg("--socket", socket=True),
        help="santhrottled's control socket (default: the configuration's, and the default)",
    )
    c.add_argument(
        "--force",
        action="store_true",
        help="while santhrottled answers: stop it (SIGTERM, as systemctl stop does) first",
    )
    c.set_defaults(func=cmd_cleanup)
