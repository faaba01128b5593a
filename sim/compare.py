"""Tenants under policies: the scenario as written beside the policies its run.compare names.

What it runs
    Every policy (sim/tenants.py: no-caps, static-pNN, rate-reservations)
    and the scenario as written ("levels" when its groups have levels,
    "reservations" when they reserve disk time), each controlled at the
    scenario's first threshold, on the same arrivals (common random numbers),
    with its tenants measured (sim/usage.py).

Figures per policy
    The first resource's 1 s read latency (p95, and the share of the time
    above the threshold: the threshold held), and per group usage.py's:
    the latency percentiles of its IOs, IOPS, level-seconds and their cost
    (sum of cap x seconds, IOPS-seconds), promotions, demotions, its share of
    the busy time while it had a stream on, and its share while every group
    had a stream on (contention: what a reservation guarantees).
    Beside no-caps, each group's p95 over no-caps' p95 ("p95_vs_no_caps");
    beside static-p90, the cost over static-p90's ("cost_vs_static_p90").

Worked example
    sim/scenarios/iotune.toml: compare = ["no-caps", "static-p90",
    "static-p99"]: four runs; volume 1's p95 is 1.17x no caps' with levels
    and 1,400x with caps at the 90th percentile (docs/levels.md).
"""

from __future__ import annotations

import math
from typing import Any

from .loop import run
from .measure import summarize
from .scenario import Scenario
from .tenants import policy
from .usage import Tenancy


def has_tenants(sc: Scenario) -> bool:
    """A scenario the comparison speaks of: bursty streams, levels or reservations."""
    return (
        any(s.arrivals is not None for s in sc.streams)
        or any(g.group.levels or g.group.utilization_target is not None for g in sc.groups)
        or bool(sc.compare)
    )


def label_of(sc: Scenario) -> str:
    if any(g.group.levels for g in sc.groups):
        return "levels"
    if any(g.group.utilization_target is not None for g in sc.groups):
        return "reservations"
    return "as written"


def compare(sc: Scenario) -> dict[str, Any]:
    """{policy: figures} (the module's doc), the scenario as written first."""
    out: dict[str, Any] = {}
    thr = sc.thresholds_s[0]
    settle = sc.default_settle_s()
    for name in (label_of(sc), *sc.compare):
        s2 = sc if name == label_of(sc) else policy(sc, name)
        ten = Tenancy(s2)
        res = run(s2, thr, tenancy=ten)
        m = summarize(s2, res)
        groups = ten.summary(settle, s2.controller.converge_s)
        contention = ten.contention_shares(settle)
        for g, row in groups.items():
            row["busy_share_contention"] = contention.get(g, math.nan)
        out[name] = {
            "threshold_s": thr,
            "read_latency_p95_s": m["read_latency_p95_s"],
            "time_above_threshold_pct": m.get("time_above_threshold_pct", math.nan),
            "span_s": sc.duration_s - settle,
            "groups": groups,
        }
    base, p90 = out.get("no-caps"), out.get("static-p90")
    for fig in out.values():
        for g, row in fig["groups"].items():
            if base is not None:
                row["p95_vs_no_caps"] = row["latency_p95_s"] / base["groups"][g]["latency_p95_s"]
            if p90 is not None:
                ref = p90["groups"][g]["level_cost"]
                row["cost_vs_static_p90"] = row["level_cost"] / ref if ref else math.nan
    return out
