"""The simulator's experiment: a scenario uncontrolled, at each threshold, and the best
constant delay each threshold could have had.

What simulate() runs (what `santhrottle-simulate` prints)
    One uncontrolled run (the plant alone: the uncontrolled p95 says
    whether the scenario needs throttling at all), one controlled run per
    threshold of the scenario, and per threshold the best constant delay
    (best_constant_class): the smallest class of the ladder whose run holds
    the threshold's p95, and its writers' throughput, the reference the
    controller's throughput is judged against. Every run of a scenario
    draws the same reads (common random numbers), so the search compares
    like for like and is monotone in the class.

Worked example
    The paper scenario at T = 10 ms (docs/simulator.md): the uncontrolled
    p95 49.5 ms; the controlled run's p95 9.31 ms and 25.3 MB/s of writes;
    the best constant delay 52.0 ms (class 55) with 25.7 MB/s: the
    controller moves 98.4 % of what it lets through.
"""

from __future__ import annotations

from typing import Any

from .compare import compare, has_tenants
from .groups import group_summary
from .loop import run
from .measure import RunResult, summarize
from .scenario import Scenario


def best_constant_class(sc: Scenario, threshold_s: float) -> tuple[int, RunResult] | None:
    """Smallest constant class (most writer throughput) whose p95 holds the threshold.

    Binary search: with common random numbers the latency falls monotonically
    with the delay. None if even max_class does not hold it.
    """

    def holds(c: int) -> tuple[bool, RunResult]:
        res = run(sc, constant_class=c)
        return summarize(sc, res, threshold_s)["read_latency_p95_s"] <= threshold_s, res

    lo, hi = 0, sc.controller.max_class
    ok, best = holds(hi)
    if not ok:
        return None
    ok0, res0 = holds(lo)
    if ok0:
        return lo, res0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, res = holds(mid)
        if ok:
            hi, best = mid, res
        else:
            lo = mid
    return hi, best


def simulate(sc: Scenario, baseline: bool = True) -> dict[str, Any]:
    """Uncontrolled run plus one controlled run per threshold, summarized."""
    unc = run(sc)
    runs: list[dict[str, Any]] = []
    all_runs = [unc]
    for thr in sc.thresholds_s:
        res = run(sc, threshold_s=thr)
        all_runs.append(res)
        summary = summarize(sc, res)
        summary["uncontrolled_p95_s"] = summarize(sc, unc, thr)["read_latency_p95_s"]
        if baseline:
            found = best_constant_class(sc, thr)
            if found is None:
                summary["best_constant"] = None
            else:
                c, cres = found
                cw = summarize(sc, cres, thr)["write_throughput_bps"]
                summary["best_constant"] = {
                    "delay_class": c,
                    "delay_s": sc.controller.ladder.delay_s(c),
                    "write_throughput_bps": cw,
                    "controlled_vs_constant": summary["write_throughput_bps"] / cw if cw else None,
                }
        runs.append(summary)
    targeted = any(g.group.targeted for g in sc.groups)  # levels alone: no arbiter
    out_groups = {r.label: _groups_view(sc, r) for r in all_runs if r.groups and targeted}
    return {
        **({"groups": out_groups} if out_groups else {}),
        **({"tenants": compare(sc)} if has_tenants(sc) else {}),
        "uncontrolled": summarize(sc, unc),
        "controlled": runs,
        "series": {
            r.label: {
                "t_s": r.series.t_s,
                "read_latency_s": r.series.read_latency_s,
                "ewma_s": r.series.ewma_s,
                "delay_class": r.series.delay_class,
                "delay_s": [sc.controller.ladder.delay_s(c) for c in r.series.delay_class],
                "write_bps": r.series.write_bps,
            }
            for r in all_runs
        },
    }


def _groups_view(sc: Scenario, r: RunResult) -> dict[str, Any]:
    """Per group of a controlled run: its figures after the settle time, and its series."""
    specs = {g.group.name: g.group for g in sc.groups}
    settle = sc.default_settle_s()
    return {
        name: {
            "summary": group_summary(rec, specs[name], settle),
            "latency_target_s": specs[name].latency_target_s,
            "throughput_target_bps": specs[name].throughput_target_bps,
            "throughput_target_iops": specs[name].throughput_target_iops,
            "series": {
                "t_s": rec.t_s,
                "latency_s": rec.latency_s,
                "throughput_bps": rec.throughput_bps,
                "iops": rec.iops,
                "y": rec.y,
                "pwfte": rec.pwfte,
                "share": rec.share,
                "demand": rec.demand,
                "delay_class": rec.delay_class,
                "priority": rec.priority,
            },
        }
        for name, rec in r.groups.items()
    }
