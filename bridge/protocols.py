"""How each protocol's headers are found and believed, one direction at a time.

Problem
    The stream walker (flow.py) is the same for iSCSI and NVMe/TCP; what
    differs is how many bytes a header needs, how it is decoded and
    believed (pdu.py), and where a resync may look for one. Protocol says
    that for one direction; Iscsi and NvmeTcp are stateless, one instance
    per protocol and direction (ISCSI, NVME).

Candidates
    A resync looks only where a regular expression on a header's fixed
    bytes matches -- for iSCSI the opcode, flags and the bytes each opcode
    requires to be zero (a data segment under 1 MiB), for NVMe/TCP the
    type, its flags and its hlen -- so a 64 KiB payload is searched at C
    speed, and pdu.py's plausible_*() judges what the expression lets
    through. The expression takes every header plausible_*() takes, no
    fewer (tests/unit/test_bridge_pdu.py checks it on every opcode).

Digests
    iSCSI's header digest is recognised by its CRC32C (header_digest_at);
    NVMe/TCP's digests are in each PDU's flags.

Other protocols
    tls_record() recognises a TLS record header (content type 20-23,
    version 3.1 to 3.4, a record's length): a stream of TLS on a storage
    port is encrypted (NVMe/TCP over TLS), not a desynchronised walk.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .pdu import (
    DIGEST_BYTES,
    ISCSI_BHS_BYTES,
    LOGIN_OPCODES,
    NVME_CH_BYTES,
    NVME_HLEN,
    SN_STEP_MAX,
    Pdu,
    crc32c,
    decode_iscsi,
    decode_nvme,
    plausible_iscsi,
    plausible_nvme,
)

Buffer = bytes | memoryview
Digests = tuple[bool, bool]
SEQ_MOD = 1 << 32
MASK = SEQ_MOD - 1
# A direction that shows this many bytes without ever one proven header is not
# storage traffic the sensor can read (another protocol on the port, or encrypted).
UNPARSED_BYTES = 256 * 1024
TLS, UNPARSED = "tls", "not iSCSI or NVMe/TCP"
# A header digest is judged on headers of at most this many AHS words (a SCSI Command
# the search takes has at most 16, every other header none or 2).
CRC_AHS_WORDS = 16
# The search looks at candidates within this many bytes of where it starts (the
# in-kernel walker searches so much of a segment, bridge/bpf/wire.bpf.c).
SEARCH_MAX_BYTES = 128 * 1024


def seq_diff(a: int, b: int) -> int:
    """a - b in sequence space: negative when a is before b."""
    return (a - b + (1 << 31)) % SEQ_MOD - (1 << 31)


def sn_coherent(a: int, b: int) -> bool:
    """Two sequence numbers of one direction within SN_STEP_MAX of each other (0: none)."""
    return not a or not b or (b - a + SN_STEP_MAX) & MASK <= 2 * SN_STEP_MAX


# A resync takes no header of a PDU longer than this (a data segment of 1 MiB,
# beyond what targets negotiate): a false one would skip that much of the stream.
RESYNC_MAX_PDU_BYTES = (1 << 20) + 256


class Sniffer:
    """What a stream that never showed a proven header is: TLS (a handshake record at
    its start), or after UNPARSED_BYTES another protocol (TLS if records were seen)."""

    __slots__ = ("seen", "tls")

    def __init__(self) -> None:
        self.seen = 0
        self.tls = False

    def verdict(self, buf: Buffer, at_start: bool) -> str | None:
        """buf, the stream's next bytes: TLS, UNPARSED, or None (nothing said yet)."""
        if tls_record(buf, 0):
            self.tls = True
            if buf[0] == 22 and at_start:  # its handshake
                return TLS
        self.seen += len(buf)
        if self.seen < UNPARSED_BYTES:
            return None
        return TLS if self.tls else UNPARSED


def tls_record(buf: Buffer, off: int) -> bool:
    """A TLS record header at off: content type 20-23, version 3.1-3.4, a length a
    record may have."""
    if len(buf) - off < 5:
        return False
    return (
        20 <= buf[off] <= 23
        and buf[off + 1] == 3
        and 1 <= buf[off + 2] <= 4
        and (buf[off + 3] << 8 | buf[off + 4]) <= (1 << 14) + 2048
    )


# decode_iscsi and decode_nvme: (buf, off, direction, header digest, data digest, limit)
DecodeFn = Callable[[Buffer, int, bool, bool, bool, int], Pdu | None]


