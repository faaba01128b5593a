"""FleetAgent: one appliance's link to its fleet, in a thread of its own.

Problem
    The daemon's tick (100 ms) must never wait for the engine: an engine call
    may take up to its call budget (fleet/etcd.py, CALL_BUDGET_S), and a
    partition makes every call take that long.  So one thread talks to the
    engine and the tick only trades with it, under a lock, in microseconds:
    it hands over its samples and the decisions of the resources it leads,
    and reads the view of the last good cycle.

One cycle (every tick_s, in the agent's thread)
    1. join under a new lease when it has none (at the start, after LeaseLost);
       else refresh the lease every ttl_s / 4;
    2. publish the appliance's latest samples (codec.Published) when new;
    3. read the array's snapshot (one range request);
    4. campaign for every resource the daemon controls that has no leader
       (not with lead=False: an appliance whose etcd user may not write
       leaders and decisions only follows);
    5. publish the decision the tick left for each resource it leads at the
       epoch it leads with (the engine refuses a deposed leader's: counted);
    6. make the new view: the appliances, the leaders and their epochs, the other
       appliances' samples (each with the local time its seq was first seen:
       another machine's clock says nothing here), the current decisions of
       the resources others lead.  A decision counts only when the engine's
       records bind it to the current leader (engine.Snapshot.current: the
       leader key's lease, written during the leadership); any other is
       skipped and counted once per version (unbound), whatever its value
       says.  This appliance leads a resource when the leader key is under its
       own lease, not when the key merely names it.
    A failing call ends the cycle: EngineUnavailable is counted and kept as
    the view's reason; LeaseLost also drops every leadership and joins again
    next cycle.  A payload another appliance wrote that does not decode is
    skipped and counted (bad_payloads), never raised.

Degraded
    view().degraded once no cycle has succeeded for degraded_after_s
    (DEGRADED_AFTER_S, 1 s; the daemon gives the lease's TTL) or none ever
    did: the daemon then controls alone on its own samples
    (daemon/core/fleetmode.py).  One slow call does not flip it; a partition
    longer than the lease does, and by then the engine has ended this
    appliance's lease and leaderships anyway.

Bounds
    The tick's calls (offer, offer_decision, want, view) take the agent's lock
    only: never an engine call.  stop() waits for the cycle in progress (at
    most the adapter's call budget, plus connect and read) and then leaves
    (revokes the lease: this appliance's leaderships end at once, not after
    ttl_s).

Worked example
    agent = FleetAgent(EtcdCoordinator("array1", eps), "gw-a", {"mode": "bridge"})
    agent.start()                                     # the thread
    agent.want({"vg0"}); agent.offer(Published(tick_batch, conv_batch))
    v = agent.view()     # v.leading == {"vg0": 42}: this appliance leads vg0
    agent.offer_decision("vg0", 42, LeaderClasses(seq, 12, {"10.0.0.3": 12}))
    agent.stop()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from santhrottle.appliance.fleet.codec import (
    BadSamples,
    LeaderClasses,
    Published,
    SampleBatch,
    decode_classes,
    decode_published,
    encode_classes,
    encode_published,
)
from santhrottle.appliance.fleet.engine import (
    Coordinator,
    EngineUnavailable,
    LeaseLost,
    Payload,
    Snapshot,
)
from santhrottle.appliance.fleet.names import resource_key, resource_of

log = logging.getLogger("santhrottled.fleet")

# No successful cycle for this long: degraded, control alone.  The lease's
# TTL (1 s): past it the engine has ended this appliance's lease anyway.
DEGRADED_AFTER_S = 1.0
# The lease is refreshed at this fraction of its TTL (a stall of 3/4 of it is survived).
REFRESH_FRACTION = 1.0 / 4.0


@dataclass(frozen=True, slots=True)
class Part:
    """Another appliance's published samples, as this one received them."""

    appliance: str
    tick: SampleBatch
    tick_seen_s: float  # local clock: when this tick's seq was first seen
    conv: SampleBatch | None = None
    conv_seen_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Followed:
    """A resource another appliance leads, and its current decision: revision
    is the engine's (the decision key's mod_revision), unlike classes.seq."""

    resource: str
    leader: str
    epoch: int
    classes: LeaderClasses
    revision: int = 0


@dataclass(frozen=True, slots=True)
class FleetView:
    array: str
    appliance: str
    degraded: bool
    reason: str = ""  # why degraded, or the last failure
    revision: int = 0
    ok_age_s: float | None = None  # since the last good cycle; None: none yet
    appliances: tuple[str, ...] = ()
    leaders: dict[str, tuple[str, int]] = field(default_factory=dict)  # resource -> (who, epoch)
    leading: dict[str, int] = field(default_factory=dict)  # resource -> my epoch
    parts: dict[str, Part] = field(default_factory=dict)  # the others' samples
    followed: dict[str, Followed] = field(default_factory=dict)


