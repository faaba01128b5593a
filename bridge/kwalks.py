"""The in-kernel sensor's two large maps walked off the tick: the flows, the commands in flight.

Problem
    bridge/kernel.py's program keeps up to 65,536 connection directions in
    its flow map and up to 2^20 commands in its map of commands in flight.
    Read and walked in Python, 50,000 live connections take a good part of
    a second (tests/privileged/test_bridge_hostile.py). Walked by the
    daemon's tick, or under the sensor's lock that the tick takes, they
    made ticks late.

Law
    Walker, a thread of its own, walks them outside the sensor's lock and
    takes the lock only to hand what it found to the sensor's KernelSums
    (ksums.py's install(): a few assignments). Each walk reads:
      the flows, every time: flow_walk() -- per (protocol, portal,
        target) its talking measurable connections and those with a
        direction not in sync (ksums.py's out_of_sync() law: a flow whose
        walk did not move for SYNC_VOTE_S is silent), the connections
        with a flow (ksums.py's sweep: one without any has ended), and
        the SyncSummary a status shows;
      the commands in flight, when in_flight() was asked since the last
        walk of them, AGE_S after it, or every time while the last one
        found at most FEW_INFLIGHT: inflight_walk() -- the reads in flight
        per volume, and the commands older than INFLIGHT_MAX_S, which it
        deletes (aged).
    After a walk that took d seconds it waits max(WALK_S - d, REST * d):
    the walks use at most 1 / (1 + REST) of a core, however many
    connections there are. The tick and the convergence read the last
    walk's results: their cost does not grow with the connections; the
    results are a walk old (the reads in flight, beyond FEW_INFLIGHT of
    them: up to AGE_S at the first tick that asks after a quiet spell, a
    walk after that).

Errors
    A walk that fails (a map read refused) is logged once per distinct
    message, the last results are kept, and the next walk tries again.

Worked example
    65,442 flows and 50,000 commands in flight: the walker reads them once
    a second; each 100 ms tick reads the stats map (the volumes' sums)
    and the last walk's reads in flight per volume, a dictionary of a few
    entries.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .belief import STATE_NAMES, SYNCED, UNMEASURABLE
from .conns import IN_SYNC, LISTED, ConnKey, SyncRow, SyncSummary, listed_first
from .kernel import Conn, FlowState
from .pdu import ISCSI_PORT, READ
from .protocols import TLS, UNPARSED
from .sums import ISCSI, NVME, Volume, portal_name
from .tracker import INFLIGHT_MAX_S, SYNC_VOTE_S

if TYPE_CHECKING:
    from .ksums import KernelSums

log = logging.getLogger(__name__)

WALK_S = 1.0  # a walk of the flows at most this often (the convergence's cadence)
AGE_S = 10.0  # the commands in flight walked at least this often (they age in 60 s)
REST = 3.0  # after a walk of d seconds, at least REST * d before the next
FEW_INFLIGHT = 4096  # commands in flight walked at each walk while no more (a few ms)
_REASONS = {1: TLS, 2: UNPARSED}  # the program's reasons for not measurable

# a flow (its connection, to_target) -> its mark (next sequence number, bytes out of
# sync) and since when it is that
Moved = dict[tuple[Conn, bool], tuple[tuple[int, int], float]]


@dataclass(frozen=True, slots=True)
class FlowWalk:
    """One walk of the flow map (module header)."""

    at: float  # the sensor's clock
    out_of_sync: dict[tuple[str, str, str], tuple[int, int]]
    flowing: frozenset[Conn]  # the connections with a flow in the map
    summary: SyncSummary
    flows: list[FlowState]  # as read (the command line's every sync row)
    # directions the program's full map dropped (its LRU) since the load, at least: the
    # flows it took in, read before the walk, less those it took out, read after, less
    # those the walk found (exact when none came or went meanwhile)
    evicted: int = 0


@dataclass(frozen=True, slots=True)
class InflightWalk:
    """One walk of the commands in flight: the reads per volume, and those aged out."""

    at: float
    reads: dict[Volume, int]
    aged: int
    size: int  # the commands in flight it read
    # the (connection, volume)s with a command in the map (kbusy.py's lost ones)
    held: frozenset[tuple[Conn, int]] = frozenset()


def conn_key(c: Conn) -> ConnKey:
    return (c.initiator, c.initiator_port, c.target, c.target_port)


def sync_row(f: FlowState, target: str) -> SyncRow:
    """One direction the program walks, as a status row."""
    c = f.conn
    return SyncRow(
        initiator=c.initiator,
        initiator_port=c.initiator_port,
        portal=portal_name(c.target, c.target_port),
        target=target,
        direction="to_target" if f.to_target else "to_initiator",
        state=STATE_NAMES[min(f.state, UNMEASURABLE)],
        out_of_sync_bytes=f.out_of_sync_bytes,
        out_of_sync_s=round(f.out_of_sync_s, 6),
        desyncs=f.desyncs,
        reason=_REASONS.get(f.reason, ""),
    )


def flow_walk(
    flows: list[FlowState],
    moved: Moved,
    now: float,
    target_of: Callable[[ConnKey], str],
    extra: Iterable[SyncRow] = (),
) -> tuple[FlowWalk, Moved]:
    """The walk's results from the flows as read (and extra rows: IPsec's), and each
    flow's mark for the next walk (moved: the last one's)."""
    # per connection: a direction moved in the last SYNC_VOTE_S, one not in sync, one
    # not measurable
    conns: dict[Conn, list[bool]] = {}
    marks: Moved = {}
    directions: dict[str, int] = {}
    total_s = 0.0
    for f in flows:
        c = f.conn
        mark = (f.next_seq, f.out_of_sync_bytes)
        was = moved.get((c, f.to_target))
        at = was[1] if was is not None and was[0] == mark else now
        marks[c, f.to_target] = (mark, at)
        a = conns.get(c)
        if a is None:
            a = conns[c] = [False, False, False]
        a[0] = a[0] or now - at <= SYNC_VOTE_S
        a[1] = a[1] or f.state != SYNCED
        a[2] = a[2] or f.state == UNMEASURABLE
        name = STATE_NAMES[min(f.state, UNMEASURABLE)]
        directions[name] = directions.get(name, 0) + 1
        total_s += f.out_of_sync_s
    out: dict[tuple[str, str, str], list[int]] = {}
    for c, (talking, lost, gone) in conns.items():
        if not talking or gone:
            continue
        proto = ISCSI if c.target_port == ISCSI_PORT else NVME
        portal = portal_name(c.target, c.target_port)
        n = out.setdefault((proto, portal, target_of(conn_key(c))), [0, 0])
        n[0] += 1
        n[1] += lost
    first = heapq.nsmallest(
        LISTED, flows, key=lambda f: listed_first(f.state == SYNCED, f.out_of_sync_s)
    )
    rows = [sync_row(f, target_of(conn_key(f.conn))) for f in first]
    for r in extra:
        directions[r.state] = directions.get(r.state, 0) + 1
        total_s += r.out_of_sync_s
        rows.append(r)
    rows = heapq.nsmallest(
        LISTED, rows, key=lambda r: listed_first(r.state == IN_SYNC, r.out_of_sync_s)
    )
    walk = FlowWalk(
        at=now,
        out_of_sync={k: (n, m) for k, (n, m) in out.items()},
        flowing=frozenset(conns),
        summary=SyncSummary(directions, total_s, rows),
        flows=flows,
    )
    return walk, marks


def inflight_walk(
    inflight: dict[tuple[Conn, int], tuple[int, int, int]],
    now: float,
    now_ns: int,
    volume_of: Callable[[Conn, int], Volume | None],
    forget: Callable[[Conn, int, int], None],
) -> InflightWalk:
    """The reads in flight per volume; the commands older than INFLIGHT_MAX_S (by the
    program's CLOCK_MONOTONIC start, now_ns) forgotten (forget(conn, tag, volume)) and
    counted."""
    oldest_ns = now_ns - int(INFLIGHT_MAX_S * 1e9)
    per: dict[tuple[Conn, int], int] = {}
    held: set[tuple[Conn, int]] = set()
    aged = 0
    for (c, tag), (start_ns, op, raw) in inflight.items():
        if start_ns < oldest_ns:
            forget(c, tag, raw)
            aged += 1
            continue
        held.add((c, raw))
        if op == READ:
            per[c, raw] = per.get((c, raw), 0) + 1
    reads: dict[Volume, int] = {}
    for (c, raw), n in per.items():
        v = volume_of(c, raw)
        if v is not None:
            reads[v] = reads.get(v, 0) + n
    return InflightWalk(now, reads, aged, len(inflight), frozenset(held))


def rest_s(took_s: float, walk_s: float = WALK_S) -> float:
    """The wait after a walk that took took_s: the next starts walk_s after it began, or
    REST times its length after it ended, whichever is later."""
    return max(walk_s - took_s, REST * took_s)


class Walker:
    """The thread that walks a KernelSums' maps (module header) and hands the results
    over under `lock`."""

    def __init__(
        self,
        sums: KernelSums,
        lock: Any,
        clock: Callable[[], float] = time.monotonic,
        walk_s: float = WALK_S,
    ) -> None:
        self.sums = sums
        self.lock = lock
        self.clock = clock
        self.walk_s = walk_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_age = -float("inf")
        self._few = False  # the last walk of the commands in flight found few of them
        self._failed = ""  # the last failure's message, logged once
        self.last_s = 0.0  # how long the last walk took

    def start(self) -> None:
        self.sums.walker = True
        self._thread = threading.Thread(target=self._run, name="wire-walks", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.walk_once()
            self.last_s = took = time.monotonic() - t0
            self._stop.wait(rest_s(took, self.walk_s))

    def walk_once(self) -> None:
        """One walk: the flows, the commands in flight when due; the results handed over."""
        now = self.clock()
        try:
            flows = self.sums.walk_flows(now)
            inflight = None
            if self.sums.inflight_wanted or now >= self._next_age or self._few:
                self._next_age = now + AGE_S
                inflight = self.sums.walk_inflight(now)
        except Exception as e:  # a map read refused: the last results stay
            if str(e) != self._failed:
                log.warning("in-kernel wire sensor: walking its maps: %s", e)
            self._failed = str(e)
            return
        self._failed = ""
        if inflight is not None:
            self._few = inflight.size <= FEW_INFLIGHT
        with self.lock:
            self.sums.install(flows, inflight)
