"""`make bench`: performance figures, measured and compared with their goals.

Each bench prints one line: what, the figure, the goal, met or MISSED.
Goals are targets from the issues; they are reported, never asserted in
unit tests (timings depend on the machine).
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from santhrottle.controller.domain import (
    ControllerConfig,
    ReadSample,
    Resource,
    Samples,
    WriteSample,
)

try:  # a revision before decide() and state.py (bench-compare runs this file on it)
    from santhrottle.controller.decide import decide
    from santhrottle.controller.state import new_state
except ImportError:  # pragma: no cover
    from santhrottle.controller.step import new_state  # type: ignore[no-redef]
    from santhrottle.controller.step import step as decide  # type: ignore[no-redef]

MIB = 1024.0 * 1024.0


def bench_controller_decide(
    n_resources: int = 1000, n_initiators: int = 10000, plant: str = "open"
) -> dict:
    """One decide() with 1,000 resources and 10,000 initiators (goal <= 5 ms on one core).

    Every initiator writes heavily to one resource, one in ten to a second
    one, so all are members; every resource has reads every tick. Measured
    separately: plain ticks, and the tick that is also the 1 s convergence
    with 11,000 write samples.

    plant "open" (the worst case): each tick's latency is drawn between 0.4
    and 1.4 T whatever the delay, with no hysteresis, so classes change
    every tick and climb (an open loop never settles).
    plant "closed": each resource's latency answers its delay (C + S / (1 +
    d / D), C 2-6 ms, S 5-30 ms, D 5-30 ms, T 10 ms, +-35 % noise per tick),
    with the product's defaults: classes settle, and the noise moves them.
    """
    rng = random.Random(7)
    cfg = ControllerConfig(class_hysteresis=0.0) if plant == "open" else ControllerConfig()
    names = [f"vg{i}" for i in range(n_resources)]
    st = new_state(cfg, [Resource(n, 0.010) for n in names])
    pairs = [
        (f"vg{i % n_resources}", f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
        for i in range(n_initiators)
    ]
    pairs += [(f"vg{rng.randrange(n_resources)}", ini) for _, ini in pairs[::10]]
    writes = [WriteSample(r, i, 20 * MIB) for r, i in pairs]
    prng = random.Random(11)  # plant "closed": (C, S, D) per resource, in s
    lines = [
        (prng.uniform(0.002, 0.006), prng.uniform(0.005, 0.030), prng.uniform(0.005, 0.030))
        for _ in names
    ]

    def latency(i: int) -> float:
        if plant == "open":
            return 0.004 + 0.010 * rng.random()
        c, s, d0 = lines[i]
        d = cfg.ladder.delay_s(st.resources[names[i]].delay_class)
        return (c + s / (1.0 + d / d0)) * (0.65 + 0.7 * rng.random())

    t = 0.0
    st, _ = decide(st, Samples(writes=writes), t)
    tick_ms: list[float] = []
    conv_ms: list[float] = []
    changed: list[int] = []
    for k in range(1, 201):
        t = round(k * cfg.tick_s, 6)
        reads = [ReadSample(names[i], 6, latency(i), 20 * MIB) for i in range(n_resources)]
        conv = k % 10 == 0
        samples = Samples(reads, writes if conv else ())
        t0 = time.perf_counter()
        st, d = decide(st, samples, t)
        dt_ms = (time.perf_counter() - t0) * 1000.0
        (conv_ms if conv else tick_ms).append(dt_ms)
        changed.append(len(d.initiator_classes))
    members = sum(len(m) for m in st.write_sets.members.values())
    tick = statistics.median(tick_ms)
    conv = statistics.median(conv_ms)
    return {
        "name": f"controller decide(), 1,000 resources x 10,000 initiators, {plant} loop",
        "met": tick <= 5.0 and conv <= 5.0,
        "summary": f"tick {tick:.2f} ms median ({sorted(tick_ms)[int(0.99 * len(tick_ms))]:.2f} "
        f"p99), tick with the 1 s convergence {conv:.2f} ms median ({max(conv_ms):.2f} max); "
        f"{members} set members, {statistics.median(changed):.0f} initiator class changes "
        "per tick",
        "members": members,
        "tick_ms_median": statistics.median(tick_ms),
        "tick_ms_p99": sorted(tick_ms)[int(0.99 * len(tick_ms))],
        "converge_tick_ms_median": statistics.median(conv_ms),
        "converge_tick_ms_max": max(conv_ms),
        "initiator_class_changes_per_tick_median": statistics.median(changed),
        "goal_ms": 5.0,
    }


def _lazy(module: str, function: str) -> Callable[[], dict]:
    """A bench of another module, imported when it runs: a bench that needs what a
    revision lacks (bench-compare runs this file against older code) fails alone."""

    def run() -> dict:
        return getattr(importlib.import_module(module), function)()  # type: ignore[no-any-return]

    return run


BENCHES: dict[str, Callable[[], dict]] = {
    "controller": bench_controller_decide,
    "controller-closed": lambda: bench_controller_decide(plant="closed"),
    "controller-compiled": _lazy("bench_compiled", "bench_compiled"),
    "controller-deb": _lazy("bench_compiled", "bench_deb"),
    "sensing": _lazy("bench_sensing", "bench_sensing"),
    "datapath": _lazy("bench_datapath", "bench_datapath"),
    "drift": _lazy("bench_drift", "bench_drift"),
    "ladder": _lazy("bench_ladder", "bench_ladder"),
    "wire": _lazy("bench_wire", "bench_wire"),
    "groups": _lazy("bench_groups", "bench_groups"),
    "fleet": _lazy("bench_fleet", "bench_fleet"),
    "simulator": _lazy("bench_sim", "bench_sim"),
    "tenants": _lazy("bench_tenants", "bench_tenants"),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help=f"benches to run (default all: {', '.join(BENCHES)})")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    unknown = sorted(set(args.names) - set(BENCHES))
    if unknown:
        p.error(f"unknown bench {unknown[0]!r}; have {', '.join(BENCHES)}")
    results = [BENCHES[n]() for n in (args.names or BENCHES)]
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()
        return 0
    for r in results:
        if r.get("goal"):  # a goal that is not a time
            print(f"{r['name']}: {r['summary']}; goal {r['goal']}: "
                  f"{'met' if r['met'] else 'MISSED'}")  # fmt: skip
            continue
        if r.get("goal_ms") is None:  # a measurement without a goal
            print(f"{r['name']}: {r['summary']}")
            continue
        print(
            f"{r['name']}: {r['summary']}; goal <= {r['goal_ms']:g} ms: "
            f"{'met' if r['met'] else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
