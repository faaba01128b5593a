"""`santhrottle simulate ARGS`: runs the simulator's own program, santhrottle-simulate ARGS.

What it owns
    The verb in santhrottle's parser (so that `santhrottle --help`, santhrottle(8)
    and the completions name it) and the hand-over: every argument after
    `simulate`, --help included, goes to `python3 -m santhrottle.sim` (the same
    program as santhrottle-simulate, sim/cli.py), run as a child with this
    process's standard streams: its output, its errors and its exit status are
    the simulator's.

Why a child process
    The simulator is not part of the appliance: no product module imports sim/
    (the import contract sim-beside-the-product, without exceptions).  The
    verb stays for the admins and scripts that run `santhrottle simulate`; the
    simulator keeps its own arguments, checks and --help.  A child, not an
    exec: main() still returns the exit status to whoever called it.

Worked example
    `santhrottle simulate sim/scenarios/paper.toml --no-baseline` runs
    `python3 -m santhrottle.sim sim/scenarios/paper.toml --no-baseline`, which
    prints the uncontrolled p50/p95/p99, then one line per threshold, and exits
    0; `santhrottle simulate --help` prints santhrottle-simulate's help.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

from santhrottle.appliance.cli.common import verb

VERB = "simulate"
SIMULATOR = "santhrottle.sim"  # the module `python3 -m` runs: santhrottle-simulate
SIMULATE_EPILOG = """\
examples:
  santhrottle simulate sim/scenarios/paper.toml
  santhrottle simulate --help            # the simulator's own help

`santhrottle simulate ARGS` runs santhrottle-simulate ARGS: its arguments, its
output and its exit status are the simulator's (santhrottle-simulate(1)).
"""


def forward(args: list[str]) -> int:
    """The simulator run with `args`: its exit status (128 + N if signal N ended it; a
    simulator that cannot be started raises OSError: one line from main())."""
    sys.stdout.flush()
    rc = subprocess.run([sys.executable, "-m", SIMULATOR, *args], check=False).returncode
    return 128 - rc if rc < 0 else rc


def add_commands(sub: Any) -> None:
    s = verb(
        sub,
        VERB,
        "run the real controller against a simulated storage resource (santhrottle-simulate)",
        SIMULATE_EPILOG,
    )
    # What the simulator takes: main() hands every argument after the verb over
    # before this parser sees them; the man page and the completions show them so
    # (the completions offer file names: a scenario).
    s.add_argument(
        "simulator_args",
        metavar="ARG",
        nargs=argparse.REMAINDER,
        help="the simulator's arguments and options (santhrottle-simulate --help)",
    )
    s.set_defaults(func=lambda a: forward(a.simulator_args))
