"""Elastic levels per group (IOTune): a rate ceiling that rises while the array has room.

Problem
    A static cap per tenant forces a choice: a cap at the 80th or 90th
    percentile of its rate throttles every burst, one at the 99th wastes
    the array most of the time. IOTune's answer is a ladder of caps per
    tenant (a baseline and elastic levels, e.g. 600 / 1,200 / 2,400 / 4,800
    IOPS): the tenant is promoted a level when its rate reaches its cap
    while the array has headroom, demoted when its rate falls under the
    level below, and billed for the seconds it spends at each level.

Measured signal (per group, every interval: the convergence, 1 s)
    From the IoSamples of its initiators on every resource:
        rate  = IOs / interval (IOPS) or bytes / interval (bandwidth), of
                all its IOs, its reads or its writes (Levels.direction; the
                reads' bytes are the bytes times the reads' share of the IOs)
        L     = its IOs' mean latency at the array (IO-weighted)
        d     = the mean delay its initiators had (their class in force)
    and per resource it loaded, whether it has headroom (caller's
    `headroom`: its latency EWMA under its threshold and its utilization
    under promote_below_utilization).

Law, per Levels of a group (a group may have several: IOPS and bandwidth,
all IOs or reads and writes apart, each with its own level), per interval
    cap = caps[level]
    promote   level + 1   when rate >= PROMOTE_AT_FRACTION x cap, the level
                          is not the top one and every resource the group
                          loaded has headroom;
    demote    level - 1   when rate < DEMOTE_AT_FRACTION x caps[level - 1]
                          for DEMOTE_AFTER_INTERVALS intervals in a row;
    else      hold.
    At most one level per decision. The band between the two fractions and
    the intervals in a row are the hysteresis: after a promotion the rate
    is at the old cap, well above the demotion line of the new level.

The knob: a cap -> a delay (Little's law)
    A group keeping q IOs outstanding, each L at the array and d in our
    delay, moves q / (L + d) IOs per second. Its cap holds with
        d = q / cap - L           (0 when q / cap <= L: the cap does not bind)
    q is measured: q = rate x (L + d) (Little, over the interval, d the
    delay its initiators had). A group promoted by this decision is not
    held back while it rises: its cap binds once it cannot rise further (the
    top level, or no headroom), as IOTune serves a burst by promoting the
    volume rather than queueing it; and under PROMOTE_AT_FRACTION of its cap
    the group is not held back by it. In both cases d is at most
    RELEASE_PER_INTERVAL of the last one.
    The class is the smallest whose delay is at least d: the smallest class
    whose Little's-law rate q / (L + d_k) is at or below the cap. With
    several Levels the largest delay wins (one delay per initiator slows
    all its IOs). The class in force moves to that class tick by tick (the
    ramp up, class_decrease_max_per_tick down: ramp.py's move_toward), as
    a resource's and a group's do.
    Below its cap a group gets d -> 0: with rate < cap, rate x (L + d) / cap
    - L < d, so a delay that no longer binds shrinks by the ratio of the
    rate to the cap every interval, and by half at least under
    PROMOTE_AT_FRACTION of it. A closed stream (fio at an iodepth) is
    capped at the first interval; an open stream (arrivals at their own
    pace) only once its IOs queue at the initiator: each interval raises
    its delay by the ratio of its rate to the cap until they do.

Composition
    A level is a ceiling: its class enters the initiators' effective class
    through the max with their resources' (the PID's) and their groups'
    (the arbiter's) classes (effective.py). Under overload the arbiter or
    the PID delays more than the level asks; a level never makes the array
    give a group what it cannot.

Idle behaviour
    A group without IOs has rate 0: it is demoted one level per
    DEMOTE_AFTER_INTERVALS intervals, and its delay goes to 0 (d shrinks
    with its rate). Its members stay known until its class is back at 0.

How to watch it
    LevelState per group: the level of each Levels, its rate and cap,
    promotions and demotions, the delay and classes (target, in force).
    The daemon meters the seconds at each level (docs/levels.md).

Worked example (the default ladder: 0.5 ms steps to 10 ms, then 5 %)
    iops_levels = [600, 1200, 2400, 4800]; a closed stream of depth 3 at
    L = 2 ms (1,500 IOPS undelayed) is at level 0 (cap 600), the array has
    headroom: 1,500 >= 0.9 x 600 -> promote to level 1 (cap 1,200), and no
    delay while it rises. The array then loses its headroom: 1,500 >= 0.9 x
    1,200 but no promotion; its q = 1,500 x 2 ms = 3 IOs, so d = 3 / 1,200 -
    2 ms = 0.5 ms: class 1, and it moves 3 / 2.5 ms = 1,200 IOPS. With
    headroom again it is promoted to 2,400, where d = 3 / 2,400 - 2 ms < 0:
    class 0, 1,500 IOPS. Its rate is under 0.8 x 1,200 = 960 only when its
    demand falls: two intervals of that demote it to 1,200.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from .domain import IoSample
from .ladder import Ladder
from .ramp import move_toward

# "Reaches its cap": a capped group runs between the cap and the class below it
# (the delay is rounded up to a class: the ladder's 5 % steps), so at 90 % of it.
PROMOTE_AT_FRACTION = 0.9
# Demoted under this fraction of the level below, DEMOTE_AFTER_INTERVALS in a row:
# with PROMOTE_AT_FRACTION a band that keeps a rate near a level from flapping.
DEMOTE_AT_FRACTION = 0.8
DEMOTE_AFTER_INTERVALS = 2
# Under PROMOTE_AT_FRACTION of its cap a group is not held back by it (a capped group
# runs at 95-100 % of its cap): the delay its cap asks falls at least to this
# fraction of the last one each interval. Little's law alone lowers it by the ratio
# of the rate to the cap, which is slow for arrivals that do not speed up when the
# delay falls (a rate at 85 % of the cap would keep most of a 10 ms delay for ten
# intervals, every IO paying it).
RELEASE_PER_INTERVAL = 0.5
# The knob's L: an EWMA over intervals with this weight of the newest (as groups.py).
KNOB_LATENCY_ALPHA = 0.3
# A group absent from the specs, or without IOs and back at class 0 and level 0,
# is forgotten (its members' class is 0 by then).

MEASURES = ("iops", "bandwidth")
DIRECTIONS = ("all", "read", "write")


class LevelsError(ValueError):
    """Levels that cannot be used; the message names the problem."""


@dataclass(frozen=True, slots=True)
class Levels:
    """One ladder of caps: per second, IOs (measure "iops") or bytes ("bandwidth"),
    of all the group's IOs, its reads or its writes."""

    caps: tuple[float, ...]
    measure: str = "iops"
    direction: str = "all"

    def __post_init__(self) -> None:
        if self.measure not in MEASURES:
            raise LevelsError(f"levels measure must be one of {', '.join(MEASURES)}")
        if self.direction not in DIRECTIONS:
            raise LevelsError(f"levels direction must be one of {', '.join(DIRECTIONS)}")
        if not self.caps:
            raise LevelsError("levels need at least one cap")
        if any(not c > 0.0 for c in self.caps):
            raise LevelsError("every level must be above 0")
        if any(b <= a for a, b in zip(self.caps, self.caps[1:], strict=False)):
            raise LevelsError("levels must rise from one to the next")

    @property
    def name(self) -> str:
        """The config key's stem: "iops", "read_iops", "write_bandwidth", ..."""
        return self.measure if self.direction == "all" else f"{self.direction}_{self.measure}"


