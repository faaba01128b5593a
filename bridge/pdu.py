"""Storage PDUs on the wire: iSCSI's Basic Header Segment and NVMe/TCP's PDU headers.

Problem
    On a bridge the only view of the array is the TCP byte streams between
    initiators and target. A read's latency is the time from its command
    PDU to the PDU that completes it; a write's size is in its command.
    This module decodes one PDU header at a given offset of a buffer into
    what the tracker (tracker.py) needs -- what kind of PDU, which command
    (its tag), which volume, read or write, how many bytes -- and how long
    the whole PDU is, so that the stream walker (flow.py) can find the next
    header. It reads no socket and keeps no state.

Layouts
    iSCSI (RFC 7143 section 11; big-endian), the 48-byte BHS:
        byte 0         opcode = byte & 0x3f (bit 0x40: immediate; 0x80 reserved)
        byte 1         flags (Command: F 0x80, R 0x40, W 0x20;
                       Data-In: F 0x80, S 0x01 = status present)
        byte 3         status (Response; Data-In when S is set)
        byte 4         TotalAHSLength, in 4-byte words
        bytes 5-7      DataSegmentLength
        bytes 8-15     LUN (Command)
        bytes 16-19    Initiator Task Tag (ITT)
        bytes 20-23    Command: expected data transfer length (EDTL)
        bytes 32-47    Command: CDB (byte 32: 0x28/0x88/0xa8 READ(10/16/12),
                       0x2a/0x8a/0xaa WRITE(10/16/12))
      PDU length = 48 + 4 x AHS + (4 if header digest) + the data segment
      padded to 4 + (4 if data digest and a data segment).
    NVMe/TCP (NVMe/TCP transport 1.0 section 3.6; little-endian), the
    common header: byte 0 type, byte 1 flags (HDGST 0x01, DDGST 0x02,
    LAST 0x04, SUCCESS 0x08), byte 2 hlen, byte 3 pdo, bytes 4-7 plen (the
    whole PDU: digests and padding included).
        CapsuleCmd  0x04  hlen 72: SQE opcode 8 (0x02 read, 0x01 write,
                          0x7f fabrics: fctype byte 12, 0x01 connect), CID
                          10-11, NSID 12-15, NLB 56-57 (blocks - 1)
        CapsuleResp 0x05  hlen 24: CID 20-21, status 22-23 (bit 0: phase)
        H2CData     0x06  hlen 24: CCCID 8-9, DATAL 16-19
        C2HData     0x07  hlen 24: CCCID 8-9, DATAL 16-19, flag SUCCESS
        ICReq/ICResp 0x00/0x01 hlen 128; TermReq 0x02/0x03, R2T 0x09 hlen 24

Completion
    A read completes at the iSCSI SCSI Response, or at the Data-In with
    the S bit (LIO sends F|S on a read's last Data-In and often no
    Response); an NVMe read at the CapsuleResp, or at the C2HData with
    SUCCESS (sent when SQ head updates are off; otherwise a CapsuleResp
    follows: the tracker counts the first, the second finds no command).

Bounds
    decode_*() returns None for bytes that cannot be such a header: an
    opcode or type the direction does not send, reserved flag bits set,
    lengths past MAX_DATA_BYTES or a header length that is not the type's.
    The stream walker relies on it to resynchronise after a gap, with the
    next header as a second check (a payload that happens to look like a
    header rarely chains to another one).

Worked example
    The 48 bytes 01 c0 00 00 00 00 00 00 | 00 01 00 00 00 00 00 00 |
    00 00 00 07 | 00 00 10 00 | ... | 28 00 ... (initiator to target) are
    a SCSI Command, F|R, READ(10), LUN 1, ITT 7, 4096 bytes:
    Pdu(CMD, tag 7, READ, volume 1, length 48, data_bytes 4096).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

ISCSI_PORT = 3260
NVME_TCP_PORT = 4420

ISCSI_BHS_BYTES = 48
NVME_CH_BYTES = 8  # the common header: type, flags, hlen, pdo, plen
DIGEST_BYTES = 4
# Larger than any data segment a target negotiates (MaxRecvDataSegmentLength
# and MAXH2CDATA are far lower; 2^24 - 1 is iSCSI's field's own limit): a
# length past it is not a header.
MAX_DATA_BYTES = 16 * 1024 * 1024

# What a PDU is to the tracker.
CMD = 1  # a command (op READ, WRITE, or 0: another one): its completion will come
DONE = 2  # completes the command with the tag
DATA_OUT = 3  # write data for the command with the tag (NVMe H2CData)
LOGIN = 4  # iSCSI login request or response (op: its flags): their text names the
# target, the initiator and the digests
CONNECT = 5  # NVMe fabrics connect: its data names the subsystem and the host
OTHER = 0

READ = 1
WRITE = 2

# iSCSI opcodes (byte 0 & 0x3f)
_IS_NOP_OUT, _IS_CMD, _IS_TMF, _IS_LOGIN, _IS_TEXT, _IS_DATA_OUT, _IS_LOGOUT = range(7)
_IS_SNACK = 0x10
_IS_NOP_IN, _IS_RESP, _IS_TMF_RESP, _IS_LOGIN_RESP, _IS_TEXT_RESP, _IS_DATA_IN = range(0x20, 0x26)
_IS_LOGOUT_RESP, _IS_R2T, _IS_ASYNC, _IS_REJECT = 0x26, 0x31, 0x32, 0x3F
ISCSI_TO_TARGET = frozenset(
    {_IS_NOP_OUT, _IS_CMD, _IS_TMF, _IS_LOGIN, _IS_TEXT, _IS_DATA_OUT, _IS_LOGOUT, _IS_SNACK}
)
ISCSI_TO_INITIATOR = frozenset(
    {_IS_NOP_IN, _IS_RESP, _IS_TMF_RESP, _IS_LOGIN_RESP, _IS_TEXT_RESP, _IS_DATA_IN,
     _IS_LOGOUT_RESP, _IS_R2T, _IS_ASYNC, _IS_REJECT}
)  # fmt: skip
_SCSI_READS = frozenset({0x08, 0x28, 0x88, 0xA8})
_SCSI_WRITES = frozenset({0x0A, 0x2A, 0x8A, 0xAA})
# flag bits that must be zero (RFC 7143 11.3, 11.4, 11.7, 11.8)
_IS_CMD_RESERVED = 0x18
_IS_RESP_RESERVED = 0x61  # and bit 0x80 set
_IS_DATA_IN_RESERVED = 0x38

# NVMe/TCP PDU types and their header lengths
NVME_HLEN = {0x00: 128, 0x01: 128, 0x02: 24, 0x03: 24, 0x04: 72, 0x05: 24, 0x06: 24,
             0x07: 24, 0x09: 24}  # fmt: skip
NVME_TO_CONTROLLER = frozenset({0x00, 0x02, 0x04, 0x06})
NVME_TO_HOST = frozenset({0x01, 0x03, 0x05, 0x07, 0x09})
_NV_CMD, _NV_RESP, _NV_H2C, _NV_C2H = 0x04, 0x05, 0x06, 0x07
_NV_SUCCESS = 0x08
_NV_HDGST, _NV_DDGST = 0x01, 0x02
_NVME_READ, _NVME_WRITE, _NVME_FABRICS = 0x02, 0x01, 0x7F
_FABRICS_CONNECT = 0x01

_U32_LE = struct.Struct("<I")
_ISCSI_HEAD = struct.Struct(">BBxBB3sQII")  # op, flags, status, ahs, dsl, lun, itt, edtl
_NVME_CH = struct.Struct("<BBBBI")  # type, flags, hlen, pdo, plen
_U16_LE = struct.Struct("<H")
_NVME_SQE = struct.Struct("<BxHI")  # opcode, CID, NSID (from byte 8)


class Pdu(NamedTuple):
    """One decoded header. tag: ITT or CID; volume: LUN (iSCSI, the 8 bytes
    as a number: first-level addressing puts LUN n at n << 48) or NSID;
    data_bytes: an iSCSI command's expected transfer, the data an NVMe
    capsule carries in itself, an H2CData's or C2HData's DATAL, a login's
    data segment; blocks: an NVMe read's or write's block count (the wire
    does not tell the block size); header_bytes: where the PDU's data
    starts (iSCSI: after the AHS and header digest; NVMe: pdo). A tuple: one
    is made per header, hundreds of thousands a second."""

    kind: int
    tag: int
    op: int
    volume: int
    length: int
    data_bytes: int = 0
    status: int = 0
    header_bytes: int = 0
    blocks: int = 0


def iscsi_length(ahs_words: int, data_bytes: int, header_digest: bool, data_digest: bool) -> int:
    """The whole PDU's length on the wire."""
    n = ISCSI_BHS_BYTES + 4 * ahs_words + (DIGEST_BYTES if header_digest else 0)
    if data_bytes:
        n += (data_bytes + 3) & ~3
        if data_digest:
            n += DIGEST_BYTES
    return n


