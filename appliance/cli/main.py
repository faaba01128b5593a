"""The `santhrottle` command line: one parser, a module per group of verbs.

Errors an admin can cause (a bad file, a bad argument) print one line on
stderr naming the problem and exit with status 2; never a traceback.
build_parser() is also what the man page and the shell completions are
generated from (`make wheel`).
"""

from __future__ import annotations

import argparse
import sys

from santhrottle.appliance.cli import daemon, datapath, sensing, simulate
from santhrottle.appliance.cli.common import EXIT_USAGE, CliError
from santhrottle.appliance.version import version_line

EPILOG = """\
examples:
  santhrottle status                       # what the daemon controls, measured now
  santhrottle threshold set vg_aic 15ms
  santhrottle pin 10.0.0.3 --delay 5ms     # throttle a host by hand
  santhrottle resources                    # discovery, without the daemon
  santhrottle COMMAND --help               # each command's own examples
"""


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
    datapath.add_commands(sub)
    sensing.add_commands(sub)
    simulate.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc: int = args.func(args)
        return rc
    except CliError as e:
        print(f"santhrottle: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `santhrottle ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
