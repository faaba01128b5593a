"""Per volume, the time it has at least one command in flight: its utilization, from the wire.

Problem
    A device busy all of the time is full whatever its latency says
    (controller/utilization.py); on a target host diskstats' io_ticks says
    how busy each device is, on a bridge only the wire can: a volume is busy
    from the moment a command is sent to it while none is outstanding to the
    moment its last outstanding command completes (io_ticks' own definition,
    seen from the wire: it includes the hop from the bridge to the array).

Law
    up(volume, t) when a command starts, down(volume, t) when one leaves
    (completed, aged out, evicted, its connection gone); a volume going from
    0 to 1 command opens a busy span at t, one going from 1 to 0 closes it;
    take(t) returns the busy seconds since the last take per volume, the
    open spans counted up to t (and continued from t).

Worked example
    up(v, 0.00), up(v, 0.01), down(v, 0.03), down(v, 0.05), up(v, 0.08):
    take(0.10) -> {v: 0.07} (0.00-0.05 and 0.08-0.10).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V", bound=Hashable)


class Busy(Generic[V]):
    def __init__(self) -> None:
        self.outstanding: dict[V, int] = {}
        self.since: dict[V, float] = {}
        self.busy_s: dict[V, float] = {}

    def up(self, volume: V | None, now_s: float) -> None:
        if volume is None:  # a command to no volume known: nothing of a volume's busy
            return
        n = self.outstanding.get(volume, 0)
        if not n:
            self.since[volume] = now_s
        self.outstanding[volume] = n + 1

    def down(self, volume: V | None, now_s: float) -> None:
        if volume is None:
            return
        n = self.outstanding.get(volume, 0) - 1
        if n > 0:
            self.outstanding[volume] = n
            return
        self.outstanding.pop(volume, None)
        start = self.since.pop(volume, None)
        if start is not None:
            self.busy_s[volume] = self.busy_s.get(volume, 0.0) + max(0.0, now_s - start)

    def take(self, now_s: float) -> dict[V, float]:
        """Busy seconds per volume since the last take (open spans up to now_s)."""
        for v, start in self.since.items():
            self.busy_s[v] = self.busy_s.get(v, 0.0) + max(0.0, now_s - start)
            self.since[v] = now_s
        out, self.busy_s = self.busy_s, {}
        return out