def decode_iscsi(
    buf: bytes | memoryview,
    off: int,
    to_target: bool,
    header_digest: bool = False,
    data_digest: bool = False,
) -> Pdu | None:
    """The iSCSI PDU whose BHS starts at buf[off] (48 bytes needed), or None."""
    if len(buf) - off < ISCSI_BHS_BYTES:
        return None
    b0, flags, status, ahs, dsl3, lun, itt, edtl = _ISCSI_HEAD.unpack_from(buf, off)
    if b0 & 0x80:
        return None
    op = b0 & 0x3F
    dsl = int.from_bytes(dsl3, "big")
    if dsl > MAX_DATA_BYTES or ahs > 64:
        return None
    if op not in (ISCSI_TO_TARGET if to_target else ISCSI_TO_INITIATOR):
        return None
    length = iscsi_length(ahs, dsl, header_digest, data_digest)
    hdr = length - ((dsl + 3) & ~3) - (DIGEST_BYTES if dsl and data_digest else 0)
    if op == _IS_CMD:
        if flags & _IS_CMD_RESERVED or itt == 0xFFFFFFFF:
            return None
        cdb0 = buf[off + 32]
        rw = READ if cdb0 in _SCSI_READS else WRITE if cdb0 in _SCSI_WRITES else 0
        return Pdu(CMD, itt, rw, lun, length, edtl, 0, hdr)
    if op == _IS_DATA_IN:
        if flags & _IS_DATA_IN_RESERVED:
            return None
        if flags & 0x01:  # S: the status is in this PDU
            return Pdu(DONE, itt, 0, 0, length, dsl, status, hdr)
        return Pdu(OTHER, itt, 0, 0, length, dsl, 0, hdr)
    if op == _IS_RESP:
        if not flags & 0x80 or flags & _IS_RESP_RESERVED:
            return None
        return Pdu(DONE, itt, 0, 0, length, dsl, status, hdr)
    if op in (_IS_LOGIN, _IS_LOGIN_RESP):  # their text: the target, the digests
        return Pdu(LOGIN, itt, flags, 0, length, dsl, 0, hdr)
    return Pdu(OTHER, itt, 0, 0, length, dsl, 0, hdr)