@dataclass(slots=True)
class LadderState:
    """One Levels of one group."""

    level: int = 0
    rate: float = 0.0  # this interval's, per second (IOs or bytes)
    q: float = 0.0  # outstanding (IOs or bytes), Little
    delay_s: float = 0.0  # the delay its cap asks
    below: int = 0  # intervals in a row under the demotion line
    promotions: int = 0
    demotions: int = 0


@dataclass(slots=True)
class LevelState:
    """One group with levels."""

    ladders: list[LadderState] = field(default_factory=list)
    latency_s: float = 0.0  # its IOs' mean latency at the array, this interval
    knob_latency_s: float = 0.0  # latency_s smoothed (KNOB_LATENCY_ALPHA)
    delay_in_force_s: float = 0.0  # the mean delay its initiators had
    delay_s: float = 0.0  # the largest of its ladders' delays
    target_class: int = 0
    delay_class: int = 0  # in force (moves to target_class tick by tick)
    members: frozenset[str] = frozenset()  # initiators seen with IOs
    headroom: bool = True  # every resource it loaded had headroom, this interval


@dataclass(slots=True)
class LevelsState:
    """Every group with levels: spec and state."""

    specs: dict[str, tuple[Levels, ...]] = field(default_factory=dict)
    groups: dict[str, LevelState] = field(default_factory=dict)

    def configure(self, specs: Mapping[str, Sequence[Levels]]) -> set[str]:
        """New levels, live. A group whose ladders are unchanged keeps its levels; one
        with new ladders starts again at level 0; one without levels any more goes
        (its members are returned: their class changes)."""
        out: set[str] = set()
        new = {g: tuple(ls) for g, ls in specs.items() if ls}
        for g in list(self.groups):
            if g not in new:
                out.update(self.groups.pop(g).members)
            elif new[g] != self.specs.get(g):
                self.groups[g].ladders = [LadderState() for _ in new[g]]
        self.specs = new
        return out

    def classed_members(self) -> Iterator[tuple[int, Iterable[str]]]:
        """(level class, members) of every group whose level's class is in force."""
        for ls in self.groups.values():
            if ls.delay_class:
                yield ls.delay_class, ls.members


