"""Robustness sweep: the controller on many generated plants, judged by the spine's bounds.

Problem
    Say how often the controller holds the threshold on plants it was not
    tuned on, and which plants it fails, for the default settings and for
    other named settings (variants) side by side.

Law (per plant, sim/plantgen.py draws it from (seed, index))
    1. feasible: experiment.best_constant_class finds the smallest constant class
       of the ladder whose p95 holds T (with the scenario's own [controller]
       table, i.e. the default ladder); its writer throughput is the
       reference of bound 3. A plant no constant delay holds does not count.
    2. per variant (a named set of overrides of the scenario's [controller]
       and [datapath] keys, the daemon's, parse_scenario's overrides): one
       controlled run at T, summarized by sim/measure.py's summarize.
    2b. per variant, its oracle (ORACLE): one more run with the variant's
       settings and each resource's class held at the best constant one
       (sim/loop.py run's oracle_class): the sets' cadence and the ramp alone, no
       control law. A plant the oracle misses needs a writer throttled
       before the sets name it, or faster than the ramp lets it.
    3. bounds, each against T:
         p95 of the 1 s read latency            <= P95_BOUND x T
         p99 outside the 2 s after a switch-on  <= P99_BOUND x T
         writer throughput                       >= THROUGHPUT_BOUND x the best constant's
       margin = the worst of p95/(1.1 T), p99calm/(1.1 T), 0.9/throughput ratio:
       > 1 fails; the worst cases are the largest margins.

Bounds
    Pure: the caller brings the parallelism as a map function (the CLI
    passes a process pool's imap); results come back in index order, so a
    sweep is the same for any number of workers. Statistics are the
    simulator's: resource 0's reader (plantgen makes any second resource
    one that every constant delay holding resource 0 holds too).

Worked example
    sweep(4, seed=1) judges plants (1, 0)..(1, 3) under VARIANTS:
    result["summary"]["variants"]["default"] == {"feasible": 4, "pass_all": 3,
    "share_all": 0.75, ...}, result["summary"]["oracle"]["default"] the same
    for its oracle runs, and result["summary"]["worst"]["default"][0] is the plant
    with the largest margin, its parameters and figures (the oracle's too).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from . import plantgen
from .experiment import best_constant_class
from .loop import run
from .measure import RunResult, summarize
from .scenario import Scenario, ScenarioError, parse_scenario

# ---------------------------------------------------------------------------
# VARIANTS: named overrides of a scenario's [controller] and [datapath] keys (the
# daemon's keys and values, docs/configure.md). "default" is the controller's defaults as they are;
# "paper" stands for the defaults before the log law and the long ladder (the
# method paper's PID on the class index, linear 0.5 ms ladder to 50 ms = 100
# classes), a fixed setpoint. Owner of the control law: keep "paper" equal to
# those old defaults where a key can (the write-drop hold of decide.py has none).
# ---------------------------------------------------------------------------
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "paper": {
        "law": "paper",
        "ladder_ratio": 1.0,
        "max_delay": "50ms",
        "write_heavy_share": 0.0,
        "setpoint_quiet_fraction": 0.0,
    },
}

# Beside each variant, every feasible plant is run once more with the variant's
# settings but each resource's class held at the best constant one (loop.run's
# oracle_class): a writer gets it only once the write-heavy sets have it, and
# through the ramp. A plant the oracle misses is lost to the sets' cadence and
# the ramp, not to the control law.
ORACLE = "oracle"

P95_BOUND = 1.1
P99_BOUND = 1.1
THROUGHPUT_BOUND = 0.9
WORST_CASES = 10
BOUNDS = ("p95", "p99_calm", "throughput")
BY = ("family", "schedule", "resources")  # the plant parameters the shares are split by

Variants = Mapping[str, Mapping[str, Any]]
MapFn = Callable[[Callable[[int], dict[str, Any]], Iterable[int]], Iterable[dict[str, Any]]]


# A variant's name on the command line: a short identifier (it heads a column).
VARIANT_NAME_MAX = 10
_LOWER = "abcdefghijklmnopqrstuvwxyz"
_LETTERS = _LOWER + _LOWER.upper()
_NAME_CHARS = frozenset(_LETTERS + "0123456789_.-")
_KEY_CHARS = frozenset(_LOWER + "_")


def _is_name(text: str) -> bool:
    return 0 < len(text) <= VARIANT_NAME_MAX and text[0] in _LETTERS and set(text) <= _NAME_CHARS


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """NAME:KEY=VALUE[,KEY=VALUE...] (VALUE a TOML literal) -> (NAME, overrides).

    `sp95:setpoint_fraction=0.95` or `oldlaw:law="paper",ladder_ratio=1.0`.
    ScenarioError naming the problem; the keys are checked by check_variants."""
    name, sep, rest = text.partition(":")
    if not sep or not _is_name(name):
        raise ScenarioError(
            f"variant {text!r}: expected NAME:KEY=VALUE[,KEY=VALUE...], NAME a letter "
            "then up to 9 letters, digits, '_', '.' or '-'"
        )
    overrides: dict[str, Any] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key or not set(key) <= _KEY_CHARS:
            raise ScenarioError(f"variant {name!r}: {item.strip()!r} is not KEY=VALUE")
        try:
            parsed = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            raise ScenarioError(
                f"variant {name!r}: {key}: {value.strip()!r} is not a TOML value "
                '(a number, true/false or a "string")'
            ) from None
        if key in overrides:
            raise ScenarioError(f"variant {name!r}: {key} given twice")
        overrides[key] = parsed
    return name, overrides


def check_variants(variants: Variants) -> None:
    """ScenarioError (naming the variant) if a variant's overrides do not parse."""
    if not variants:
        raise ScenarioError("sweep: no variants")
    if ORACLE in variants:
        raise ScenarioError(f"variant {ORACLE!r}: the name is the sweep's own (its oracle run)")
    text = plantgen.generate(0, 0)
    for name, overrides in variants.items():
        try:
            parse_scenario(text, overrides)
        except ScenarioError as e:
            raise ScenarioError(f"variant {name!r}: {e}") from None


