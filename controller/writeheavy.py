"""Write-heavy initiator sets, one per resource, with hysteresis.

Problem
    The PID of a resource throttles the initiators that load it with
    writes (paper 2.3.1: "sets of IP addresses that are known to be doing
    write activity at a certain level"). Which initiators those are changes
    as workloads come and go, and must not flap when a writer hovers near
    the threshold.

Measured signal
    Per (resource, initiator): the write rate in bytes/s over the sensor
    interval, smoothed by a time-constant EWMA (controller/ewma.py) with
    its own tau. A pair without a sample in a convergence period is folded
    in as a 0 B/s sample (the initiator stopped writing or disconnected).

Law (evaluated at every set convergence, 1 s by default)
    not member and ewma >  enter                -> join   ("enter")
    member     and ewma <  leave                -> leave  ("leave")
    otherwise                                    -> keep   ("hold")
    with leave < enter: the band between them is the hysteresis, and
    and, unless share = 0, lower thresholds per resource:
      contended (the controller's view: latency over its setpoint, or a
      class > 0) and writing > floor = CONTENDED_FLOOR_FRACTION x leave in all:
        enter = floor           every writer above the floor is throttled
        leave = FORGET_FRACTION x leave   members hold while contended (a
                throttled writer writes little: judged by its throttled
                rate it would leave, and come back unthrottled)
      not contended but writing > enter_bytes_per_s in all:
        enter = min(enter_bytes_per_s, share x fair)
        leave = min(leave_bytes_per_s, share x fair x leave / enter)
        fair  = sum(r^2) / sum(r) over the resource's pairs' write EWMAs r:
                the rate of the writer that writes the average byte (40
                hosts at r each: r; one at 20 and one at 0.3 MiB/s: 19.7)
    The relative part ("share", 0 turns it off) catches many hosts that each
    write little (under any per-host threshold) but together load the
    resource: 40 hosts at 0.5 MiB/s each all join (each writes the fair
    share), while one host at 0.3 MiB/s beside one at 20 MiB/s does not
    (the fair share is 10 MiB/s).

Bounds
    A pair that is not a member and whose EWMA has decayed below
    FORGET_FRACTION * leave is forgotten, so the table does not grow with
    every initiator ever seen.

Performance
    observe_many: two lookups of str keys per sample (the resource, then
    the initiator: no (resource, initiator) tuple to build and hash), one
    alpha per sensor pass (its pairs share the previous pass's time).
    converge: one pass over the table, which folds in the silent pairs and
    sets aside, in table order, all but the members at or over leave_bps
    (they hold: the relative thresholds are lower); then a pass over those
    set aside, so the sets change in the same order as in one pass over the
    whole table. A resource's sums (fair share) are taken, in table order
    (its pairs are also indexed by resource), only once one of its pairs is
    set aside: a convergence where every pair is a member over leave_bps
    sums nothing. split(): each resource's members of it alone and of
    several, kept until a member joins or leaves (effective.py's
    follow_resources reads it every tick). `make bench` (1,000 resources,
    11,000 pairs) measures the tick with it.

Idle behaviour
    A writer that pauses decays as exp(-t / tau): with tau = 8 s and a
    member writing 1 MiB/s, it stays a member through a 5 s pause as long as
    leave < 0.53 MiB/s, so the next burst is throttled from its first tick
    instead of after a new convergence. A member whose sample is under
    AWAY_FRACTION x leave (2.56 KiB/s by default) is away (the
    controller holds its resource's class for a while, controller/decide.py);
    one that writes little because it is throttled has not: a 4 KiB QD1
    writer at 250 ms writes 16 KiB/s.

Worked example
    enter 1 MiB/s, leave 0.25 MiB/s, tau 8 s, samples each second:
        t=0  0.9 MiB/s (seed 0.9)        hold  (0.9 <= enter)
        t=1  4.0 MiB/s -> 0.9+0.1175*3.1 = 1.264   join
        t=2..6 0 MiB/s -> 1.264*e^-(5/8) = 0.677   hold  (0.677 >= leave)
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Final

from .ewma import alpha_for

# A pair below this fraction of the leave threshold, and not a member, is
# dropped from the table (it would take a new burst to matter again).
FORGET_FRACTION: Final = 0.01
# A contended resource (latency over its setpoint) applies the relative rule
# once its writers write this fraction of leave_bps in all (64 KiB/s by
# default): small-IO writers saturate a slow array at well under 1 MiB/s,
# while a reader's own log writes stay under it.
CONTENDED_FLOOR_FRACTION: Final = 0.25
# A member writing under this fraction of leave_bps is away ("Idle behaviour").
AWAY_FRACTION: Final = 0.01


# _Resource before _Pair, which names it: Debian 12's mypyc (1.0.1) stores a dataclass's
# annotations at class creation and crashes on a class defined further down.
@dataclass(slots=True, eq=False)
class _Resource:
    """One resource's pairs, in the table's order, and its thresholds in force at
    the convergence numbered `at` (the relative ones where they apply)."""

    name: str
    pairs: dict[str, _Pair] = field(default_factory=dict)  # initiator -> pair
    at: int = -1
    enter_bps: float = 0.0
    leave_bps: float = 0.0


@dataclass(slots=True, eq=False)
class _Pair:
    rate_bps: float
    last_s: float
    of: _Resource  # its resource's pairs
    initiator: str
    member: bool = False
    seen: bool = True  # got a sample since the last convergence
    away_since_s: float | None = None  # since when its samples are under the away floor


@dataclass
class SetChanges:
    """Changes of one convergence, per resource."""

    joined: dict[str, set[str]] = field(default_factory=dict)
    left: dict[str, set[str]] = field(default_factory=dict)
    # resources with a member that stopped writing (its samples under away_bps)
    # less than away_hold_s ago, while the resource is contended
    away: set[str] = field(default_factory=set)


class WriteHeavySets:
    """Per-resource sets of write-heavy initiators (pure; time passed in)."""

    def __init__(
        self,
        tau_s: float,
        enter_bytes_per_s: float,
        leave_bytes_per_s: float,
        share: float = 0.0,
        away_hold_s: float = 0.0,
    ) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"write-heavy share must be within 0-1, got {share}")
        if not 0.0 <= leave_bytes_per_s < enter_bytes_per_s:
            raise ValueError(
                "write-heavy thresholds need 0 <= leave < enter, got "
                f"leave={leave_bytes_per_s} enter={enter_bytes_per_s}"
            )
        if tau_s <= 0.0:
            raise ValueError(f"write-rate EWMA time constant must be > 0 s, got {tau_s}")
        self.tau_s = tau_s
        self.enter_bps = enter_bytes_per_s
        self.leave_bps = leave_bytes_per_s
        self.share = share
        self.away_hold_s = away_hold_s
        # a member writing under this is away (AWAY_FRACTION x leave)
        self.away_bps = AWAY_FRACTION * leave_bytes_per_s
        self._pairs: dict[tuple[str, str], _Pair] = {}  # the table, in order of arrival
        self._resources: dict[str, _Resource] = {}  # the same pairs by resource, initiator
        self._converges = 0  # convergences so far
        self.members: dict[str, set[str]] = {}  # resource -> initiators
        self.member_of: dict[str, set[str]] = {}  # initiator -> resources
        self.multi: set[str] = set()  # initiators that are members of two resources or more
        # resource -> its members of it alone, and those also of another (split(); kept
        # until its members or their other memberships change)
        self._split: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self._alpha_cache: dict[float, float] = {}

    def clear_alpha_cache(self) -> None:
        """After a change of tau_s."""
        self._alpha_cache.clear()

    def _alpha(self, dt_s: float) -> float:
        # Samples from one sensor pass share dt: one exp() per pass, not per pair.
        a = self._alpha_cache.get(dt_s)
        if a is None:
            if len(self._alpha_cache) > 64:
                self._alpha_cache.clear()
            a = self._alpha_cache[dt_s] = alpha_for(dt_s, self.tau_s)
        return a

    def _new_pair(self, resource: str, initiator: str, rate_bps: float, now_s: float) -> None:
        of = self._resources.get(resource)
        if of is None:
            of = self._resources[resource] = _Resource(resource)
        p = of.pairs[initiator] = _Pair(rate_bps, now_s, of, initiator)  # first sample seeds
        self._pairs[resource, initiator] = p

    def _drop_pair(self, p: _Pair) -> None:
        of = p.of
        del of.pairs[p.initiator]
        del self._pairs[of.name, p.initiator]
        if not of.pairs:
            del self._resources[of.name]

    def observe(self, resource: str, initiator: str, rate_bps: float, now_s: float) -> None:
        self.observe_many(((resource, initiator, rate_bps),), now_s)

    def observe_many(self, samples: Iterable[tuple[str, str, float]], now_s: float) -> None:
        """observe() for a whole sensor pass; the hot path of a convergence."""
        resources = self._resources
        away_bps = self.away_bps
        last_s = math.nan  # the previous pair's last_s, and its alpha: one per sensor pass
        a = 0.0
        for resource, initiator, rate in samples:
            # by resource, then initiator: two lookups of str keys, whose hashes the
            # strs keep, where the table's (resource, initiator) key is a new tuple per
            # sample to build, hash and compare (and to collect: tuples are tracked)
            of = resources.get(resource)
            p = None if of is None else of.pairs.get(initiator)
            if p is None:
                self._new_pair(resource, initiator, rate, now_s)
                continue
            if p.last_s != last_s:
                last_s = p.last_s
                a = self._alpha(now_s - last_s)
            r = p.rate_bps  # read once; r + a * (rate - r), as `+=` computes it
            p.rate_bps = r + a * (rate - r)
            p.last_s = now_s
            p.seen = True
            if rate < away_bps:
                if p.away_since_s is None:
                    p.away_since_s = now_s
            else:
                p.away_since_s = None

    def rate(self, resource: str, initiator: str) -> float | None:
        p = self._pairs.get((resource, initiator))
        return None if p is None else p.rate_bps

    def rates(self) -> dict[tuple[str, str], float]:
        return {k: p.rate_bps for k, p in self._pairs.items()}

    def converge(self, now_s: float, contended: Collection[str] = ()) -> SetChanges:
        """Re-evaluate every set. contended: resources whose latency is over their
        setpoint (the controller's view): the relative rule applies to them from
        CONTENDED_FLOOR_FRACTION x leave on, to the others from enter_bps."""
        out = SetChanges()
        away = out.away
        hold_s = self.away_hold_s
        leave_bps = self.leave_bps
        # 1. Every pair: fold in the silent ones; set aside, in table order, all but
        #    the members at or over leave_bps (they hold whatever the relative
        #    thresholds, which are lower).
        todo: list[_Pair] = []
        last_s = math.nan  # the previous silent pair's last_s, and its alpha
        a = 0.0
        for p in self._pairs.values():
            if p.seen:
                p.seen = False
            else:  # no sample this period: it wrote nothing
                if p.last_s != last_s:
                    last_s = p.last_s
                    a = self._alpha(now_s - last_s)
                p.rate_bps -= a * p.rate_bps
                p.last_s = now_s
                if p.away_since_s is None:
                    p.away_since_s = now_s
            if p.member:
                if p.away_since_s is not None and now_s - p.away_since_s < hold_s:
                    away.add(p.of.name)
                if p.rate_bps >= leave_bps:
                    continue  # hold
            todo.append(p)
        cont = frozenset(contended)
        out.away &= cont
        # 2. Those set aside, in the same order (the sets change as in one pass over
        #    the table), against their resource's thresholds (computed once, when
        #    first needed: the other resources' are not).
        self._converges = at = self._converges + 1
        forget_bps = FORGET_FRACTION * leave_bps
        dead: list[_Pair] = []
        for p in todo:
            of = p.of
            if of.at != at:
                self._thresholds(of, cont)
                of.at = at
            r = p.rate_bps
            if p.member:  # under leave_bps
                if r >= of.leave_bps:
                    continue  # hold
                p.member = False  # leave
                self._unlink(of.name, p.initiator)
                out.left.setdefault(of.name, set()).add(p.initiator)
            elif r > of.enter_bps:  # enter
                p.member = True
                self.members.setdefault(of.name, set()).add(p.initiator)
                of_initiator = self.member_of.setdefault(p.initiator, set())
                of_initiator.add(of.name)
                if len(of_initiator) == 2:
                    self.multi.add(p.initiator)
                for name in of_initiator:  # their splits change (the new one's, or multi)
                    self._split.pop(name, None)
                out.joined.setdefault(of.name, set()).add(p.initiator)
                continue
            if r <= forget_bps:  # forget
                dead.append(p)
        for p in dead:
            self._drop_pair(p)
        return out

    def _thresholds(self, of: _Resource, contended: Collection[str]) -> None:
        """A resource's thresholds in force: the absolute ones, or lower ones where
        the relative rule applies: a contended resource's writers above the floor
        enter and its members hold; a busy one's writers of their share of the fair
        share enter. From the sums over its pairs in table order."""
        enter_bps, leave_bps = self.enter_bps, self.leave_bps
        of.enter_bps, of.leave_bps = enter_bps, leave_bps
        if not self.share:
            return
        total = s2 = 0.0
        for p in of.pairs.values():
            r = p.rate_bps
            total += r
            s2 += r * r
        if of.name in contended:
            of.leave_bps = min(leave_bps, FORGET_FRACTION * leave_bps)
            if total > (floor := CONTENDED_FLOOR_FRACTION * leave_bps):
                of.enter_bps = min(enter_bps, floor)
        elif total > enter_bps:
            fair = self.share * s2 / total
            if fair < enter_bps:
                of.enter_bps = fair
                of.leave_bps = min(leave_bps, fair * (leave_bps / enter_bps))

    def _unlink(self, resource: str, initiator: str) -> None:
        self.members[resource].discard(initiator)
        self._split.pop(resource, None)
        of = self.member_of[initiator]
        of.discard(resource)
        if len(of) == 1:
            self.multi.discard(initiator)
            for name in of:  # a member of that one alone now
                self._split.pop(name, None)
        elif not of:
            del self.member_of[initiator]

    def split(self, resource: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """A resource's members: those that are members of it alone, and those that are
        also members of another resource (`multi`), each in the members' set order.
        Kept until one of its members joins or leaves a set: a tick reads it for
        every resource whose class moved, a convergence rarely changes it."""
        got = self._split.get(resource)
        if got is None:
            members, multi = self.members.get(resource, ()), self.multi
            alone = tuple([i for i in members if i not in multi])
            shared = tuple([i for i in members if i in multi])
            got = self._split[resource] = (alone, shared)
        return got

    def forget_resource(self, resource: str) -> set[str]:
        """Drop a resource that went away; returns the members it had."""
        gone = set(self.members.get(resource, ()))
        for initiator in gone:
            self._unlink(resource, initiator)
        self.members.pop(resource, None)
        self._split.pop(resource, None)
        of = self._resources.pop(resource, None)
        if of is not None:
            for initiator in of.pairs:
                del self._pairs[resource, initiator]
        return gone
