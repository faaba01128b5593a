"""Prometheus metrics of the initiator groups, per (resource, group).

What it owns
    group_families(): the status' group rows (status/views.py GroupView: one
    per grouped resource and group) as gauge families, in metrics.py's
    style (base units, node_exporter's vocabulary).  The labels are the
    resource and the group: both come from the configuration ([groups.NAME]
    and "default", the grouped resources), so their number is bounded by
    the file, never by the initiators seen.  No groups configured: no
    families at all (metrics.py calls this only when there are rows).

    A target that is not set has no series (a group without a latency
    target has no santhrottle_group_latency_target_seconds); y ("performance
    ratio") has none while the group has no target; a latency none while the
    group has no reads.

Worked example
    A row {"resource": "vg0", "group": "db", "priority": 2.0, "latency_target_s":
    0.01, "latency_s": 0.02, "y": 0.5, "pwfte": 1.0, "share": 0.56, "delay_class": 0,
    "override": {}, ...} gives
        santhrottle_group_latency_target_seconds{group="db",resource="vg0"} 0.01
        santhrottle_group_latency_seconds{group="db",resource="vg0"} 0.02
        santhrottle_group_performance_ratio{group="db",resource="vg0"} 0.5
        santhrottle_group_pwfte{group="db",resource="vg0"} 1.0
        santhrottle_group_share_ratio{group="db",resource="vg0"} 0.56
        santhrottle_group_delay_class{group="db",resource="vg0"} 0.0
        santhrottle_group_override{group="db",resource="vg0"} 0.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from santhrottle.appliance.daemon.status.views import GroupView

LABELS = ["resource", "group"]
# (metric name, its value in a status group row, help); a value of None has no sample
GROUP_GAUGES: tuple[tuple[str, Callable[[GroupView], float | None], str], ...] = (
    (
        "santhrottle_group_priority",
        lambda g: g.priority,
        "The group's priority in force (the file's, or one set with santhrottle group set)",
    ),
    (
        "santhrottle_group_latency_target_seconds",
        lambda g: g.latency_target_s,
        "The group's latency target in force: the mean read latency its initiators should see, "
        "the delay included",
    ),
    (
        "santhrottle_group_throughput_target_bytes_per_second",
        lambda g: g.throughput_target_bps,
        "The group's throughput target in force, in bytes per second",
    ),
    (
        "santhrottle_group_throughput_target_iops",
        lambda g: g.throughput_target_iops,
        "The group's throughput target in force, in IOs per second",
    ),
    (
        "santhrottle_group_latency_seconds",
        lambda g: g.latency_s,
        "Mean read latency the group's initiators saw over the last convergence, the delay "
        "santhrottle added included",
    ),
    (
        "santhrottle_group_array_latency_seconds",
        lambda g: g.io_latency_s,
        "Mean latency of the group's IOs at the array over the last convergence",
    ),
    (
        "santhrottle_group_throughput_bytes_per_second",
        lambda g: g.throughput_bps,
        "Bytes per second the group moved on the resource over the last convergence",
    ),
    (
        "santhrottle_group_iops",
        lambda g: g.iops,
        "IOs per second the group did on the resource over the last convergence",
    ),
    (
        "santhrottle_group_performance_ratio",
        lambda g: g.y,
        "y: the group's performance over its target (1 = met; the worse of its targets)",
    ),
    (
        "santhrottle_group_pwfte",
        lambda g: g.pwfte,
        "The group's priority-weighted fractional tracking error, priority x (1 - y): above 0 "
        "it is short of its target",
    ),
    (
        "santhrottle_group_share_ratio",
        lambda g: g.share,
        "The group's allocation: its share of the resource's concurrency (the shares sum to 1)",
    ),
    (
        "santhrottle_group_demand_ratio",
        lambda g: g.demand,
        "The group's demand share: the IOs it keeps outstanding over the resource's",
    ),
    (
        "santhrottle_group_delay_class",
        lambda g: g.delay_class,
        "Delay class in force for the group's initiators on the resource (0: not delayed)",
    ),
    (
        "santhrottle_group_delay_seconds",
        lambda g: g.delay_s,
        "Packet delay of that class (the ladder's delay)",
    ),
)


def group_families(rows: list[GroupView]) -> Iterator[Metric]:
    fams = [(GaugeMetricFamily(name, doc, labels=LABELS), v) for name, v, doc in GROUP_GAUGES]
    initiators = GaugeMetricFamily(
        "santhrottle_group_initiators",
        "Initiators of the group with IOs on the resource over the last convergence",
        labels=LABELS,
    )
    override = GaugeMetricFamily(
        "santhrottle_group_override",
        "1 while a target or the priority of the group is set at run time (santhrottle "
        "group set; group reset returns to the file's)",
        labels=LABELS,
    )
    overloaded = GaugeMetricFamily(
        "santhrottle_group_resource_overloaded",
        "1 while the groups' requests on the resource do not fit (not every target can be "
        "met: the arbiter evens out their PWFTE)",
        labels=["resource"],
    )
    seen: set[str] = set()
    for r in rows:
        labels = [r.resource, r.group]
        for fam, value in fams:
            v = value(r)
            if v is not None:
                fam.add_metric(labels, v)
        initiators.add_metric(labels, len(r.members))
        override.add_metric(labels, 1.0 if r.override else 0.0)
        if r.resource not in seen:
            seen.add(r.resource)
            overloaded.add_metric([r.resource], 1.0 if r.overloaded else 0.0)
    yield from (fam for fam, _v in fams)
    yield from (initiators, override, overloaded)