def _ratio(x: float, thr: float) -> float:
    return x / thr if math.isfinite(x) else math.inf


def judge(index: int, seed: int, variants: Variants) -> dict[str, Any]:
    """One plant: feasibility, its best constant delay, each variant's figures and bounds."""
    plant = plantgen.draw(seed, index)
    text = plant.toml()
    sc = parse_scenario(text)
    thr = sc.thresholds_s[0]
    out: dict[str, Any] = {
        "seed": seed,
        "index": index,
        "description": plant.describe(),
        "params": plant.params(),
        "threshold_s": thr,
        "feasible": False,
        "variants": {},
    }
    found = best_constant_class(sc, thr)
    if found is None:
        return out
    cls, cres = found
    best_bps = summarize(sc, cres, thr)["write_throughput_bps"]
    out.update(
        feasible=True,
        best_class=cls,
        best_delay_s=sc.controller.ladder.delay_s(cls),
        best_write_bps=best_bps,
    )
    out[ORACLE] = {}
    for name, overrides in variants.items():
        scv = parse_scenario(text, overrides)
        out["variants"][name] = _figures(scv, run(scv, threshold_s=thr), thr, best_bps)
        # the best constant delay on the variant's ladder (the top class if it is short)
        k = scv.controller.ladder.class_at_least(sc.controller.ladder.delay_s(cls))
        oracle = run(scv, threshold_s=thr, oracle_class=k)
        out[ORACLE][name] = _figures(scv, oracle, thr, best_bps)
    return out


def _figures(sc: Scenario, r: RunResult, thr: float, best_bps: float) -> dict[str, Any]:
    """One controlled run's figures against T and the best constant delay, and its bounds."""
    s = summarize(sc, r)
    p95 = _ratio(s["read_latency_p95_s"], thr)
    p99 = _ratio(s["read_latency_p99_outside_transients_s"], thr)
    wr = s["write_throughput_bps"] / best_bps if best_bps > 0.0 else 1.0
    ok = {
        "p95": p95 <= P95_BOUND,
        "p99_calm": p99 <= P99_BOUND,
        "throughput": wr >= THROUGHPUT_BOUND,
    }
    return {
        "p95_x_threshold": p95,
        "p99_calm_x_threshold": p99,
        "throughput_x_best_constant": wr,
        "write_bps": s["write_throughput_bps"],
        "peak_x_threshold": _ratio(s["peak_overshoot_s"], thr),
        "time_above_threshold_pct": s["time_above_threshold_pct"],
        "class_changes_per_min": s["class_changes_per_min"],
        "passes": ok,
        "pass_all": all(ok.values()),
        "margin": max(p95 / P95_BOUND, p99 / P99_BOUND, THROUGHPUT_BOUND / max(wr, 1e-9)),
    }


