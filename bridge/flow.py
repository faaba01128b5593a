"""One direction of a storage TCP connection: where each PDU header is, segment by segment.

Problem
    A capture hands over TCP segments, not PDUs. Once a link is loaded a
    segment holds several PDUs back to back, a header can straddle two
    segments, a GRO'd skb is 64 KiB of them, and most bytes are data that
    merely has to be skipped. Captures also lose packets and see
    retransmissions, and a sensor may start in the middle of a session.
    Stream walks one direction's byte stream by TCP sequence number and
    yields each PDU header it crosses, decoded by its protocol (pdu.py).

State, per direction
    pdu_seq: the sequence number where the next header starts (None:
    not synchronised). carry: the bytes of a header cut by the end of a
    segment (at most MAX_CARRY_BYTES), or the start of a PDU whose body
    is wanted (iSCSI login, NVMe connect: they name the target and the
    initiator, and are at most MAX_CARRY_BYTES long), from carry_seq.
    expect_seq: the sequence number after the last byte seen.

Law, per segment (seq, payload)
    behind expect_seq entirely: a retransmission, ignored; partly: its
    new bytes only. Ahead of expect_seq: a gap (bytes the capture lost) --
    the position of the next header is unknown: resynchronise. Otherwise
    walk: while the next header starts inside the bytes at hand, decode it
    (None: not a header where one must be -- count it, resynchronise from
    there), emit it, move by its length.
    Resynchronise: find the first offset where a header decodes and the
    header after it (if inside the bytes at hand) decodes too, trying the
    digest settings the protocol allows (iSCSI: negotiated at login; a
    sensor that missed the login tries each, and a header whose successor
    is past the bytes at hand is confirmed, or its digests corrected, where
    that successor falls); only the full feature phase's I/O PDUs, none
    over RESYNC_MAX_PDU_BYTES; candidates come from a regular expression on
    the header's fixed bytes, so a 64 KiB payload is scanned at C speed.

Bounds
    Sequence arithmetic is modulo 2^32. A carry never exceeds
    MAX_CARRY_BYTES: a wanted PDU longer than that is emitted with the
    part of its body its first segment holds.

Worked example (iSCSI, no digests)
    SYN with ISN 999: pdu_seq = 1000. Segment (1000, 60 bytes) holds a
    48-byte SCSI Command and the first 12 bytes of the next BHS: one PDU
    emitted, carry = those 12 bytes at 1048. Segment (1060, 100 bytes):
    carry + payload decode the second header at 1048 (a Data-Out with 4096
    bytes of data): pdu_seq = 1048 + 48 + 4096 = 5192; nothing else in this
    segment. Segment (5192, ...) starts with a header again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .pdu import (
    CONNECT,
    ISCSI_BHS_BYTES,
    LOGIN,
    NVME_CH_BYTES,
    NVME_HLEN,
    Pdu,
    decode_iscsi,
    decode_nvme,
)

SEQ_MOD = 1 << 32
Buffer = bytes | memoryview  # a segment's payload: a capture's frame is decoded in place
# The most bytes kept across segments: a cut header, or a login's or connect's
# start (iSCSI login text is a few hundred bytes; the NVMe connect data is 1 KiB
# after a 72-byte header).
MAX_CARRY_BYTES = 4096
# A resync takes no header of a PDU longer than this (a data segment of 1 MiB,
# beyond what targets negotiate): a false one would skip that much of the stream.
RESYNC_MAX_PDU_BYTES = (1 << 20) + 256
# Wanted bodies: PDUs whose data the tracker reads (they name the target and the initiator).
WANTED = frozenset({LOGIN, CONNECT})


def seq_diff(a: int, b: int) -> int:
    """a - b in sequence space: negative when a is before b."""
    return (a - b + (1 << 31)) % SEQ_MOD - (1 << 31)


@dataclass(slots=True)
class Counters:
    pdus: int = 0
    retransmitted_bytes: int = 0
    gaps: int = 0
    desyncs: int = 0  # a non-header where a header had to be
    resyncs: int = 0


class Protocol:
    """How one protocol's headers are found and decoded in one direction."""

    # iSCSI's header digests are a connection's setting, not in each PDU
    digest_choices: tuple[tuple[bool, bool], ...] = ((False, False),)
    candidates: re.Pattern[bytes]

    def need(self, buf: Buffer, off: int) -> int:
        """Bytes from off needed to decode the header there."""
        raise NotImplementedError

    def decode(self, buf: Buffer, off: int, digests: tuple[bool, bool]) -> Pdu | None:
        raise NotImplementedError


