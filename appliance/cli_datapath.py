"""`santhrottle datapath apply|cleanup|show`, `santhrottle pin`, `santhrottle unpin`.

The data path's kernel state (appliance/datapath.py) driven by hand: for
admins (the paper's first experiments throttled named hosts by hand) and for
the lab.  pin/unpin act on the kernel directly for now; the daemon will take
them over through its control socket.

Errors an admin can cause print one line on stderr and exit 2, like the
rest of the CLI.  This module stays light: pyroute2 is imported only when a
command runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

EXIT_USAGE = 2
DEFAULT_SOCKET = "/run/santhrottle/control.sock"

DATAPATH_EPILOG = """\
examples:
  santhrottle datapath apply --device eth1
  santhrottle datapath apply --device eth1 --ports 3260 --step 500us --max-delay 50ms \\
      --link-speed 25gbit --write-mode all
  santhrottle datapath show
  santhrottle datapath show --json | jq '.members'
  santhrottle datapath cleanup

apply is idempotent: it builds what is missing, changes what differs and
adopts what a previous run left; it refuses a root qdisc it did not create.
cleanup removes every qdisc, class, set and rule santhrottle created.
Layout and measurements: docs/datapath.md.
"""

PIN_EPILOG = """\
examples:
  santhrottle pin 10.0.0.3 --delay 5ms                  # all its packets, 5 ms
  santhrottle pin 10.0.0.3 --delay 10ms --mode read     # its reads only
  santhrottle pin 10.0.0.3 --delay 2ms --device eth1    # apply on eth1 first if needed

The delay must be a multiple of the data path's step (0.5 ms by default) and
at most its maximum (50 ms by default).  Modes: all (every packet from the
storage ports: slows writes and reads), ack (pure ACKs only: slows writes only
when the initiator is window-limited), read (payload packets: slows reads).
"""


def _fail(msg: str) -> int:
    print(f"santhrottle: {msg}", file=sys.stderr)
    return EXIT_USAGE


def _common_kw(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for opt, key in (
        ("tc", "tc_bin"),
        ("ipset", "ipset_bin"),
        ("iptables", "iptables_bin"),
        ("iptables_restore", "iptables_restore_bin"),
    ):
        v = getattr(args, opt, None)
        if v:
            kw[key] = v
    return kw


def _config_kw(args: argparse.Namespace) -> dict[str, Any]:
    """Constructor arguments from apply's options (parsed strictly)."""
    from santhrottle.appliance import datapath as dp

    kw: dict[str, Any] = {}
    step_us = dp.parse_delay_us(args.step)
    if step_us <= 0:
        raise dp.DatapathError(f"bad step {args.step!r}: must be above 0")
    kw["step_s"] = step_us / 1e6
    max_us = dp.parse_delay_us(args.max_delay)
    k, rem = divmod(max_us, step_us)
    if rem or k < 1:
        raise dp.DatapathError(
            f"maximum delay {args.max_delay} is not a positive multiple of the step {args.step}"
        )
    if k > dp.MAX_CLASS_LIMIT:
        raise dp.DatapathError(
            f"maximum delay {args.max_delay} needs {k} classes of {args.step}: "
            f"at most {dp.MAX_CLASS_LIMIT}"
        )
    kw["max_class"] = k
    kw["ports"] = dp.parse_ports(args.ports)
    kw["link_bits_s"] = dp.parse_rate_bits(args.link_speed)
    kw["write_mode"] = args.write_mode
    kw["glide_leaves"] = args.glide_leaves
    return kw


