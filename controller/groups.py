"""Initiator groups on a resource: Maestro's shares turned into delay classes.

Problem
    On a resource with groups (config [groups.NAME]), who is delayed and by
    how much follows the groups' targets and priorities (controller/maestro.py)
    instead of the resource's one threshold: a database group that must see
    5 ms is protected, a backup group that may see 50 ms gives way, and when
    not every target can be met each falls short in inverse proportion to its
    priority. Initiators of the resource in no group form the group "default"
    (no target, priority default_priority): best effort, it gives way first.

Measured signal (IoSample per (resource, initiator), every interval)
    Over the interval (the convergence, 1 s): IOs, bytes and reads
    completed, and the reads' mean latency at the array (the wire's per
    initiator in bridge mode; on a target host the resource's diskstats
    latency stands for every initiator's). Per group, summed:
        X  = bytes / interval   (throughput; IOPS = IOs / interval)
        L  = the group's mean read latency at the array (the resource's
             when it has no reads of its own)
        d  = the delay its class adds (every packet to a delayed initiator,
             its reads' data too), so it sees L + d
        y  = maestro.normalised(target latency, L + d, target, X); with a
             disk-time reservation (utilization_target) the lower of that
             and disktime.reservation_y of its share of the busy time (its
             IOs' time at the array over every group's); 1 for a group
             without a target
        q  = IOPS * (L + d)     (Little: its IOs outstanding, in our delay
             or at the array; for closed streams the same at any delay)

The knob: a share u -> a delay d
    Maestro's scheduler bounds each application's IOs at the array; ours
    delays its packets. A group whose streams keep q IOs outstanding, each
    spending L at the array and d in our delay, has q * L / (L + d) of them
    at the array (Little). Its share u of the resource's concurrency
    C = sum q (every group's demand: nobody delayed) is C * u IOs, so
        d = L * (w / u - 1)   for u < w = q / C,   0 for u >= w.
    A share above the group's demand w is not concurrency it uses but
    concurrency the others are denied: it is how a protected group that
    delays nobody makes the others give way. This is why Maestro's 80 %
    utilisation rule is left out: here a share beyond use is the lever.
    The delay is rounded up to the ladder's next class (class_at_least):
    a share is never exceeded by rounding.

Each interval, per grouped resource
    1. A group with IOs this interval is active; one seen for the first
       time starts at its demand share w (no delay), the shares of the
       others scaled down to make room; one that went quiet leaves, its
       share spread over the rest in proportion.
    2. model.observe(share in force, y); claims -> maestro.arbitrate, each
       with its change limit l_i = f_i x (sum over groups of
       min(u, w)): a share point is C/100 IOs, and what that does to the
       latency depends on how many IOs the array holds in all (a backup
       group throttled to a tenth of its demand moves its IOs at the array
       by half with a change of 0.05 of C). f_i starts at
       LIMIT_MAX_FRACTION, grows x LIMIT_GROW while the group's share moves
       one way and shrinks x LIMIT_SHRINK (not under LIMIT_MIN_FRACTION) when
       it turns: its delay follows its share a tick or more late, and full
       changes each way would oscillate.
    3. Shares -> delays -> classes: the group's target class. L and d are
       means over the interval (its IOs' latency at the array; the delay of
       the class in force at each tick); the L of d = L(w/u - 1) is smoothed
       over intervals (KNOB_LATENCY_ALPHA): with this interval's L, a high
       L asks a long delay, which brings a low L, which asks a short one,
       a swing of a few seconds in a heavily throttled group. q is peak-held
       (DEMAND_DECAY_PER_INTERVAL): an interval in which writers start or
       pause shows part of their demand, and a demand that looks halved
       would halve their delay.
Every tick the class in force moves to the target class: up by the ramp,
down by class_decrease_max_per_tick (ramp.py's move_toward), as a resource's
class does (a delay that falls too fast reorders and retransmits).

Paused (GroupsState.applied False: the daemon's `santhrottle pause`)
    The groups are measured (latency, throughput, y, PWFTE, with no delay
    counted: the data path applies none) but nothing is decided: the
    models learn nothing, the shares and target classes stay, and a resume
    goes on from where the pause began.

Idle behaviour
    A resource without IOs in an interval keeps its groups' shares and
    classes; a group without IOs for GROUP_IDLE_INTERVALS intervals leaves
    and its initiators go back to class 0 (gradually).

How to watch it
    GroupState per (resource, group): measured latency and throughput, y,
    PWFTE, share, demand share, the model (beta, default or fitted), delay
    and classes; `santhrottle-simulate` prints them per group and plots
    them over time (sim/groups.py, docs/groups.md).

Worked example (the ladder's 0.5 ms steps)
    Two groups on one resource, L = 20 ms: "db" (q = 1, latency target
    10 ms, p = 2) and "backup" (q = 9, no target), shares = demand shares
    w = 0.1 / 0.9 (nobody delayed: in use 1.0, l = 0.1), y_db = 0.5,
    y_backup = 1. Requests: db 0.1 + 0.5 -> 0.2, backup 0.9: sum 1.1 > 1,
    overload. PWFTE e_db = 2 * (0.5 - (u - 0.1)) = 2 * (0.6 - u), e_backup
    = -(u - 0.9); boxes [0.005, 0.2] and [0.8, 1.0]: u_db = 0.2, u_backup
    = 0.8 (e = 0.8 and 0.1: db at its top). backup's delay: 20 ms * (0.9 /
    0.8 - 1) = 2.5 ms -> class 5. While db is short the shares move on:
    backup at 0.5 gets 20 * (0.9 / 0.5 - 1) = 16 ms.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from .disktime import attribute, reservation_y
from .domain import IoSample
from .ladder import Ladder
from .levels import Levels, highest_class
from .maestro import (
    LIMIT_MAX_FRACTION,
    U_MIN_FRACTION,
    Claim,
    Model,
    arbitrate,
    normalised,
    pwfte,
)
from .ramp import move_toward

# The implicit group of a grouped resource's initiators in no group.
DEFAULT_GROUP = "default"
# A group without IOs this many intervals in a row leaves its resource; until then it
# keeps its share, so writers that pause (the method paper: 5 s) come back to the
# share they had, not to their demand.
GROUP_IDLE_INTERVALS = 30
# A group's demand (IOs outstanding) is the larger of this interval's and the last
# one's times this: writers that start or pause within an interval show part of
# their demand in it, and a demand that looks halved halves the delay (d = L(w/u - 1)).
DEMAND_DECAY_PER_INTERVAL = 0.8
# A group's change limit adapts (_adapt_limit): x LIMIT_GROW per interval its share
# keeps moving one way, x LIMIT_SHRINK when it turns, never under LIMIT_MIN_FRACTION.
# The knob's L (d = L(w/u - 1)) is an EWMA over intervals with this weight of the
# newest: a time constant of about 3 intervals.
KNOB_LATENCY_ALPHA = 0.3
LIMIT_GROW = 1.5
LIMIT_SHRINK = 0.7
LIMIT_MIN_FRACTION = 0.05


@dataclass(frozen=True, slots=True)
class Group:
    """A group's targets and priority (the members are mapped by the caller)."""

    name: str
    priority: float = 1.0
    latency_target_s: float | None = None
    throughput_target_bps: float | None = None
    throughput_target_iops: float | None = None
    utilization_target: float | None = None  # its share of the busy time (disktime.py)
    levels: tuple[Levels, ...] = ()  # rate ceilings that rise with headroom (levels.py)

    @property
    def targeted(self) -> bool:
        """A group with a target makes its resources arbitrated (the others there are best
        effort); without one there is nothing to arbitrate: its resources keep their PID."""
        t = self.latency_target_s, self.throughput_target_bps, self.throughput_target_iops
        return any(x is not None for x in (*t, self.utilization_target))


