"""The `santhrottle` command line: one parser, a module per group of verbs.

Every failure prints one line on stderr naming the problem, never a traceback,
and exits with the status that says whose it is (cli/common.py, EXIT_CODES):
1 the kernel, the daemon or a tool refused or failed, 2 bad usage or input
(argparse's own errors too), 3 santhrottled is not running or not answering.
build_parser() is also what the man page and the shell completions are
generated from (`make wheel`).

Worked example
    main(["status", "--socket", "/nonexistent"]) prints "santhrottle: santhrottled
    is not running (no socket /nonexistent)" and returns 3; main(["top", "nan"])
    exits 2 with argparse's "santhrottle top: error: argument interval: ...".
"""

from __future__ import annotations

import argparse
import sys

from santhrottle.appliance.cli import (
    daemon,
    datapath,
    fleet,
    groups,
    meter,
    names,
    sensing,
    simulate,
)
from santhrottle.appliance.cli.common import EXIT_HELP, Failed, NoDaemon, one_line_failures
from santhrottle.appliance.daemon.control.requests import DaemonUnavailable, RemoteError
from santhrottle.appliance.version import version_line

EPILOG = (
    """\
examples:
  santhrottle status                       # what the daemon controls, measured now
  santhrottle threshold set vg_aic 15ms
  santhrottle pin 10.0.0.3 --delay 5ms     # throttle a host by hand
  santhrottle resources                    # discovery, without the daemon
  santhrottle COMMAND --help               # each command's own examples

--json (every command has it) prints {"protocol": N, "data": ...}: N is the
version of the control protocol, data what the command shows.

"""
    + EXIT_HELP
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="santhrottle",
        description="Keep shared storage read latency under a threshold by delaying "
        "the packets of write-heavy iSCSI / NVMe-oF initiators.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=version_line("santhrottle"))
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    daemon.add_commands(sub)
    groups.add_commands(sub)
    meter.add_commands(sub)
    fleet.add_commands(sub)
    datapath.add_commands(sub)
    sensing.add_commands(sub)
    simulate.add_commands(sub)
    names.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [simulate.VERB]:  # every argument is the simulator's, --help too
        return one_line_failures("santhrottle", lambda: simulate.forward(argv[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)  # a usage error: argparse's lines, SystemExit(2)
    return one_line_failures("santhrottle", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    """The verb; the daemon's refusals as the command line's failures."""
    try:
        rc: int = args.func(args)
        return rc
    except DaemonUnavailable as e:  # a verb that let it through: still exit 3, one line
        raise NoDaemon(str(e)) from None
    except RemoteError as e:
        raise Failed(str(e)) from None


if __name__ == "__main__":
    sys.exit(main())