def cmd_apply(args: argparse.Namespace) -> int:
    from santhrottle.appliance import datapath as dp

    try:
        kw = _config_kw(args)
        with dp.Datapath(args.device, netns=args.netns, **kw, **_common_kw(args)) as d:
            rep = d.apply()
    except dp.DatapathError as e:
        return _fail(str(e))
    print(
        f"applied on {args.device}: {kw['max_class']} delay classes of "
        f"{dp.fmt_us(round(kw['step_s'] * 1e6))} (max {args.max_delay}), ports "
        f"{','.join(map(str, kw['ports']))}, write mode {kw['write_mode']}; {rep.summary()}"
    )
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    from santhrottle.appliance import datapath as dp

    try:
        with dp.Datapath(None, netns=args.netns, **_common_kw(args)) as d:
            rep = d.cleanup()
    except dp.DatapathError as e:
        return _fail(str(e))
    print(rep.summary())
    return 0


def _print_status(st: dict[str, Any]) -> None:
    from santhrottle.appliance.datapath import classid, fmt_us

    where = f" (netns {st['netns']})" if st["netns"] else ""
    if (
        not st["chain"]["exists"]
        and not st["installed_devices"]
        and not any(v is not None for v in st["sets"].values())
    ):
        print(f"santhrottle data path: not applied{where}; iptables {st['backend']} backend")
        return
    print(
        f"santhrottle data path on {st['device'] or '?'}{where}; iptables {st['backend']} backend"
    )
    c = st["classes"]
    if c:
        step = f"{fmt_us(c['step_us'])} steps" if c["step_us"] else f"{c['leaf']} leaves"
        link = f", {c['link_bits_s'] / 1e9:g} Gbit/s" if c["link_bits_s"] else ""
        print(
            f"  tc: htb {c['root']} root, {c['classes']} delay classes of {step}"
            f" (max class {c['max_class']}), unthrottled: HTB {c['default']} queue{link}"
        )
        gl = c.get("glides") or []
        if gl:
            busy = [
                f"{g['leaf']} at {fmt_us(g['delay_us']) if g['delay_us'] is not None else '-'}"
                f" ({len(g['members'])} initiators)"
                for g in gl
                if g["members"]
            ]
            print(
                f"  glide leaves: {len(gl)} (lowered delays keep each initiator's packets in "
                f"order){'; gliding: ' + ', '.join(busy) if busy else ''}"
            )
    else:
        print("  tc: no santhrottle qdisc tree")
    ch = st["chain"]
    if ch["exists"]:
        jumps = "; ".join(j.replace("-A ", "", 1) for j in ch["jumps"]) or "NO jump rule"
        print(
            f"  iptables: chain SANTHROTTLE ({len(ch['rules'])} rules, ports "
            f"{','.join(map(str, ch['ports']))}), {jumps}"
        )
    else:
        print("  iptables: no SANTHROTTLE chain")
    sets = ", ".join(f"{name} {'missing' if n is None else n}" for name, n in st["sets"].items())
    print(f"  sets: {sets}")
    if st["members"]:
        head = ("initiator", "mode", "class", "delay", "packets", "bytes")
        print("  {:<15} {:<4} {:>5} {:>7} {:>10} {:>12}".format(*head))
        for m in st["members"]:
            delay = fmt_us(m["delay_us"]) if m["delay_us"] is not None else "-"
            print(
                f"  {m['ip']:<15} {m['mode']:<4} {m['class']:>5} {delay:>7} "
                f"{m['packets']:>10} {m['bytes']:>12}"
            )
    if c and c.get("counters"):
        busy = {k: v for k, v in c["counters"].items() if v["packets"]}
        if busy:
            print(f"  {'class':<10} {'delay':>7} {'packets':>10} {'bytes':>12}")
            for k, v in sorted(busy.items(), key=lambda kv: int(kv[0])):
                delay = fmt_us(int(k) * c["step_us"]) if c["step_us"] else "-"
                name = classid(int(k))
                if k == "0":
                    delay, name = "none", "direct"
                print(f"  {name:<10} {delay:>7} {v['packets']:>10} {v['bytes']:>12}")


def cmd_show(args: argparse.Namespace) -> int:
    from santhrottle.appliance import datapath as dp

    try:
        with dp.Datapath(args.device, netns=args.netns, **_common_kw(args)) as d:
            st = d.status()
    except dp.DatapathError as e:
        return _fail(str(e))
    if args.json:
        json.dump(st, sys.stdout)
        sys.stdout.write("\n")
    else:
        _print_status(st)
    return 0


