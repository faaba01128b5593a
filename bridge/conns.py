"""A storage connection as the wire sensor holds it: its two walks, its commands in flight.

Connection
    Per TCP connection (initiator address and port, target address and
    port): its protocol, a flow.Stream per direction, the names its login
    or connect gave (target, initiator), the commands in flight by tag
    (ITT; NVMe's whole 16-bit CID: Linux hosts put a generation counter in
    its top bits), every volume it sent a command to, and what the walks
    found out about it (not measurable, a run of completions of nothing,
    the login's digests and segment limits waiting for its full feature
    phase). tracker.py's Tracker holds them and applies the law.

Sync
    sync_rows(): a row per direction -- in sync or not, the bytes and
    seconds it was not, its desyncs, why it is not measurable; fold(): a
    connection's walk counts added to a total (what the forgotten ones
    leave behind); SyncSummary: what a status shows of the rows -- each
    state's count, the seconds out of sync summed, and the first LISTED
    rows in listed_first()'s order (not in sync first, the longest first).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .belief import STATE_NAMES, SYNCED
from .belief import Counters as StreamCounters
from .flow import Stream
from .logins import Login
from .protocols import Digests
from .sums import Volume

if TYPE_CHECKING:
    from .esp import EspFlows


@dataclass(slots=True)
class Command:
    start_s: float
    op: int
    volume: Volume | None  # None: an NVMe command of no namespace (connect, keep-alive)
    held_bytes: int = 0  # a provisional write's bytes, counted when it is confirmed


ConnKey = tuple[str, int, str, int]  # initiator address, port, target address, port


@dataclass(slots=True)
class Connection:
    proto: str
    initiator: str  # the initiator's address
    portal: str
    to_target: Stream
    to_initiator: Stream
    target: str = ""
    initiator_name: str = ""  # the IQN or host NQN it logged in with
    login: Login | None = None  # its login's or connect's text, as far as read
    last_s: float = 0.0
    inflight: dict[int, Command] = field(default_factory=dict)
    volumes: set[Volume] = field(default_factory=set)  # every volume it sent a command to
    units: dict[int, Volume] = field(default_factory=dict)  # LUN or NSID -> its volume
    key: ConnKey = ("", 0, "", 0)
    unmeasurable: str = ""  # why its streams cannot be read (flow.py: TLS, UNPARSED)
    unmatched_run: int = 0  # completions of nothing in a row (UNMATCHED_RUN)
    # the login's digests and segment limits, in force once it reaches full feature
    pending_digests: Digests | None = None
    pending_limits: dict[bool, int] = field(default_factory=dict)  # to_target -> bytes


@dataclass(frozen=True, slots=True)
class SyncRow:
    """One direction of one connection: is the walk in sync, and how long it was not."""

    initiator: str
    initiator_port: int
    portal: str
    target: str
    direction: str  # "to_target" or "to_initiator"
    state: str  # flow.STATE_NAMES
    out_of_sync_bytes: int
    out_of_sync_s: float
    desyncs: int
    reason: str = ""  # why not measurable


LISTED = 256  # the rows a SyncSummary keeps (a status lists them)
IN_SYNC = STATE_NAMES[SYNCED]


@dataclass(frozen=True, slots=True)
class SyncSummary:
    """What a status shows of the sync rows (module header)."""

    directions: dict[str, int]  # state name -> rows in it
    out_of_sync_s: float  # over every row
    rows: list[SyncRow]  # the first LISTED in listed_first()'s order


def listed_first(in_sync: bool, out_of_sync_s: float) -> tuple[bool, float]:
    """The order a status lists directions in: not in sync first, the longest first."""
    return in_sync, -out_of_sync_s


def summary(rows: Iterable[SyncRow], listed: int = LISTED) -> SyncSummary:
    rows = list(rows)
    directions: dict[str, int] = {}
    for r in rows:
        directions[r.state] = directions.get(r.state, 0) + 1
    first = heapq.nsmallest(
        listed, rows, key=lambda r: listed_first(r.state == IN_SYNC, r.out_of_sync_s)
    )
    return SyncSummary(directions, sum(r.out_of_sync_s for r in rows), first)


def sync_rows(conn: Connection, now_s: float) -> list[SyncRow]:
    """Its two directions: in sync or not, and how long not."""
    ini, port = conn.key[0], conn.key[1]
    return [
        SyncRow(
            initiator=ini,
            initiator_port=port,
            portal=conn.portal,
            target=conn.target,
            direction=direction,
            state=STATE_NAMES[st.state],
            out_of_sync_bytes=st.counters.out_of_sync_bytes,
            out_of_sync_s=round(st.out_of_sync_s(now_s), 6),
            desyncs=st.counters.desyncs,
            reason=conn.unmeasurable,
        )
        for st, direction in ((conn.to_target, "to_target"), (conn.to_initiator, "to_initiator"))
    ]


def fold(total: StreamCounters, conn: Connection, now_s: float) -> None:
    """Add both its walks' counts to total."""
    for st in (conn.to_target, conn.to_initiator):
        c = st.counters
        total.pdus += c.pdus
        total.retransmitted_bytes += c.retransmitted_bytes
        total.gaps += c.gaps
        total.desyncs += c.desyncs
        total.resyncs += c.resyncs
        total.retracted += c.retracted
        total.out_of_sync_bytes += c.out_of_sync_bytes
        total.out_of_sync_s += st.out_of_sync_s(now_s)
        total.truncated += c.truncated


class SyncViews:
    """The walks' state over a tracker's connections (tracker.py's Tracker): its walks'
    counts, each direction's sync row, what is out of sync per target, what is not
    measurable."""

    conns: dict[ConnKey, Connection]
    walk: StreamCounters  # the walks of the connections forgotten
    esp: EspFlows
    _now: float

    def walk_totals(self) -> StreamCounters:
        """The walks' counts over both directions of every connection, forgotten ones
        included (flow.py's Counters)."""
        t = StreamCounters(**{k: getattr(self.walk, k) for k in StreamCounters.__slots__})
        for conn in self.conns.values():
            fold(t, conn, self._now)
        return t

    def sync_rows(self, now_s: float) -> list[SyncRow]:
        """Each live connection's two directions: in sync or not, and how long not; each
        IPsec security association seen, not measurable."""
        rows = [row for conn in self.conns.values() for row in sync_rows(conn, now_s)]
        return rows + self.esp.rows()

    def sync_summary(self, now_s: float) -> SyncSummary:
        """What a status shows of sync_rows() (SyncSummary)."""
        return summary(self.sync_rows(now_s))

    def out_of_sync(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """(protocol, portal, target) -> (its live connections, those with a direction
        not in sync), measurable connections that carried a segment in the last
        SYNC_VOTE_S only: for a resource's hold."""
        from .tracker import SYNC_VOTE_S

        out: dict[tuple[str, str, str], list[int]] = {}
        for conn in self.conns.values():
            if conn.unmeasurable or self._now - conn.last_s > SYNC_VOTE_S:
                continue
            a = out.setdefault((conn.proto, conn.portal, conn.target), [0, 0])
            a[0] += 1
            if conn.to_target.state != SYNCED or conn.to_initiator.state != SYNCED:
                a[1] += 1
        return {k: (n, m) for k, (n, m) in out.items()}

    def unmeasurable(self) -> list[tuple[ConnKey, str]]:
        """The live connections not measurable, and why."""
        return [(k, c.unmeasurable) for k, c in self.conns.items() if c.unmeasurable]
