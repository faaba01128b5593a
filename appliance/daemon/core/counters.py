"""The daemon's counters: events, the tick duration histogram, raw I/O totals.

What it owns
    Counters: the daemon's event counts (ticks, late ticks, errors, reloads),
    each tick's duration in fixed buckets (TICK_DURATION_BUCKETS_S), and per
    resource the raw totals node_exporter would keep for a disk: reads
    completed, read time (reads x their mean latency, summed per sample, like
    node_disk_read_time_seconds_total) and bytes written (the sample's write
    rate x the tick interval it covers).  WrittenBytes: bytes written per
    (initiator, resource), the write rate of each convergence's samples x the
    convergence period, kept by the convergence worker behind its own lock so
    that the tick never waits for it.

    Everything is accumulated from the samples the daemon already gets and
    from its configured periods, never from a clock: in virtual time
    (tests/unit/test_metrics.py) the totals are exact.  Not thread-safe except
    WrittenBytes: Counters is changed and read under the daemon's lock.

The interval of a tick's sample
    The sensors' rates are over the time since their previous read.  A tick
    whose deadline was late by k periods (counted in tick_overruns before it
    runs) covers 1 + k periods; a tick whose read failed covers none and the
    next one covers both.  So written bytes = write rate x tick period x the
    periods since the last successful read.

Worked example
    With a 100 ms tick: record_tick(0.004) puts one tick into the 5 ms bucket
    (0.004 <= 0.005) and adds 0.004 to tick_seconds_sum;
    add_reads([ReadSample("vg0", 6, 0.030, 20e6)], 0.1) after an on-time tick
    adds 6 reads, 6 x 0.030 = 0.18 s of read time and 20e6 x 0.1 = 2e6 bytes
    written to vg0's totals.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from santhrottle.controller.domain import ReadSample, WriteSample

# Upper bounds of the tick duration histogram, for a 100 ms tick whose work
# takes 1-50 ms: fine steps there, then the tick itself and the overruns.
TICK_DURATION_BUCKETS_S = (
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.25,
    1.0,
)


@dataclass(slots=True)
class ResourceTotals:
    """Raw counters of one resource since the daemon started."""

    reads_completed: int = 0
    read_time_s: float = 0.0
    written_bytes: float = 0.0


@dataclass
class Counters:
    ticks: int = 0
    tick_overruns: int = 0
    converges: int = 0
    sensor_errors: int = 0
    actuator_errors: int = 0
    reloads: int = 0
    reload_failures: int = 0
    state_save_errors: int = 0
    repairs: int = 0  # kernel objects found missing or changed and rebuilt (core/drift.py)
    tick_seconds_sum: float = 0.0
    # ticks per bucket of TICK_DURATION_BUCKETS_S (not cumulative), +Inf last
    tick_duration_counts: list[int] = field(
        default_factory=lambda: [0] * (len(TICK_DURATION_BUCKETS_S) + 1)
    )
    resources: dict[str, ResourceTotals] = field(default_factory=dict)
    # tick periods since the last successful read; late ticks already counted in them
    _periods_unsampled: int = field(default=0, init=False, repr=False)
    _overruns_seen: int = field(default=0, init=False, repr=False)

    def record_tick(self, duration_s: float) -> None:
        """One tick took duration_s (its work, not the sleep before it)."""
        self.ticks += 1
        self.tick_seconds_sum += duration_s
        self.tick_duration_counts[bisect_left(TICK_DURATION_BUCKETS_S, duration_s)] += 1

    def tick_duration_buckets(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative ticks) per bucket, +Inf (math.inf) last."""
        out, total = [], 0
        for bound, n in zip(
            (*TICK_DURATION_BUCKETS_S, float("inf")), self.tick_duration_counts, strict=True
        ):
            total += n
            out.append((bound, total))
        return out

    def add_reads(self, reads: Iterable[ReadSample] | None, tick_period_s: float) -> None:
        """Once per tick: that tick's read samples (None: the read failed)."""
        self._periods_unsampled += 1 + self.tick_overruns - self._overruns_seen
        self._overruns_seen = self.tick_overruns
        if reads is None:
            return
        interval_s = self._periods_unsampled * tick_period_s
        self._periods_unsampled = 0
        totals = self.resources
        for r in reads:
            t = totals.get(r.resource)
            if t is None:
                t = totals[r.resource] = ResourceTotals()
            t.reads_completed += r.reads
            t.read_time_s += r.reads * r.read_latency_s
            if r.write_bps is not None:
                t.written_bytes += r.write_bps * interval_s


class WrittenBytes:
    """Bytes written per (initiator, resource): the convergence worker adds, status() reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: dict[tuple[str, str], float] = {}

    def add(
        self,
        writes: Iterable[WriteSample],
        period_s: float,
        live: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        """One convergence's samples x its period; live (initiator -> its
        resources, from the discovery): the pairs to keep, the others are
        dropped (their series go with the initiator's other series)."""
        with self._lock:
            acc = self._bytes
            get = acc.get
            for res, ini, bps in writes:
                key = (ini, res)
                acc[key] = get(key, 0.0) + bps * period_s
            if live is not None:
                for key in [k for k in acc if k[1] not in live.get(k[0], ())]:
                    del acc[key]

    def snapshot(self) -> dict[tuple[str, str], float]:
        with self._lock:
            return dict(self._bytes)
