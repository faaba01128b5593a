"""Issue 22's fleet simulator as a bench: N appliances on the paths of one array.

For each scenario (controller/scenarios/paper.toml, fleet-deep.toml) and seed,
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
from pathlib import Path
from typing import Any

from santhrottle.controller.fleetsim import fleet_compare
from santhrottle.controller.scenario import parse_scenario

SCENARIOS = Path(__file__).parents[2] / "controller" / "scenarios"
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
    return {
        "name": "fleet simulator (issue 22), one appliance vs 2 and 4",
        "summary": "\n\n" + "\n\n".join(texts),
        "results": results,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS))
    p.add_argument("--threshold-ms", type=float, default=DEFAULT_THRESHOLD_MS)
    p.add_argument("--scenario", action="append", help="a file of controller/scenarios/")
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
