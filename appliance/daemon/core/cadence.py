"""The daemon's two cadences: a fixed-rate tick, and the convergence in a worker of its own.

Problem
    The controller's tick (100 ms) must run at a fixed rate, not at a fixed
    delay after its own work: a 13 ms tick scheduled 100 ms after its end
    would drift to 113 ms and shift every gain.  A tick that comes late (a
    loaded host, a slow netlink dump) must run once, not be caught up with a
    burst of back-to-back ticks that would act on the same samples.  The
    convergence (1 s: discovery and write rates) may be slow (a large configfs
    tree): it runs in a worker thread, and the tick never waits for it.

The law
    next_tick starts one period after the first tick; each tick is due at
    next_tick.  At a deadline `now`: missed = floor((now - next_tick) / tick);
    missed deadlines are counted (santhrottle_tick_overruns_total) and logged,
    the tick runs once, next_tick += (missed + 1) x tick.  The worker's next
    run is the previous one's deadline plus the (reloadable) period; a worker
    slower than its period starts again from now.  A tick comes late when the
    host is loaded, and when a garbage collection holds every thread: the
    collector is timed while run() runs, a slow collection said after the
    tick that follows it, and what the daemon built to start is frozen once it
    is up (core/gcwatch.py).

Worked example
    tick 0.1 s, next_tick 1000.0; the tick is woken at 1000.25: missed = 2
    (logged "tick late by 250 ms: 2 tick(s) skipped"), one tick runs,
    next_tick = 1000.3.  Time and sleep are injected: tests/unit/test_daemon.py
    runs it in virtual time.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

from santhrottle.appliance.daemon.core.gcwatch import GcWatch, freeze_started
from santhrottle.controller.domain import ControllerConfig

log = logging.getLogger("santhrottled")


class Cadence:
    def __init__(
        self,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        periods: Callable[[], ControllerConfig],
    ) -> None:
        self.clock = clock
        self.sleep = sleep
        self.periods = periods  # tick_s, converge_s: read at every deadline (a reload)
        self.next_tick: float | None = None
        self.stopping = threading.Event()
        self.gc = GcWatch()  # times the collector while run() runs

    def run(
        self,
        tick: Callable[[float], None],
        converge: Callable[[], None],
        overruns: Callable[[int], None],
        ready: Callable[[], None],
    ) -> None:
        """A first convergence and a first tick, off the schedule (they open sockets
        and load what the tick needs: seconds under an emulated CPU), then the fixed
        rate until stop(), the convergence in its worker."""
        worker = threading.Thread(
            target=self._converge_loop, args=(converge,), name="converge", daemon=True
        )
        with self.gc:
            converge()
            tick(self.clock())
            freeze_started()  # what it imported and built to get here (gcwatch.py)
            self.next_tick = self.clock() + self.periods().tick_s
            worker.start()
            ready()
            while not self.stopping.is_set():
                self.run_once(tick, overruns)
            worker.join(timeout=5.0)

    def run_once(self, tick: Callable[[float], None], overruns: Callable[[int], None]) -> None:
        """Sleep until the next deadline, then tick once (fixed rate, no bunching)."""
        period = self.periods().tick_s
        now = self.clock()
        if self.next_tick is None:
            self.next_tick = now
        if now < self.next_tick:
            self.sleep(self.next_tick - now)
            now = self.clock()
            if now < self.next_tick:
                return
        missed = math.floor((now - self.next_tick) / period + 1e-9)
        if missed:
            overruns(missed)
            log.warning(
                "tick late by %.0f ms: %d tick(s) skipped", (now - self.next_tick) * 1e3, missed
            )
        self.next_tick += (missed + 1) * period
        tick(now)
        self.gc.say()  # a collection that held every thread (core/gcwatch.py)

    def _converge_loop(self, converge: Callable[[], None]) -> None:
        nxt = self.clock() + self.periods().converge_s
        while not self.stopping.wait(max(0.0, nxt - self.clock())):
            converge()
            period = self.periods().converge_s  # a reload may change it
            nxt += period
            now = self.clock()
            if nxt < now:  # slower than its period: start again from now
                nxt = now + period

    def stop(self) -> None:
        self.stopping.set()
