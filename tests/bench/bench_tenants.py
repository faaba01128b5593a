"""1,000 groups with levels and disk-time reservations (goal <= 5 ms of arbiter time).

Three figures, medians of 50 intervals with their p90:
  arbitrate()   Maestro's arbiter alone (controller/maestro.py) on the claims of
                1,000 groups whose targets are disk-time reservations summing to 100 %
                (each y from disktime.reservation_y, the device saturated), overload;
  interval()    the whole interval on one resource (controller/groups.py) for those
                groups: 10,000 IoSamples aggregated, busy shares, models, the arbiter,
                shares to classes;
  levels        controller/levels.py's interval for the same 1,000 groups, each with
                IOPS levels: 10,000 IoSamples folded, a level and a cap's delay each.
The last two run once per convergence (1 s), beside the goal.
"""

from __future__ import annotations

import random
import time

from bench_groups import GOAL_MS, INITIATORS_PER_GROUP, N_GROUPS, _median_p90

from santhrottle.controller.disktime import reservation_y
from santhrottle.controller.domain import IoSample
from santhrottle.controller.groups import Group, GroupsState, interval, regroup
from santhrottle.controller.ladder import Ladder
from santhrottle.controller.levels import Levels, LevelsState
from santhrottle.controller.levels import interval as levels_interval
from santhrottle.controller.maestro import Claim, arbitrate


def bench_tenants(reps: int = 50) -> dict:
    rng = random.Random(49)
    target = 1.0 / N_GROUPS  # the reservations sum to 100 %
    arb_ms: list[float] = []
    overloaded = 0
    for _ in range(reps):
        raw = [rng.uniform(0.2, 2.0) for _ in range(N_GROUPS)]
        tot = sum(raw)
        claims = []
        for r in raw:
            share = r / tot
            y = reservation_y(target, share * rng.uniform(0.8, 1.2), True, 1.0, share, share)
            claims.append(Claim(rng.choice([1.0, 2.0]), y, share, rng.uniform(0.5, 3.0)))
        t0 = time.perf_counter()
        _, over = arbitrate(claims)
        arb_ms.append((time.perf_counter() - t0) * 1000.0)
        overloaded += over

    specs = [Group(f"g{i}", utilization_target=target) for i in range(N_GROUPS)]
    member = {
        f"10.{i >> 8 & 255}.{i & 255}.{j}": f"g{i}"
        for i in range(N_GROUPS)
        for j in range(INITIATORS_PER_GROUP)
    }
    st = GroupsState()
    regroup(st, specs, member)
    lv = LevelsState()
    lv.configure({f"g{i}": (Levels((100.0, 200.0, 400.0, 800.0)),) for i in range(N_GROUPS)})
    ladder = Ladder()
    ivl_ms: list[float] = []
    lvl_ms: list[float] = []
    for _ in range(reps):
        lat = rng.uniform(0.002, 0.02)
        samples = [
            IoSample("vg", ini, r, r * 4096, r * 0.7, lat, lat * rng.uniform(0.5, 2.0))
            for ini in member
            for r in (rng.uniform(5.0, 100.0),)
        ]
        t0 = time.perf_counter()
        interval(st, "vg", samples, 1.0, ladder, lat, 0.97)
        ivl_ms.append((time.perf_counter() - t0) * 1000.0)
        t0 = time.perf_counter()
        levels_interval(lv, member, samples, 1.0, ladder, lambda r: True, lambda i: 0.001)
        lvl_ms.append((time.perf_counter() - t0) * 1000.0)
    a_med, a_p90 = _median_p90(arb_ms)
    i_med, i_p90 = _median_p90(ivl_ms)
    l_med, l_p90 = _median_p90(lvl_ms)
    return {
        "name": "1,000 groups with disk-time reservations and levels",
        "met": a_med <= GOAL_MS,
        "summary": f"arbitrate {a_med:.2f} ms median ({a_p90:.2f} p90, {overloaded}/{reps} "
        f"in overload); the whole interval with reservations {i_med:.2f} ms median "
        f"({i_p90:.2f} p90); the levels' interval {l_med:.2f} ms median ({l_p90:.2f} p90), "
        "each once a second",
        "arbitrate_ms_median": a_med,
        "arbitrate_ms_p90": a_p90,
        "interval_ms_median": i_med,
        "interval_ms_p90": i_p90,
        "levels_ms_median": l_med,
        "levels_ms_p90": l_p90,
        "goal_ms": GOAL_MS,
    }
