"""The daemon's data path: reconcile it with what is wanted, isolate refusals, mend drift.

What it owns
    Actuation composes a Datapath (actuator.py: the kernel objects), the
    Reconciler (reconcile.py: the record of what the kernel holds, the diff,
    the quarantine) and the drift check (drift.py) into what the daemon calls
    its actuator (daemon/core/sensors.py, Actuator):
      apply()       the start: Datapath.apply(), then the members read back
                    become the record (a restart adopts what the last run left)
      reconcile()   every tick: the kernel to the classes wanted
      advance_glides()      every tick: the glide leaves' due lowerings and handoffs,
                    quarantined like any refusal when the kernel refuses them
      members(), quarantined(), errors, quarantines   for status and metrics
      expected(), missing(), drift(), repair()   the drift check (the presence
                    read at every convergence, the full comparison) and its repair
                    (a member santhrottle did not put there is taken out)
      cleanup()     the stop
    The command line's `pin`, `datapath apply` and `cleanup` use the Datapath
    alone: no record outlives a command.

Worked example
    a = Actuation(Datapath(DatapathSpec(("eth1",))))
    a.apply(); a.reconcile({"10.0.0.3": (20, "all")}); a.members() ->
    {"10.0.0.3": (20, "all")}; after an `ipset flush santhrottle-all` by hand,
    a.drift(a.expected()) -> ["ipset: santhrottle-all holds 0 members, santhrottle
    left 1 there"]; a.repair(); a.reconcile(the same) puts 10.0.0.3 back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from santhrottle.appliance.datapath.actuator import ApplyReport, CleanupReport, Datapath
from santhrottle.appliance.datapath.drift import Expected, Watch, find_drift, find_missing
from santhrottle.appliance.datapath.reconcile import Change, Quarantined, Reconciler, Target
from santhrottle.appliance.datapath.spec import DatapathSpec


class Actuation:
    def __init__(self, datapath: Datapath) -> None:
        self.datapath = datapath
        self.reconciler = Reconciler(self._send, datapath.clock)
        self._watch: Watch | None = None  # the drift check's sockets (one thread's)
        self._watch_thread = 0

    def _send(self, classes: Mapping[str, int], mode: str, ordered: bool) -> int:
        return self.datapath.set_classes(classes, mode, ordered=ordered)

    # ------------------------------------------------------------ lifecycle
    def apply(self) -> ApplyReport:
        report = self.datapath.apply()
        self._read_back()
        return report

    def _read_back(self) -> None:
        """The kernel's members become the record; one santhrottle did not put there
        (no skbprio of its classes: `ipset add santhrottle-all IP` by hand, sent to
        HTB's direct queue) is taken out."""
        members = self.datapath.current()
        strays = self.datapath.strays()
        if strays:
            self.datapath.set_classes(dict.fromkeys(strays, 0), ordered=False)
        self.reconciler.adopt(
            {ip: (m.klass, m.mode) for ip, m in members.items() if ip not in strays}
        )

    def cleanup(self) -> CleanupReport:
        self._unwatch()
        return self.datapath.cleanup()

    # ------------------------------------------------------------ every tick
    def reconcile(self, want: Mapping[str, Target], *, ordered: bool = True) -> dict[str, Change]:
        """Every initiator to its (class, mode) in `want`, the others out of every set;
        what the kernel refuses is quarantined, the rest goes in (reconcile.py).
        Returns what changed: ip -> (class before, class after, mode)."""
        return self.reconciler.reconcile(want, ordered)

    def advance_glides(self) -> int:
        return self.reconciler.guard("glide leaves", "leaf", self.datapath.advance_glides)

    # ------------------------------------------------------------ what it shows
    def members(self) -> Mapping[str, Target]:
        """ip -> (class, mode) of every member as applied: the record of the kernel."""
        return self.reconciler.members()

    def quarantined(self) -> Mapping[str, Quarantined]:
        return self.reconciler.quarantine

    @property
    def errors(self) -> int:
        """Refusals of the kernel since the start (a batch, a member, an object)."""
        return self.reconciler.errors

    @property
    def quarantines(self) -> Mapping[str, int]:
        """Per kind (member, jumps, gate, leaf, repair): the quarantines since the start."""
        return self.reconciler.quarantined_total

    @property
    def glided(self) -> int:
        return self.datapath.glided

    @property
    def unordered_moves(self) -> int:
        return self.datapath.unordered_moves

    # ------------------------------------------------------------ drift
    def expected(self) -> Expected:
        """What the data path left in the kernel (the tick's thread; drift.py)."""
        return self.datapath.expected()

    def missing(self, expected: Expected) -> list[str]:
        """What is surely missing or not as left (drift.py's presence read, cheap: every
        convergence); read only, through sockets kept for the convergence worker."""
        return self._watched(find_missing, expected)

    def drift(self, expected: Expected) -> list[str]:
        """What is missing or changed against `expected`, one line per object (drift.py's
        full comparison); read only, through the same sockets."""
        return self._watched(find_drift, expected)

    def _watched(
        self, read: Callable[[DatapathSpec, Expected, Watch], list[str]], expected: Expected
    ) -> list[str]:
        dp = self.datapath
        if self._watch is not None and self._watch_thread != threading.get_ident():
            # pyroute2 keeps a socket per thread and opens it at a thread's first
            # request: from another thread, outside the namespace (the daemon's first
            # check runs in its main thread, the later ones in the convergence worker)
            self._unwatch()
        if self._watch is None:
            self._watch = Watch(dp.netns, dp.host.tools)
            self._watch_thread = threading.get_ident()
        try:
            return read(dp.spec, expected, self._watch)
        except Exception:
            self._unwatch()  # opened again at the next read
            raise

    def _unwatch(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def repair(self) -> int:
        """Rebuild what drifted (Datapath.apply(): the tree, the sets, the gate, the
        rules) and read the members back, so the next reconcile() puts back what is
        missing; a failure waits for its retry like any refusal (reconcile.py)."""
        return self.reconciler.guard("data path repair", "repair", self._repair)

    def _repair(self) -> int:
        lines = self.datapath.apply().tc_lines
        self._read_back()
        return lines + 1
