"""Several appliances, one array: merging their samples, fencing their leaders' decisions.

Problem
    An array behind two (or four) fabrics has one appliance per fabric and
    multipath initiators: each appliance sees only its paths' share of an
    initiator's writes and of a resource's reads. Per resource, one elected
    leader runs the unchanged controller.decide.decide() on the samples of ALL
    appliances merged, and publishes the classes with an epoch; every
    appliance applies the published classes on its own ports. This module
    is the pure part of that: the merge, the freshness of the parts, and
    the fence that keeps a deposed leader's decisions out.

Measured signals (passed in; this module reads nothing)
    Report: one appliance's Samples of one tick (controller/domain.py),
    with the appliance's name, its sequence number and the time it took
    them (at_s, on the caller's clock).
    Decision: what a resource's leader published: its epoch (raised by
    every election), its sequence number within the epoch, the class of
    every member initiator of the resource.

Law
    fresh(reports, now_s): per appliance the report of highest seq, and
    only if now_s - at_s <= stale_s (STALE_SAMPLES_S): a dead appliance's
    last samples must not count forever.
    merge(parts), per resource r and initiator i, over the parts p that
    name them (sums over p):
        reads_r         = sum reads_p
        read_latency_r  = sum reads_p x lat_p / reads_r      (reads_r > 0)
                        = 0.0, reads 0                        (no reads anywhere:
                          decide() holds on reads 0 and never reads the latency;
                          a plain mean of the parts' placeholder values would
                          pretend to be a measurement)
        write_bps_r     = sum of the write_bps_p that are known; None only
                          when no part knows it (decide() then never holds)
        reads_in_flight = sum of the known ones; None when none is known
        write_bps_(r,i) = sum write_bps_p                     (WriteSample)
        device: ios summed, latency_s weighted by ios (0.0 without ios),
                in_flight summed (each appliance's queue is its paths' share)
        IoSample: ios, bytes, reads summed; read_latency_s weighted by
                reads and latency_s by ios over the parts that know them
                (a plain mean of those when their weights are all 0; None
                when no part knows it)
    The output is sorted by resource, then initiator: the same parts in any
    order give the same Samples.
    DecisionFence.offer(decision): accepted iff (epoch, seq) is greater than
    the last accepted for its resource (lexicographically): an older epoch is
    a deposed leader's, an older seq of the same epoch a reordered message.
    The accepted classes stay in force until the next accepted decision;
    an initiator's class on this appliance is the max over the resources'
    accepted classes (decide()'s max-over-resources, across leaders).
    follow(state, resource, leader_class): a follower's own controller
    moves its resource's class toward the leader's as decide() moves a class
    (ramp.move_toward: up by the ramp, down by at most
    class_decrease_max_per_tick a tick), its PID continuing from there
    (restate.set_class): the class it applies is the leader's, and when
    the leader dies it goes on from there (bumpless).

Bounds
    Read latency of a merge lies between the parts' smallest and largest
    (a weighted mean); sums are exact. A fence never goes back: after
    accepting (e, s), nothing <= (e, s) for that resource is accepted.

Worked example
    Appliance A saw 30 reads at 12 ms and a writer at 7 MB/s, appliance B
    10 reads at 8 ms and the same writer at 3 MB/s: the merge has 40 reads
    at (30 x 12 + 10 x 8) / 40 = 11 ms and the writer at 10 MB/s, as one
    appliance on both fabrics would have measured. Leader epoch 3 publishes
    seq 41, then the old leader (epoch 2) its seq 977: refused; epoch 3 seq
    42: accepted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .domain import DeviceSample, IoSample, ReadSample, Samples, WriteSample
from .ramp import move_toward
from .restate import set_class
from .state import ControllerState

# A report older than this (its at_s against now_s) is a dead or partitioned
# appliance's: five ticks of 100 ms. The merge without it under-counts the
# writes for a moment; with it, a gone appliance's last rates would count forever.
STALE_SAMPLES_S = 0.5


@dataclass(frozen=True, slots=True)
class Report:
    """One appliance's samples of one tick, as published."""

    appliance: str
    seq: int
    at_s: float
    samples: Samples


@dataclass(frozen=True, slots=True)
class Decision:
    """A resource leader's published classes (initiator -> class, members only)."""

    resource: str
    epoch: int
    seq: int
    classes: Mapping[str, int] = field(default_factory=dict)


def fresh(
    reports: Iterable[Report], now_s: float, stale_s: float = STALE_SAMPLES_S
) -> list[Report]:
    """Per appliance its newest report (highest seq), unless older than stale_s; sorted."""
    newest: dict[str, Report] = {}
    for r in reports:
        if now_s - r.at_s > stale_s:
            continue
        old = newest.get(r.appliance)
        if old is None or r.seq > old.seq:
            newest[r.appliance] = r
    return [newest[a] for a in sorted(newest)]


def _weighted(values: Sequence[tuple[float, float | None]]) -> float | None:
    """Mean of the known values weighted by their weights; plain mean if all weights are 0."""
    known = [(w, v) for w, v in values if v is not None]
    if not known:
        return None
    total = sum(w for w, _ in known)
    if total > 0.0:
        return sum(w * v for w, v in known) / total
    return sum(v for _, v in known) / len(known)