@dataclass
class AgentCounters:
    cycles: int = 0
    failures: int = 0  # cycles ended by EngineUnavailable (LeaseLost included)
    joins: int = 0
    leases_lost: int = 0
    elections_won: int = 0
    refused: int = 0  # decisions the engine refused (deposed leader)
    bad_payloads: int = 0  # others' samples or decisions that did not decode; refused members
    unbound: int = 0  # decisions not written under the current leadership (versions)


class FleetAgent:
    def __init__(
        self,
        coordinator: Coordinator,
        appliance: str,
        info: Payload,
        *,
        ttl_s: float = 1.0,
        degraded_after_s: float = DEGRADED_AFTER_S,
        tick_s: float = 0.1,
        max_class: int = 10_000,
        lead: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.coord = coordinator
        self.lead = lead
        self.name = appliance
        self.info = dict(info)
        self.ttl_s = ttl_s
        self.degraded_after_s = degraded_after_s
        self.tick_s = tick_s
        self.max_class = max_class
        self.clock = clock
        self.counters = AgentCounters()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # the tick's side
        self._wanted: set[str] = set()
        self._mine: Published | None = None
        self._outgoing: dict[str, tuple[int, LeaderClasses]] = {}
        # the engine's side
        self._joined = False
        self._refreshed_s = -1e18
        self._sent_seq: tuple[int, int] | None = None  # (tick seq, conv seq) published
        self._published: dict[str, tuple[int, int]] = {}  # resource -> (epoch, seq) sent
        self._unbound_seen: dict[str, int] = {}  # resource -> revision of an unbound decision
        self._refused_seen: dict[str, int] = {}  # resource -> revision whose refusals were said
        self._ok_s: float | None = None
        self._reason = "not joined yet"
        self._view = FleetView(coordinator.array, appliance, True, self._reason)

    # ------------------------------------------------------------ the tick's side
    def want(self, resources: Iterable[str]) -> None:
        """The resources to lead when nobody does (the daemon's controlled ones)."""
        with self._lock:
            self._wanted = set(resources)

    def offer(self, published: Published) -> None:
        """This appliance's latest samples; the next cycle publishes them."""
        with self._lock:
            self._mine = published

    def offer_decision(self, resource: str, epoch: int, classes: LeaderClasses) -> None:
        with self._lock:
            self._outgoing[resource] = (epoch, classes)

    def view(self) -> FleetView:
        """The last good cycle's view, degraded when it is older than degraded_after_s."""
        with self._lock:
            v = self._view
            ok = self._ok_s
            reason = self._reason
        now = self.clock()
        age = None if ok is None else now - ok
        degraded = age is None or age > self.degraded_after_s
        if degraded:
            if not reason:  # a round still waiting for the engine
                reason = f"no answer from the engine for {age:.1f} s"
            return FleetView(v.array, v.appliance, True, reason, v.revision, age, v.appliances)
        return FleetView(
            v.array,
            v.appliance,
            False,
            reason,
            v.revision,
            age,
            v.appliances,
            v.leaders,
            v.leading,
            v.parts,
            v.followed,
        )

    # ------------------------------------------------------------ the thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleet", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nxt = self.clock()
        while not self._stop.is_set():
            try:
                self.cycle()
            except Exception as e:  # a bug: counted and logged, the rounds go on
                self.counters.failures += 1
                self._fail(f"{type(e).__name__}: {e}")
                log.exception("fleet: round")
            nxt += self.tick_s
            now = self.clock()
            if nxt < now:  # a slow cycle: the next at once, no backlog
                nxt = now
            self._stop.wait(nxt - now)

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the thread, then leave the fleet (best effort: an unreachable
        engine ends the lease itself after ttl_s)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        try:
            self.coord.leave()
        except EngineUnavailable as e:
            log.warning("fleet: leaving %s: %s", self.coord.array, e)

    # ------------------------------------------------------------ one cycle
    def cycle(self) -> None:
        """One round with the engine (the agent's thread; tests call it directly)."""
        self.counters.cycles += 1
        try:
            self._cycle()
        except LeaseLost as e:
            self.counters.failures += 1
            self.counters.leases_lost += 1
            self._joined = False
            self._published.clear()
            self._fail(f"lease lost: {e}")
        except EngineUnavailable as e:
            self.counters.failures += 1
            self._fail(str(e))

    def _fail(self, reason: str) -> None:
        with self._lock:
            first = self._reason == "" or self.counters.failures == 1
            self._reason = reason
            if not self._joined:  # no lease: no leadership is mine any more
                self._view = FleetView(self._view.array, self.name, True, reason)
        if first:
            log.warning("fleet %s: %s", self.coord.array, reason)

    def _cycle(self) -> None:
        now = self.clock()
        if not self._joined:
            self.coord.join(self.name, self.info)
            self._joined, self._refreshed_s = True, now
            self.counters.joins += 1
            self._sent_seq = None
        elif now - self._refreshed_s >= self.ttl_s * REFRESH_FRACTION:
            self.coord.refresh()
            self._refreshed_s = now
        with self._lock:
            mine, wanted, outgoing = self._mine, set(self._wanted), dict(self._outgoing)
        if mine is not None:
            seqs = (mine.tick.seq, -1 if mine.conv is None else mine.conv.seq)
            if seqs != self._sent_seq:
                self.coord.publish_samples(encode_published(mine))
                self._sent_seq = seqs
        snap = self.coord.snapshot()
        leaders = {  # a leader key without a lease is nobody's: campaign() replaces it
            resource_of(k): (lead.appliance, lead.epoch)
            for k, lead in snap.leaders.items()
            if lead.lease != 0
        }
        mine = self.coord.lease
        leading = {
            resource_of(k): lead.epoch
            for k, lead in snap.leaders.items()
            if mine is not None and lead.lease == mine
        }
        for r in sorted(wanted - set(leaders)) if self.lead else ():
            got = self.coord.campaign(resource_key(r))
            if got is not None:
                leaders[r] = (got.appliance, got.epoch)
                if got.lease == mine:
                    leading[r] = got.epoch
                    self.counters.elections_won += 1
                    log.info("fleet %s: leading %s (epoch %d)", self.coord.array, r, got.epoch)
        for r, (epoch, lc) in outgoing.items():
            if leading.get(r) != epoch or self._published.get(r) == (epoch, lc.seq):
                continue
            if self.coord.publish_decisions(resource_key(r), epoch, encode_classes(lc)):
                self._published[r] = (epoch, lc.seq)
            else:
                self.counters.refused += 1
                leading.pop(r, None)
        self._make_view(snap, leaders, leading)

    def _unbound(self, r: str, revision: int, lead: tuple[str, int]) -> None:
        """A decision of r the current leader did not write: counted once per
        version, logged when r's decision turns unbound."""
        before = self._unbound_seen.get(r)
        if before == revision:
            return
        self._unbound_seen[r] = revision
        self.counters.unbound += 1
        if before is None:
            log.warning(
                "fleet %s: the decision for %s (revision %d) is not written under its "
                "leader's lease and epoch (%s, epoch %d): skipped",
                self.coord.array,
                r,
                revision,
                lead[0],
                lead[1],
            )

    def _make_view(
        self, snap: Snapshot, leaders: dict[str, tuple[str, int]], leading: dict[str, int]
    ) -> None:
        now = self.clock()
        with self._lock:
            old = self._view.parts
        parts: dict[str, Part] = {}
        for who, raw in snap.samples.items():
            if who == self.name:
                continue
            try:
                pub = decode_published(raw)
            except BadSamples as e:
                self.counters.bad_payloads += 1
                log.debug("fleet: samples of %s: %s", who, e)
                continue
            prev = old.get(who)
            tick_seen = (
                prev.tick_seen_s if prev is not None and prev.tick.seq == pub.tick.seq else now
            )
            conv_seen = now
            if prev is not None and prev.conv is not None and pub.conv is not None:
                conv_seen = prev.conv_seen_s if prev.conv.seq == pub.conv.seq else now
            parts[who] = Part(who, pub.tick, tick_seen, pub.conv, conv_seen)
        followed: dict[str, Followed] = {}
        mine = self.coord.lease
        for key, dec in snap.decisions.items():
            r = resource_of(key)
            lead, held = leaders.get(r), snap.leaders.get(key)
            if lead is None or r in leading or (held is not None and held.lease == mine):
                continue  # nobody's, or mine (a refused write does not make it another's)
            if not snap.bound(key, dec):  # not the current leader's: etcd says so
                self._unbound(r, dec.revision, lead)
                continue
            self._unbound_seen.pop(r, None)
            try:
                classes = decode_classes(dec.payload, self.max_class)
            except BadSamples as e:
                self.counters.bad_payloads += 1
                log.debug("fleet: decision for %s: %s", r, e)
                continue
            if classes.refused and self._refused_seen.get(r) != dec.revision:
                self._refused_seen[r] = dec.revision
                self.counters.bad_payloads += len(classes.refused)
                said = "; ".join(classes.refused)
                log.warning("fleet %s: decision for %s, dropped: %s", self.coord.array, r, said)
            followed[r] = Followed(r, lead[0], lead[1], classes, dec.revision)
        view = FleetView(
            self.coord.array,
            self.name,
            False,
            "",
            snap.revision,
            0.0,
            tuple(sorted(snap.appliances)),
            leaders,
            leading,
            parts,
            followed,
        )
        with self._lock:
            if self._reason:
                log.info("fleet %s: the engine answers again", self.coord.array)
            self._view, self._ok_s, self._reason = view, now, ""
