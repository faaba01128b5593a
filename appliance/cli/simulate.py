"""`santhrottle simulate`: the real controller against a simulated storage resource.

What it owns
    Reading a scenario file (a regular file of at most MAX_SCENARIO_BYTES: a
    FIFO or /dev/zero is refused, never read), running it, the summary table,
    --json ({"protocol": N, "data": ...}) and --plot (checked before the run:
    a figure format matplotlib writes).  A bad scenario or --plot is exit 2; a
    plot that cannot be drawn (no matplotlib) is exit 1.

Worked example
    `santhrottle simulate controller/scenarios/paper.toml --no-baseline` prints
    the uncontrolled p50/p95/p99, then one line per threshold (10, 15, 20 ms).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from santhrottle.appliance.cli.common import (
    JSON_HELP,
    CliError,
    Failed,
    envelope,
    path_arg,
    verb,
)
from santhrottle.appliance.config.parse import read_text_file
from santhrottle.appliance.units import fmt_ms
from santhrottle.controller.plant import SaturatedError
from santhrottle.controller.scenario import ScenarioError, parse_scenario
from santhrottle.controller.sim import simulate

SIMULATE_EPILOG = """\
examples:
  santhrottle simulate controller/scenarios/paper.toml
  santhrottle simulate paper.toml --plot /tmp/paper.png
  santhrottle simulate paper.toml --json | jq '.data.controlled[].read_latency_p95_s'

The scenario format is described in docs/simulator.md.  --json prints
{"protocol": N, "data": ...}, N the control protocol's version.
"""
# A scenario is a few kB of TOML; anything larger is not one.
MAX_SCENARIO_BYTES = 1024 * 1024
# The figure formats --plot writes (by the file name's suffix).
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def read_scenario(path: Path) -> str:
    """A regular file's UTF-8 text, at most MAX_SCENARIO_BYTES; CliError otherwise
    (a FIFO or a device never blocks)."""
    return read_text_file(path, MAX_SCENARIO_BYTES, CliError, what="scenario ")


def _print_summary(result: dict[str, Any]) -> None:
    unc = result["uncontrolled"]
    print(
        f"settle at {unc['settle_s']:g} s; 1 s read latency after it. "
        f"uncontrolled: p50 {fmt_ms(unc['read_latency_p50_s'], '')} ms, "
        f"p95 {fmt_ms(unc['read_latency_p95_s'], '')} ms, "
        f"p99 {fmt_ms(unc['read_latency_p99_s'], '')} ms, "
        f"writes {unc['write_throughput_bps'] / 1e6:.1f} MB/s"
    )
    head = (
        f"{'threshold':>9} {'p50':>7} {'p95':>7} {'p99':>7} {'p99calm':>7} {'peak':>7} "
        f"{'over_s':>6} {'above%':>6} {'wr MB/s':>7} {'const':>13} {'chg/min':>7}"
    )
    print(head)
    for c in result["controlled"]:
        bc = c.get("best_constant")
        const = (
            "-"
            if not bc
            else f"{bc['delay_s'] * 1000:.1f}ms {bc['write_throughput_bps'] / 1e6:.1f}"
        )
        print(
            f"{fmt_ms(c['threshold_s'], ''):>7}ms {fmt_ms(c['read_latency_p50_s'], ''):>7} "
            f"{fmt_ms(c['read_latency_p95_s'], ''):>7} {fmt_ms(c['read_latency_p99_s'], ''):>7} "
            f"{fmt_ms(c['read_latency_p99_outside_transients_s'], ''):>7} "
            f"{fmt_ms(c['peak_overshoot_s'], ''):>7} {c['overshoot_duration_s']:>6.1f} "
            f"{c['time_above_threshold_pct']:>6.1f} {c['write_throughput_bps'] / 1e6:>7.1f} "
            f"{const:>13} {c['class_changes_per_min']:>7.1f}"
        )
    print(
        "latencies in ms; p99calm excludes 2 s after each switch-on; peak/over_s: worst "
        "switch-on peak and its time back under the threshold; const: best constant delay "
        "holding p95 <= threshold and its write MB/s"
    )


def cmd_simulate(args: argparse.Namespace) -> int:
    path = Path(args.scenario)
    if args.plot and Path(args.plot).suffix.lower() not in PLOT_SUFFIXES:
        raise CliError(
            f"--plot {args.plot!r}: name a {', '.join(s[1:] for s in PLOT_SUFFIXES)} file"
        )
    text = read_scenario(path)
    try:
        sc = parse_scenario(text)
        result = simulate(sc, baseline=not args.no_baseline)
    except (ScenarioError, SaturatedError) as e:
        raise CliError(f"scenario {path}: {e}") from None
    if args.plot:
        from santhrottle.appliance.cli.plot import PlotError, PlotUnavailable, plot_simulation

        try:
            plot_simulation(result, Path(args.plot), f"santhrottle simulate {path.name}")
        except PlotUnavailable as e:
            raise Failed(str(e)) from None
        except PlotError as e:
            raise CliError(str(e)) from None
        except OSError as e:
            raise CliError(f"cannot write plot {args.plot}: {e.strerror or e}") from None
    if args.json:
        json.dump(envelope(result), sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
    else:
        _print_summary(result)
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


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
        "scenario", metavar="SCENARIO", type=path_arg("SCENARIO"), help="scenario file (TOML)"
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
    s.set_defaults(func=cmd_simulate)