class Iscsi(Protocol):
    digest_choices = ((False, False), (True, False), (False, True), (True, True))

    def __init__(self, to_target: bool) -> None:
        self.to_target = to_target
        # byte 0: an opcode of the full feature phase's I/O (to the target NOP-Out,
        # Command, Data-Out, with bit 0x40, immediate, on the first two; to the
        # initiator NOP-In, Response, Data-In, R2T: a resync lands on the next such
        # PDU); byte 4: no AHS (extended CDBs are rare); byte 5: a data segment
        # under 1 MiB
        ops = bytes([0x00, 0x01, 0x05, 0x40, 0x41] if to_target else [0x20, 0x21, 0x25, 0x31])
        self.candidates = re.compile(b"(?=[" + ops + b"][\\x00-\\xff]{3}\\x00[\\x00-\\x0f])", re.S)

    def need(self, buf: Buffer, off: int) -> int:
        return ISCSI_BHS_BYTES

    def decode(self, buf: Buffer, off: int, digests: tuple[bool, bool]) -> Pdu | None:
        return decode_iscsi(buf, off, self.to_target, digests[0], digests[1])


class NvmeTcp(Protocol):
    def __init__(self, to_controller: bool) -> None:
        self.to_controller = to_controller
        # the I/O's PDUs (not ICReq/ICResp, which only start a stream, nor TermReq)
        types = (0x04, 0x06) if to_controller else (0x05, 0x07, 0x09)
        # type, flags (4 bits), hlen of that type
        alts = b"|".join(
            re.escape(bytes([t])) + b"[\\x00-\\x0f]" + re.escape(bytes([NVME_HLEN[t]]))
            for t in types
        )
        self.candidates = re.compile(b"(?=" + alts + b")", re.S)

    def need(self, buf: Buffer, off: int) -> int:
        if len(buf) - off < NVME_CH_BYTES:
            return NVME_CH_BYTES
        return NVME_HLEN.get(buf[off], NVME_CH_BYTES)

    def decode(self, buf: Buffer, off: int, digests: tuple[bool, bool]) -> Pdu | None:
        return decode_nvme(buf, off, self.to_controller)


# (pdu, its body's bytes as far as captured: for WANTED kinds, else b"")
Emitted = tuple[Pdu, bytes]
_NONE: list[Emitted] = []  # returned for no header: never appended to
Digests = tuple[bool, bool]