def sweep(
    n: int,
    seed: int,
    variants: Variants = VARIANTS,
    map_fn: MapFn = map,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Plants (seed, 0..n-1), each judged (judge()), and their summary."""
    if n < 1:
        raise ScenarioError(f"sweep: need at least 1 plant, got {n}")
    check_variants(variants)
    job = partial(judge, seed=seed, variants=dict(variants))
    plants: list[dict[str, Any]] = []
    for p in map_fn(job, range(n)):
        plants.append(p)
        if progress is not None:
            progress(len(plants), n)
    return {"summary": summarize_sweep(plants, list(variants), seed), "plants": plants}


def summarize_sweep(plants: list[dict[str, Any]], variants: list[str], seed: int) -> dict[str, Any]:
    """Shares meeting the bounds per variant (among feasible plants) and the worst cases."""
    feasible = [p for p in plants if p["feasible"]]
    out: dict[str, Any] = {
        "seed": seed,
        "plants": len(plants),
        "feasible": len(feasible),
        "needs_delay": sum(1 for p in feasible if p["best_class"] > 0),
        "bounds": {
            "p95_x_threshold_max": P95_BOUND,
            "p99_calm_x_threshold_max": P99_BOUND,
            "throughput_x_best_constant_min": THROUGHPUT_BOUND,
        },
        "variants": {},
        "worst": {},
    }
    out[ORACLE] = {}
    for v in variants:
        out["variants"][v] = _shares(feasible, "variants", v)
        out[ORACLE][v] = _shares(feasible, ORACLE, v)
        ranked = sorted(feasible, key=lambda p: -_key(p["variants"][v]["margin"]))
        out["worst"][v] = [
            {
                "seed": p["seed"],
                "index": p["index"],
                "description": p["description"],
                "params": p["params"],
                "best_delay_s": p["best_delay_s"],
                "figures": {name: _brief(f) for name, f in p["variants"].items()},
                "oracle": {name: _brief(f) for name, f in p[ORACLE].items()},
            }
            for p in ranked[:WORST_CASES]
        ]
    return out


def _shares(feasible: list[dict[str, Any]], kind: str, variant: str) -> dict[str, Any]:
    """The shares of p[kind][variant] ("variants" or ORACLE) meeting each bound and all
    three, in all and per plant parameter."""
    rows = [p[kind][variant] for p in feasible]
    k = len(rows)
    passed = sum(1 for r in rows if r["pass_all"])
    return {
        "feasible": k,
        "pass_all": passed,
        "share_all": passed / k if k else math.nan,
        "pass": {b: sum(1 for r in rows if r["passes"][b]) for b in BOUNDS},
        **{f"by_{param}": _by(feasible, kind, variant, param) for param in BY},
    }


def _key(margin: float) -> float:
    return math.inf if math.isnan(margin) else margin


def _by(plants: list[dict[str, Any]], kind: str, variant: str, param: str) -> dict[str, list[int]]:
    """{value of param: [passing all bounds, feasible]}."""
    out: dict[str, list[int]] = {}
    for p in plants:
        row = out.setdefault(str(p["params"][param]), [0, 0])
        row[0] += int(p[kind][variant]["pass_all"])
        row[1] += 1
    return dict(sorted(out.items()))


def _brief(f: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "p95_x_threshold",
        "p99_calm_x_threshold",
        "throughput_x_best_constant",
        "time_above_threshold_pct",
        "class_changes_per_min",
        "pass_all",
        "margin",
    )
    return {k: f[k] for k in keys}