class Protocol:
    """How one protocol's headers are found and decoded in one direction."""

    candidates: re.Pattern[bytes]
    digest_aware = False  # iSCSI: digests are the connection's, in no header
    # for the walk's loop, one call a header: decode_fn(buf, off, direction, header
    # digest, data digest, limit) (pdu.py), and the most bytes need() says
    decode_fn: DecodeFn
    direction = True  # to the target (controller)
    most_need = ISCSI_BHS_BYTES

    def need(self, buf: Buffer, off: int) -> int:
        """Bytes from off needed to decode the header there."""
        raise NotImplementedError

    def decode(self, buf: Buffer, off: int, digests: Digests, limit: int) -> Pdu | None:
        raise NotImplementedError

    def plausible(self, buf: Buffer, off: int, digests: Digests) -> bool:
        raise NotImplementedError


def _class(values: object) -> bytes:
    return b"[" + b"".join(re.escape(bytes([v])) for v in sorted(set(values))) + b"]"  # type: ignore[call-overload]


ANY = range(256)
DSL_HI = range(16)  # a data segment under 1 MiB (RESYNC_MAX_PDU_BYTES)
# the flags of a SCSI Command, a SCSI Response, a Login (Response), a Data-In whose
# reserved bits are zero (pdu.py)
_CMD_FLAGS = [f for f in ANY if not f & 0x18 and f & 7 <= 4]
_RESP_FLAGS = [f for f in ANY if f & 0x80 and not f & 0x61]
_LOGIN_FLAGS = [f for f in ANY if not f & 0x30]
_DATA_IN_FLAGS = [f for f in ANY if not f & 0x38]
# The fixed bytes 0-5 of each iSCSI header a resync may take (opcode, flags, 2, 3, AHS,
# the data segment's top byte), by direction: what pdu.plausible_iscsi() takes, no less.
_ISCSI_FIXED = {
    True: (
        ((0x00, 0x40), (0x80,), (0,), (0,), (0,), DSL_HI),  # NOP-Out
        ((0x01, 0x41), _CMD_FLAGS, (0,), ANY, range(17), DSL_HI),  # SCSI Command
        ((0x02, 0x42), range(0x81, 0x8F), (0,), (0,), (0,), (0,)),  # Task Management
        ((0x43,), _LOGIN_FLAGS, (0,), (0,), (0,), DSL_HI),  # Login
        ((0x04, 0x44), (0x00, 0x40, 0x80), (0,), (0,), (0,), DSL_HI),  # Text
        ((0x05,), (0x00, 0x80), (0,), (0,), (0,), DSL_HI),  # Data-Out
        ((0x06, 0x46), (0x80, 0x81, 0x82), (0,), (0,), (0,), (0,)),  # Logout
        ((0x10,), range(0x80, 0x84), (0,), (0,), (0,), (0,)),  # SNACK
    ),
    False: (
        ((0x20,), (0x80,), (0,), (0,), (0,), DSL_HI),  # NOP-In
        ((0x21,), _RESP_FLAGS, (0, 1), ANY, range(3), DSL_HI),  # SCSI Response
        ((0x22,), (0x80,), ANY, (0,), (0,), (0,)),  # Task Management Response
        ((0x23,), _LOGIN_FLAGS, (0,), (0,), (0,), DSL_HI),  # Login Response
        ((0x24,), (0x00, 0x40, 0x80), (0,), (0,), (0,), DSL_HI),  # Text
        ((0x25,), _DATA_IN_FLAGS, (0,), ANY, (0,), DSL_HI),  # Data-In
        ((0x26,), (0x80,), range(4), (0,), (0,), (0,)),  # Logout Response
        ((0x31,), (0x80,), (0,), (0,), (0,), (0,)),  # R2T
        ((0x32,), (0x80,), (0,), (0,), (0,), DSL_HI),  # Async
        ((0x3F,), (0x80,), ANY, (0,), (0,), DSL_HI),  # Reject
    ),
}


class Iscsi(Protocol):
    digest_aware = True

    def __init__(self, to_target: bool) -> None:
        self.to_target = self.direction = to_target
        self.decode_fn = decode_iscsi
        alts = b"|".join(b"".join(_class(v) for v in row) for row in _ISCSI_FIXED[to_target])
        self.candidates = re.compile(b"(?=(?:" + alts + b"))", re.S)

    def need(self, buf: Buffer, off: int) -> int:
        return ISCSI_BHS_BYTES

    def decode(self, buf: Buffer, off: int, digests: Digests, limit: int) -> Pdu | None:
        return decode_iscsi(buf, off, self.to_target, digests[0], digests[1], limit)

    def plausible(self, buf: Buffer, off: int, digests: Digests) -> bool:
        return plausible_iscsi(buf, off, self.to_target, digests[0])

    @staticmethod
    def header_digest_at(buf: Buffer, off: int) -> bool | None:
        """Whether the 4 bytes after the header at off are its CRC32C (None: they are not
        here, the header has more AHS than CRC_AHS_WORDS, or it is a login's, never
        digested: not judged)."""
        if buf[off] & 0x3F in LOGIN_OPCODES:
            return None
        ahs = buf[off + 4]
        end = off + ISCSI_BHS_BYTES + 4 * ahs
        if ahs > CRC_AHS_WORDS or len(buf) < end + DIGEST_BYTES:
            return None
        return int.from_bytes(buf[end : end + DIGEST_BYTES], "little") == crc32c(buf[off:end])


