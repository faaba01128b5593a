"""Issue 22's fleet simulator as a bench: N appliances on the paths of one array.

For each scenario (sim/scenarios/paper.toml, fleet-deep.toml) and seed,
controller/fleetsim.fleet_compare runs one appliance seeing all traffic, then
for 2 and 4 appliances with even and uneven path splits, both multipath
policies (round-robin, service-time), the fleet (merged samples, one leader,
the same class on every path one tick later) and independent appliances
(each alone on its own samples). The table holds the medians over the seeds.

    .venv/bin/python tests/bench/run.py fleet             # as part of make bench
    .venv/bin/python tests/bench/bench_fleet.py --seeds 1 2 3 --threshold-ms 15 [--json]

No goal: a measurement (issue 22's acceptance "control quality against one
appliance seeing all traffic"); seeded, the same seeds give the same table.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from santhrottle.sim.fleet import FleetCase, fleet_compare, fleet_summary, run_fleet
from santhrottle.sim.measure import percentile
from santhrottle.sim.scenario import parse_scenario

SCENARIOS = Path(__file__).parents[2] / "sim" / "scenarios"
DEFAULT_SCENARIOS = ("paper.toml", "fleet-deep.toml")
DEFAULT_SEEDS = (1, 2, 3)
DEFAULT_THRESHOLD_MS = 15.0


def table(name: str, res: dict[str, Any]) -> str:
    """The medians of one scenario, one line per case (markdown)."""
    lines = [
        f"{name}, T = {res['threshold_s'] * 1000:g} ms, seeds {res['seeds']}, medians; "
        "best constant class per seed: "
        + ", ".join(
            f"{b['delay_class']} ({b['write_throughput_bps'] / 1e6:.3f} MB/s)"
            for b in res["best_constant"]
        ),
        "",
        "| case | p95/T | above T % | writes / best const | class changes/min "
        "| writer spread | unthrottled % per appliance | path write share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        run0 = r["runs"][0]  # seed 1's per-appliance detail
        unthr = "/".join(
            f"{sum(u.values()) / len(u):.0f}" if u else "-" for u in run0["unthrottled_pct"]
        )
        share = "/".join(f"{x:.2f}" for x in run0["path_write_share"])
        spread = sorted(x["writer_spread"] for x in r["runs"])[len(r["runs"]) // 2]
        lines.append(
            f"| {r['case']} | {r['p95_over_T_median']:.3f} | {r['above_T_pct_median']:.1f} "
            f"| {r['writes_vs_best_median']:.3f} | {r['class_changes_per_min_median']:.0f} "
            f"| {spread:.2f} | {unthr} | {share} |"
        )
    return "\n".join(lines)


# The publish lag and a leader failover (at FAILOVER_S, mid-burst), on 70/30 round-robin.
FAILOVER_S = 62.0
LAG_CASES = (
    ("lag 0 ticks", FleetCase((0.7, 0.3), "round-robin", "fleet", lag_ticks=0)),
    ("lag 1 tick (default)", FleetCase((0.7, 0.3), "round-robin", "fleet", lag_ticks=1)),
    ("lag 2 ticks", FleetCase((0.7, 0.3), "round-robin", "fleet", lag_ticks=2)),
    ("lag 5 ticks", FleetCase((0.7, 0.3), "round-robin", "fleet", lag_ticks=5)),
    ("failover, handover", FleetCase((0.7, 0.3), "round-robin", "fleet", failover_at_s=FAILOVER_S)),
    (
        "failover, new leader from 0",
        FleetCase((0.7, 0.3), "round-robin", "fleet", failover_at_s=FAILOVER_S, handover=False),
    ),
)


def lag_table(name: str, threshold_ms: float, seeds: tuple[int, ...]) -> str:
    """The fleet's publish lag and failover, medians over the seeds."""
    sc = parse_scenario((SCENARIOS / name).read_text())
    thr = threshold_ms / 1000.0
    lines = [
        f"{name}, fleet 70/30 round-robin, T = {threshold_ms:g} ms, seeds {list(seeds)}, medians",
        "",
        "| case | p95/T | above T % | writes MB/s | class changes/min "
        f"| peak {FAILOVER_S - 2:g}-{FAILOVER_S + 13:g} s / T | decisions refused |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, case in LAG_CASES:
        rows = []
        for seed in seeds:
            sc_s = replace(sc, seed=seed)
            fr = run_fleet(sc_s, case, thr)
            f = fleet_summary(sc_s, fr, None)
            s = fr.result.series
            peak = max(
                v
                for t, v in zip(s.t_s, s.read_latency_s, strict=True)
                if v is not None and FAILOVER_S - 2 <= t < FAILOVER_S + 13
            )
            rows.append((f, peak / thr))

        def med(key: str, rows: list[tuple[dict[str, Any], float]] = rows) -> float:
            return percentile([f[key] for f, _ in rows], 50)

        lines.append(
            f"| {label} | {med('p95_over_T'):.3f} | {med('above_T_pct'):.1f} "
            f"| {med('write_throughput_bps') / 1e6:.3f} | {med('class_changes_per_min'):.0f} "
            f"| {percentile([p for _, p in rows], 50):.2f} | {med('refused'):.0f} |"
        )
    return "\n".join(lines)


def bench_fleet(
    seeds: tuple[int, ...] = DEFAULT_SEEDS,
    threshold_ms: float = DEFAULT_THRESHOLD_MS,
    scenarios: tuple[str, ...] = DEFAULT_SCENARIOS,
) -> dict[str, Any]:
    results = {}
    texts = []
    for name in scenarios:
        sc = parse_scenario((SCENARIOS / name).read_text())
        res = fleet_compare(sc, threshold_ms / 1000.0, seeds)
        results[name] = res
        texts.append(table(name, res))
    texts.append(lag_table("paper.toml", threshold_ms, seeds))
    return {
        "name": "fleet simulator (issue 22), one appliance vs 2 and 4",
        "summary": "\n\n" + "\n\n".join(texts),
        "results": results,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS))
    p.add_argument("--threshold-ms", type=float, default=DEFAULT_THRESHOLD_MS)
    p.add_argument("--scenario", action="append", help="a file of sim/scenarios/")
    p.add_argument("--json", action="store_true", help="the whole result, per seed")
    a = p.parse_args()
    r = bench_fleet(tuple(a.seeds), a.threshold_ms, tuple(a.scenario or DEFAULT_SCENARIOS))
    if a.json:
        json.dump(r["results"], sys.stdout, indent=1)
        print()
    else:
        print(r["summary"].strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
