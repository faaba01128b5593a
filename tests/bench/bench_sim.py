"""The simulator's runtime on the paper scenario (`make bench`'s `simulator`).

Method (run by tests/bench/run.py, or alone: `.venv/bin/python tests/bench/bench_sim.py
[--json]`): the paper scenario of the tree that imports (its own scenario file) is
simulated as `santhrottle-simulate --no-baseline` does it: one uncontrolled run and one
controlled run per threshold (10, 15, 20 ms), 130 s of plant each. The wall time of the
four runs is taken REPEATS times in one process; the figure is their median, with the
fastest and the slowest. One core; the time depends on the host, so compare side by
side (`make bench-compare REV=... ARGS=simulator`).

Either layout of the simulator is found (sim/, or controller/ before it left), so the
same bench measures a revision from before the move (compare.py runs this checkout's
bench there when the revision's run.py has none).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPEATS = 5


def _simulator() -> tuple[Any, Any, Path]:
    """(simulate, parse_scenario, the scenarios' folder) of the tree that imports."""
    import santhrottle.controller as ctl

    if (Path(ctl.__file__).parent / "sim.py").exists():  # the simulator in controller/
        sim = importlib.import_module("santhrottle.controller.sim")
        scen = importlib.import_module("santhrottle.controller.scenario")
    else:
        sim = importlib.import_module("santhrottle.sim.experiment")
        scen = importlib.import_module("santhrottle.sim.scenario")
    return sim.simulate, scen.parse_scenario, Path(scen.__file__).parent / "scenarios"


def bench_sim(repeats: int = REPEATS) -> dict[str, Any]:
    simulate, parse, scenarios = _simulator()
    sc = parse((scenarios / "paper.toml").read_text())
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = simulate(sc, baseline=False)
        walls.append(time.perf_counter() - t0)
    p95 = [r["read_latency_p95_s"] * 1000.0 for r in out["controlled"]]
    med = statistics.median(walls)
    return {
        "name": "simulator, the paper scenario (uncontrolled and 3 thresholds, 4 x 130 s)",
        "summary": f"{med:.2f} s median [{min(walls):.2f}..{max(walls):.2f}] over {repeats} "
        f"repeats; controlled p95 {', '.join(f'{x:.2f}' for x in p95)} ms",
        "paper_s_median": med,
        "paper_s": walls,
        "goal_ms": None,
        "met": True,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=REPEATS)
    args = ap.parse_args()
    r = bench_sim(args.repeats)
    print(json.dumps(r) if args.json else f"{r['name']}: {r['summary']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
