"""Prometheus metrics, read from the daemon's state at scrape time.

A custom collector on an injected CollectorRegistry (no global registry,
no values cached between scrapes); names in base units with
node_exporter's vocabulary. The exporter listens on 127.0.0.1 by default.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry


class StatusSource(Protocol):
    lock: Any

    def status(self) -> dict[str, Any]: ...


class DaemonCollector(Collector):
    def __init__(self, daemon: StatusSource) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Metric]:
        with self.daemon.lock:
            st = self.daemon.status()
        lat = GaugeMetricFamily(
            "santhrottle_resource_read_latency_seconds",
            "Read latency of the resource (EWMA the controller uses; the last interval's mean "
            "for resources only observed)",
            labels=["resource"],
        )
        thr = GaugeMetricFamily(
            "santhrottle_resource_threshold_seconds",
            "Read-latency threshold of the resource",
            labels=["resource"],
        )
        cls = GaugeMetricFamily(
            "santhrottle_resource_delay_class",
            "Delay class the resource's PID asks for its write-heavy initiators",
            labels=["resource"],
        )
        members = GaugeMetricFamily(
            "santhrottle_resource_write_heavy_initiators",
            "Initiators in the resource's write-heavy set",
            labels=["resource"],
        )
        for r in st["resources"]:
            name = r["resource"]
            v = r["read_latency_ewma_s"]
            if v is None:
                v = r["read_latency_s"]
            if v is not None:
                lat.add_metric([name], v)
            if r["threshold_s"] is not None:
                thr.add_metric([name], r["threshold_s"])
            cls.add_metric([name], r["delay_class"])
            members.add_metric([name], len(r["members"]))
        wr = GaugeMetricFamily(
            "santhrottle_initiator_write_bytes_per_second",
            "Smoothed write rate of the initiator on the resource",
            labels=["initiator", "resource"],
        )
        delay = GaugeMetricFamily(
            "santhrottle_initiator_delay_seconds",
            "Packet delay applied to the initiator",
            labels=["initiator", "mode"],
        )
        for i in st["initiators"]:
            for res, bps in i["write_bytes_per_second"].items():
                if bps is not None:
                    wr.add_metric([i["initiator"], res], bps)
            delay.add_metric([i["initiator"], i["mode"]], i["delay_s"])
        c = st["counters"]
        yield from (lat, thr, cls, members, wr, delay)
        paused = GaugeMetricFamily("santhrottle_paused", "1 while throttling is paused")
        paused.add_metric([], 1.0 if st["paused"] else 0.0)
        yield paused
        for name, key, doc in (
            ("santhrottle_ticks", "ticks", "Controller ticks run"),
            ("santhrottle_tick_overruns", "tick_overruns", "Tick deadlines missed (late ticks)"),
            ("santhrottle_convergences", "converges", "Set convergences (discovery) finished"),
            ("santhrottle_sensor_errors", "sensor_errors", "Failed sensor reads"),
            ("santhrottle_actuator_errors", "actuator_errors", "Failed kernel updates"),
            ("santhrottle_reloads", "reloads", "Configuration reloads"),
            ("santhrottle_reload_failures", "reload_failures", "Refused reloads"),
            ("santhrottle_tick_seconds", "tick_seconds_sum", "Time spent in ticks"),
            (
                "santhrottle_glided_descents",
                "glided_descents",
                "Initiators whose delay went down through a glide leaf (kept in order)",
            ),
            (
                "santhrottle_unordered_descents",
                "unordered_descents",
                "Initiators whose delay went down without a free glide leaf (may reorder)",
            ),
        ):
            m = CounterMetricFamily(name, doc)
            m.add_metric([], c[key])
            yield m


def registry_for(daemon: StatusSource) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DaemonCollector(daemon))
    return reg
