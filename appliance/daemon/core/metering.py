"""The daemon's meter: a thread of its own samples the daemon and writes the meter.

What it owns
    Metering: the Meter (core/meter.py) and its keeper (core/meterstore.py)
    in daemon.state_dir beside the runtime state, and the thread that, every
    convergence period ([controller] converge, read at each sample), samples
    the daemon under its lock (the controller's levels and classes, the
    pause, and the sensors' IoSamples of a convergence it has not counted --
    each convergence makes a list of its own -- as the sensor counted them: the
    IOs it saw, however long its convergence took), then writes the
    meter outside the lock (the tick never waits for an fsync). The meter's file is read at the
    first sample (an invalid one set aside, logged: metering from zero);
    [metering]'s period and retention are read from the daemon's config at
    every sample, so a reload takes effect at once (a new period length from
    the next period on). stop() samples and writes once more.
    Times: the daemon's clock (monotonic) for the seconds sampled, the wall
    clock (injected) for the periods.

Worked example
    m = Metering(daemon, MeterStore("/var/lib/santhrottle")); m.start(): a
    sample a second (converge = "1s"), /var/lib/santhrottle/meter.json written
    after each, a period's lines appended to meter/2026-11.jsonl when it
    closes; m.once() is one sample and write (the tests').
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from santhrottle.appliance.config import Config
from santhrottle.appliance.daemon.core.counters import Counters
from santhrottle.appliance.daemon.core.meter import Meter
from santhrottle.appliance.daemon.core.meterstore import MeterKeeper, MeterStore
from santhrottle.appliance.daemon.core.runtime import Runtime
from santhrottle.appliance.daemon.core.sensors import Sensors
from santhrottle.controller.state import ControllerState

log = logging.getLogger("santhrottled")


class Metered(Protocol):
    """What the meter reads of the daemon (core/loop.py's Daemon)."""

    lock: Any
    config: Config
    ctl: ControllerState
    runtime: Runtime
    counters: Counters
    sensors: Sensors
    clock: Callable[[], float]


class Metering:
    def __init__(
        self,
        daemon: Metered,
        store: MeterStore | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.d = daemon
        self.meter = Meter(daemon.config.metering.period_s)
        self.keeper = MeterKeeper(store)  # no store: nothing survives a restart (tests)
        self.wall = wall
        self.loaded = False
        self._counted: object = daemon.sensors.io_samples  # what a start finds: not ours
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def once(self) -> bool:
        """One sample of the daemon, then the meter written; False when the write
        failed (logged and counted; the next sample tries again)."""
        d = self.d
        if not self.loaded:
            kept = self.keeper.load()
            self.meter.restore(kept.totals, kept.current)
            self.loaded = True
        with d.lock:
            cfg = d.config
            ios = []
            s = d.sensors
            got = s.io_samples  # a convergence's IOs, once: each is a list of its own
            if got is not self._counted:  # counted once, unscaled: every IO served
                self._counted, ios = got, got
            self.meter.period_s = cfg.metering.period_s
            self.meter.sample(d.ctl, ios, d.clock(), self.wall(), d.runtime.paused)
            snap = self.meter.snapshot()
        if self.keeper.save(lambda: snap, cfg.metering.retention_s):
            return True
        with d.lock:
            d.counters.state_save_errors += 1
        return False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="meter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The last sample written, the thread ended."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        self.once()

    def _run(self) -> None:
        while not self._stop.wait(self.d.config.controller.converge_s):
            try:
                self.once()
            except Exception as e:  # metering must never stop the daemon
                log.error("meter: %s", e)
