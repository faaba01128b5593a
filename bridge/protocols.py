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

from .pdu import (
    DIGEST_BYTES,
    ISCSI_BHS_BYTES,
    NVME_CH_BYTES,
    NVME_HLEN,
    Pdu,
    crc32c,
    decode_iscsi,
    decode_nvme,
    plausible_iscsi,
    plausible_nvme,
)

Buffer = bytes | memoryview
Digests = tuple[bool, bool]


def tls_record(buf: Buffer, off: int) -> bool:
    """A TLS record header at off: content type 20-23, version 3.1-3.4, a length a
    record may have."""
    if len(buf) - off < 5:
        return False
    return (20 <= buf[off] <= 23 and buf[off + 1] == 3 and 1 <= buf[off + 2] <= 4
            and (buf[off + 3] << 8 | buf[off + 4]) <= (1 << 14) + 2048)  # fmt: skip


class Protocol:
    """How one protocol's headers are found and decoded in one direction."""

    candidates: re.Pattern[bytes]
    digest_aware = False  # iSCSI: digests are the connection's, in no header
    # for the walk's loop, one call a header: decode_fn(buf, off, direction, header
    # digest, data digest, limit) (pdu.py), and the bytes a header needs when fixed
    decode_fn = staticmethod(decode_iscsi)
    direction = True  # to the target (controller)
    fixed_need = 0

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
# The fixed bytes 0-5 of each iSCSI header a resync may take (opcode, flags, 2, 3, AHS,
# the data segment's top byte), by direction: what pdu.plausible_iscsi() takes, no less.
_ISCSI_FIXED = {
    True: (
        ((0x00, 0x40), (0x80,), (0,), (0,), (0,), DSL_HI),  # NOP-Out
        ((0x01, 0x41), [f for f in ANY if not f & 0x18 and f & 7 <= 4], (0,), ANY,
         range(17), DSL_HI),  # SCSI Command
        ((0x02, 0x42), range(0x81, 0x8F), (0,), (0,), (0,), (0,)),  # Task Management
        ((0x43,), [f for f in ANY if not f & 0x30], (0,), (0,), (0,), DSL_HI),  # Login
        ((0x04, 0x44), (0x00, 0x40, 0x80), (0,), (0,), (0,), DSL_HI),  # Text
        ((0x05,), (0x00, 0x80), (0,), (0,), (0,), DSL_HI),  # Data-Out
        ((0x06, 0x46), (0x80, 0x81, 0x82), (0,), (0,), (0,), (0,)),  # Logout
        ((0x10,), range(0x80, 0x84), (0,), (0,), (0,), (0,)),  # SNACK
    ),
    False: (
        ((0x20,), (0x80,), (0,), (0,), (0,), DSL_HI),  # NOP-In
        ((0x21,), [f for f in ANY if f & 0x80 and not f & 0x61], (0, 1), ANY, range(3),
         DSL_HI),  # SCSI Response
        ((0x22,), (0x80,), ANY, (0,), (0,), (0,)),  # Task Management Response
        ((0x23,), [f for f in ANY if not f & 0x30], (0,), (0,), (0,), DSL_HI),  # Login
        ((0x24,), (0x00, 0x40, 0x80), (0,), (0,), (0,), DSL_HI),  # Text
        ((0x25,), [f for f in ANY if not f & 0x38], (0,), ANY, (0,), DSL_HI),  # Data-In
        ((0x26,), (0x80,), range(4), (0,), (0,), (0,)),  # Logout Response
        ((0x31,), (0x80,), (0,), (0,), (0,), (0,)),  # R2T
        ((0x32,), (0x80,), (0,), (0,), (0,), DSL_HI),  # Async
        ((0x3F,), (0x80,), ANY, (0,), (0,), DSL_HI),  # Reject
    ),
}  # fmt: skip


class Iscsi(Protocol):
    digest_aware = True

    fixed_need = ISCSI_BHS_BYTES

    def __init__(self, to_target: bool) -> None:
        self.to_target = self.direction = to_target
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
        """Whether the 4 bytes after the header at off are its CRC32C (None: not here)."""
        end = off + ISCSI_BHS_BYTES + 4 * buf[off + 4]
        if len(buf) < end + DIGEST_BYTES:
            return None
        return int.from_bytes(buf[end : end + DIGEST_BYTES], "little") == crc32c(buf[off:end])


class NvmeTcp(Protocol):
    decode_fn = staticmethod(decode_nvme)

    def __init__(self, to_controller: bool) -> None:
        self.to_controller = self.direction = to_controller
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
