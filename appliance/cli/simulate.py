"""`santhrottle simulate`: the real controller against a simulated storage resource."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from santhrottle.appliance.cli.common import CliError, verb
from santhrottle.appliance.units import fmt_ms
from santhrottle.controller.plant import SaturatedError
from santhrottle.controller.scenario import ScenarioError, parse_scenario
from santhrottle.controller.sim import simulate

SIMULATE_EPILOG = """\
examples:
  santhrottle simulate controller/scenarios/paper.toml
  santhrottle simulate paper.toml --plot /tmp/paper.png
  santhrottle simulate paper.toml --json | jq '.controlled[].read_latency_p95_s'

The scenario format is described in docs/simulator.md.
"""


def _finite(x: Any) -> Any:
    """JSON has no NaN/Infinity: map them to null, recursively."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


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
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise CliError(f"cannot read scenario {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise CliError(f"scenario {path}: not UTF-8 text") from None
    try:
        sc = parse_scenario(text)
        result = simulate(sc, baseline=not args.no_baseline)
    except (ScenarioError, SaturatedError) as e:
        raise CliError(f"scenario {path}: {e}") from None
    if args.plot:
        from santhrottle.appliance.cli.plot import PlotUnavailable, plot_simulation

        try:
            plot_simulation(result, Path(args.plot), f"santhrottle simulate {path.name}")
        except PlotUnavailable as e:
            raise CliError(str(e)) from None
        except OSError as e:
            raise CliError(f"cannot write plot {args.plot}: {e.strerror or e}") from None
    if args.json:
        json.dump(_finite(result), sys.stdout, allow_nan=False)
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
    s.add_argument("scenario", metavar="SCENARIO", help="scenario file (TOML)")
    s.add_argument("--json", action="store_true", help="print the summary and series as JSON")
    s.add_argument("--plot", metavar="FILE.png", help="write a figure like the paper's fig. 16")
    s.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the search for the best constant delay (faster)",
    )
    s.set_defaults(func=cmd_simulate)
