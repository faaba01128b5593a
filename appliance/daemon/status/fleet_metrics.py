"""Prometheus metrics of the fleet ([fleet] in the config), from Daemon.status()'s "fleet".

What it owns
    fleet_families(): the fleet's gauges and counters in metrics.py's style.
    Labels are resources (bounded by the configuration and discovery) and
    the array; no series per other appliance's name beyond the appliances'
    count.  Without [fleet], no families at all.

Worked example
    {"array": "array1", "mode": "degraded", "engine_age_s": 2.4, "appliances": ["gw-a"],
     "leaders": {"vg0": {"appliance": "gw-a", "epoch": 17}}, "leading": ["vg0"],
     "counters": {"failures": 12, ...}, ...} gives
        santhrottle_fleet_degraded{array="array1"} 1.0
        santhrottle_fleet_engine_age_seconds{array="array1"} 2.4
        santhrottle_fleet_appliances{array="array1"} 1.0
        santhrottle_fleet_leading{resource="vg0"} 1.0
        santhrottle_fleet_epoch{resource="vg0"} 17.0
        santhrottle_fleet_engine_failures_total{array="array1"} 12.0
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# (metric name without _total, counter key in status, help)
FLEET_COUNTERS = (
    ("santhrottle_fleet_engine_cycles", "cycles", "Rounds of this appliance with the engine"),
    (
        "santhrottle_fleet_engine_failures",
        "failures",
        "Rounds the engine did not answer in time (or answered that the lease is gone)",
    ),
    (
        "santhrottle_fleet_leases_lost",
        "leases_lost",
        "Times this appliance's lease had ended when it refreshed it (it joins again)",
    ),
    (
        "santhrottle_fleet_elections_won",
        "elections_won",
        "Resources this appliance became the leader of",
    ),
    (
        "santhrottle_fleet_decisions_refused",
        "refused",
        "Decisions the engine refused: this appliance no longer led at their epoch",
    ),
    (
        "santhrottle_fleet_bad_payloads",
        "bad_payloads",
        "Other appliances' samples or decisions that did not decode (skipped), and decision "
        "members whose address no initiator has (dropped)",
    ),
    (
        "santhrottle_fleet_unbound_decisions",
        "unbound_decisions",
        "Decisions in etcd not written under the current leader's lease and epoch (skipped)",
    ),
)


def fleet_families(s: dict[str, Any]) -> Iterator[Metric]:
    arr = [s["array"]]
    degraded = GaugeMetricFamily(
        "santhrottle_fleet_degraded",
        "1 while the engine does not answer: this appliance controls alone on its own samples",
        labels=["array"],
    )
    degraded.add_metric(arr, 1.0 if s["mode"] == "degraded" else 0.0)
    age = GaugeMetricFamily(
        "santhrottle_fleet_engine_age_seconds",
        "Since the engine last answered a whole round (absent before the first)",
        labels=["array"],
    )
    if s["engine_age_s"] is not None:
        age.add_metric(arr, s["engine_age_s"])
    appliances = GaugeMetricFamily(
        "santhrottle_fleet_appliances", "Appliances registered for the array", labels=["array"]
    )
    appliances.add_metric(arr, float(len(s["appliances"])))
    leading = GaugeMetricFamily(
        "santhrottle_fleet_leading",
        "1 while this appliance leads the resource (runs its controller for the fleet)",
        labels=["resource"],
    )
    epoch = GaugeMetricFamily(
        "santhrottle_fleet_epoch", "Epoch of the resource's current leadership", labels=["resource"]
    )
    for r, lead in s["leaders"].items():
        leading.add_metric([r], 1.0 if r in s["leading"] else 0.0)
        epoch.add_metric([r], float(lead["epoch"]))
    yield from (degraded, age, appliances, leading, epoch)
    for name, k, doc in FLEET_COUNTERS:
        c = CounterMetricFamily(name, doc, labels=["array"])
        c.add_metric(arr, float(s["counters"][k]))
        yield c