def _discover_or_apply(args: argparse.Namespace) -> tuple[Any, str]:
    from santhrottle.appliance import datapath as dp

    note = ""
    try:
        d = dp.discover(netns=args.netns, **_common_kw(args))
    except dp.NotApplied:
        if not args.device:
            raise
        d = dp.Datapath(args.device, netns=args.netns, **_common_kw(args))
        d.apply()
        note = f"applied the data path on {args.device} (defaults); "
    if args.device and args.device != d.device:
        devices = d.installed_devices()
        if args.device not in devices:
            d.close()
            raise dp.DatapathError(
                f"the data path is applied on {', '.join(devices) or d.device}, not {args.device}"
            )
    return d, note


def _daemon(args: argparse.Namespace, cmd: str, **kw: Any) -> Any:
    """Ask santhrottled when it runs (it owns the kernel state then); None if it does not."""
    from santhrottle.appliance.control import DaemonUnavailable, request
    from santhrottle.appliance.errors import CliError

    if args.socket is None and not os.path.exists(DEFAULT_SOCKET):
        return None
    try:
        return request(args.socket or DEFAULT_SOCKET, cmd, **kw)
    except DaemonUnavailable:
        if args.socket:
            raise CliError(f"santhrottled does not answer on {args.socket}") from None
        return None


def cmd_pin(args: argparse.Namespace) -> int:
    from santhrottle.appliance import datapath as dp
    from santhrottle.appliance.control import RemoteError

    try:
        ip = dp.check_ip(args.initiator)
        delay_us = dp.parse_delay_us(args.delay)
        if delay_us == 0:
            raise dp.DatapathError(f"delay 0 throttles nothing: use `santhrottle unpin {ip}`")
        st = _daemon(args, "status")
        if st is not None:  # through the daemon: it would overwrite a pin behind its back
            step_us = round(st["step_s"] * 1e6)
            k = dp.delay_to_class(delay_us, step_us, st["max_class"])
            _daemon(args, "pin", initiator=ip, mode=args.mode, **{"class": k})
            print(
                f"pinned {ip} through santhrottled: {args.mode} packets delayed "
                f"{dp.fmt_us(k * step_us)} (class {k}) from the next tick"
            )
            return 0
        d, note = _discover_or_apply(args)
        with d:
            k = dp.delay_to_class(delay_us, d.step_us, d.max_class)
            # ordered=False: this process exits now, nobody would settle a glide
            d.set_classes({ip: k}, mode=args.mode, ordered=False)
    except (dp.DatapathError, RemoteError) as e:
        return _fail(str(e))
    if d.leaf != "netem":  # only the tests build pfifo leaves (kernels without netem)
        note += f"{d.leaf} test leaves: classified, not delayed; "
    print(
        f"{note}pinned {ip}: {args.mode} packets from ports {','.join(map(str, d.ports))} "
        f"delayed {dp.fmt_us(k * d.step_us)} (class {k}, {dp.classid(k)}) on {d.device}"
    )
    return 0


def cmd_unpin(args: argparse.Namespace) -> int:
    from santhrottle.appliance import datapath as dp
    from santhrottle.appliance.control import RemoteError

    try:
        ip = dp.check_ip(args.initiator)
        if _daemon(args, "ping") is not None:
            _daemon(args, "unpin", initiator=ip)
            print(f"unpinned {ip} through santhrottled (from the next tick)")
            return 0
        with dp.Datapath(None, netns=args.netns, **_common_kw(args)) as d:
            cur = d.current()
            if ip not in cur:
                print(f"{ip} was not pinned or throttled")
                return 0
            d.set_classes({ip: 0}, ordered=False)
    except (dp.DatapathError, RemoteError) as e:
        return _fail(str(e))
    m = cur[ip]
    print(f"unpinned {ip} (was {m.mode}, class {m.klass})")
    return 0


