"""The tenants' tables: `status`'s levels and utilization, `simulate`'s policies side by side.

status (the daemon's LevelViews, status/views.py): one line per Levels of a
group: its level, cap, the rate it moved at the last convergence, whether
its resources had headroom, the class its cap asks, promotions and demotions.
A resource's utilization is shown as a percentage, "!" when it is over its
utilization_threshold (it counts as over its latency threshold).

simulate (sim/compare.py's figures):

One block per policy (the scenario as written first: "levels" or
"reservations", then its run.compare), one line per group: the latency
percentiles of its IOs (arrival to completion: its wait at the initiator,
the delay, the device), IOPS served, what its levels billed per second
(cap x seconds / the span after the settle time), promotions and demotions,
its share of the busy time while it had a stream on and while every group
had one, and the ratios to no caps' p95 and to static-p90's cost when those
policies ran.

Worked example
    levels: read p95 0.81 ms (threshold 2.00 ms, 0.0 % above)
      group      p50 ms  p95 ms  p99 ms    IOPS  cost/s  up  down  busy  cont  p95/none  cost/p90
      vol1         0.66    1.08    1.23   905.5  2087.2  45    46  0.30  0.30      1.17      1.11
"""

from __future__ import annotations

import math
from typing import Any

from santhrottle.appliance.daemon.status.views import LevelView
from santhrottle.appliance.units import fmt_ms


def _num(x: float, fmt: str) -> str:
    """x in fmt ("7.2f"), or "-" as wide for a figure that is not there (NaN)."""
    if x is None or math.isnan(x):
        return "-".rjust(int(fmt.split(".")[0] or 0))
    return format(x, fmt)


def print_tenants(tenants: dict[str, Any]) -> None:
    for name, fig in tenants.items():
        thr = fig["threshold_s"]
        print(
            f"{name}: read p95 {fig['read_latency_p95_s'] * 1e3:.2f} ms (threshold "
            f"{thr * 1e3:.2f} ms, {_num(fig['time_above_threshold_pct'], '.1f')} % above)"
        )
        print(
            f"  {'group':<10} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'IOPS':>7} "
            f"{'cost/s':>8} {'up':>4} {'down':>5} {'busy':>5} {'cont':>5} "
            f"{'p95/none':>9} {'cost/p90':>9}"
        )
        span = fig["span_s"]
        for g, r in fig["groups"].items():
            print(
                f"  {g:<10} {_num(r['latency_p50_s'] * 1e3, '7.2f')} "
                f"{_num(r['latency_p95_s'] * 1e3, '7.2f')} "
                f"{_num(r['latency_p99_s'] * 1e3, '7.2f')} {_num(r['iops'], '7.1f')} "
                f"{r['level_cost'] / span:>8.1f} {r['promotions']:>4} {r['demotions']:>5} "
                f"{_num(r['busy_share_on'], '5.2f')} {_num(r['busy_share_contention'], '5.2f')} "
                f"{_num(r.get('p95_vs_no_caps', math.nan), '9.2f')} "
                f"{_num(r.get('cost_vs_static_p90', math.nan), '9.2f')}"
            )
    print(
        "  latency: each IO's, from its arrival (its wait at the initiator included); "
        "cost/s: level cap x seconds per second (IOPS); busy: its share of the busy time "
        "while on; cont: while every group is on; p95/none: over no caps'; cost/p90: over "
        "static-p90's"
    )


def fmt_util(u: float | None, saturated: bool) -> str:
    """0.62 -> "62%"; over its utilization_threshold: "99%!"; None: "-"."""
    return "-" if u is None else f"{u * 100:.0f}%" + ("!" if saturated else "")


def _rate(measure: str, x: float) -> str:
    return f"{x:.0f}" if measure.endswith("iops") else f"{x / 1e6:.1f}MB/s"


def print_levels(rows: list[LevelView]) -> None:
    """`santhrottle status`'s groups with levels."""
    print(
        f"{'GROUP':<16} {'LEVELS':<16} {'LEVEL':>5} {'CAP':>10} {'RATE':>10} {'ROOM':>4} "
        f"{'CLASS':>5} {'DELAY':>8} {'UP':>5} {'DOWN':>5}"
    )
    for r in rows:
        print(
            f"{r.group:<16} {r.levels:<16} {r.level:>5} {_rate(r.levels, r.caps[r.level]):>10} "
            f"{_rate(r.levels, r.rate):>10} {'yes' if r.headroom else 'no':>4} "
            f"{r.delay_class:>5} {fmt_ms(r.delay_s):>8} {r.promotions:>5} {r.demotions:>5}"
        )