def _known_sum(values: Iterable[float | int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(sum(known)) if known else None


def merge(parts: Sequence[Samples]) -> Samples:
    """The samples one appliance on every path would have taken (see the Law above)."""
    reads: dict[str, list[ReadSample]] = {}
    writes: dict[tuple[str, str], float] = {}
    devices: dict[str, list[DeviceSample]] = {}
    ios: dict[tuple[str, str], list[IoSample]] = {}
    for p in parts:
        for r in p.reads:
            reads.setdefault(r.resource, []).append(r)
        for w in p.writes:
            key = (w.resource, w.initiator)
            writes[key] = writes.get(key, 0.0) + w.write_bps
        for d in p.devices:
            devices.setdefault(d.resource, []).append(d)
        for io in p.ios:
            ios.setdefault((io.resource, io.initiator), []).append(io)
    return Samples(
        reads=[_merge_reads(name, reads[name]) for name in sorted(reads)],
        writes=[WriteSample(r, i, writes[(r, i)]) for r, i in sorted(writes)],
        devices=[_merge_devices(name, devices[name]) for name in sorted(devices)],
        ios=[_merge_ios(key, ios[key]) for key in sorted(ios)],
    )


def _merge_reads(name: str, xs: Sequence[ReadSample]) -> ReadSample:
    n = sum(x.reads for x in xs)
    lat = sum(x.reads * x.read_latency_s for x in xs if x.reads > 0) / n if n > 0 else 0.0
    in_flight = _known_sum(x.reads_in_flight for x in xs)
    return ReadSample(
        name,
        n,
        lat,
        _known_sum(x.write_bps for x in xs),
        None if in_flight is None else round(in_flight),
    )


def _merge_devices(name: str, xs: Sequence[DeviceSample]) -> DeviceSample:
    n = sum(x.ios for x in xs)
    lat = sum(x.ios * x.latency_s for x in xs) / n if n > 0 else 0.0
    return DeviceSample(name, n, lat, sum(x.in_flight for x in xs))


def _merge_ios(key: tuple[str, str], xs: Sequence[IoSample]) -> IoSample:
    return IoSample(
        key[0],
        key[1],
        sum(x.ios for x in xs),
        sum(x.bytes for x in xs),
        sum(x.reads for x in xs),
        _weighted([(x.reads, x.read_latency_s) for x in xs]),
        _weighted([(x.ios, x.latency_s) for x in xs]),
        None if any(x.busy_s is None for x in xs) else sum(x.busy_s or 0.0 for x in xs),
    )


@dataclass(slots=True)
class DecisionFence:
    """A follower's view of the leaders: the last accepted (epoch, seq) and classes per resource."""

    last: dict[str, tuple[int, int]] = field(default_factory=dict)
    classes: dict[str, dict[str, int]] = field(default_factory=dict)
    refused: int = 0  # decisions refused so far (stale epochs, reordered seqs)

    def accept(self, resource: str, epoch: int, seq: int) -> bool:
        """True (and remembered) iff (epoch, seq) is newer than the last accepted."""
        old = self.last.get(resource)
        if old is not None and (epoch, seq) <= old:
            self.refused += 1
            return False
        self.last[resource] = (epoch, seq)
        return True

    def offer(self, d: Decision) -> bool:
        """Accept a leader's decision if fenced in; its classes replace the resource's."""
        if not self.accept(d.resource, d.epoch, d.seq):
            return False
        self.classes[d.resource] = {i: k for i, k in d.classes.items() if k > 0}
        return True

    def forget(self, resource: str) -> None:
        """The resource is gone: its classes no longer apply (its fence goes too)."""
        self.last.pop(resource, None)
        self.classes.pop(resource, None)

    def initiator_classes(self) -> dict[str, int]:
        """Per initiator the max over the resources' accepted classes (> 0 only)."""
        out: dict[str, int] = {}
        for per in self.classes.values():
            for ini, k in per.items():
                if k > out.get(ini, 0):
                    out[ini] = k
        return out


def leader_decision(
    resource: str, epoch: int, seq: int, members: Iterable[str], effective: Mapping[str, int]
) -> Decision:
    """What a resource's leader publishes after decide(): its members' effective classes.

    effective: the leader's ControllerState.effective (initiator -> class,
    ramp included); members: the resource's write-heavy set."""
    return Decision(resource, epoch, seq, {i: effective.get(i, 0) for i in sorted(members)})


def follow(state: ControllerState, resource: str, leader_class: int) -> dict[str, int]:
    """Move `resource`'s class one tick toward the leader's (the Law above); returns
    the initiators whose effective class changed."""
    c = state.config
    want = max(0, min(leader_class, c.max_class))
    cur = state.resources[resource].delay_class
    moved = move_toward(cur, want, state.rise_to, c.class_decrease_max_per_tick)
    return set_class(state, resource, moved) if moved != cur else {}