def _add_socket(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--socket",
        help=f"santhrottled's control socket (default {DEFAULT_SOCKET}); when the daemon runs, "
        "pins go through it, otherwise straight to the kernel",
    )


def _add_netns(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--netns",
        metavar="NAME",
        help="act inside this network namespace (/run/netns/NAME); default: the current one",
    )


def add_commands(sub: Any) -> None:
    """Add `datapath`, `pin` and `unpin` to the CLI's subparsers."""
    from santhrottle.appliance.datapath import DEFAULT_GLIDE_LEAVES
    from santhrottle.controller.domain import DELAY_STEP_S, MAX_CLASS

    step_default = f"{round(DELAY_STEP_S * 1e6)}us"
    max_default = f"{round(DELAY_STEP_S * MAX_CLASS * 1e3):g}ms"

    dpp = sub.add_parser(
        "datapath",
        help="install, show or remove the throttle data path (tc, ipset, iptables)",
        description="The kernel state that delays initiators: an HTB root with one netem "
        "class per delay step on the device facing the initiators, skbinfo ipsets "
        "(initiator -> class), static rules in the mangle chain SANTHROTTLE.",
        epilog=DATAPATH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dsub = dpp.add_subparsers(dest="datapath_command", metavar="ACTION", required=True)

    a = dsub.add_parser(
        "apply",
        help="install or reconcile the data path on a device",
        epilog=DATAPATH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a.add_argument(
        "--device", required=True, metavar="IF", help="egress device facing the initiators"
    )
    a.add_argument(
        "--ports", default="3260,4420", help="storage ports, comma separated (default 3260,4420)"
    )
    a.add_argument("--step", default=step_default, help=f"delay step (default {step_default})")
    a.add_argument(
        "--max-delay", default=max_default, help=f"largest delay class (default {max_default})"
    )
    a.add_argument(
        "--link-speed",
        default="10gbit",
        help="link speed for HTB and netem sizing (default 10gbit)",
    )
    a.add_argument(
        "--write-mode",
        choices=("all", "ack"),
        default="all",
        help="what the controller's writer classes delay (default all)",
    )
    a.add_argument(
        "--glide-leaves",
        type=int,
        default=DEFAULT_GLIDE_LEAVES,
        metavar="N",
        help="netem leaves whose delay is lowered in place so that an initiator's "
        "packets stay in order when its delay goes down (default %(default)s, 0 = none)",
    )
    _add_netns(a)
    a.set_defaults(func=cmd_apply)

    c = dsub.add_parser("cleanup", help="remove everything santhrottle installed")
    _add_netns(c)
    c.set_defaults(func=cmd_cleanup)

    s = dsub.add_parser("show", help="print the installed state, members and counters")
    s.add_argument("--device", metavar="IF", help="device (default: the one the rules name)")
    s.add_argument("--json", action="store_true", help="print it as JSON")
    _add_netns(s)
    s.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "pin",
        help="delay one initiator by hand",
        description="Put an initiator into a delay class by hand: through santhrottled "
        "when it runs, on the kernel directly otherwise.",
        epilog=PIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("initiator", metavar="INITIATOR", help="initiator IPv4 address")
    p.add_argument("--delay", required=True, help="delay with a unit: 5ms, 500us")
    p.add_argument(
        "--mode", choices=("all", "ack", "read"), default="all", help="what to delay (default all)"
    )
    p.add_argument(
        "--device", metavar="IF", help="apply the data path on IF first if it is not applied"
    )
    _add_netns(p)
    _add_socket(p)
    p.set_defaults(func=cmd_pin)

    u = sub.add_parser("unpin", help="stop delaying an initiator")
    u.add_argument("initiator", metavar="INITIATOR", help="initiator IPv4 address")
    _add_netns(u)
    _add_socket(u)
    u.set_defaults(func=cmd_unpin)