class Stream:
    """One direction's walk; feed() returns the headers crossed."""

    __slots__ = ("alts", "carry", "carry_seq", "counters", "digests", "expect_seq",
                 "on_digests", "pdu_seq", "proto", "verified")  # fmt: skip

    def __init__(
        self, proto: Protocol, on_digests: Callable[[Digests], None] | None = None
    ) -> None:
        self.proto = proto
        self.digests: Digests = (False, False)
        # digests confirmed: by a header where the previous one's length under them
        # said, or set by the login (set_digests); until then, where the next
        # header would be under each other choice (alts)
        self.verified = len(proto.digest_choices) == 1
        self.alts: list[tuple[Digests, int]] = []
        self.on_digests = on_digests  # the walk found the connection's digests
        self.pdu_seq: int | None = None
        self.expect_seq: int | None = None
        self.carry = b""
        self.carry_seq = 0
        self.counters = Counters()

    def start(self, isn: int) -> None:
        """A SYN: the stream's first byte (isn + 1) starts a header; a new
        connection's digests are negotiated anew."""
        self.pdu_seq = self.expect_seq = (isn + 1) % SEQ_MOD
        self.carry = b""
        self.digests = (False, False)
        self.verified = len(self.proto.digest_choices) == 1
        self.alts = []

    def set_digests(self, digests: Digests) -> None:
        """The digests negotiated at login (they apply once it completes)."""
        self.digests = digests
        self.verified = True
        self.alts = []

    def feed(self, seq: int, payload: Buffer) -> list[Emitted]:
        n = len(payload)
        if not n:
            return _NONE
        if seq == self.expect_seq and not self.carry and self.pdu_seq is not None:
            # in order, synchronised: most segments are data with no header in them
            self.expect_seq = (seq + n) % SEQ_MOD
            at = (self.pdu_seq - seq) % SEQ_MOD
            if at >= n:
                return _NONE
            out: list[Emitted] = []
            self._walk(payload, seq, at, out)
            return out
        out = []
        if self.expect_seq is not None:
            d = seq_diff(seq, self.expect_seq)
            if d < 0:  # a retransmission, or an overlap
                if -d >= len(payload):
                    self.counters.retransmitted_bytes += len(payload)
                    return _NONE
                self.counters.retransmitted_bytes += -d
                payload = payload[-d:]
                seq = self.expect_seq
            elif d > 0:  # the capture lost bytes: the next header's place is unknown
                self.counters.gaps += 1
                self._lose_sync()
        self.expect_seq = (seq + len(payload)) % SEQ_MOD
        buf: Buffer
        if self.carry:
            buf = self.carry + payload
            base = self.carry_seq
            self.carry = b""
        else:
            buf, base = payload, seq
        if self.pdu_seq is None:
            off = self._resync(buf, 0)
            if off is None:
                return out
        else:
            off = seq_diff(self.pdu_seq, base)
            if off < 0:  # cannot happen with a consistent state; be safe
                self._lose_sync()
                return out
        self._walk(buf, base, off, out)
        return out

    def _walk(self, buf: Buffer, base: int, off: int, out: list[Emitted]) -> None:
        proto = self.proto
        n = len(buf)
        while off < n:
            need = proto.need(buf, off)
            if n - off < need:  # a header cut by the segment's end
                self._keep(buf[off:], base + off)
                return
            pdu = proto.decode(buf, off, self.digests)
            if self.alts:  # the previous header's length was under unconfirmed digests
                if pdu is not None:
                    self.verified = True  # a header where they said: confirmed
                else:  # another choice's length?
                    hit = self._try_alts(buf, base)
                    if hit is not None:
                        off, pdu = hit
                self.alts = []
            if pdu is None:
                self.counters.desyncs += 1
                self._lose_sync()
                nxt = self._resync(buf, off + 1)
                if nxt is None:
                    return
                off = nxt
                continue
            if pdu.kind in WANTED and n - off < pdu.length <= MAX_CARRY_BYTES:
                self._keep(buf[off:], base + off)  # its body comes in the next segments
                return
            self.counters.pdus += 1
            body = bytes(buf[off : off + pdu.length]) if pdu.kind in WANTED else b""
            out.append((pdu, body))
            if not self.verified:
                self._note_alts(buf, base, off)
            off += pdu.length
        self.pdu_seq = (base + off) % SEQ_MOD

    def _note_alts(self, buf: Buffer, base: int, off: int) -> None:
        """Where the next header is under each digest choice but the current one."""
        for d in self.proto.digest_choices:
            if d != self.digests:
                alt = self.proto.decode(buf, off, d)
                if alt is not None:
                    self.alts.append((d, (base + off + alt.length) % SEQ_MOD))

    def _try_alts(self, buf: Buffer, base: int) -> tuple[int, Pdu] | None:
        for d, seq in self.alts:
            off = seq_diff(seq, base)
            if off >= 0 and off + self.proto.need(buf, off) <= len(buf):
                pdu = self.proto.decode(buf, off, d)
                if pdu is not None:
                    self._adopt(d)
                    self.verified = True
                    return off, pdu
        return None

    def _keep(self, data: Buffer, seq: int) -> None:
        self.carry = bytes(data)  # a copy: a capture's buffer goes back to the kernel
        self.carry_seq = seq % SEQ_MOD
        self.pdu_seq = self.carry_seq

    def _lose_sync(self) -> None:
        self.pdu_seq = None
        self.carry = b""
        self.alts = []

    def _resync(self, buf: Buffer, start: int) -> int | None:
        """The first offset >= start where a header decodes that the next one does not
        refute (see the module header)."""
        proto = self.proto
        n = len(buf)
        for m in proto.candidates.finditer(buf, start):
            off = m.start()
            if n - off < proto.need(buf, off):
                return None
            for digests in proto.digest_choices:
                pdu = proto.decode(buf, off, digests)
                if pdu is None or pdu.kind in WANTED or pdu.length > RESYNC_MAX_PDU_BYTES:
                    continue  # logins and connects only start a stream (its SYN is seen)
                nxt = off + pdu.length
                if nxt + proto.need(buf, nxt) <= n:  # the next header is here: check it
                    if proto.decode(buf, nxt, digests) is None:
                        continue  # refuted
                    verified = True
                else:  # to be confirmed where the next header falls (alts)
                    verified = len(proto.digest_choices) == 1
                self.counters.resyncs += 1
                self._adopt(digests)
                self.verified = verified
                return off
        return None

    def _adopt(self, digests: Digests) -> None:
        if digests != self.digests:
            self.digests = digests
            if self.on_digests is not None:
                self.on_digests(digests)
