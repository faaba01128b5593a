"""One direction of a storage TCP connection: where each PDU header is, segment by segment.

Problem
    A capture hands over TCP segments, not PDUs. Once a link is loaded a
    segment holds several PDUs back to back, a header can straddle two
    segments, a GRO'd skb is 64 KiB of them, and most bytes are data that
    merely has to be skipped. Captures lose packets, see retransmissions
    and reordering, and a sensor starts in the middle of sessions (a
    bridge slid into a running SAN, a restarted daemon): for the walker,
    not knowing where the next header is, is the normal state. Stream walks
    one direction's byte stream by TCP sequence number and hands each PDU
    header it crosses, decoded by its protocol (pdu.py), to its sink.

States, per direction
    SYNCED       pdu_seq is where the next header starts, and the chain
                 of headers that led there proves it.
    PROVISIONAL  a resync took a header whose successor lies beyond the
                 bytes it had: pdu_seq is that successor's place, and the
                 header is believed only once its successor is there.
    LOST         the next header's place is unknown.
    UNMEASURABLE not iSCSI or NVMe/TCP to look at: TLS (a handshake record
                 at the stream's start), or UNPARSED_BYTES seen and not one
                 header ever proven. Nothing is searched or handed on.

Law, per segment (seq, payload, now)
    Behind expect_seq entirely: a retransmission, ignored; partly: its new
    bytes only. Ahead of expect_seq (the capture lost bytes): when the next
    header is still ahead (the lost bytes were a PDU's data) nothing is
    lost; else the walk is LOST (a provisional header whose successor fell
    in the gap is retracted).
    SYNCED: while the next header starts inside the bytes at hand, decode
    it (the walk's belief, pdu.py) and check its sequence number against
    the last header's (SN_STEP_MAX); hand it to the sink when its last byte
    is there (held until then), and the sink may say the walk is off (the
    tracker's run of completions of nothing); move by its length. A header
    that fails, or that the sink refuses, is a desync: counted, and the
    bytes after the last good header are searched again.
    LOST: resynchronise (below). PROVISIONAL: where the successor falls,
    it must be a header the resync would believe (decode, plausible,
    coherent with the provisional one): then both are confirmed and the
    walk goes on; else the provisional header is retracted (counted, its
    effects undone by the sink's owner) and the bytes at hand searched
    from their start. A segment that ends before the successor is searched
    as if the walk were LOST, and a header found there takes over from the
    provisional one (retracted): the newest evidence wins, so a false
    header that claims a long data segment costs one segment, not the
    segments it claims (one PDU per segment is what a reader at queue depth
    1 sends).
    Resynchronise: the first offset where a header is plausible (pdu.py:
    the resync's belief) and its successor, inside the bytes at hand, is
    plausible too and coherent with it (iSCSI: sequence numbers within
    SN_STEP_MAX): confirmed. Failing that, the first plausible header whose
    successor is beyond the bytes at hand: provisional. Nothing longer than
    RESYNC_MAX_PDU_BYTES is taken. Candidates come from a regular
    expression on the headers' fixed bytes, so a 64 KiB payload is
    searched at C speed.
    iSCSI digests are a connection's setting, not in any header. A header
    digest is recognised at a resync by its CRC32C (the 4 bytes after the
    header are the header's CRC32C, or there is no header digest); a data
    digest only by where the next header is: until a PDU with data proves
    it, the walk notes where the next header would be with the other data
    digest setting and takes that place if the expected one fails. A login
    seen from the SYN says both (tracker.py sets them).

Accounting
    out_of_sync_bytes: bytes walked while not SYNCED, and bytes lost in
    gaps that lost the walk; out_of_sync_s: seconds not SYNCED (a stream
    first seen mid-session starts LOST at its first segment).

Bounds
    Sequence arithmetic is modulo 2^32. A carry (a header cut by a
    segment's end, or a login's or connect's start) never exceeds
    MAX_CARRY_BYTES: a wanted PDU longer than that is handed on with the
    part of its body its first segment holds.

Worked example (iSCSI, no digests)
    SYN with ISN 999: pdu_seq = 1000. Segment (1000, 60 bytes) holds a
    48-byte SCSI Command and the first 12 bytes of the next BHS: the
    command goes to the sink, carry = those 12 bytes at 1048. Segment
    (1060, 100 bytes): carry + payload decode the second header at 1048 (a
    Data-Out with 4096 bytes of data): pdu_seq = 1048 + 48 + 4096 = 5192, the
    Data-Out held. Segment (5160, 32 bytes) holds its last byte: it goes to
    the sink with that segment's time (a PDU is timed where it is whole, as
    Wireshark times it). Segment (5192, ...) starts with a header again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .pdu import CONNECT, DIGEST_BYTES, LOGIN, MAX_DATA_BYTES, NVME_CH_BYTES, SN_STEP_MAX, Pdu
from .protocols import Buffer, Digests, Iscsi, Protocol, tls_record

SEQ_MOD = 1 << 32
MASK = SEQ_MOD - 1
# The most bytes kept across segments: a cut header, or a login's or connect's
# start (iSCSI login text is a few hundred bytes; the NVMe connect data is 1 KiB
# after a 72-byte header).
MAX_CARRY_BYTES = 4096
# A resync takes no header of a PDU longer than this (a data segment of 1 MiB,
# beyond what targets negotiate): a false one would skip that much of the stream.
RESYNC_MAX_PDU_BYTES = (1 << 20) + 256
# A direction that shows this many bytes without ever one proven header is not
# storage traffic the sensor can read (another protocol on the port, or encrypted).
UNPARSED_BYTES = 256 * 1024
# Wanted bodies: PDUs whose data the tracker reads (they name the target and the initiator).
WANTED = frozenset({LOGIN, CONNECT})

SYNCED, PROVISIONAL, LOST, UNMEASURABLE = 0, 1, 2, 3
STATE_NAMES = ("in sync", "provisional", "out of sync", "not measurable")
TLS, UNPARSED = "tls", "not iSCSI or NVMe/TCP"


def seq_diff(a: int, b: int) -> int:
    """a - b in sequence space: negative when a is before b."""
    return (a - b + (1 << 31)) % SEQ_MOD - (1 << 31)


def sn_coherent(a: int, b: int) -> bool:
    """Two sequence numbers of one direction within SN_STEP_MAX of each other (0: none)."""
    return not a or not b or (b - a + SN_STEP_MAX) & MASK <= 2 * SN_STEP_MAX


@dataclass(slots=True)
class Counters:
    pdus: int = 0
    retransmitted_bytes: int = 0
    gaps: int = 0
    desyncs: int = 0  # the walk was off: a non-header where a header had to be
    resyncs: int = 0
    retracted: int = 0  # provisional headers whose successor was not there
    out_of_sync_bytes: int = 0
    out_of_sync_s: float = 0.0


class Hooks:
    """What a stream tells its owner besides the PDUs of a proven walk (tracker.py);
    these defaults do nothing."""

    def provisional(self, pdu: Pdu, body: bytes) -> None:
        """A header a resync took before its successor was there."""

    def confirm(self) -> None:
        """The provisional header's successor is there: it holds."""

    def retract(self) -> None:
        """The provisional header's successor is not there: undo what it did."""

    def unmeasurable(self, reason: str) -> None:
        """Nothing here is iSCSI or NVMe/TCP to read (TLS, UNPARSED)."""

    def digests(self, digests: Digests) -> None:
        """The walk found the connection's iSCSI digests."""


