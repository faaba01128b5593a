"""Prometheus metrics of the wire sensor (bridge mode), read from the status' WireView.

What it owns
    wire_families(): the wire sensor's counters since its start (WIRE_COUNTERS:
    what it saw, matched and lost, and its walks' desyncs, resyncs, retracted
    headers and gaps), whether it captures, the connection directions by sync
    state (santhrottle_wire_directions{state}), the seconds they spent out of
    sync, and the resources holding their class because their connections
    are mostly out of sync (santhrottle_wire_resource_held{resource}: one
    series per configured resource that holds, none otherwise).  metrics.py
    calls it in bridge mode only.

Worked example
    A WireView with two directions in sync, one out of sync for 1.5 s and the
    resource "array1" held gives santhrottle_wire_directions{state="in sync"} 2,
    {state="out of sync"} 1, santhrottle_wire_out_of_sync_seconds 1.5 and
    santhrottle_wire_resource_held{resource="array1"} 1.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from santhrottle.appliance.daemon.status.views import WireView

# Bridge mode: (metric name without _total, the wire sensor's counter, help)
WIRE_COUNTERS = (
    ("santhrottle_wire_commands", "commands", "Storage commands seen on the wire"),
    ("santhrottle_wire_completions", "completions", "Commands matched to their completion"),
    (
        "santhrottle_wire_unmatched_completions",
        "unmatched",
        "Completions of commands not seen (sent before the capture started, or lost)",
    ),
    (
        "santhrottle_wire_replaced_commands",
        "replaced",
        "Commands whose tag was reused before their completion was seen",
    ),
    ("santhrottle_wire_aged_commands", "aged", "Commands never completed, aged out after 60 s"),
    ("santhrottle_wire_connections", "connections", "Storage connections seen"),
    ("santhrottle_wire_frames", "capture_frames", "Frames read from the array-side port"),
    (
        "santhrottle_wire_truncated_frames",
        "capture_truncated",
        "Frames longer than the capture's snap length (the stream resynchronises)",
    ),
    (
        "santhrottle_wire_dropped_frames",
        "capture_kernel_drops",
        "Frames the kernel dropped because the capture ring was full",
    ),
    ("santhrottle_wire_desyncs", "walk_desyncs", "Walks found off: no header where one had to be"),
    ("santhrottle_wire_resyncs", "walk_resyncs", "Walks that found their place again"),
    (
        "santhrottle_wire_retracted_headers",
        "walk_retracted",
        "Headers a resync took and their successor did not confirm",
    ),
    ("santhrottle_wire_gaps", "walk_gaps", "Bytes of a stream the capture lost, in stretches"),
    (
        "santhrottle_wire_evicted_directions",
        "kernel_flows_evicted",
        "Connection directions the in-kernel sensor's full flow map dropped to make room "
        "(at least): each is read out of sync until found again",
    ),
)
SYNC_STATES = ("in sync", "provisional", "out of sync", "not measurable")


def wire_families(wire: WireView) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "santhrottle_wire_capturing", "1 while the wire sensor reads the array-side port"
    )
    up.add_metric([], 1.0 if wire.capturing else 0.0)
    yield up
    for name, key, doc in WIRE_COUNTERS:
        m = CounterMetricFamily(name, doc)
        m.add_metric([], wire.counters.get(key, 0))  # 0 for a count this sensor has not
        yield m
    ways = GaugeMetricFamily(
        "santhrottle_wire_directions",
        "Storage connection directions by the wire sensor's sync state",
        labels=["state"],
    )
    for state in SYNC_STATES:
        ways.add_metric([state], wire.directions.get(state, 0))
    yield ways
    out = GaugeMetricFamily(
        "santhrottle_wire_out_of_sync_seconds",
        "Seconds the live connection directions spent out of sync, summed",
    )
    out.add_metric([], wire.out_of_sync_s)
    yield out
    held = GaugeMetricFamily(
        "santhrottle_wire_resource_held",
        "1 while a resource holds its class: its connections are mostly out of sync",
        labels=["resource"],
    )
    for name in wire.held:
        held.add_metric([name], 1.0)
    yield held