@dataclass(slots=True)
class GroupState:
    """One group on one resource."""

    model: Model = field(default_factory=Model)
    share: float = 0.0  # u in force
    demand: float = 0.0  # w = q / C, this interval
    q: float = 0.0  # IOs outstanding (Little), peak-held (DEMAND_DECAY_PER_INTERVAL)
    y: float | None = None
    pwfte: float = 0.0
    latency_s: float | None = None  # as the group sees it: its reads' L + d
    io_latency_s: float = 0.0  # its IOs' mean latency at the array (the knob's L)
    throughput_bps: float = 0.0
    iops: float = 0.0
    delay_s: float = 0.0  # the target class's delay
    target_class: int = 0
    delay_class: int = 0  # in force (moves to target_class tick by tick)
    idle_intervals: int = 0
    limit: float = LIMIT_MAX_FRACTION  # its change limit, a fraction of the in-use share
    last_way: int = 0  # the sign of its last share change
    knob_latency_s: float = 0.0  # io_latency_s smoothed (KNOB_LATENCY_ALPHA)
    delay_sum_s: float = 0.0  # the delay in force, summed over the interval's ticks
    delay_ticks: int = 0
    members: frozenset[str] = frozenset()  # initiators seen this interval
    busy_share: float = 0.0  # its share of the resource's busy time (disktime.py)
    held_back: bool = False  # its class delayed it over the interval


