"""santhrottle-simulate: the real controller against a simulated storage resource.

What it owns
    The simulator's program (`santhrottle-simulate`, `python3 -m santhrottle.sim`;
    `santhrottle simulate` runs it too): its arguments, --help's examples, the
    checks of the options together (--seed, --workers, --save-worst and --variant
    go with --sweep N; --plot and --no-baseline do not; --plot names a figure
    format matplotlib writes, checked before the run), reading a scenario file (a
    regular file of at most MAX_SCENARIO_BYTES: a FIFO or /dev/zero is refused,
    never read), running it, --plot, the summary table and --json ({"protocol":
    N, "data": ...}); the sweep, its table and --save-worst.  A bad scenario or a
    bad combination of options is one line and exit 2; a plot that cannot be
    drawn (no matplotlib) is exit 1.

Why here
    The simulator is not part of the appliance: no product module imports sim/
    (the import contract sim-beside-the-product, without exceptions).  This
    program borrows the command line's conventions from the product (its errors,
    exit codes, argument checks, units and --json envelope; the tenants' table).
    The man page santhrottle-simulate(1) and its completions are generated from
    build_parser() (buildsys/santhrottle_build.py).

Worked example
    main(["sim/scenarios/paper.toml", "--no-baseline"]) prints the uncontrolled
    p50/p95/p99, then one line per threshold (10, 15, 20 ms); main(["--sweep",
    "200", "--seed", "1", "--workers", "2"]) prints, per variant, the share of the
    feasible plants meeting all three bounds, then the worst 10 plants with their
    parameters.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from santhrottle.appliance.cli.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    JSON_HELP,
    CliError,
    Failed,
    envelope,
    number,
    one_line_failures,
    path_arg,
)
from santhrottle.appliance.cli.tenantsview import print_tenants
from santhrottle.appliance.textfile import read_text_file
from santhrottle.appliance.units import fmt_ms
from santhrottle.sim.experiment import simulate
from santhrottle.sim.plant import SaturatedError
from santhrottle.sim.plantgen import generate
from santhrottle.sim.scenario import ScenarioError, parse_scenario
from santhrottle.sim.sweep import (
    ORACLE,
    VARIANTS,
    MapFn,
    check_variants,
    parse_variant,
    sweep,
)

PROG = "santhrottle-simulate"
EPILOG = """\
examples:
  santhrottle-simulate sim/scenarios/paper.toml
  santhrottle-simulate paper.toml --plot /tmp/paper.png
  santhrottle-simulate paper.toml --json | jq '.data.controlled[].read_latency_p95_s'
  santhrottle-simulate --sweep 200 --seed 1 --workers 2 --save-worst /tmp/worst
  santhrottle-simulate --sweep 200 --variant sp95:setpoint_fraction=0.95
  santhrottle-simulate /tmp/worst/plant-1-17.toml   # replay one of them