def highest_class(classed: Iterable[tuple[int, Iterable[str]]]) -> dict[str, int]:
    """initiator -> the highest of the classes it is a member at (a group's class and
    its levels' class are both ceilings: the max)."""
    out: dict[str, int] = {}
    for k, members in classed:
        for ini in members:
            if k > out.get(ini, 0):
                out[ini] = k
    return out


@dataclass(slots=True)
class _Acc:
    ios: float = 0.0
    reads: float = 0.0
    bytes: float = 0.0
    read_bytes: float = 0.0
    lat_sum: float = 0.0  # sum over IOs of their latency (timed ones)
    timed: float = 0.0
    delay_sum: float = 0.0  # sum over IOs of their initiator's delay in force
    resources: set[str] = field(default_factory=set)
    members: set[str] = field(default_factory=set)


def interval(
    st: LevelsState,
    group_of: Mapping[str, str],
    samples: Iterable[IoSample],
    span_s: float,
    ladder: Ladder,
    headroom: Callable[[str], bool],
    delay_of: Callable[[str], float],
) -> None:
    """One decision for every group with levels: levels, then target classes.

    group_of: initiator -> group; headroom(resource): may a group that loads it be
    promoted; delay_of(initiator): the delay its class in force adds (s)."""
    if not st.specs:
        return
    accs: dict[str, _Acc] = {}
    for s in samples:
        g = group_of.get(s.initiator)
        if g is None or g not in st.specs:
            continue
        acc = accs.get(g)
        if acc is None:
            acc = accs[g] = _Acc()
        acc.ios += s.ios
        acc.reads += s.reads
        acc.bytes += s.bytes
        if s.ios > 0:  # IoSamples carry bytes of every kind: reads' by their share of IOs
            acc.read_bytes += s.bytes * s.reads / s.ios
        lat = s.latency_s if s.latency_s is not None else s.read_latency_s
        if lat is not None and s.ios > 0:
            acc.lat_sum += s.ios * lat
            acc.timed += s.ios
        acc.delay_sum += s.ios * delay_of(s.initiator)
        acc.resources.add(s.resource)
        acc.members.add(s.initiator)
    for g, specs in st.specs.items():
        ls = st.groups.get(g)
        acc = accs.get(g)
        if ls is None:
            if acc is None:  # never seen: nothing to decide
                continue
            ls = st.groups[g] = LevelState([LadderState() for _ in specs])
        decide(ls, specs, acc or _Acc(), span_s, ladder, headroom)