@dataclass(slots=True)
class GroupedResource:
    groups: dict[str, GroupState] = field(default_factory=dict)
    overloaded: bool = False
    latency_s: float | None = None  # the resource's read latency over the interval


@dataclass(slots=True)
class GroupsState:
    """Every grouped resource's groups, and who is in which group."""

    groups: dict[str, Group] = field(default_factory=dict)  # name -> spec
    group_of: dict[str, str] = field(default_factory=dict)  # initiator -> group name
    resources: dict[str, GroupedResource] = field(default_factory=dict)
    default_priority: float = 1.0
    limit_max_fraction: float = LIMIT_MAX_FRACTION
    # False while the data path applies no class (the daemon paused): a group's
    # latency is then its IOs' alone, not its class's delay added to them
    applied: bool = True

    def spec(self, name: str) -> Group:
        g = self.groups.get(name)
        return g if g is not None else Group(DEFAULT_GROUP, self.default_priority)

    def classed_members(self) -> Iterator[tuple[int, Iterable[str]]]:
        """(class, members) of every group in force over a grouped resource."""
        for gr in self.resources.values():
            for gs in gr.groups.values():
                if gs.delay_class:
                    yield gs.delay_class, gs.members

    def class_by_initiator(self) -> dict[str, int]:
        """initiator -> its highest class in force over the grouped resources (> 0 only)."""
        return highest_class(self.classed_members())


def regroup(
    st: GroupsState,
    groups: Sequence[Group],
    group_of: Mapping[str, str],
    ungrouped: Iterable[str] = (),
    default_priority: float = 1.0,
) -> set[str]:
    """New specs (targets, priorities) and membership: live, from the next interval.

    Shares, models and classes stay (a priority change moves the shares by at
    most limit_max_fraction per interval); a group that no longer exists goes at
    the next interval, its initiators into "default". The resources in
    `ungrouped` leave the groups; returns their initiators (their classes go)."""
    st.groups = {g.name: g for g in groups}
    st.group_of = dict(group_of)
    st.default_priority = default_priority
    out: set[str] = set()
    for name in ungrouped:
        gr = st.resources.pop(name, None)
        if gr is not None:
            for gs in gr.groups.values():
                out.update(gs.members)
    return out


def run_intervals(
    st: GroupsState,
    grouped: Iterable[str],
    samples: Iterable[IoSample],
    span_s: float,
    ladder: Ladder,
    latency_of: Mapping[str, float | None],
    utilization_of: Mapping[str, float] | None = None,
) -> None:
    """interval() on every grouped resource, each with its own samples."""
    by_res: dict[str, list[IoSample]] = {name: [] for name in grouped}
    for io in samples:
        mine = by_res.get(io.resource)
        if mine is not None:
            mine.append(io)
    util = utilization_of or {}
    for name, ios in by_res.items():
        interval(st, name, ios, span_s, ladder, latency_of.get(name), util.get(name))