def nvme_digests(buf: bytes | memoryview, off: int) -> tuple[bool, bool]:
    """(header digest, data digest) from the flags of the PDU at buf[off]."""
    flags = buf[off + 1]
    return bool(flags & _NV_HDGST), bool(flags & _NV_DDGST)


def decode_nvme(buf: bytes | memoryview, off: int, to_controller: bool) -> Pdu | None:
    """The NVMe/TCP PDU whose header starts at buf[off] (its hlen needed), or None."""
    if len(buf) - off < NVME_CH_BYTES:
        return None
    ptype, flags, hlen, pdo, plen = _NVME_CH.unpack_from(buf, off)
    if NVME_HLEN.get(ptype) != hlen:
        return None
    if ptype not in (NVME_TO_CONTROLLER if to_controller else NVME_TO_HOST):
        return None
    if plen < hlen or plen > MAX_DATA_BYTES + 2 * hlen or (pdo and pdo < hlen):
        return None
    if len(buf) - off < hlen:
        return None
    if ptype == _NV_CMD:
        opcode, cid, nsid = _NVME_SQE.unpack_from(buf, off + 8)
        data = plen - pdo - (DIGEST_BYTES if flags & _NV_DDGST else 0) if pdo else 0
        if opcode in (_NVME_READ, _NVME_WRITE):
            nlb = _U16_LE.unpack_from(buf, off + 56)[0]
            rw = READ if opcode == _NVME_READ else WRITE
            return Pdu(CMD, cid, rw, nsid, plen, data, 0, pdo, nlb + 1)
        if opcode == _NVME_FABRICS and buf[off + 12] == _FABRICS_CONNECT:
            return Pdu(CONNECT, cid, 0, 0, plen, data, 0, pdo)
        return Pdu(CMD, cid, 0, nsid, plen, data, 0, pdo)  # its completion is awaited too
    if ptype == _NV_RESP:
        cid = _U16_LE.unpack_from(buf, off + 20)[0]
        status = _U16_LE.unpack_from(buf, off + 22)[0] >> 1  # bit 0: the phase tag
        return Pdu(DONE, cid, 0, 0, plen, 0, status, pdo)
    if ptype in (_NV_C2H, _NV_H2C):
        cid = _U16_LE.unpack_from(buf, off + 8)[0]
        datal = _U32_LE.unpack_from(buf, off + 16)[0]
        if ptype == _NV_H2C:
            return Pdu(DATA_OUT, cid, 0, 0, plen, datal, 0, pdo)
        if flags & _NV_SUCCESS:
            return Pdu(DONE, cid, 0, 0, plen, datal, 0, pdo)
        return Pdu(OTHER, cid, 0, 0, plen, datal, 0, pdo)
    return Pdu(OTHER, 0, 0, 0, plen, 0, 0, pdo)