def decide(
    ls: LevelState,
    specs: Sequence[Levels],
    acc: _Acc,
    span_s: float,
    ladder: Ladder,
    headroom: Callable[[str], bool],
) -> None:
    """One group's interval: its levels (promote, demote, hold), then its target class."""
    if acc.members:
        ls.members = frozenset(acc.members)
    if acc.timed:
        ls.latency_s = acc.lat_sum / acc.timed
        ls.knob_latency_s = (
            ls.latency_s
            if not ls.knob_latency_s
            else ls.knob_latency_s + KNOB_LATENCY_ALPHA * (ls.latency_s - ls.knob_latency_s)
        )
    ls.delay_in_force_s = acc.delay_sum / acc.ios if acc.ios else 0.0
    ls.headroom = all(headroom(r) for r in acc.resources)
    lat, d = ls.knob_latency_s, ls.delay_in_force_s
    delay = 0.0
    for spec, lad in zip(specs, ls.ladders, strict=True):
        rate = _rate(spec, acc) / span_s
        lad.rate = rate
        # 1. the level
        cap = spec.caps[lad.level]
        top = lad.level == len(spec.caps) - 1
        promoted = rate >= PROMOTE_AT_FRACTION * cap and not top and ls.headroom
        if promoted:  # promote
            lad.level += 1
            lad.promotions += 1
            lad.below = 0
        elif lad.level and rate < DEMOTE_AT_FRACTION * spec.caps[lad.level - 1]:
            lad.below += 1
            if lad.below >= DEMOTE_AFTER_INTERVALS:  # demote
                lad.level -= 1
                lad.demotions += 1
                lad.below = 0
        else:  # hold
            lad.below = 0
        # 2. the knob: q / cap - L (Little)
        cap = spec.caps[lad.level]
        lad.q = q = rate * (lat + d)
        want = max(0.0, q / cap - lat) if lat > 0.0 else 0.0
        if promoted or rate < PROMOTE_AT_FRACTION * cap:  # rising, or under its cap: release
            want = min(want, lad.delay_s * RELEASE_PER_INTERVAL)
        lad.delay_s = want
        delay = max(delay, want)
    ls.delay_s = delay
    ls.target_class = ladder.class_at_least(delay)


def _rate(spec: Levels, acc: _Acc) -> float:
    if spec.measure == "iops":
        if spec.direction == "read":
            return acc.reads
        return acc.ios - acc.reads if spec.direction == "write" else acc.ios
    if spec.direction == "read":
        return acc.read_bytes
    return acc.bytes - acc.read_bytes if spec.direction == "write" else acc.bytes


def advance(st: LevelsState, rise_to: Sequence[int], decrease_max: int) -> set[str]:
    """One tick: every group's level class in force moves toward its target class.
    Returns the initiators whose level class changed."""
    changed: set[str] = set()
    for g in list(st.groups):
        ls = st.groups[g]
        k = ls.delay_class
        want = move_toward(k, ls.target_class, rise_to, decrease_max)
        if want != k:
            ls.delay_class = want
            changed.update(ls.members)
    return changed


def level_of(st: LevelsState, group: str) -> list[int]:
    """The level of each of a group's Levels (0s for a group not seen yet)."""
    ls = st.groups.get(group)
    if ls is not None:
        return [lad.level for lad in ls.ladders]
    return [0 for _ in st.specs.get(group, ())]
