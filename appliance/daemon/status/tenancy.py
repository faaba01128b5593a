"""What the status and the metrics show of levels, utilization and the meter (docs/levels.md).

What it owns
    level_rows(ctl): one LevelView per Levels of every group with levels, from
    the controller's state (controller/levels.py), for `santhrottle status`.
    tenancy_families(view): the status' levels and resources' utilization as
    gauge families; MeterCollector: the meter's lifetime totals
    (core/meter.py) as counters, read under the daemon's lock at scrape
    time. Labels come from the configuration (groups, their Levels, the caps,
    the ladder's classes): bounded by the file, never by the initiators seen.

Worked example
    gold with iops_levels [600, 1200] at level 1, 1,100 IOPS, vg0 busy 0.62:
        santhrottle_group_level{group="gold",levels="iops"} 1.0
        santhrottle_group_level_cap{group="gold",levels="iops"} 1200.0
        santhrottle_group_rate{group="gold",levels="iops"} 1100.0
        santhrottle_resource_utilization_ratio{resource="vg0"} 0.62
    and, after 3 s at 600 IOPS and 1 s at 1,200:
        santhrottle_group_level_seconds_total{group="gold",levels="iops",level="600"} 3.0
        santhrottle_group_level_seconds_total{group="gold",levels="iops",level="1200"} 1.0
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from santhrottle.appliance.daemon.core.meter import Usage
from santhrottle.appliance.daemon.core.metering import Metering
from santhrottle.appliance.daemon.status.views import LevelView, StatusView
from santhrottle.controller.state import ControllerState


def level_rows(ctl: ControllerState) -> list[LevelView]:
    """Every Levels of every group with levels (a group not seen yet: at level 0)."""
    rows = []
    for g, specs in sorted(ctl.levels.specs.items()):
        ls = ctl.levels.groups.get(g)
        for i, spec in enumerate(specs):
            lad = None if ls is None else ls.ladders[i]
            rows.append(
                LevelView(
                    group=g,
                    levels=spec.name,
                    level=0 if lad is None else lad.level,
                    caps=list(spec.caps),
                    rate=0.0 if lad is None else lad.rate,
                    delay_s=0.0 if lad is None else lad.delay_s,
                    delay_class=0 if ls is None else ls.delay_class,
                    target_class=0 if ls is None else ls.target_class,
                    headroom=True if ls is None else ls.headroom,
                    promotions=0 if lad is None else lad.promotions,
                    demotions=0 if lad is None else lad.demotions,
                )
            )
    return rows


def tenancy_families(view: StatusView) -> Iterator[Metric]:
    util = GaugeMetricFamily(
        "santhrottle_resource_utilization_ratio",
        "The share of the last convergence the resource's device had IO in flight "
        "(diskstats' io_ticks, iostat's %util; on a bridge, a volume with a command in "
        "flight); of several devices, the busiest",
        labels=["resource"],
    )
    sat = GaugeMetricFamily(
        "santhrottle_resource_saturated",
        "1 while the resource's utilization is over its utilization_threshold: it counts "
        "as over its latency threshold",
        labels=["resource"],
    )
    for r in view.resources:
        if r.utilization is not None:
            util.add_metric([r.resource], r.utilization)
            sat.add_metric([r.resource], 1.0 if r.saturated else 0.0)
    yield util
    yield sat
    if not view.levels:
        return
    names = ["group", "levels"]
    level = GaugeMetricFamily(
        "santhrottle_group_level", "The group's level (0: the baseline)", labels=names
    )
    cap = GaugeMetricFamily(
        "santhrottle_group_level_cap",
        "The cap of the group's level, per second: IOs (iops levels) or bytes",
        labels=names,
    )
    rate = GaugeMetricFamily(
        "santhrottle_group_rate",
        "What the group moved at the last convergence, in its levels' unit, per second",
        labels=names,
    )
    for lv in view.levels:
        key = [lv.group, lv.levels]
        level.add_metric(key, float(lv.level))
        cap.add_metric(key, lv.caps[lv.level])
        rate.add_metric(key, lv.rate)
    yield from (level, cap, rate)


class MeterCollector:
    """The meter's lifetime totals as counters (they survive restarts: the meter's
    store, daemon/core/meterstore.py), read under the daemon's lock."""

    def __init__(self, metering: Metering, lock: Any) -> None:
        self.metering, self.lock = metering, lock

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            totals = {g: _copy(u) for g, u in self.metering.meter.peek()[0].items()}
        seconds = CounterMetricFamily(
            "santhrottle_group_level_seconds",
            "Seconds the group spent at each level (level: the level's cap, per second), "
            "what it is billed for (santhrottle meter)",
            labels=["group", "levels", "level"],
        )
        ios = CounterMetricFamily(
            "santhrottle_group_ios", "IOs the group's initiators completed", labels=["group"]
        )
        nbytes = CounterMetricFamily(
            "santhrottle_group_bytes", "Bytes the group's initiators moved", labels=["group"]
        )
        delayed = CounterMetricFamily(
            "santhrottle_group_delay_seconds",
            "Initiator-seconds the group's initiators were delayed at each class",
            labels=["group", "class"],
        )
        for g, u in sorted(totals.items()):
            for name, caps in sorted(u.level_s.items()):
                for c, s in sorted(caps.items()):
                    seconds.add_metric([g, name, c], s)
            ios.add_metric([g], u.ios)
            nbytes.add_metric([g], u.bytes)
            for k, s in sorted(u.delay_s.items()):
                delayed.add_metric([g, str(k)], s)
        yield from (seconds, ios, nbytes, delayed)


def _copy(u: Usage) -> Usage:
    c = Usage()
    c.add(u)
    return c