class NvmeTcp(Protocol):
    most_need = max(NVME_HLEN.values())

    def __init__(self, to_controller: bool) -> None:
        self.to_controller = self.direction = to_controller
        self.decode_fn = decode_nvme
        types = (0x00, 0x02, 0x04, 0x06) if to_controller else (0x01, 0x03, 0x05, 0x07, 0x09)
        # type, its flags, its hlen
        alts = b"|".join(
            re.escape(bytes([t])) + b"[\\x00-\\x0f]" + re.escape(bytes([NVME_HLEN[t]]))
            for t in types
        )
        self.candidates = re.compile(b"(?=" + alts + b")", re.S)

    def need(self, buf: Buffer, off: int) -> int:
        if len(buf) - off < NVME_CH_BYTES:
            return NVME_CH_BYTES
        return NVME_HLEN.get(buf[off], NVME_CH_BYTES)

    def decode(self, buf: Buffer, off: int, digests: Digests, limit: int) -> Pdu | None:
        return decode_nvme(buf, off, self.to_controller, False, False, limit)

    def plausible(self, buf: Buffer, off: int, digests: Digests) -> bool:
        return plausible_nvme(buf, off)


# One per protocol and direction (they hold no state): True is to the target.
ISCSI = {True: Iscsi(True), False: Iscsi(False)}
NVME = {True: NvmeTcp(True), False: NvmeTcp(False)}


# (offset, header, the digests it was read with, whether its successor confirmed it)
Found = tuple[int, Pdu, Digests, bool]


def search(
    proto: Protocol, buf: Buffer, start: int, limit: int, hd: bool | None, dd: bool | None
) -> Found | None:
    """The first header at or after start that its successor, inside buf, confirms
    (both plausible, their sequence numbers coherent: SN_STEP_MAX); failing that the
    first plausible one whose successor is beyond buf (not confirmed). hd, dd: the
    connection's digests where known (None: iSCSI's header digest by its CRC32C, the
    data digest both ways). Headers cut by buf's end and PDUs over RESYNC_MAX_PDU_BYTES
    are not taken."""
    n = len(buf)
    first: Found | None = None
    stop = start + SEARCH_MAX_BYTES
    for m in proto.candidates.finditer(buf, start, min(n, stop + 5)):
        off = m.start()
        if off >= stop:
            break
        if n - off < proto.need(buf, off):
            continue  # cut by the bytes' end: nothing to judge
        for digests in _choices(proto, buf, off, hd, dd):
            pdu = proto.decode(buf, off, digests, limit)
            if pdu is None or pdu.length > RESYNC_MAX_PDU_BYTES:
                continue
            if not proto.plausible(buf, off, (False, False)):  # the CRC: _choices()
                break
            nxt = off + pdu.length
            if nxt + NVME_CH_BYTES <= n and nxt + proto.need(buf, nxt) <= n:
                q = proto.decode(buf, nxt, digests, limit)
                if q is None or not proto.plausible(buf, nxt, digests):
                    continue
                if not sn_coherent(pdu.sn, q.sn):
                    continue
                return off, pdu, digests, True
            if first is None:
                first = (off, pdu, digests, False)
    return first


def prove(
    proto: Protocol,
    buf: Buffer,
    off: int,
    pdu: Pdu | None,
    digests: Digests,
    limit: int,
    sn: int,
    alt: int | None,
) -> tuple[Pdu, int, Digests] | None:
    """The header at off (pdu: decoded with digests) if it proves itself -- plausible,
    its sequence number coherent with sn -- else the one at alt (where the other data
    digest setting puts it) if that one does; else None."""
    if pdu is not None and proto.plausible(buf, off, digests) and sn_coherent(sn, pdu.sn):
        return pdu, off, digests
    if alt is not None and alt >= 0 and alt + proto.need(buf, alt) <= len(buf):
        other = (digests[0], not digests[1])
        q = proto.decode(buf, alt, other, limit)
        if q is not None and proto.plausible(buf, alt, other) and sn_coherent(sn, q.sn):
            return q, alt, other
    return None


def _choices(
    proto: Protocol, buf: Buffer, off: int, hd: bool | None, dd: bool | None
) -> tuple[Digests, ...]:
    """The digest settings a header at off may be read with: iSCSI's header digest by
    its CRC32C (one that disagrees with a known setting: none), the data digest as
    known (both while unknown)."""
    if not proto.digest_aware:
        return ((False, False),)
    crc = Iscsi.header_digest_at(buf, off)
    if hd is not None:
        if crc is not None and crc != hd:
            return ()
    else:
        hd = bool(crc)
    if dd is not None:
        return ((hd, dd),)
    return ((hd, False), (hd, True))
