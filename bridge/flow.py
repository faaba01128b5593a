"""One direction of a storage TCP connection: where each PDU header is, segment by segment.

Problem
    A capture hands over TCP segments, not PDUs: a loaded link packs PDUs
    back to back, a header straddles two segments, a GRO'd skb is 64 KiB of
    them, most bytes are data to skip. Captures lose, repeat and reorder
    segments, and a sensor starts in the middle of sessions (a bridge slid
    into a running SAN, a restarted daemon): not knowing where the next
    header is, is the walker's normal state. Stream walks one direction by
    TCP sequence number and hands each PDU it crosses (pdu.py) to its sink.

States
    SYNCED       pdu_seq is where the next header starts, proven by the
                 chain of headers that led there.
    PROVISIONAL  a resync took a header whose successor lies beyond the
                 bytes it had; it is believed once its successor is there.
    LOST         the next header's place is unknown.
    UNMEASURABLE not iSCSI or NVMe/TCP (protocols.Sniffer: TLS, or another
                 protocol): nothing is searched or handed on.

Law, per segment (seq, payload, now)
    Before expect_seq: a retransmission, only its new bytes count; more than
    BEHIND_MAX_BYTES before it: the stream is elsewhere, a gap, LOST. After
    it (bytes lost): the walk holds if its next header is still ahead (the
    lost bytes were data), else it is LOST (a provisional header whose
    successor fell in the gap is retracted).
    SYNCED: decode the header at pdu_seq (pdu.py's walk belief), its
    sequence number within SN_STEP_MAX of the last one's; hand it to the
    sink with the time of the segment that holds its last byte (held until
    then: Wireshark times a PDU where it is whole); the sink may say the
    walk is off (the tracker's completions of nothing). A header that
    fails, or that the sink refuses, is a desync: counted, LOST, and the
    bytes after the last good header searched again.
    LOST: protocols.search() -- the first header its successor confirms,
    else the first whose successor is beyond the bytes at hand:
    PROVISIONAL. Where that successor falls it must be a header the search
    would believe: then the walk is SYNCED; else the provisional header is
    retracted (counted; the hooks undo what it did) and the bytes searched
    anew. A segment that ends before the successor is searched too, and a
    header found there takes over (the newest evidence wins: a false header
    claiming a long data segment costs a segment, not what it claims).
    iSCSI digests are the connection's, in no header: a header digest is
    recognised by its CRC32C, a data digest by where the next header is
    (until a PDU with data proves it, alt_seq notes where the next header
    would be with the other setting). A login seen from the SYN says both.

Accounting
    out_of_sync_bytes: bytes walked while not SYNCED and bytes lost in gaps
    that lost the walk; out_of_sync_s: seconds not SYNCED (a stream first
    seen mid-session starts LOST at its first segment).

Bounds
    Sequence numbers are modulo 2^32. A carry is at most a header cut by a
    segment's end; a login's or connect's body is kept to MAX_CARRY_BYTES.

Worked example (iSCSI, no digests)
    SYN with ISN 999: pdu_seq = 1000. Segment (1000, 60 bytes): a 48-byte
    SCSI Command (to the sink) and 12 bytes of the next BHS (carried).
    Segment (1060, 100 bytes): the carry completes a Data-Out of 4096 bytes
    at 1048: pdu_seq = 5192, the Data-Out held. Segment (5160, 32 bytes)
    holds its last byte: the Data-Out goes to the sink with that segment's
    time. Segment (5192, ...) starts with a header again.
"""

from __future__ import annotations

from .belief import (  # noqa: F401  (the names the tracker takes from here)
    LOST,
    MAX_CARRY_BYTES,
    MAX_SEARCHES,
    MAX_WALK,
    NO_HOOKS,
    PROVISIONAL,
    STATE_NAMES,
    SYNCED,
    UNMEASURABLE,
    WANTED,
    Belief,
    Counters,
    Hooks,
    Sink,
)
from .pdu import LOGIN, SN_STEP_MAX, Pdu
from .protocols import MASK, Buffer, Protocol, seq_diff