def interval(
    st: GroupsState,
    resource: str,
    samples: Sequence[IoSample],
    span_s: float,
    ladder: Ladder,
    resource_latency_s: float | None,
    utilization: float | None = None,
) -> None:
    """One Maestro interval on one grouped resource: shares and target classes.
    utilization: the resource's over the interval (a disk-time reservation's, disktime.py)."""
    gr = st.resources.setdefault(resource, GroupedResource())
    agg: dict[str, _Acc] = {}
    group_of = st.group_of
    for s in samples:  # 10,000s per interval (make bench): no more than this per sample
        g = group_of.get(s.initiator, DEFAULT_GROUP)
        acc = agg.get(g)
        if acc is None:
            acc = agg[g] = _Acc()
        acc.add(s)
    whole = _Acc.total(agg.values())
    res_lat = whole.io_latency_s(resource_latency_s)
    gr.latency_s = res_lat
    if res_lat is None or not agg:  # nothing measured: hold
        return
    active = _active(st, gr, agg)
    q: dict[str, float] = {}
    busy: dict[str, float] = {}
    for g in active:
        acc = agg[g]
        gs = gr.groups.setdefault(g, GroupState())
        gs.idle_intervals = 0
        gs.members = frozenset(acc.initiators)
        # the delay its IOs met over the interval (the class moved tick by tick)
        delay = (
            gs.delay_sum_s / gs.delay_ticks if gs.delay_ticks else ladder.delay_s(gs.delay_class)
        )
        gs.delay_sum_s, gs.delay_ticks = 0.0, 0
        gs.io_latency_s = acc.io_latency_s(res_lat) or res_lat
        # the knob's L, smoothed: d = L(w/u - 1) with this interval's L swings (a high
        # L asks a long delay, which brings a low L, which asks a short one ...)
        gs.knob_latency_s = (
            gs.io_latency_s
            if not gs.knob_latency_s
            else gs.knob_latency_s + KNOB_LATENCY_ALPHA * (gs.io_latency_s - gs.knob_latency_s)
        )
        gs.latency_s = (acc.read_latency_s() or gs.io_latency_s) + delay
        gs.iops = acc.ios / span_s
        gs.throughput_bps = acc.bytes / span_s
        # Little, peak-held: an interval the streams started or paused in shows less
        gs.q = max(gs.iops * (gs.io_latency_s + delay), gs.q * DEMAND_DECAY_PER_INTERVAL)
        q[g] = gs.q
        gs.held_back = delay > 0.0
        # its IOs' time at the array (Little: its mean IOs in flight): its disk time's weight
        busy[g] = acc.lat_sum + (acc.ios - acc.timed_ios) * gs.io_latency_s
    total_q = sum(q.values())
    if total_q <= 0.0:
        return
    busy = attribute(busy, {g: agg[g].busy_s for g in active}, (utilization or 0.0) * span_s)
    total_busy = sum(busy.values()) or 1.0
    for g in active:
        gr.groups[g].demand = q[g] / total_q
        gr.groups[g].busy_share = busy[g] / total_busy
    _make_room(gr, active)
    # 2. models, claims, the arbiter
    # the change limit, in shares of the demand C: a fraction of what is at the array
    in_use = sum(min(gr.groups[g].share, gr.groups[g].demand) for g in active)
    claims = []
    for g in active:
        gs = gr.groups[g]
        spec = st.spec(g)
        y = normalised(
            spec.latency_target_s,
            gs.latency_s,
            spec.throughput_target_bps,
            gs.throughput_bps,
        )
        if spec.throughput_target_iops is not None:
            yi = gs.iops / spec.throughput_target_iops
            y = yi if y is None else min(y, yi)
        if spec.utilization_target is not None:
            t, u, w = spec.utilization_target, gs.share, gs.demand
            yu = reservation_y(t, gs.busy_share, gs.held_back, utilization, u, w)
            y = yu if y is None else min(y, yu)
        gs.y = y
        y_eff = 1.0 if y is None else y
        if not st.applied:  # paused: measured, not decided (nor learnt: no delay is in y)
            gs.pwfte = spec.priority * (1.0 - y_eff)
            continue
        beta = gs.model.observe(gs.share, y_eff)
        cl = Claim(spec.priority, y_eff, gs.share, beta, gs.limit * in_use)
        gs.pwfte = pwfte(cl)
        claims.append(cl)
    if not st.applied:
        return
    shares, gr.overloaded = arbitrate(claims, st.limit_max_fraction * in_use)
    for g, u in zip(active, shares, strict=True):
        _adapt_limit(gr.groups[g], u, st.limit_max_fraction)
    # 3. shares -> delays -> target classes
    for g, u in zip(active, shares, strict=True):
        gs = gr.groups[g]
        gs.share = u
        gs.delay_s = share_delay_s(gs.knob_latency_s, gs.demand, u)
        gs.target_class = ladder.class_at_least(gs.delay_s)


