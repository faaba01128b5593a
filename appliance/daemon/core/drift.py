"""The daemon's side of drift: the kernel checked every convergence, repaired at the next tick.

What it owns
    DriftWatch.check() runs in the convergence worker, after each convergence:
    it takes what the data path left (Actuator.expected(), under the daemon's
    lock), has the data path compare the kernel with it (Actuator.drift():
    read only, netlink sockets of its own: datapath/drift.py), and keeps what it
    found when the data path did not change meanwhile (a tick that moved members
    during the read is no drift: the next convergence looks again).
    DriftWatch.repair() runs in the tick, under the lock: each line is logged
    (WARNING santhrottled: drift: LINE; repaired) and counted
    (santhrottle_repairs_total), and the data path rebuilds what drifted
    (Actuator.repair(), its apply()); the tick's converge() then puts back the
    members that are missing.  A check that fails is logged once until it works
    again.

Worked example
    `santhrottle cleanup --force` is the way to remove the data path under a
    running daemon (it stops the daemon first); an `ipset flush santhrottle-all`
    by hand is seen at the next convergence ("ipset: santhrottle-all holds 0
    members, santhrottle left 3 there") and the three members are back at the
    tick after it: within about 1.1 s.
"""

from __future__ import annotations

import logging
import threading

from santhrottle.appliance.daemon.core.counters import Counters
from santhrottle.appliance.daemon.core.sensors import Actuator

log = logging.getLogger("santhrottled")


class DriftWatch:
    def __init__(self) -> None:
        self.found: list[str] = []  # what the last check found, until repaired
        self._failing = False

    def check(self, actuator: Actuator, lock: threading.RLock) -> None:
        with lock:
            before = actuator.expected()
        try:
            found = actuator.drift(before)
        except Exception as e:  # a check that cannot read: said once, tried again
            if not self._failing:
                log.warning("drift: cannot check the data path: %s", e)
            self._failing = True
            return
        self._failing = False
        with lock:
            if found and actuator.expected() == before:
                self.found = found

    def repair(self, actuator: Actuator, counters: Counters) -> None:
        """Under the daemon's lock, in the tick."""
        if not self.found:
            return
        found, self.found = self.found, []
        for line in found:
            log.warning("drift: %s; repairing", line)
        counters.repairs += len(found)
        actuator.repair()
