"""The groups' arbiter for 1,000 groups (goal <= 5 ms per interval).

Two figures, medians of 50 intervals with their p90:
  arbitrate()  Maestro's arbiter alone (controller/maestro.py): 1,000 claims in
               overload (every group short, random priorities, slopes and
               shares), the linear program by water-filling;
  interval()   the whole interval on one resource (controller/groups.py):
               10,000 IoSamples (1,000 groups x 10 initiators) aggregated,
               models re-fitted, the arbiter, shares to classes. It runs once
               per convergence (1 s), not per tick; reported beside the goal.
"""

from __future__ import annotations

import random
import statistics
import time

from santhrottle.controller.domain import IoSample
from santhrottle.controller.groups import Group, GroupsState, interval, regroup
from santhrottle.controller.ladder import Ladder
from santhrottle.controller.maestro import Claim, arbitrate

N_GROUPS = 1000
INITIATORS_PER_GROUP = 10
GOAL_MS = 5.0


def _median_p90(xs: list[float]) -> tuple[float, float]:
    return statistics.median(xs), sorted(xs)[int(0.9 * len(xs))]


def bench_groups(reps: int = 50) -> dict:
    rng = random.Random(20)
    raw = [rng.uniform(0.1, 1.0) for _ in range(N_GROUPS)]
    tot = sum(raw)
    arb_ms: list[float] = []
    overloaded = 0
    for _ in range(reps):
        claims = [
            Claim(rng.choice([1.0, 2.0, 4.0]), rng.uniform(0.3, 0.95), r / tot, rng.uniform(0.5, 3))
            for r in raw
        ]
        t0 = time.perf_counter()
        _, over = arbitrate(claims)
        arb_ms.append((time.perf_counter() - t0) * 1000.0)
        overloaded += over

    st = GroupsState()
    groups = [
        Group(f"g{i}", priority=rng.choice([1.0, 2.0]), latency_target_s=0.010)
        for i in range(N_GROUPS)
    ]
    member = {
        f"10.{i >> 8 & 255}.{i & 255}.{j}": f"g{i}"
        for i in range(N_GROUPS)
        for j in range(INITIATORS_PER_GROUP)
    }
    regroup(st, groups, member)
    ladder = Ladder()
    ivl_ms: list[float] = []
    for _ in range(reps):
        lat = rng.uniform(0.008, 0.02)
        samples = [
            IoSample("vg", ini, 100.0, 4e5, 100.0, lat * rng.uniform(0.8, 1.2), lat)
            for ini in member
        ]
        t0 = time.perf_counter()
        interval(st, "vg", samples, 1.0, ladder, lat)
        ivl_ms.append((time.perf_counter() - t0) * 1000.0)
    a_med, a_p90 = _median_p90(arb_ms)
    i_med, i_p90 = _median_p90(ivl_ms)
    return {
        "name": "groups' arbiter, 1,000 groups",
        "met": a_med <= GOAL_MS,
        "summary": f"arbitrate {a_med:.2f} ms median ({a_p90:.2f} p90, {overloaded}/{reps} "
        f"in overload); the whole interval (1,000 models, 10,000 initiators' samples, "
        f"once a second) {i_med:.2f} ms median ({i_p90:.2f} p90)",
        "arbitrate_ms_median": a_med,
        "arbitrate_ms_p90": a_p90,
        "interval_ms_median": i_med,
        "interval_ms_p90": i_p90,
        "goal_ms": GOAL_MS,
    }
