"""`santhrottle simulate`: the real controller against a simulated storage resource.

What it owns
    The verb: its arguments, --help's examples, and the checks of the options
    together (--seed, --workers, --save-worst and --variant go with --sweep N;
    --plot and --no-baseline do not; --plot names a figure format matplotlib
    writes, checked before the run).  A bad combination is exit 2.  The run
    itself is simrun.py's, imported only when the verb runs: building the
    command line's parser (every other command, the man page, the
    completions) loads nothing of sim/.

Worked example
    `santhrottle simulate sim/scenarios/paper.toml --no-baseline` prints
    the uncontrolled p50/p95/p99, then one line per threshold (10, 15, 20 ms).
    `santhrottle simulate --sweep 200 --seed 1 --workers 2` prints, per
    variant, the share of the feasible plants meeting all three bounds, then
    the worst 10 plants with their parameters.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from santhrottle.appliance.cli.common import JSON_HELP, CliError, number, path_arg, verb

SIMULATE_EPILOG = """\
examples:
  santhrottle simulate sim/scenarios/paper.toml
  santhrottle simulate paper.toml --plot /tmp/paper.png
  santhrottle simulate paper.toml --json | jq '.data.controlled[].read_latency_p95_s'
  santhrottle simulate --sweep 200 --seed 1 --workers 2 --save-worst /tmp/worst
  santhrottle simulate --sweep 200 --variant sp95:setpoint_fraction=0.95
  santhrottle simulate /tmp/worst/plant-1-17.toml   # replay one of them

The scenario format is described in docs/simulator.md.  --json prints
{"protocol": N, "data": ...}, N the control protocol's version.
"""
# The figure formats --plot writes (by the file name's suffix).
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
# --sweep: at most this many plants, this many worker processes.
MAX_SWEEP_PLANTS = 100_000
MAX_WORKERS = 256
MAX_SEED = 10**9


def cmd_simulate(args: argparse.Namespace) -> int:
    """The options checked together, then the run (simrun.py, loaded now)."""
    if args.sweep is not None:
        if args.scenario is not None:
            raise CliError("give a SCENARIO or --sweep N, not both")
        for flag, given in (("--plot", args.plot), ("--no-baseline", args.no_baseline)):
            if given:
                raise CliError(f"{flag} does not go with --sweep")
    else:
        for flag, given in (
            ("--seed", args.seed is not None),
            ("--workers", args.workers is not None),
            ("--save-worst", args.save_worst is not None),
            ("--variant", bool(args.variant)),
        ):
            if given:
                raise CliError(f"{flag} goes with --sweep N")
        if args.scenario is None:
            args.simulate_parser.error("give a SCENARIO file, or --sweep N")
        if args.plot and Path(args.plot).suffix.lower() not in PLOT_SUFFIXES:
            raise CliError(
                f"--plot {args.plot!r}: name a {', '.join(s[1:] for s in PLOT_SUFFIXES)} file"
            )
    from santhrottle.appliance.cli import simrun  # the simulator, for this verb only

    return simrun.run_sweep(args) if args.sweep is not None else simrun.run_scenario(args)


def add_commands(sub: Any) -> None:
    s = verb(
        sub,
        "simulate",
        "run the real controller against a simulated storage resource",
        SIMULATE_EPILOG,
        "Run a scenario: uncontrolled, then controlled at each threshold; print latency "
        "percentiles, overshoot, time above threshold, writer throughput.",
    )
    s.add_argument(
        "scenario",
        metavar="SCENARIO",
        nargs="?",
        type=path_arg("SCENARIO"),
        help="scenario file (TOML); not with --sweep",
    )
    s.add_argument("--json", action="store_true", help=JSON_HELP + ": the summary and the series")
    s.add_argument(
        "--plot",
        metavar="FILE.png",
        type=path_arg("--plot"),
        help="write a figure like the paper's fig. 16 (.png, .svg or .pdf)",
    )
    s.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the search for the best constant delay (faster)",
    )
    s.add_argument(
        "--sweep",
        metavar="N",
        type=number("--sweep", lo=1, hi=MAX_SWEEP_PLANTS, integer=True),
        help="robustness sweep: N generated plants (sim/plantgen.py), each judged "
        "for every controller variant against the spine's bounds",
    )
    s.add_argument(
        "--seed",
        metavar="S",
        type=number("--seed", lo=0, hi=MAX_SEED, integer=True),
        help="--sweep: the plants' seed (default 1; the same seed, the same plants)",
    )
    s.add_argument(
        "--workers",
        metavar="W",
        type=number("--workers", lo=1, hi=MAX_WORKERS, integer=True),
        help="--sweep: worker processes (default 1)",
    )
    s.add_argument(
        "--save-worst",
        metavar="DIR",
        type=path_arg("--save-worst"),
        help="--sweep: write the worst plants' scenarios to DIR (replay: simulate FILE)",
    )
    s.add_argument(
        "--variant",
        metavar="NAME:KEY=VALUE[,...]",
        action="append",
        help="--sweep: judge also the controller with these [controller] keys of a "
        "scenario (docs/simulator.md) beside the defaults; repeatable",
    )
    s.set_defaults(func=cmd_simulate, simulate_parser=s)
