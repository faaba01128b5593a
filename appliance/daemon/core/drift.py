"""The daemon's side of drift: the kernel looked at every convergence, repaired at the next tick.

What it owns
    DriftWatch.check() runs in the convergence worker after each convergence.
    It takes what the data path left (Actuator.expected(), under the daemon's
    lock) and has the data path read the kernel (read only, netlink sockets
    of its own: datapath/drift.py):
      - the presence read (Actuator.missing()) at every convergence: each
        device's root qdisc and, at every fifth, its tree's digest
        (datapath/drift.py, TREE_DIGEST_EVERY), the sets and their member
        counts, the chain and its jumps (nftables' generation, their
        fingerprint when it moved), or on a bridge its nftables table;
      - the full comparison (Actuator.drift()) at most every CHECK_EVERY_S, at
        the first convergence after a repair (did it hold?), after a check
        that raced a tick, and at once when the presence read finds something
        it has not already sent there: each device's tree (object by object
        where its digest is not the one last found as wanted, and every 30th
        time: datapath/drift.py), the gate's list, the chain through
        `iptables -S` where it cannot be read in-process (datapath/mangle.py).
    It keeps what the full comparison found when the data path did not
    change meanwhile (a tick that moved members during the read is no drift:
    the next convergence looks again).
    DriftWatch.repair() runs in the tick, under the lock: each line is logged
    (WARNING santhrottled: drift: LINE; repaired) and counted
    (santhrottle_repairs_total), and the data path rebuilds what drifted
    (Actuator.repair(), its apply()); the tick's reconcile() then puts back the
    members that are missing.  A check that fails is logged once until it works
    again.  A drift that comes back after each repair (another program that
    rewrites the chain, a data path that cannot hold what it built) is repaired
    again after AGAIN_BACKOFF_S, doubled each time up to MAX_BACKOFF_S, and said
    once every SAY_AGAIN_S with the number of repairs, not at every convergence;
    one check that finds it gone ends that.

Cost
    On the 2-core development host, one device with the default ladder's 193
    tc objects (tests/bench/bench_drift.py; docs/datapath.md "Drift" has the
    side-by-side figures): the presence read 0.7 ms of CPU a convergence
    (0.6 ms of it the tree's digest), a full comparison ~30 ms (pyroute2
    decoding the tree's two dumps), so 2.5 ms a convergence on average,
    against 3.2 ms for the code that ran the whole check with `iptables -S`
    every 10 s.  A full comparison at every
    convergence cost ~3 % of a CPU there and, in the one-vCPU lab guest, a
    fifth of the guest's CPU, which the target's writers then lacked (make
    lab-light, docs/lab.md "Work conservation"): hence the period.  Every
    10 s it was still half of the daemon's CPU in a slower guest, where one
    look through pyroute2 took 3-8 s: a tree whose digest is the one found as
    wanted is now looked at that way every 30th full comparison.  A root
    qdisc, a set, a member count, the chain or a jump that goes or changes is
    found at the next convergence, a class or a leaf under santhrottle's root
    within five; a rule replaced in place with the same matches, or a member
    moved to another class by hand (the counts kept), within CHECK_EVERY_S
    plus a convergence.

Worked example
    `santhrottle cleanup --force` is the way to remove the data path under a
    running daemon (it stops the daemon first); an `ipset flush santhrottle-all`
    by hand is seen by the next convergence's presence read, confirmed by the
    full comparison at once ("ipset: santhrottle-all holds 0 members,
    santhrottle left 3 there"), and the three members are back at the tick
    after it: within about a convergence (1 s) plus a tick.
"""

from __future__ import annotations

import logging
import re
import threading

from santhrottle.appliance.daemon.core.counters import Counters
from santhrottle.appliance.daemon.core.sensors import Actuator

log = logging.getLogger("santhrottled")

# A drift found again right after its repair: repaired again after this, doubled each
# time (the rebuild costs the tick), up to MAX_BACKOFF_S; said once every SAY_AGAIN_S.
AGAIN_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
SAY_AGAIN_S = 60.0
# How often the kernel is read at most (module header, "Cost").
CHECK_EVERY_S = 10.0


def _kind(line: str) -> str:
    """A drift line without its numbers: the same drift, whatever it counts."""
    return re.sub(r"\d+", "#", line)


class DriftWatch:
    def __init__(self) -> None:
        self.found: list[str] = []  # what the last check found, until repaired
        self._failing = False
        self._again: dict[str, tuple[int, float]] = {}  # kind -> (repairs in a row, next at)
        self._said: dict[str, float] = {}  # kind -> when it was last said
        self._next_s: float | None = None  # the next check not before (None: at once)
        self._answered: list[str] = []  # what the presence read found, looked at in full

    def check(self, actuator: Actuator, lock: threading.RLock, now: float) -> None:
        """In the convergence worker (now: the daemon's clock), after each convergence:
        the presence read, and the full comparison when it is due or when the
        presence read found something (module header)."""
        with lock:
            due = self._next_s is None or now >= self._next_s
            before = actuator.expected()
        try:
            missing = [] if due else actuator.missing(before)
            if not due and missing == self._answered:  # nothing, or what was looked at
                return
            self._answered = missing
            with lock:
                self._next_s = now + CHECK_EVERY_S
            found = actuator.drift(before)
        except Exception as e:  # a check that cannot read: said once, tried again
            self._answered = []  # what the presence read finds goes to the next one
            if not self._failing:
                log.warning("drift: cannot check the data path: %s", e)
            self._failing = True
            return
        self._failing = False
        with lock:
            if actuator.expected() != before:
                self._next_s = None  # the data path moved meanwhile: the next one looks
                return
            self.found = found
            kinds = {_kind(line) for line in found}
            for k in [k for k in self._again if k not in kinds]:  # the repair held
                del self._again[k]

    def repair(self, actuator: Actuator, counters: Counters, now: float) -> None:
        """Under the daemon's lock, in the tick (now: the daemon's clock)."""
        if not self.found:
            return
        found, self.found = self.found, []
        due = []
        for line in found:
            k = _kind(line)
            n, not_before = self._again.get(k, (0, now))
            if now < not_before:
                continue  # backing off: the next check finds it again
            wait = 0.0 if n == 0 else min(AGAIN_BACKOFF_S * 2 ** (n - 1), MAX_BACKOFF_S)
            self._again[k] = (n + 1, now + wait)
            if n == 0:
                log.warning("drift: %s; repairing", line)
            elif now - self._said.get(k, -SAY_AGAIN_S) >= SAY_AGAIN_S:
                self._said[k] = now
                log.warning(
                    "drift: %s, again after %d repair(s) (does another program rewrite "
                    "it?); repairing, next time after %g s",
                    line,
                    n,
                    min(AGAIN_BACKOFF_S * 2**n, MAX_BACKOFF_S),
                )
            due.append(line)
        if due:
            counters.repairs += len(due)
            actuator.repair()
            self._next_s = None  # did it hold? the next convergence looks
