"""The simulated sensors: what each path's appliance sees of the array, every tick.

What they report (as the daemon's sensors do, controller/domain.py's Samples)
    Per path and resource, over the tick: the reads completed on that path
    (their count, rounded up, and mean latency) and the resource's write
    rate (a ReadSample, also with 0 reads: a path that saw writes but no
    reads still counts them); at a convergence, the write rate of every
    (resource, initiator) pair over the convergence (WriteSample). The
    array's device samples (threshold "auto"), its utilization and the
    groups' IO samples are the whole array's, for an appliance that sees
    every path.
    whole() is what one appliance on every path sees: the paths' sums.

Worked example
    Path 0 saw 4 reads summing 40 ms and 1.2 MB of writes to vg in a
    100 ms tick, path 1 2 reads summing 30 ms: part(0) has ReadSample(vg,
    4, 10 ms, 12 MB/s), part(1) ReadSample(vg, 2, 15 ms, 0), whole()
    ReadSample(vg, 6, 11.67 ms, 12 MB/s).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TypeVar

from santhrottle.controller.domain import (
    DeviceSample,
    IoSample,
    ReadSample,
    Samples,
    UtilizationSample,
    WriteSample,
)

_K = TypeVar("_K")


class Sensed:
    """What each path's sensor saw since the last tick (the pairs' writes: since the
    last convergence), the array's device samples and the groups' IO samples."""

    def __init__(self, resources: Sequence[str], n_paths: int, tick_s: float) -> None:
        self.names = list(resources)
        self.tick_s = tick_s
        self.read_sum = [dict.fromkeys(self.names, 0.0) for _ in range(n_paths)]
        self.read_n = [dict.fromkeys(self.names, 0.0) for _ in range(n_paths)]
        self.write_res = [dict.fromkeys(self.names, 0.0) for _ in range(n_paths)]  # bytes
        self.write_pair: list[dict[tuple[str, str], float]] = [{} for _ in range(n_paths)]
        self.span_s = 0.0  # > 0 at a convergence: the writes' period
        self.devices: list[DeviceSample] = []
        self.ios: list[IoSample] = []
        self.utilization: list[UtilizationSample] = []  # the array's, per tick

    @property
    def converging(self) -> bool:
        return self.span_s > 0.0

    def part(self, p: int) -> Samples:
        """Path p's Samples of the tick (the pairs' writes only at a convergence)."""
        return _samples(
            self.read_sum[p], self.read_n[p], self.write_res[p], self.write_pair[p], self
        )

    def whole(self) -> Samples:
        """What one appliance on every path saw (with the device and IO samples)."""
        if len(self.read_sum) == 1:
            one = self.part(0)
            return Samples(one.reads, one.writes, self.devices, self.ios, self.utilization)
        one = _samples(
            _sum(self.read_sum),
            _sum(self.read_n),
            _sum(self.write_res),
            _sum(self.write_pair),
            self,
        )
        return Samples(one.reads, one.writes, self.devices, self.ios, self.utilization)

    def clear(self) -> None:
        """After the tick (and the convergence's writes after a convergence)."""
        for per in (self.read_sum, self.read_n, self.write_res):
            for d in per:
                for name in d:
                    d[name] = 0.0
        if self.span_s:
            for w in self.write_pair:
                w.clear()
        self.span_s = 0.0
        self.devices = []
        self.ios = []
        self.utilization = []


def _sum(ds: Sequence[Mapping[_K, float]]) -> dict[_K, float]:
    out: dict[_K, float] = {}
    for d in ds:
        for key, v in d.items():
            out[key] = out.get(key, 0.0) + v
    return out


def _samples(
    rsum: Mapping[str, float],
    rn: Mapping[str, float],
    wb: Mapping[str, float],
    pairs: Mapping[tuple[str, str], float],
    sensed: Sensed,
) -> Samples:
    tick_s, span_s = sensed.tick_s, sensed.span_s
    reads = [
        ReadSample(name, math.ceil(rn[name]), rsum[name] / rn[name], wb[name] / tick_s)
        if rn[name] > 0.0
        else ReadSample(name, 0, 0.0, wb[name] / tick_s)
        for name in rn
    ]
    writes = [WriteSample(r, i, b / span_s) for (r, i), b in pairs.items()] if span_s else []
    return Samples(reads, writes)