@dataclass(slots=True)
class _Acc:
    """IoSamples summed (one group's, or the resource's)."""

    ios: float = 0.0
    bytes: float = 0.0
    reads: float = 0.0
    read_lat_sum: float = 0.0
    timed_ios: float = 0.0
    lat_sum: float = 0.0
    busy_s: float | None = 0.0  # its own LUNs' (IoSample.busy_s); None once one has none
    initiators: set[str] = field(default_factory=set)

    def add(self, s: IoSample) -> None:
        _, ini, ios, nbytes, reads, read_lat, lat, busy = s
        self.busy_s = None if busy is None or self.busy_s is None else self.busy_s + busy
        self.ios += ios
        self.bytes += nbytes
        self.initiators.add(ini)
        if read_lat is not None and reads > 0:
            self.reads += reads
            self.read_lat_sum += reads * read_lat
        if lat is not None and ios > 0:
            self.timed_ios += ios
            self.lat_sum += ios * lat

    @classmethod
    def total(cls, accs: Iterable[_Acc]) -> _Acc:
        out = cls()
        for a in accs:
            out.ios += a.ios
            out.bytes += a.bytes
            out.reads += a.reads
            out.read_lat_sum += a.read_lat_sum
            out.timed_ios += a.timed_ios
            out.lat_sum += a.lat_sum
        return out

    def read_latency_s(self) -> float | None:
        return self.read_lat_sum / self.reads if self.reads else None

    def io_latency_s(self, otherwise: float | None) -> float | None:
        """Mean latency of the IOs, else of the reads, else `otherwise`."""
        if self.timed_ios:
            return self.lat_sum / self.timed_ios
        r = self.read_latency_s()
        return otherwise if r is None else r


def _active(st: GroupsState, gr: GroupedResource, agg: Mapping[str, _Acc]) -> list[str]:
    """1. The groups with IOs this interval; the others count idle intervals and,
    past GROUP_IDLE_INTERVALS or once their spec is gone, leave (advance() drops
    them when their class is back at 0)."""
    for name, gs in gr.groups.items():
        known = name == DEFAULT_GROUP or name in st.groups
        if known and name in agg:
            continue
        gs.idle_intervals += 1
        if not known or gs.idle_intervals >= GROUP_IDLE_INTERVALS:
            gs.share, gs.target_class = 0.0, 0
    return [g for g in agg if g in st.groups or g == DEFAULT_GROUP]


def _make_room(gr: GroupedResource, active: Sequence[str]) -> None:
    """A group new on the resource starts at its demand share; the others scale
    down to make room (and absorb the shares of the ones idle now): sum = 1."""
    new = [g for g in active if gr.groups[g].share <= 0.0]
    room = sum(gr.groups[g].demand for g in new)
    old_sum = sum(gr.groups[g].share for g in active if g not in new)
    for g in active:
        gs = gr.groups[g]
        if g in new:
            gs.share = gs.demand if old_sum > 0.0 else gs.demand / room
        elif old_sum > 0.0:
            gs.share = max(gs.share / old_sum * (1.0 - room), U_MIN_FRACTION)
    norm = sum(gr.groups[g].share for g in active)
    for g in active:
        gr.groups[g].share /= norm


def _adapt_limit(gs: GroupState, u: float, limit_max: float) -> None:
    """A group's change limit: it grows while its share moves one way and halves
    when the share turns back (the delay lags the share by a tick or more, and a
    full change each way would oscillate)."""
    move = u - gs.share
    if abs(move) < 1e-9:
        return
    way = 1 if move > 0 else -1
    if way == -gs.last_way:
        gs.limit = max(gs.limit * LIMIT_SHRINK, LIMIT_MIN_FRACTION)
    elif way == gs.last_way:
        gs.limit = min(gs.limit * LIMIT_GROW, limit_max)
    gs.last_way = way


def share_delay_s(latency_s: float, demand: float, share: float) -> float:
    """The delay that leaves a group of demand share w with share u at the array."""
    if share >= demand or share <= 0.0:
        return 0.0 if share >= demand else math.inf
    return latency_s * (demand / share - 1.0)


def advance(
    st: GroupsState, rise_to: Sequence[int], decrease_max: int, ladder: Ladder
) -> dict[str, set[str]]:
    """One tick: every group's class in force moves toward its target class (and
    its delay is summed for the interval's mean).

    Returns resource -> the initiators whose class on it changed."""
    changed: dict[str, set[str]] = {}
    for name, gr in st.resources.items():
        for g in list(gr.groups):
            gs = gr.groups[g]
            gs.delay_sum_s += ladder.delay_s(gs.delay_class) if st.applied else 0.0
            gs.delay_ticks += 1
            k = gs.delay_class
            want = move_toward(k, gs.target_class, rise_to, decrease_max)
            if want != k:
                gs.delay_class = want
                changed.setdefault(name, set()).update(gs.members)
            if not gs.delay_class and gs.share <= 0.0:  # left, and back at 0
                del gr.groups[g]
    return changed