The scenario format is described in docs/simulator.md.  --json prints
{"protocol": N, "data": ...}, N the control protocol's version.  `santhrottle
simulate ARGS` runs santhrottle-simulate ARGS.
"""
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "the figure cannot be drawn (no matplotlib) or a file cannot be written",
    EXIT_USAGE: "bad usage or input (an argument, a scenario file, a combination of options)",
    EXIT_INTERRUPTED: "interrupted (^C)",
}
EXIT_HELP = "exit status:\n" + "".join(f"  {k:<3}  {v}\n" for k, v in EXIT_CODES.items())
# The figure formats --plot writes (by the file name's suffix).
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
# --sweep: at most this many plants, this many worker processes.
MAX_SWEEP_PLANTS = 100_000
MAX_WORKERS = 256
MAX_SEED = 10**9

# A scenario is a few kB of TOML; anything larger is not one.
MAX_SCENARIO_BYTES = 1024 * 1024


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
    for label, groups in result.get("groups", {}).items():
        _print_groups(label, groups)
    if "tenants" in result:
        print_tenants(result["tenants"])


def _target_text(g: dict[str, Any]) -> str:
    parts = []
    if g["latency_target_s"] is not None:
        parts.append(f"{fmt_ms(g['latency_target_s'], '')}ms")
    if g["throughput_target_bps"] is not None:
        parts.append(f"{g['throughput_target_bps'] / 1e6:.1f}MB/s")
    if g["throughput_target_iops"] is not None:
        parts.append(f"{g['throughput_target_iops']:g}iops")
    return ",".join(parts) or "-"


def _print_groups(label: str, groups: dict[str, Any]) -> None:
    """One line per group of a controlled run (scenarios with [[group]])."""
    print(f"groups, {label}, after the settle time:")
    print(
        f"  {'group':<12} {'prio':>4} {'target':>14} {'lat p95':>7} {'MB/s':>7} {'y':>5} "
        f"{'short':>5} {'pwfte':>6} {'share':>5} {'class':>5}"
    )
    for name, g in groups.items():
        s = g["summary"]
        print(
            f"  {name:<12} {s['priority']:>4g} {_target_text(g):>14} "
            f"{fmt_ms(s['latency_p95_s'], ''):>7} {s['throughput_bps'] / 1e6:>7.1f} "
            f"{s['y_mean']:>5.2f} {s['shortfall']:>5.2f} {s['pwfte']:>6.2f} "
            f"{s['share']:>5.2f} {s['delay_class']:>5.1f}"
        )
    print(
        "  lat p95: of the 1 s latency the group sees (delay included); MB/s: pauses included; "
        "y: performance / "
        "target (mean); short: 1 - y where short; pwfte: priority x (1 - y); share: of "
        "the resource's concurrency; class: mean delay class"
    )


def run_scenario(args: argparse.Namespace) -> int:
    """`santhrottle-simulate SCENARIO` (its options checked by check()): the run,
    its plot, its summary or --json."""
    path = Path(args.scenario)
    text = read_scenario(path)
    try:
        sc = parse_scenario(text)
        result = simulate(sc, baseline=not args.no_baseline)
    except (ScenarioError, SaturatedError) as e:
        raise CliError(f"scenario {path}: {e}") from None
    if args.plot:
        from santhrottle.sim.plot import (
            PlotError,
            PlotUnavailable,
            groups_plot_path,
            plot_groups,
            plot_simulation,
        )

        try:
            plot_simulation(result, Path(args.plot), f"{PROG} {path.name}")
            if "groups" in result:
                plot_groups(result, groups_plot_path(Path(args.plot)), f"{path.name}: groups")
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
            if "groups" in result:
                from santhrottle.sim.plot import groups_plot_path

                print(f"plot of the groups: {groups_plot_path(Path(args.plot))}")
    return 0


def run_sweep(args: argparse.Namespace) -> int:
    """`santhrottle-simulate --sweep N` (its options checked by check())."""
    seed = 1 if args.seed is None else args.seed
    workers = 1 if args.workers is None else args.workers
    worst_dir = _worst_dir(args.save_worst) if args.save_worst else None
    show = _progress if sys.stderr.isatty() and not args.json else None
    variants = _variants(args.variant or [])
    t0 = time.monotonic()
    try:
        with _mapper(workers) as map_fn:
            result = sweep(args.sweep, seed, variants, map_fn, show)
    except (ScenarioError, SaturatedError) as e:
        raise CliError(f"sweep: {e}") from None
    wall_s = time.monotonic() - t0
    result["summary"]["wall_s"] = round(wall_s, 1)
    result["summary"]["workers"] = workers
    saved = _save_worst(worst_dir, result, seed) if worst_dir else []
    if args.json:
        json.dump(envelope(result), sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
    else:
        _print_sweep(result["summary"])
        if saved:
            print(f"worst plants saved: {', '.join(str(p) for p in saved)}")
    return 0


def _variants(texts: list[str]) -> dict[str, dict[str, Any]]:
    """The built-in variants and those of --variant (checked before the sweep)."""
    out: dict[str, dict[str, Any]] = {k: dict(v) for k, v in VARIANTS.items()}
    try:
        for text in texts:
            name, overrides = parse_variant(text)
            if name in out:
                raise ScenarioError(f"variant {name!r} is already defined")
            out[name] = overrides
        check_variants(out)
    except ScenarioError as e:
        raise CliError(f"--variant: {e}") from None
    return out


@contextmanager
def _mapper(workers: int) -> Iterator[MapFn]:
    """map for one worker, else a process pool's ordered imap (one plant per task)."""
    if workers == 1:
        yield map
        return
    with multiprocessing.get_context().Pool(workers) as pool:
        yield partial(pool.imap, chunksize=1)


def _progress(done: int, total: int) -> None:
    if done == total or done % max(1, total // 20) == 0:
        end = "\n" if done == total else ""
        print(f"\rswept {done}/{total} plants", end=end, file=sys.stderr, flush=True)


def _worst_dir(text: str) -> Path:
    """--save-worst's directory, created now (a bad one fails before the sweep)."""
    d = Path(text)
    if d.exists() and not d.is_dir():
        raise CliError(f"--save-worst {text}: not a directory")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"--save-worst {text}: {e.strerror or e}") from None
    if not d.is_dir():
        raise CliError(f"--save-worst {text}: not a directory")
    return d


def _save_worst(d: Path, result: dict[str, Any], seed: int) -> list[Path]:
    first = next(iter(result["summary"]["worst"]))
    out = []
    for w in result["summary"]["worst"][first]:
        f = d / f"plant-{w['seed']}-{w['index']}.toml"
        figures = "; ".join(
            f"{name}: p95 {x['p95_x_threshold']:.2f} T, p99calm {x['p99_calm_x_threshold']:.2f} T, "
            f"writes {x['throughput_x_best_constant']:.2f} x best constant"
            for name, x in w["figures"].items()
        )
        head = f"# {PROG} --sweep (seed {seed}): {figures}\n"
        try:
            f.write_text(head + generate(w["seed"], w["index"]))
        except OSError as e:
            raise CliError(f"--save-worst {f}: {e.strerror or e}") from None
        out.append(f)
    return out


def _print_sweep(s: dict[str, Any]) -> None:
    print(
        f"{s['plants']} plants (seed {s['seed']}), {s['feasible']} feasible (a constant "
        f"delay within the ladder holds T), {s['needs_delay']} of them need a delay; "
        f"wall time {s['wall_s']:.0f} s on {s['workers']} worker(s)"
    )
    print(f"{'variant':<17} {'all 3 bounds':>16} {'p95':>5} {'p99calm':>7} {'writes':>6}")
    rows = [*s["variants"].items(), *((f"{n} ({ORACLE})", v) for n, v in s[ORACLE].items())]
    for name, v in rows:
        share = (
            f"{v['pass_all']}/{v['feasible']} {100 * v['share_all']:.1f}%" if v["feasible"] else "-"
        )
        p = v["pass"]
        print(f"{name:<17} {share:>16} {p['p95']:>5} {p['p99_calm']:>7} {p['throughput']:>6}")
        for by in ("by_family", "by_schedule", "by_resources"):
            cells = ", ".join(f"{k} {a}/{b}" for k, (a, b) in v[by].items())
            print(f"{'':<17} {by[3:]}: {cells}")
    print(
        f"({ORACLE}): the variant with every resource's class held at the best constant "
        "one; a writer gets it once the write-heavy sets have it, through the ramp"
    )
    for name, rows in s["worst"].items():
        print(f"worst {len(rows)} for {name} (x T; writes x best constant):")
        for w in rows:
            figs = "  ".join(
                f"{n} {x['p95_x_threshold']:.2f}/{x['p99_calm_x_threshold']:.2f}/"
                f"{x['throughput_x_best_constant']:.2f}"
                for n, x in [
                    *w["figures"].items(),
                    *((f"{n}({ORACLE})", x) for n, x in w[ORACLE].items()),
                ]
            )
            print(
                f"  {w['seed']}/{w['index']:<4} {figs}  best {w['best_delay_s'] * 1000:g} ms  "
                f"{w['description']}"
            )
    b = s["bounds"]
    print(
        f"bounds: p95 <= {b['p95_x_threshold_max']:g} T, p99 outside the 2 s after a "
        f"switch-on <= {b['p99_calm_x_threshold_max']:g} T, writes >= "
        f"{b['throughput_x_best_constant_min']:g} x the best constant delay's; figures "
        "p95/p99calm/writes"
    )


# ------------------------------------------------------------------ the command line
def build_parser() -> argparse.ArgumentParser:
    """santhrottle-simulate's parser (also what its man page and completions are
    generated from)."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Run the real controller against a simulated storage resource: a "
        "scenario uncontrolled, then controlled at each threshold; print latency "
        "percentiles, overshoot, time above threshold, writer throughput.",
        epilog=EPILOG + "\n" + EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "scenario",
        metavar="SCENARIO",
        nargs="?",
        type=path_arg("SCENARIO"),
        help="scenario file (TOML); not with --sweep",
    )
    p.add_argument("--json", action="store_true", help=JSON_HELP + ": the summary and the series")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        type=path_arg("--plot"),
        help="write a figure like the paper's fig. 16 (.png, .svg or .pdf)",
    )
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the search for the best constant delay (faster)",
    )
    p.add_argument(
        "--sweep",
        metavar="N",
        type=number("--sweep", lo=1, hi=MAX_SWEEP_PLANTS, integer=True),
        help="robustness sweep: N generated plants (sim/plantgen.py), each judged "
        "for every controller variant against the spine's bounds",
    )
    p.add_argument(
        "--seed",
        metavar="S",
        type=number("--seed", lo=0, hi=MAX_SEED, integer=True),
        help="--sweep: the plants' seed (default 1; the same seed, the same plants)",
    )
    p.add_argument(
        "--workers",
        metavar="W",
        type=number("--workers", lo=1, hi=MAX_WORKERS, integer=True),
        help="--sweep: worker processes (default 1)",
    )
    p.add_argument(
        "--save-worst",
        metavar="DIR",
        type=path_arg("--save-worst"),
        help="--sweep: write the worst plants' scenarios to DIR (replay: "
        "santhrottle-simulate FILE)",
    )
    p.add_argument(
        "--variant",
        metavar="NAME:KEY=VALUE[,...]",
        action="append",
        help="--sweep: judge also the controller with these [controller] keys of a "
        "scenario (docs/simulator.md) beside the defaults; repeatable",
    )
    p.add_argument("--version", action="version", version=_version())
    return p


def _version() -> str:
    from santhrottle.appliance.version import version_line

    return version_line(PROG)


def check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The options checked together (CliError; no SCENARIO nor --sweep: argparse's
    usage error)."""
    if args.sweep is not None:
        if args.scenario is not None:
            raise CliError("give a SCENARIO or --sweep N, not both")
        for flag, given in (("--plot", args.plot), ("--no-baseline", args.no_baseline)):
            if given:
                raise CliError(f"{flag} does not go with --sweep")
        return
    for flag, given in (
        ("--seed", args.seed is not None),
        ("--workers", args.workers is not None),
        ("--save-worst", args.save_worst is not None),
        ("--variant", bool(args.variant)),
    ):
        if given:
            raise CliError(f"{flag} goes with --sweep N")
    if args.scenario is None:
        parser.error("give a SCENARIO file, or --sweep N")
    if args.plot and Path(args.plot).suffix.lower() not in PLOT_SUFFIXES:
        raise CliError(
            f"--plot {args.plot!r}: name a {', '.join(s[1:] for s in PLOT_SUFFIXES)} file"
        )


def main(argv: list[str] | None = None) -> int:
    """santhrottle-simulate: every failure one line on stderr, never a traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)  # a usage error: argparse's lines, SystemExit(2)
    return one_line_failures(PROG, lambda: _run(args, parser))


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    check(args, parser)
    return run_sweep(args) if args.sweep is not None else run_scenario(args)