Sink = Callable[[Pdu, bytes], bool]  # False: the walk is off at this PDU
NO_HOOKS = Hooks()


def _accept(pdu: Pdu, body: bytes) -> bool:
    return True


class Stream:
    """One direction's walk: feed() hands each header to sink (module header)."""

    __slots__ = ("alt_seq", "carry", "carry_seq", "counters", "dd_known", "digests",
                 "expect_seq", "hd_known", "held", "hooks", "limit", "lost_since", "pdu_seq",
                 "proto", "proven", "sink", "sn", "state", "tls_seen", "unparsed")  # fmt: skip

    def __init__(self, proto: Protocol, sink: Sink = _accept, hooks: Hooks = NO_HOOKS) -> None:
        self.proto = proto
        self.sink = sink
        self.hooks = hooks
        self.digests: Digests = (False, False)
        # the data digest proven (by a PDU with data where it said, or by the login);
        # until then alt_seq is where the next header would be under the other setting
        self.dd_known = not proto.digest_aware
        self.alt_seq: int | None = None
        self.limit = MAX_DATA_BYTES  # the receiver's MaxRecvDataSegmentLength / MAXH2CDATA
        self.state = LOST
        self.pdu_seq = 0
        self.expect_seq: int | None = None
        self.carry = b""
        self.carry_seq = 0
        # the PDU whose header was walked and whose last byte is still to come (pdu_seq
        # is its end): handed on with the time of the segment that holds that byte
        self.held: tuple[Pdu, bytes, bool] | None = None  # (pdu, body, provisional)
        self.sn = 0  # the last header's sequence number (pdu.py: Pdu.sn)
        self.counters = Counters()
        self.lost_since: float | None = None  # when it last stopped being SYNCED
        self.proven = False  # a header of it was believed
        self.hd_known = not proto.digest_aware
        self.unparsed = 0  # bytes seen before any proven header
        self.tls_seen = False

    # ------------------------------------------------------------ settings
    def start(self, isn: int) -> None:
        """A SYN: the stream's first byte (isn + 1) starts a header; a new
        connection's logins carry no digests."""
        self.pdu_seq = self.expect_seq = (isn + 1) & MASK
        self.carry = b""
        self.held = None
        self.digests = (False, False)
        self.dd_known = self.hd_known = True
        self.alt_seq = None
        self.sn = 0
        if self.state != UNMEASURABLE:
            self._synced(None)

    def set_digests(self, digests: Digests) -> None:
        """The digests a login negotiated (they apply once it completes)."""
        self.digests = digests
        self.dd_known = self.hd_known = True
        self.alt_seq = None

    def set_unmeasurable(self, now: float | None = None) -> None:
        if self.state == SYNCED:
            self.lost_since = now
        self.state = UNMEASURABLE
        self.carry = b""
        self.held = None

    @property
    def in_sync(self) -> bool:
        return self.state == SYNCED

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
            self.expect_seq = (seq + n) & MASK
            at = (self.pdu_seq - seq) & MASK
            if at <= n:
                if self.held is not None and not self._release(payload, seq, at, now):
                    return
                if at < n:
                    self._walk(payload, seq, at, 0, now)
            return
        self._feed(seq, payload, now)

    def _feed(self, seq: int, payload: Buffer, now: float) -> None:
        c = self.counters
        if self.state == UNMEASURABLE:
            c.out_of_sync_bytes += len(payload)
            return
        if self.expect_seq is not None:
            d = seq_diff(seq, self.expect_seq)
            if d < 0:  # a retransmission, or an overlap
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
        self.expect_seq = (seq + len(payload)) & MASK
        buf: Buffer
        if self.carry:
            buf = self.carry + payload
            base = self.carry_seq
            self.carry = b""
        else:
            buf, base = payload, seq
        if self.state == LOST:
            self._lost(buf, base, now)
            return
        off = seq_diff(self.pdu_seq, base)
        if self.held is not None and 0 < off <= len(buf) and not self._release(buf, base, off, now):
            return
        if self.state == SYNCED:
            self._walk(buf, base, off, 0, now)
        else:
            self._provisional(buf, base, off, now)

    def _release(self, buf: Buffer, base: int, end: int, now: float) -> bool:
        """The held PDU's last byte is in buf (before end): it goes to the sink (or the
        hooks, provisional) with this segment's time. False: the sink says the walk is
        off; the rest of buf was searched (the walk is LOST or SYNCED anew)."""
        pdu, body, provisional = self.held  # type: ignore[misc]
        self.held = None
        if provisional:
            self.hooks.provisional(pdu, body)
            return True
        if self.sink(pdu, body):
            return True
        self.counters.desyncs += 1
        self._lose(now)
        found = self._resync(buf, base, end, True, now)
        if found is not None:
            self._walk(buf, base, found, found, now)
        return False

    def _gap(self, seq: int, lost: int, now: float) -> None:
        """Bytes before seq were lost: the walk holds when its next header is still
        ahead and nothing was carried."""
        if self.state == LOST:
            self.counters.out_of_sync_bytes += lost
            return
        if not self.carry and seq_diff(self.pdu_seq, seq) >= 0:
            return  # the lost bytes were a PDU's data
        if self.state == PROVISIONAL:
            self._retract()
        self.counters.out_of_sync_bytes += lost
        self._lose(now)

    def _lost(self, buf: Buffer, base: int, now: float) -> None:
        if not self.proven and self._unparsed(buf, now):
            return
        off = self._resync(buf, base, 0, True, now)
        self.counters.out_of_sync_bytes += len(buf) if off is None else off
        if off is not None:
            self._walk(buf, base, off, off, now)

    def _provisional(self, buf: Buffer, base: int, off: int, now: float) -> None:
        """A provisional header's successor (at off) is in buf, or beyond it."""
        n = len(buf)
        if off >= n:  # still beyond: a header found here takes over (module header)
            found = self._resync(buf, base, 0, True, now)
            self.counters.out_of_sync_bytes += n if found is None else found
            if found is not None:
                self._walk(buf, base, found, found, now)
            return
        self.counters.out_of_sync_bytes += off
        self._walk(buf, base, off, 0, now)

    def _walk(self, buf: Buffer, base: int, off: int, scan_from: int, now: float) -> None:
        """Walk buf (whose first byte is at sequence number base) from off, where a
        header is; scan_from: where a search starts when the walk proves off."""
        proto = self.proto
        decode, direction, fixed = proto.decode_fn, proto.direction, proto.fixed_need
        sink = self.sink
        n = len(buf)
        while off < n:
            if n - off < (fixed or proto.need(buf, off)):  # a header cut by the segment's end
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
                    found = self._resync(buf, base, 0, True, now)
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
            ):
                pdu = None  # its sequence number is not the walk's
            if pdu is None:  # not a header where one must be
                if self.proven:
                    self.counters.desyncs += 1
                self._lose(now)
                if not self.proven and self._unparsed(buf, now):
                    return
                found = self._resync(buf, base, scan_from, True, now)
                self.counters.out_of_sync_bytes += (n if found is None else found) - off
                if found is None:
                    return
                off = scan_from = found
                continue
            end = off + pdu.length
            if pdu.kind in WANTED and end > n and pdu.length <= MAX_CARRY_BYTES:
                self._keep(buf[off:], base + off)  # its body comes in the next segments
                return
            self.counters.pdus += 1
            self.proven = True
            body = bytes(buf[off:end]) if pdu.kind in WANTED else b""
            if end > n:  # its last byte comes later: so does its time
                self.held = (pdu, body, False)
            elif not sink(pdu, body):  # the sink says the walk is off here
                self.counters.desyncs += 1
                self._lose(now)
                found = self._resync(buf, base, off + 1, True, now)
                if found is None:
                    return
                off = scan_from = found
                continue
            if pdu.sn and pdu.kind != LOGIN:
                self.sn = pdu.sn
            if not self.dd_known and pdu.segment:
                self.alt_seq = (base + off + self._other_length(pdu)) & MASK
            scan_from = off + 1
            off = end
        self.pdu_seq = (base + off) & MASK

    def _prove(
        self, buf: Buffer, base: int, off: int, pdu: Pdu | None, now: float
    ) -> tuple[Pdu | None, int]:
        """The header at off must prove itself: it follows a provisional header, or
        one whose data digest is unproven (alt_seq). The header (and where it is) if
        it does; (None, off) with the walk LOST (retracted) or PROVISIONAL (a cut
        successor, kept) if it does not."""
        proto = self.proto
        ok = pdu is not None and proto.plausible(buf, off, self.digests)
        ok = ok and sn_coherent(self.sn, pdu.sn)  # type: ignore[union-attr]
        if ok and self.alt_seq is not None:
            self.dd_known = True  # a header where the data digest setting said
        elif not ok and self.alt_seq is not None:
            alt = seq_diff(self.alt_seq, base)
            other = (self.digests[0], not self.digests[1])
            if alt >= 0 and alt + proto.need(buf, alt) <= len(buf):
                q = proto.decode(buf, alt, other, self.limit)
                if (
                    q is not None
                    and proto.plausible(buf, alt, other)
                    and sn_coherent(self.sn, q.sn)
                ):
                    self._adopt(other)
                    self.dd_known = True
                    pdu, off, ok = q, alt, True
        self.alt_seq = None
        if ok:
            if self.state == PROVISIONAL:
                self._synced(now)
                self.hooks.confirm()
            return pdu, off
        if self.state == PROVISIONAL:
            self._retract()
            self._lose(now)
        return None, off

    def _header_digest(self, buf: Buffer, off: int) -> None:
        """Whether the header at off has a header digest, by its CRC32C (none when the
        4 bytes after it are not there: the walk keeps its setting)."""
        crc = Iscsi.header_digest_at(buf, off)
        if crc is not None:
            self.hd_known = True
            self._adopt((crc, self.digests[1]))

    def _other_length(self, pdu: Pdu) -> int:
        """pdu's length with the other data digest setting."""
        return pdu.length + (-DIGEST_BYTES if self.digests[1] else DIGEST_BYTES)

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
        else:
            self.hooks.retract()

    def _unparsed(self, buf: Buffer, now: float) -> bool:
        """A stream that never showed a proven header: TLS at its start, or too many
        bytes of something else, make it UNMEASURABLE (True)."""
        if self.counters.pdus == 0 and tls_record(buf, 0):
            self.tls_seen = True
            if buf[0] == 22 and not self.counters.out_of_sync_bytes:  # its handshake
                self._unmeasurable(TLS, now)
                return True
        self.unparsed += len(buf)
        if self.unparsed < UNPARSED_BYTES:
            return False
        self._unmeasurable(TLS if self.tls_seen else UNPARSED, now)
        return True

    def _unmeasurable(self, reason: str, now: float) -> None:
        self.counters.out_of_sync_bytes += self.unparsed
        self.set_unmeasurable(now)
        self.hooks.unmeasurable(reason)

    def _resync(
        self, buf: Buffer, base: int, start: int, provisional: bool, now: float
    ) -> int | None:
        """The first offset >= start where a header is confirmed (module header); with
        `provisional`, failing that the first provisional one, handed to the hooks.
        The confirmed offset, to walk from (the walk is SYNCED there), or None."""
        proto = self.proto
        n = len(buf)
        taken: tuple[int, Pdu, Digests] | None = None
        for m in proto.candidates.finditer(buf, start):
            off = m.start()
            if n - off < proto.need(buf, off):
                continue  # cut by the bytes' end: nothing to judge
            for digests in self._choices(buf, off):
                pdu = proto.decode(buf, off, digests, self.limit)
                if pdu is None or pdu.length > RESYNC_MAX_PDU_BYTES:
                    continue
                if not proto.plausible(buf, off, (False, False)):  # the CRC: _choices()
                    break
                nxt = off + pdu.length
                if nxt + NVME_CH_BYTES <= n and nxt + proto.need(buf, nxt) <= n:
                    q = proto.decode(buf, nxt, digests, self.limit)
                    if q is None or not proto.plausible(buf, nxt, digests):
                        continue
                    if not sn_coherent(pdu.sn, q.sn):
                        continue
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
                if taken is None and provisional:
                    taken = (off, pdu, digests)
        if taken is not None:
            self._take(buf, base, *taken)
        return None

    def _choices(self, buf: Buffer, off: int) -> tuple[Digests, ...]:
        """The digest settings a header at off may be walked with: iSCSI's header digest
        by its CRC32C (one that disagrees with a proven setting: none), the data digest
        as known (both while unproven)."""
        if not self.proto.digest_aware:
            return (self.digests,)
        crc = Iscsi.header_digest_at(buf, off)
        if self.hd_known:
            hd = self.digests[0]
            if crc is not None and crc != hd:
                return ()
        else:
            hd = bool(crc)
        if self.dd_known:
            return ((hd, self.digests[1]),)
        return ((hd, False), (hd, True))

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
        body = bytes(buf[off:nxt]) if pdu.kind in WANTED else b""
        if nxt <= len(buf):
            self.hooks.provisional(pdu, body)
        else:  # its last byte comes later
            self.held = (pdu, body, True)
        self.sn = pdu.sn if pdu.kind != LOGIN else 0
        if not self.dd_known and pdu.segment:
            self.alt_seq = (base + off + self._other_length(pdu)) & MASK
        if nxt < len(buf):
            self._keep(buf[nxt:], base + nxt)
        else:
            self.pdu_seq = (base + nxt) & MASK

    def _adopt(self, digests: Digests) -> None:
        if digests != self.digests:
            self.digests = digests
            self.hooks.digests(digests)
