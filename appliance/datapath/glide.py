"""The glide planner: initiators change delay class without reordering their packets (pure).

Problem
    Lowering an initiator's delay reorders its packets: those sent after the
    move overtake those still queued at the old delay.  The target's RACK
    window is min_rtt/4 (5-10 us on a LAN) while a step is 500 us, so the
    overtaken segments are retransmitted (lab: 41-399 target retransmissions
    for 4 x (20 -> 10 -> 0 ms) under a 64k qd4 read without this; 0 with it,
    docs/datapath.md).  More delay does not reorder by itself, but HTB does
    when a dequeue runs late: it serves the lowest prio with a packet due and
    round-robins within a prio (datapath/names.py, class_prio), so a rise
    between two classes of the same prio can let the new class go first.

The mechanism (a glide leaf)
    A glide leaf is an HTB class of prio 7 (after every shared class) with a
    netem that has a rate, which makes it a FIFO: a packet leaves at
    max(previous departure, now + delay) + its transmission time, and a
    change of its delay in place (one RTM_NEWQDISC) keeps the queue.  A
    descent c -> k < c moves the initiators into a free leaf set to c (same
    delay: nothing overtakes), then lowers the leaf to k in place -- but not
    before class c's delay after the move: until then the packets sent before it
    still wait in the shared class c, and nothing in the leaf holds the new
    ones behind them.  A rise within one HTB prio takes a free leaf at the
    new delay (served after the class it left).  Initiators moving together
    share a leaf; a leaf its group fills glides again, or goes up, in place.
    The leaf hands its members to the shared class of its delay (out of the
    set at 0) once the packets of any higher delay it had have left, and
    only after a look at the kernel that saw the leaf quiet since the look
    before: nothing queued, and less than a packet per tick on average
    (nothing queued at one look is not enough: a packet entering the leaf
    between that look and the ipset change would be overtaken by the next
    one, from the class it is handed to; that takes traffic, which a tick of
    silence, or a keepalive's few packets in seconds, makes unlikely).  A
    member whose traffic never pauses rides in its leaf: as good as a class
    of its own.

States of a leaf (LeafState; `state(now)`)

    FREE      no members, nothing of a higher delay left in it: can be taken
    DRAINING  no members; packets of a higher delay leave until busy_until_s
    LOWERING  members moved in at their old delay; lowered to lower_to at lower_at_s
    GLIDING   members at the leaf's delay; older packets of a higher delay
              leave until busy_until_s
    HANDOFF   members; waits for a look at the kernel that sees the leaf quiet

    FREE --plan: descent/rise--> LOWERING (descent) or GLIDING (rise)
    LOWERING --entered/lowerings: due--> GLIDING (delay lowered in place)
    GLIDING --time--> HANDOFF --handoffs: a quiet look--> DRAINING --time--> FREE
    any state with members --plan: its whole group moves again--> in place

Interface (pure: time and the kernel's readings are inputs)
    plan(ops, mode, members, now) -> GlidePlan(before, ops, after)
        rewrites a batch of ipset ops; `before` delays are set first
    moved(before, after, ops, now)        the ops were sent
    entered(plan, now) -> [LeafDelay]     delays to set now (the rest wait)
    lowerings(now) -> [LeafDelay]         waiting lowerings that are due
    looks(now) -> [minor]                 leaves whose queue must be read
    handoffs(readings, members, now) -> [op]   members to hand on
    sync(members) / adopt(delays, now) / lost()   state read back from the kernel
    The state assumes every returned action succeeds; the actuator calls
    lost() when one fails, and the next read-back re-adopts every leaf.

Worked example (the default ladder: 0.5 ms steps up to 10 ms)
    10.0.0.4 in class 12 (6 ms) goes to 10 at t = 100.000: plan -> before
    [leaf 6000 to 12], ops [add 10.0.0.4 to santhrottle-all at 5374:6000];
    entered at 100.000 -> [] (lowering to 10 due at 100.006: LOWERING);
    lowerings(100.0061) -> [leaf 6000 to 10] (GLIDING until 100.0121, when
    the 6 ms packets have left); looks(100.0122) -> [6000]; two quiet looks
    later handoffs -> [add 10.0.0.4 at 5374:10]; the leaf drains until
    100.0172 (DRAINING), then it is FREE again.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from santhrottle.appliance.datapath.members import Op
from santhrottle.appliance.datapath.names import (
    CLASS_PRIO,
    GLIDE_MINOR_BASE,
    MINOR_CLASS,
    SET_MODE,
    class_minor,
    glide_minor,
    is_glide_minor,
    minor_class,
    set_name,
)
from santhrottle.controller.ladder import Ladder

# The gap between two pairs of looks at a HANDOFF leaf whose traffic goes on
# (GlidePlanner.handoffs): doubling from the first to the last.
LOOK_GAP_MIN_S = 0.2
LOOK_GAP_MAX_S = 0.8
# A look is quiet when the leaf queues nothing and sent fewer packets since the
# look before than one per this long (the daemon's tick): a tick of silence
# between looks a tick apart; a session's keepalives between looks seconds apart
# (a loaded host, a caller slower than the tick).
LOOK_QUIET_GAP_S = 0.1


class LeafState(enum.Enum):
    FREE = "free"
    DRAINING = "draining"
    LOWERING = "lowering"
    GLIDING = "gliding"
    HANDOFF = "handoff"


@dataclass(frozen=True, slots=True)
class LeafDelay:
    """An action: set glide leaf `minor`'s netem delay to class klass's, in place."""

    minor: int
    klass: int


@dataclass(slots=True)
class GlideLeaf:
    minor: int
    klass: int = 0  # its netem delay now, in classes
    members: set[str] = field(default_factory=set)
    # until then it still holds packets of a higher delay it had (or of
    # members that left): not to be handed on or reused before
    busy_until_s: float = 0.0
    # until then its members' packets from before they moved in may still
    # wait in their shared class: its delay must not go down to lower_to yet
    lower_at_s: float = 0.0
    lower_to: int | None = None
    # packets it had sent at the last look while due to hand its members on, and when
    sent_seen: int | None = None
    seen_at_s: float = 0.0
    # looks at a HANDOFF leaf whose traffic goes on come in pairs, a tick apart,
    # with a growing gap between pairs (LOOK_GAP_MIN_S .. LOOK_GAP_MAX_S)
    next_look_s: float = 0.0
    look_gap_s: float = 0.0
    pair_open: bool = False  # the last look saw traffic; the next one follows at once
    known: bool = False  # its delay is known (set by this planner, or adopted)

    def quiet(self, queued: int, sent: int | None, now: float) -> bool:
        """A look: nothing queued, and fewer packets sent since the last look than one
        per LOOK_QUIET_GAP_S (the first look of an episode only takes the count)."""
        before, before_s = self.sent_seen, self.seen_at_s
        self.sent_seen, self.seen_at_s = sent, now
        if queued:
            return False
        if sent is None:  # no reading: the queue is all there is
            return True
        if before is None:
            return False
        passed = sent - before
        return passed == 0 or passed * LOOK_QUIET_GAP_S < now - before_s - 1e-9

    def state(self, now: float) -> LeafState:
        if not self.members:
            return LeafState.FREE if now >= self.busy_until_s else LeafState.DRAINING
        if self.lower_to is not None:
            return LeafState.LOWERING
        return LeafState.HANDOFF if now >= self.busy_until_s else LeafState.GLIDING


class LeafView(NamedTuple):
    minor: int
    state: LeafState
    klass: int
    members: list[str]
    lower_to: int | None


@dataclass(slots=True)
class GlidePlan:
    before: list[LeafDelay]
    ops: list[Op]
    after: list[LeafDelay]


class GlidePlanner:
    """The glide leaves' state machine (module header)."""

    def __init__(self, count: int, ladder: Ladder) -> None:
        self.count = count
        self.ladder = ladder
        self.max_class = ladder.max_class
        self._delay_s = [ladder.delay_s(k) for k in range(ladder.max_class + 1)]
        self.leaves: dict[int, GlideLeaf] = {}
        self.forget()
        self.glided = 0  # initiators moved down through a glide leaf
        self.unordered = 0  # descents made without one (every leaf busy)

    def forget(self) -> None:
        """No leaf holds anything (the tree was just built or removed)."""
        self.leaves = {glide_minor(i): GlideLeaf(glide_minor(i)) for i in range(self.count)}

    # ------------------------------------------------------------ reading
    def class_of(self, minor: int) -> int:
        """The delay class a member whose skbprio has this HTB minor has now."""
        if is_glide_minor(minor):
            leaf = self.leaves.get(minor)
            return leaf.klass if leaf is not None else 0
        return minor_class(minor) or 0

    def class_table(self) -> dict[int, int]:
        """HTB minor -> delay class now, for every class and leaf (class_of, as a dict:
        the planning of 10,000 moves looks it up 20,000 times)."""
        table = dict(MINOR_CLASS)
        for minor, leaf in self.leaves.items():
            table[minor] = leaf.klass
        return table

    def state(self, minor: int, now: float) -> LeafState:
        return self.leaves[minor].state(now)

    def idle(self) -> bool:
        """No leaf holds a member or waits to be lowered: nothing can come due."""
        return not any(leaf.members or leaf.lower_to is not None for leaf in self.leaves.values())

    # ----------------------------------------------- state from the kernel
    def sync(self, members: Mapping[str, tuple[str, int]]) -> list[int]:
        """The membership read back from the kernel; returns the leaves that
        have members but whose delay this planner does not know (adopt them)."""
        for leaf in self.leaves.values():
            leaf.members.clear()
        for ip, (_mode, minor) in members.items():
            if is_glide_minor(minor):
                self.leaves.setdefault(minor, GlideLeaf(minor)).members.add(ip)
        return sorted(m for m, leaf in self.leaves.items() if leaf.members and not leaf.known)

    def adopt(self, delays_us: Mapping[int, int], now: float) -> None:
        """The kernel's delays of leaves sync() named; what they hold may be that old."""
        for minor, delay_us in delays_us.items():
            leaf = self.leaves.setdefault(minor, GlideLeaf(minor))
            leaf.klass = self.ladder.class_at_least(delay_us / 1e6)
            leaf.busy_until_s = now + delay_us / 1e6
            leaf.lower_to = None
            leaf.known = True
            leaf.sent_seen = None  # its looks start over (_delay)

    def lost(self) -> None:
        """An action failed: the kernel's delays are unknown until re-adopted."""
        for leaf in self.leaves.values():
            leaf.known = False
            leaf.lower_to = None

    # ------------------------------------------------------------ planning
    def plan(
        self, ops: Sequence[Op], mode: str, members: Mapping[str, tuple[str, int]], now: float
    ) -> GlidePlan:
        """Rewrite the ops of initiators whose delay goes down (same mode):
        per (from, to) group one leaf takes them all (a leaf they fill, else a
        free one set to the old delay first), then its delay goes down in
        place.  A group that fills a leaf and goes up goes up in place; a
        rise from a shared class to one of the same HTB prio takes a free
        leaf at the new delay; any other rise takes the shared class."""
        klass = self.class_table()
        prio = CLASS_PRIO
        last: dict[str, Op] = {}  # each initiator's last op (an initiator has one or two)
        multi: dict[str, list[Op]] = {}
        for op in ops:
            ip = op[2]
            if ip in last:
                multi.setdefault(ip, [last[ip]]).append(op)
            last[ip] = op

        def ops_of(ip: str) -> list[Op]:
            return multi.get(ip) or [last[ip]]

        groups: dict[tuple[int, int], list[str]] = {}
        keep: list[Op] = []
        for ip, lop in last.items():
            k = klass.get(lop[3], 0) if lop[0] == "add" else 0
            cur = members.get(ip)
            if cur is not None and cur[0] == mode:
                c, in_leaf = klass.get(cur[1], 0), cur[1] in self.leaves
            else:
                c, in_leaf = 0, False
            same_prio = 0 < c < k and prio[c] == prio[k]
            if SET_MODE[lop[1]] == mode and (c > k or (c < k and (in_leaf or same_prio))):
                groups.setdefault((c, k), []).append(ip)
            else:
                keep.extend(ops_of(ip))
        before: list[LeafDelay] = []
        after: list[LeafDelay] = []
        taken: set[int] = set()
        for (c, k), ips in groups.items():
            group = set(ips)
            own = {members[ip][1] for ip in ips if is_glide_minor(members[ip][1])}
            full = sorted(m for m in own if m in self.leaves and self.leaves[m].members <= group)
            rise = c < k
            if rise and not full and own:  # a rise that splits a leaf: the shared class
                keep.extend(op for ip in ips for op in ops_of(ip))
                continue
            minor = full[0] if full else self._free(now, taken)
            if minor is None:  # every leaf busy: the shared class (a descent is counted)
                self.unordered += 0 if rise else len(ips)
                keep.extend(op for ip in ips for op in ops_of(ip))
                continue
            taken.add(minor)
            self.glided += 0 if rise else len(ips)
            if not full:  # a descent enters at the old delay, a rise at the new one
                before.append(self._delay(minor, k if rise else c, now))
            keep.extend(
                ("add", set_name(mode, ip), ip, minor) for ip in ips if members[ip][1] != minor
            )
            after.append(LeafDelay(minor, k))
        return GlidePlan(before, keep, after)

    def moved(
        self,
        before: Mapping[str, tuple[str, int]],
        after: Mapping[str, tuple[str, int]],
        ops: Sequence[Op],
        now: float,
    ) -> None:
        """These ops were sent at `now`: the membership went from before to after."""
        for leaf in self.leaves.values():
            gone = [ip for ip in leaf.members if after.get(ip) != before.get(ip)]
            if not gone:
                continue
            leaf.members.difference_update(gone)  # what they sent leaves at the leaf's delay
            leaf.busy_until_s = max(leaf.busy_until_s, now + self._delay_s[leaf.klass])
            if not leaf.members:
                leaf.lower_to = None
        for verb, _name, ip, minor in ops:
            if verb == "add" and minor >= GLIDE_MINOR_BASE and after.get(ip, ("", 0))[1] == minor:
                self.leaves.setdefault(minor, GlideLeaf(minor)).members.add(ip)

    def entered(self, plan: GlidePlan, now: float) -> list[LeafDelay]:
        """After the plan's ops were sent at `now`: the delays to set now; a
        lowering that is not due yet waits (LOWERING, see lowerings())."""
        fresh = {d.minor for d in plan.before}
        out = []
        for d in plan.after:
            leaf = self.leaves[d.minor]
            if d.minor in fresh:  # moved in at delay <= leaf.klass: those packets leave by then
                leaf.lower_at_s = now + self._delay_s[leaf.klass]
            if d.klass == leaf.klass:  # a rise that entered a fresh leaf at its new delay
                leaf.lower_to = None
            elif d.klass < leaf.klass and now < leaf.lower_at_s:
                leaf.lower_to = d.klass
            else:
                leaf.lower_to = None
                out.append(self._delay(d.minor, d.klass, now))
        return out

    # ------------------------------------------------------------ settling
    def lowerings(self, now: float) -> list[LeafDelay]:
        """Waiting lowerings that are due (the members' older packets have left)."""
        out = []
        for leaf in self.leaves.values():
            if leaf.lower_to is not None and (not leaf.members or now >= leaf.lower_at_s):
                k, leaf.lower_to = leaf.lower_to, None
                if leaf.members:
                    out.append(self._delay(leaf.minor, k, now))
        return out

    def looks(self, now: float) -> list[int]:
        """The leaves in HANDOFF whose look is due: their queue and sent packets must
        be read (a leaf whose traffic goes on is looked at in pairs: see handoffs())."""
        return [
            m
            for m, leaf in self.leaves.items()
            if leaf.state(now) is LeafState.HANDOFF and now + 1e-9 >= leaf.next_look_s
        ]

    def handoffs(
        self,
        readings: Mapping[int, tuple[int, int]],
        members: Mapping[str, tuple[str, int]],
        now: float,
    ) -> list[Op]:
        """The ops that hand the members of every quiet HANDOFF leaf to the
        shared class of its delay (out of the set at 0).  readings: minor ->
        (packets queued, packets sent), summed over the devices.

        A look is quiet when nothing is queued and fewer packets passed since
        the look before than one per LOOK_QUIET_GAP_S: nothing in a tick, a
        keepalive or two in seconds (looks that far apart when every call is
        slow: a loaded host).  A look that sees traffic is followed by one at
        the next call (a tick later: the pair sees a tick of silence, as every
        look did before); a pair that sees traffic both times waits
        LOOK_GAP_MIN_S, then twice as long each time, up to LOOK_GAP_MAX_S,
        before the next pair, whose first look hands the members on if the
        gap was as quiet.  A member that never pauses costs two readings a
        gap, not ten a second (each is a netlink round trip the emulated lab
        pays ~15 ms for)."""
        ops: list[Op] = []
        for minor in self.looks(now):
            leaf = self.leaves[minor]
            queued, sent = readings.get(minor, (0, None))
            if not leaf.quiet(queued, sent, now):
                if leaf.pair_open:  # both looks of a pair saw traffic: wait longer
                    leaf.look_gap_s = min(LOOK_GAP_MAX_S, max(LOOK_GAP_MIN_S, 2 * leaf.look_gap_s))
                    leaf.next_look_s = now + leaf.look_gap_s
                leaf.pair_open = not leaf.pair_open
                continue
            for ip in sorted(leaf.members):
                name = set_name(members[ip][0], ip)
                if leaf.klass:
                    ops.append(("add", name, ip, class_minor(leaf.klass)))
                else:
                    ops.append(("del", name, ip, 0))
        return ops

    def views(self, now: float) -> list[LeafView]:
        """Each leaf for status: minor, state, delay class, members, pending lowering."""
        return [
            LeafView(m, leaf.state(now), leaf.klass, sorted(leaf.members), leaf.lower_to)
            for m, leaf in sorted(self.leaves.items())
        ]

    # ------------------------------------------------------------ internal
    def _free(self, now: float, taken: set[int]) -> int | None:
        for i in range(self.count):
            minor = glide_minor(i)
            leaf = self.leaves.setdefault(minor, GlideLeaf(minor))
            if minor not in taken and leaf.state(now) is LeafState.FREE:
                return minor
        return None

    def _delay(self, minor: int, k: int, now: float) -> LeafDelay:
        """Record a leaf's new delay (the caller sets it in the kernel)."""
        leaf = self.leaves.setdefault(minor, GlideLeaf(minor))
        if k < leaf.klass:  # its packets at the old delay leave by then
            leaf.busy_until_s = max(leaf.busy_until_s, now + self._delay_s[leaf.klass])
        leaf.klass = k
        leaf.known = True
        # a new episode: its looks start over, the first one only takes the leaf's count
        # (compared with a count from before, a look made just after members moved in
        # would call them quiet whatever they send)
        leaf.next_look_s, leaf.look_gap_s, leaf.pair_open = 0.0, 0.0, False
        leaf.sent_seen = None
        return LeafDelay(minor, k)