# A segment further behind what the walk expects is no retransmission (TCP retransmits
# within its window, a few MiB): the stream is elsewhere -- a segment forged on the
# connection's ports with a sequence number far ahead moved the walk there -- and the
# walk is LOST at the segment, searching it, instead of taking every real segment for a
# retransmission until the stream catches up (up to 2 GiB). The kernel's the same.
BEHIND_MAX_BYTES = 1 << 26


class Stream(Belief):
    """One direction's walk: feed() hands each header to sink (module header)."""

    __slots__ = ("carry", "carry_seq", "collect", "expect_seq", "lost_since", "sink", "steps")

    def __init__(self, proto: Protocol, sink: Sink | None = None, hooks: Hooks = NO_HOOKS) -> None:
        super().__init__(proto, hooks)
        self.sink: Sink = sink or (lambda pdu, body: True)
        self.expect_seq: int | None = None
        self.carry, self.carry_seq = b"", 0
        self.collect = False  # a login's or connect's body is being gathered for held
        self.lost_since: float | None = None  # when it last stopped being SYNCED
        # the segment's headers walked and searches begun (MAX_WALK, MAX_SEARCHES)
        self.steps = self.searches = 0

    # ------------------------------------------------------------ settings
    def start(self, isn: int) -> None:
        """A SYN: its next byte starts a header, and logins carry no digests."""
        self.pdu_seq = self.expect_seq = (isn + 1) & MASK
        self.carry = b""
        self.held = None
        self.digests = (False, False)
        self.dd_known = self.hd_known = True
        self.alt_seq = None
        self.sn = 0
        if self.state != UNMEASURABLE:
            self._synced(None)

    def set_unmeasurable(self, now: float | None = None) -> None:
        """Nothing here is to be read (the connection's other direction found it)."""
        if self.state == SYNCED:
            self.lost_since = now
        self.state = UNMEASURABLE
        self.carry = b""
        self.held = None

    def out_of_sync_s(self, now: float) -> float:
        """Seconds not SYNCED so far, the current stretch included."""
        s = self.counters.out_of_sync_s
        if self.state != SYNCED and self.lost_since is not None:
            s += max(0.0, now - self.lost_since)
        return s

    # ------------------------------------------------------------ walking
    def feed(self, seq: int, payload: Buffer, now: float) -> None:
        n = len(payload)
        if not n:
            return
        if seq == self.expect_seq and self.state == SYNCED and not self.carry:
            # in order, synchronised: most segments are data with no header in them
            if self.collect:
                self._gather(payload, seq)
            self.expect_seq = (seq + n) & MASK
            at = (self.pdu_seq - seq) & MASK
            if at <= n:
                self.steps = self.searches = 0
                if self.held is not None and not self._release(payload, seq, at, now):
                    return
                if at < n:
                    self._walk(payload, seq, at, 0, now)
            return
        self._feed(seq, payload, now)

    def _feed(self, seq: int, payload: Buffer, now: float) -> None:
        c = self.counters
        self.steps = self.searches = 0
        if self.state == UNMEASURABLE:
            c.out_of_sync_bytes += len(payload)
            return
        if self.expect_seq is not None:
            d = seq_diff(seq, self.expect_seq)
            if d < -BEHIND_MAX_BYTES:  # no retransmission: the stream is elsewhere
                c.gaps += 1
                if self.state == PROVISIONAL:
                    self._retract()
                if self.state != LOST:
                    self._lose(now)
            elif d < 0:  # a retransmission, or an overlap
                if -d >= len(payload):
                    c.retransmitted_bytes += len(payload)
                    return
                c.retransmitted_bytes += -d
                payload = payload[-d:]
                seq = self.expect_seq
            elif d > 0:  # the capture lost bytes
                c.gaps += 1
                self._gap(seq, d, now)
        elif self.lost_since is None:  # first seen in mid-session
            self.lost_since = now
        if self.collect:
            self._gather(payload, seq)
        self.expect_seq = (seq + len(payload)) & MASK
        buf: Buffer
        if self.carry:  # a cut header: its bytes are searched no more (the kernel's cannot)
            buf = self.carry + payload
            base = self.carry_seq
            self.carried = len(self.carry)
            self.carry = b""
        else:
            buf, base = payload, seq
            self.carried = 0
        try:
            if self.state == LOST:
                self._lost(buf, base, now)
                return
            off = seq_diff(self.pdu_seq, base)
            held = self.held is not None and 0 < off <= len(buf)
            if held and not self._release(buf, base, off, now):
                return
            if self.state == PROVISIONAL and off >= len(buf):
                self._lost(buf, base, now)  # a header found here takes over
            else:
                if self.state == PROVISIONAL:
                    self.counters.out_of_sync_bytes += off
                self._walk(buf, base, off, 0, now)
        finally:
            self.carried = 0

    def _release(self, buf: Buffer, base: int, end: int, now: float) -> bool:
        """The held PDU's last byte is in buf (before end): it goes to the sink (or the
        hooks, provisional) with this segment's time. False: the sink says the walk is
        off; the rest of buf was searched (the walk is LOST or SYNCED anew)."""
        pdu, body, provisional = self.held  # type: ignore[misc]
        self.held = None
        self.collect = False
        if provisional:
            self.hooks.provisional(pdu, body)
            return True
        if self.sink(pdu, body):
            return True
        found = self._off(buf, base, end, end, now, True)
        if found is not None:
            self._walk(buf, base, found, found, now)
        return False

    def _gather(self, payload: Buffer, seq: int) -> None:
        """More of the held login's or connect's body (module header: Bounds)."""
        pdu, body, provisional = self.held  # type: ignore[misc]
        want = min(pdu.length, MAX_CARRY_BYTES) - len(body)
        # the body's end is where the walk goes on: pdu_seq - length is its start
        if seq_diff(seq, (self.pdu_seq - pdu.length + len(body)) & MASK) != 0:
            self.collect = False  # a gap or an overlap: the text stops there
            return
        body += bytes(payload[:want])
        self.held = (pdu, body, provisional)
        self.collect = len(body) < min(pdu.length, MAX_CARRY_BYTES)

    def _gap(self, seq: int, lost: int, now: float) -> None:
        """Bytes before seq were lost: the walk holds when its next header is still
        ahead and nothing was carried."""
        if self.state == LOST:
            self.counters.out_of_sync_bytes += lost
            return
        if not self.carry and seq_diff(self.pdu_seq, seq) >= 0:  # the lost bytes were data
            if self.pdu_seq == seq:  # the held PDU's last byte too: no time to give it
                self.held = None
            self.collect = False  # a text with a hole is not read on
            return
        if self.state == PROVISIONAL:
            self._retract()
        self.counters.out_of_sync_bytes += lost
        self._lose(now)

    def _lost(self, buf: Buffer, base: int, now: float) -> None:
        """No header is known in buf (LOST, or a provisional one's successor is beyond):
        search it all."""
        if not self.proven and self.state == LOST and self._unparsed(buf, now):
            return
        if not self._may_search(now):
            return
        off = self._resync(buf, base, 0, True, now)
        self.counters.out_of_sync_bytes += len(buf) if off is None else off
        if off is not None:
            self._walk(buf, base, off, off, now)

    def _walk(self, buf: Buffer, base: int, off: int, scan_from: int, now: float) -> None:
        """Walk buf (whose first byte is at sequence number base) from off, where a
        header is; scan_from: where a search starts when the walk proves off."""
        proto = self.proto
        decode, direction, most = proto.decode_fn, proto.direction, proto.most_need
        sink, counters = self.sink, self.counters
        n = len(buf)
        steps = self.steps  # the segment's, over each walk of it
        try:
            while off < n:
                steps += 1
                if steps > MAX_WALK:  # the kernel's bound, for its walk and this one alike
                    counters.truncated += 1
                    self._lose(now)
                    return
                if n - off < most and n - off < proto.need(buf, off):  # cut by the segment's end
                    self._keep(buf[off:], base + off)
                    return
                if not self.hd_known:  # after a login the sensor did not read whole
                    self._header_digest(buf, off)
                d = self.digests
                pdu = decode(buf, off, direction, d[0], d[1], self.limit)
                if self.state != SYNCED or self.alt_seq is not None:
                    # the successor of a provisional header, or data digests unproven
                    was = self.state
                    pdu, off = self._prove(buf, base, off, pdu, now)
                    if pdu is None and was == PROVISIONAL:  # retracted: all the bytes again
                        found = self._off(buf, base, 0, off, now, False)
                        if found is None:
                            return
                        off = scan_from = found
                        continue
                elif (
                    pdu is not None
                    and pdu.sn
                    and self.sn
                    and (pdu.sn - self.sn + SN_STEP_MAX) & MASK > 2 * SN_STEP_MAX
                    and pdu.kind != LOGIN
                ):  # its sequence number must be the walk's (protocols.sn_coherent)
                    pdu = None
                if pdu is None:  # not a header where one must be
                    found = self._off(buf, base, scan_from, off, now, True)
                    if found is None:
                        return
                    off = scan_from = found
                    continue
                end = off + pdu.length
                counters.pdus += 1
                self.proven = True
                kind = pdu.kind
                body = bytes(buf[off : min(end, off + MAX_CARRY_BYTES)]) if kind in WANTED else b""
                if end > n:  # its last byte comes later: so does its time
                    self._hold(pdu, body, False)
                elif not sink(pdu, body):  # the sink says the walk is off here
                    found = self._off(buf, base, off + 1, off, now, True)
                    if found is None:
                        return
                    off = scan_from = found
                    continue
                if pdu.sn and kind != LOGIN:
                    self.sn = pdu.sn
                if not self.dd_known and pdu.segment:
                    self._note_alt(base, off, pdu)
                scan_from = off + 1
                off = end
            self.pdu_seq = (base + off) & MASK
        finally:
            self.steps = steps

    def _off(
        self, buf: Buffer, base: int, start: int, off: int, now: float, desync: bool
    ) -> int | None:
        """The walk is off at off: a desync (counted once a header was proven), LOST,
        and buf searched from start. Where the walk goes on, or None."""
        if desync and self.proven:
            self.counters.desyncs += 1
        self._lose(now)
        if not self.proven and self._unparsed(buf, now):
            return None
        if not self._may_search(now):
            return None
        found = self._resync(buf, base, start, True, now)
        self.counters.out_of_sync_bytes += max(0, (len(buf) if found is None else found) - off)
        return found

    def _hold(self, pdu: Pdu, body: bytes, provisional: bool) -> None:
        self.held = (pdu, body, provisional)
        self.collect = bool(body) and len(body) < min(pdu.length, MAX_CARRY_BYTES)

    def _keep(self, data: Buffer, seq: int) -> None:
        self.carry = bytes(data)  # a copy: a capture's buffer goes back to the kernel
        self.carry_seq = seq & MASK
        self.pdu_seq = self.carry_seq

    def _lose(self, now: float) -> None:
        if self.state == SYNCED:
            self.lost_since = now
        self.state = LOST
        self.carry = b""
        self.held = None
        self.collect = False
        self.alt_seq = None

    def _synced(self, now: float | None) -> None:
        if self.state != SYNCED and self.lost_since is not None and now is not None:
            self.counters.out_of_sync_s += max(0.0, now - self.lost_since)
        self.lost_since = None
        self.state = SYNCED

    def _retract(self) -> None:
        self.counters.retracted += 1
        if self.held is not None and self.held[2]:  # never handed on: nothing to undo
            self.held = None
            self.collect = False
        else:
            self.hooks.retract()
