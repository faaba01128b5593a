"""What one direction's walk believes about its headers, and how it finds its place.

Belief is the part of a stream (flow.py's Stream, which walks with it) that
judges headers rather than positions: the connection's digests as far as
they are proven (iSCSI's header digest by its CRC32C, the data digest by
where the next header is: alt_seq), the last header's sequence number,
whether a header of the stream was ever proven, and what the stream is
while none was (protocols.Sniffer). Its methods are flow.py's law for a
walk that does not know where it is: _resync() (protocols.search: a
confirmed header, or a provisional one, _take()), _may_search() (at most
MAX_SEARCHES a segment), _prove() (a provisional header's successor, or a
header whose data digest is unproven), and the hooks that tell the stream's
owner what a provisional header became.

Also here: the states a walk is in (SYNCED, PROVISIONAL, LOST,
UNMEASURABLE), its counters, and the hooks (Hooks) and sink (Sink) that a
stream's owner (tracker.py) gives it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import protocols as headers
from .pdu import CONNECT, DIGEST_BYTES, LOGIN, MAX_DATA_BYTES, Pdu
from .protocols import MASK, Buffer, Digests, Iscsi, Protocol, Sniffer, seq_diff

# The most bytes kept across segments: a cut header, or a login's or connect's
# start (iSCSI login text is a few hundred bytes; the NVMe connect data is 1 KiB
# after a 72-byte header).
MAX_CARRY_BYTES = 4096
# The most headers walked in one segment (64 KiB of 24-byte NVMe completions is 2,731):
# the in-kernel walker's loop bound, and this one's.
MAX_WALK = 8192
# The most searches begun in one segment (each one a desync, a retraction or a refusal
# of the tracker's): the kernel's bound, and this walk's.
MAX_SEARCHES = 16
# Wanted bodies: PDUs whose data the tracker reads (they name the target and the initiator).
WANTED = frozenset({LOGIN, CONNECT})

SYNCED, PROVISIONAL, LOST, UNMEASURABLE = 0, 1, 2, 3
STATE_NAMES = ("in sync", "provisional", "out of sync", "not measurable")


@dataclass(slots=True)
class Counters:  # per direction
    pdus: int = 0
    retransmitted_bytes: int = 0
    gaps: int = 0
    desyncs: int = 0  # the walk was off: a non-header where a header had to be
    resyncs: int = 0
    retracted: int = 0  # provisional headers whose successor was not there
    out_of_sync_bytes: int = 0
    out_of_sync_s: float = 0.0
    truncated: int = 0  # segments of more than MAX_WALK headers: the walk stopped there


class Hooks:
    """What a stream tells its owner besides a proven walk's PDUs (tracker.py):
    provisional(), a header a resync took before its successor was there; confirm(),
    its successor is there; retract(), it is not (undo what it did); unmeasurable(),
    nothing here is iSCSI or NVMe/TCP (TLS, UNPARSED). These defaults do nothing."""

    def provisional(self, pdu: Pdu, body: bytes) -> None: ...
    def confirm(self) -> None: ...
    def retract(self) -> None: ...
    def unmeasurable(self, reason: str) -> None: ...


Sink = Callable[[Pdu, bytes], bool]  # False: the walk is off at this PDU
NO_HOOKS = Hooks()


class Belief:
    """What the walk believes about its headers (module header): the connection's
    digests as far as proven, the last sequence number, whether a header of it was
    ever proven, what it is while none was; how a header is proven and how the walk
    finds its place. Stream (below) walks with it."""

    __slots__ = (
        "alt_seq",
        "carried",
        "counters",
        "dd_known",
        "digests",
        "hd_known",
        "held",
        "hooks",
        "limit",
        "pdu_seq",
        "proto",
        "proven",
        "searches",
        "sn",
        "sniffer",
        "state",
    )

    def __init__(self, proto: Protocol, hooks: Hooks) -> None:
        self.proto, self.hooks = proto, hooks
        self.state = LOST
        self.pdu_seq = 0  # where the next header starts (SYNCED), or would (PROVISIONAL)
        self.counters = Counters()
        self.carried = 0  # the carry's bytes at the start of the buffer being walked
        # the PDU whose last byte is still to come (pdu_seq is its end): (pdu, body, provisional)
        self.held: tuple[Pdu, bytes, bool] | None = None
        self.digests: Digests = (False, False)
        # the digests proven (iSCSI's: module header); alt_seq, where the next header
        # would be with the other data digest setting while that is not
        self.hd_known = self.dd_known = not proto.digest_aware
        self.alt_seq: int | None = None
        self.limit = MAX_DATA_BYTES  # the receiver's MaxRecvDataSegmentLength / MAXH2CDATA
        self.sn = 0  # the last header's sequence number (pdu.py: Pdu.sn)
        self.proven = False  # a header of it was believed
        self.sniffer = Sniffer()  # what it is, while nothing of it was proven

    def set_digests(self, digests: Digests) -> None:
        """The digests a login negotiated (they apply once it completes)."""
        self.digests = digests
        self.dd_known = self.hd_known = True
        self.alt_seq = None

    def unknown_digests(self) -> None:
        """The digests a login negotiated, not read: the walk finds them (a header digest
        by its CRC32C, the data digest by where the next header is)."""
        self.digests = (False, False)
        self.hd_known = self.dd_known = not self.proto.digest_aware
        self.alt_seq = None

    def _prove(
        self, buf: Buffer, base: int, off: int, pdu: Pdu | None, now: float
    ) -> tuple[Pdu | None, int]:
        """The header at off must prove itself (protocols.prove): it follows a
        provisional header, or one whose data digest is unproven (alt_seq). The header
        and where it is, or (None, off), a provisional header retracted."""
        alt = None if self.alt_seq is None else seq_diff(self.alt_seq, base)
        got = headers.prove(self.proto, buf, off, pdu, self.digests, self.limit, self.sn, alt)
        if got is not None and alt is not None:
            self.dd_known = True  # a header where a data digest setting said
        self.alt_seq = None
        if got is None:
            if self.state == PROVISIONAL:
                self._retract()
                self._lose(now)
            return None, off
        pdu, off, digests = got
        self._adopt(digests)
        if self.state == PROVISIONAL:
            self._synced(now)
            self.hooks.confirm()
        return pdu, off

    def _header_digest(self, buf: Buffer, off: int) -> None:
        """The header digest by the CRC32C of the header at off, when its 4 bytes follow."""
        crc = Iscsi.header_digest_at(buf, off)
        if crc is not None:
            self.hd_known = True
            self._adopt((crc, self.digests[1]))

    def _note_alt(self, base: int, off: int, pdu: Pdu) -> None:
        """While the data digest is unproven: where the header after pdu would be with
        the other setting."""
        if not self.dd_known and pdu.segment:
            other = -DIGEST_BYTES if self.digests[1] else DIGEST_BYTES
            self.alt_seq = (base + off + pdu.length + other) & MASK

    def _unparsed(self, buf: Buffer, now: float) -> bool:
        """A stream that never showed a proven header may not be storage traffic at all
        (protocols.Sniffer): then it is UNMEASURABLE (True)."""
        sniffer = self.sniffer
        reason = sniffer.verdict(buf, not self.counters.out_of_sync_bytes)
        if reason is None:
            return False
        self.counters.out_of_sync_bytes += sniffer.seen
        self.set_unmeasurable(now)
        self.hooks.unmeasurable(reason)
        return True

    def _resync(
        self, buf: Buffer, base: int, start: int, provisional: bool, now: float
    ) -> int | None:
        """The first offset >= start where a header is confirmed (protocols.search);
        with `provisional`, failing that the first provisional one, handed to the hooks.
        The confirmed offset, to walk from (the walk is SYNCED there), or None."""
        hd = self.digests[0] if self.hd_known else None
        dd = self.digests[1] if self.dd_known else None
        hit = headers.search(self.proto, buf, max(start, self.carried), self.limit, hd, dd)
        if hit is None:
            return None
        off, pdu, digests, confirmed = hit
        if not confirmed:
            if provisional:
                self._take(buf, base, off, pdu, digests)
            return None
        self._adopt(digests)
        self.hd_known = True
        if pdu.segment:
            self.dd_known = True
        self.sn = 0
        self.proven = True
        self.counters.resyncs += 1
        if self.state == PROVISIONAL:
            self._retract()
        self._synced(now)
        return off

    def _may_search(self, now: float) -> bool:
        """Another search in this segment, within MAX_SEARCHES (else the walk is LOST,
        counted: the kernel's bound, and this walk's)."""
        self.searches += 1
        if self.searches <= MAX_SEARCHES:
            return True
        self.counters.truncated += 1
        self._lose(now)
        return False

    def _take(self, buf: Buffer, base: int, off: int, pdu: Pdu, digests: Digests) -> None:
        """A provisional header at off: handed to the hooks; the walk waits for its
        successor (its first bytes kept when they are here)."""
        if self.state == PROVISIONAL:  # the newer header takes over
            self._retract()
        self._adopt(digests)
        if digests[0]:
            self.hd_known = True  # its CRC32C matched
        self.counters.resyncs += 1
        self.counters.pdus += 1
        self.state = PROVISIONAL
        nxt = off + pdu.length
        body = bytes(buf[off : min(nxt, off + MAX_CARRY_BYTES)]) if pdu.kind in WANTED else b""
        if nxt <= len(buf):
            self.hooks.provisional(pdu, body)
        else:  # its last byte comes later
            self._hold(pdu, body, True)
        self.sn = pdu.sn if pdu.kind != LOGIN else 0
        self._note_alt(base, off, pdu)
        if nxt < len(buf):
            self._keep(buf[nxt:], base + nxt)
        else:
            self.pdu_seq = (base + nxt) & MASK

    def _adopt(self, digests: Digests) -> None:
        self.digests = digests  # each direction finds its own (a login says both)

    # what the walk does with its positions (flow.py's Stream)
    def set_unmeasurable(self, now: float | None = None) -> None:
        raise NotImplementedError

    def _lose(self, now: float) -> None:
        raise NotImplementedError

    def _synced(self, now: float | None) -> None:
        raise NotImplementedError

    def _retract(self) -> None:
        raise NotImplementedError

    def _hold(self, pdu: Pdu, body: bytes, provisional: bool) -> None:
        raise NotImplementedError

    def _keep(self, data: Buffer, seq: int) -> None:
        raise NotImplementedError
