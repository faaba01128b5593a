"""The in-kernel sensor's busy time per volume: its utilization, as bridge/busy.py has it.

Problem
    The capture sensor's tracker keeps, per volume, the time it has at least one
    command in flight (busy.py). The program (bridge/bpf/wire.bpf.c, busy_move)
    keeps the same per (connection, volume) in its sums: the commands in flight
    (outstanding), the open busy span's start (since_ns, CLOCK_MONOTONIC) and the
    closed spans' total (busy_ns), moved under a lock; this reads them as busy
    seconds per volume and tick, for the bridge sensor's utilization.

Law
    A (connection, volume)'s busy time up to now_ns (busy_ns_at()): its closed
    spans, plus the open one up to now_ns. Commands that never complete are
    aged out of the program's map by userspace (ksums.py, as the tracker ages
    its own: INFLIGHT_MAX_S) and counted in the map `retired` (how many in all,
    when the last was); the program takes them off its count at the
    volume's next command or completion, closing a span they alone held open
    at the time they were aged; busy_ns_at() takes off those it has not yet
    taken in the same way. A command the program's map of commands in flight
    dropped when full (its LRU) never leaves: a walk of that map that finds
    none of a (connection, volume)'s commands while the program counts some,
    and the sums did not move across the walk, retires them at the walk's
    start (lost(): a span stays open at most one walk of the map too long).
    Each refresh adds what each (connection, volume)'s busy time grew by (an
    entry made anew, its closed total gone down, counts from zero; a read
    that is a little behind the last -- the program's clock is read when the
    segment arrives -- adds nothing). take() gives per volume the busiest of
    its connections' busy seconds since the last take: with one connection
    to a volume, the tracker's figure; with several, a lower bound of it (the
    program keeps no spans across connections).

Worked example
    A connection's LUN 0 with one command in flight since 1.00 s, closed spans
    0.20 s: busy_ns_at(..., now 1.50 s) = 0.70 s; the next refresh at 1.60 s,
    the command completed at 1.55 s: 0.75 s (0.05 s more).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from .kernel import Conn, VolumeSums
from .sums import Volume

Key = tuple[Conn, int]  # (connection, the volume as the wire has it)


def busy_ns_at(s: VolumeSums, retired: tuple[int, int], now_ns: int) -> int:
    """The (connection, volume)'s busy ns up to now_ns; retired: userspace's aged-out
    commands in all and when the last was (the program may not have taken them off)."""
    busy, outstanding = s.busy_ns, s.outstanding
    count, at_ns = retired
    n = count - s.retired
    if n > 0 and outstanding:
        if n < outstanding:
            outstanding -= n
        else:
            outstanding = 0
            busy += max(0, min(at_ns, now_ns) - s.since_ns)
    if outstanding:
        busy += max(0, now_ns - s.since_ns)
    return busy


def lost(
    before: Mapping[Key, VolumeSums],
    after: Mapping[Key, VolumeSums],
    held: frozenset[Key],
    retired: Mapping[Key, tuple[int, int]],
) -> dict[Key, int]:
    """The commands counted in flight that the map of them no longer holds (module
    header): per (connection, volume) none held, some counted, no move across the walk."""
    out = {}
    for key, s in before.items():
        if key in held or after.get(key) != s:
            continue
        n = s.outstanding - max(0, retired.get(key, (0, 0))[0] - s.retired)
        if n > 0:
            out[key] = n
    return out


class KernelBusy:
    """Per volume the busy seconds since the last take (busy.Busy's take()), from the
    program's sums as ksums.KernelSums reads them (module header)."""

    def __init__(self, volume_of: Callable[[Conn, int], Volume | None]) -> None:
        self.volume_of = volume_of
        self.retired: dict[Key, tuple[int, int]] = {}  # what userspace aged out: count, at
        self._last: dict[Key, tuple[int, int]] = {}  # the busy ns last read, the closed ns
        self._grown: dict[Key, int] = {}  # ns since the last take

    def read(self, sums: Iterable[tuple[Key, VolumeSums]], now_ns: int) -> None:
        for key, s in sums:
            total = busy_ns_at(s, self.retired.get(key, (0, 0)), now_ns)
            last, closed = self._last.get(key, (0, 0))
            if s.busy_ns < closed:  # the entry was made anew
                last = 0
            if total > last:
                self._grown[key] = self._grown.get(key, 0) + total - last
            self._last[key] = (max(last, total), s.busy_ns)

    def retire(self, key: Key, n: int, at_ns: int) -> tuple[int, int]:
        """n more of the key's commands aged out at at_ns: its (count, at) for the map."""
        count = self.retired.get(key, (0, 0))[0] + n
        self.retired[key] = (count, at_ns)
        return count, at_ns

    def forget(self, key: Key) -> None:
        for held in (self.retired, self._last, self._grown):
            held.pop(key, None)

    def take(self, now_s: float) -> dict[Volume, float]:
        """Busy seconds per volume since the last take, the busiest connection's (as of
        the last read: the sensor reads at each tick before it takes)."""
        out: dict[Volume, float] = {}
        for (c, raw), ns in self._grown.items():
            v = self.volume_of(c, raw)
            if v is not None:
                out[v] = max(out.get(v, 0.0), ns / 1e9)
        self._grown = {}
        return out
