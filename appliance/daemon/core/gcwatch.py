"""The daemon's garbage collector: long-lived objects frozen, and a slow collection said.

Problem
    A full cyclic collection walks every object the collector tracks, with the
    GIL held: every thread of the daemon waits, the tick too.  A discovery of
    10,000 initiators is 10,000s of long-lived objects (20-30 ms a full
    collection on the development host, make bench); so are the modules the
    daemon imports as it starts (rtslib-fb, pyroute2, prometheus-client: ~40,000
    objects, a full collection ~35 ms here, seconds in the one-vCPU lab guest,
    where the daemon logged ticks 2-5 s late).  Nothing said why a tick came late.

What it owns
    GcFreezer: gc.freeze() after the sensors rebuilt their discovery
    (Sensors.discoveries; core/loop.py).  freeze_started(): once the daemon is
    up (core/cadence.py: its first convergence and tick have imported and built
    what it keeps until it stops), one collection, so that no garbage is frozen,
    then gc.freeze().  Frozen objects are left to reference counting (nothing
    in a discovery or a module is garbage while the daemon runs) and full
    collections walk only what is newer.  A sensor that builds no discovery
    leaves its count at 0.
    GcWatch: a gc callback that times each collection, installed while the
    cadence runs (a context manager); one that held the GIL SLOW_COLLECTION_S
    or longer is counted (`slow`, `slow_s`) and logged after the next tick
    (WARNING santhrottled: gc: a generation-2 collection took 1.20 s ...), at
    most once every SAY_EVERY_S with the number since.

Worked example
    The daemon starts: the first convergence decodes the tc tree through
    pyroute2 (its modules imported then), the first tick runs, then
    freeze_started() collects once and freezes; a generation-2 collection later
    walks the objects made since, not the modules.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger("santhrottled")

# A collection that holds the GIL this long is said (a tick is 100 ms)
SLOW_COLLECTION_S = 0.5
SAY_EVERY_S = 60.0


class GcFreezer:
    """gc.freeze() after each rebuilt discovery and once the daemon is up (header)."""

    def __init__(self) -> None:
        self.frozen_at = 0

    def after_convergence(self, discoveries: int) -> None:
        if discoveries != self.frozen_at:
            gc.freeze()
            self.frozen_at = discoveries


def freeze_started() -> None:
    """Once the daemon is up (core/cadence.py): one collection, then gc.freeze()."""
    gc.collect()
    gc.freeze()


class GcWatch:
    """Times the collector's collections (module header): install() and uninstall(),
    or `with`; say(), after a tick, logs what the callback noted (never the callback
    itself: it runs inside an allocation, anywhere, any lock held)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.slow = 0  # collections that took SLOW_COLLECTION_S or longer
        self.slow_s = 0.0  # their time
        self._started: float | None = None
        self._noted: list[tuple[int, float, int]] = []  # (generation, took, collected)
        self._said_at: float | None = None
        self._unsaid = 0

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def __enter__(self) -> GcWatch:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        now = self.clock()
        if phase == "start":
            self._started = now
            return
        if self._started is None:
            return
        took, self._started = now - self._started, None
        if took >= SLOW_COLLECTION_S:
            self.slow += 1
            self.slow_s += took
            self._noted.append((info.get("generation", -1), took, info.get("collected", 0)))

    def say(self) -> None:
        """The slow collections noted since the last call: the last one logged, at most
        once every SAY_EVERY_S, with the number not said before it."""
        noted, self._noted = self._noted, []
        if not noted:
            return
        now = self.clock()
        self._unsaid += len(noted) - 1
        if self._said_at is not None and now - self._said_at < SAY_EVERY_S:
            self._unsaid += 1
            return
        generation, took, collected = noted[-1]
        since = f"; {self._unsaid} more since the last said" if self._unsaid else ""
        log.warning(
            "gc: a generation-%d collection took %.2f s with the GIL held (%d objects "
            "collected): every thread waited, the tick too%s",
            generation,
            took,
            collected,
            since,
        )
        self._said_at, self._unsaid = now, 0
