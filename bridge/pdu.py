"""Storage PDUs on the wire: iSCSI's Basic Header Segment and NVMe/TCP's PDU headers.

Problem
    On a bridge the only view of the array is the TCP byte streams between
    initiators and target. A read's latency is the time from its command
    PDU to the PDU that completes it; a write's size is in its command.
    This module decodes one PDU header at a given offset of a buffer into
    what the tracker (tracker.py) needs -- what kind of PDU, which command
    (its tag), which volume, read or write, how many bytes -- and how long
    the whole PDU is, so that the stream walker (flow.py) can find the next
    header; and it says how sure a header is, for a walker that lost its
    place. It reads no socket and keeps no state.

Layouts
    iSCSI (RFC 7143 section 11; big-endian), the 48-byte BHS:
        byte 0         opcode = byte & 0x3f (bit 0x40: immediate; 0x80 reserved)
        byte 1         flags (Command: F 0x80, R 0x40, W 0x20, ATTR 0x07;
                       Data-In: F 0x80, A 0x40, O 0x04, U 0x02, S 0x01 =
                       status present; Login: T 0x80, C 0x40, CSG 0x0c, NSG 0x03)
        byte 3         status (Response; Data-In when S is set)
        byte 4         TotalAHSLength, in 4-byte words
        bytes 5-7      DataSegmentLength
        bytes 8-15     LUN (Command, Data-Out, NOP)
        bytes 16-19    Initiator Task Tag (ITT)
        bytes 20-23    Command: expected data transfer length (EDTL)
        bytes 24-27    to the target: CmdSN; to the initiator: StatSN
        bytes 28-31    to the target: ExpStatSN; to the initiator: ExpCmdSN
        bytes 32-35    to the initiator: MaxCmdSN
        bytes 32-47    Command: CDB (byte 32: 0x28/0x88/0xa8 READ(10/16/12),
                       0x2a/0x8a/0xaa WRITE(10/16/12))
      PDU length = 48 + 4 x AHS + (4 if header digest) + the data segment
      padded to 4 + (4 if data digest and a data segment).
    NVMe/TCP (NVMe/TCP transport 1.0 section 3.6; little-endian), the
    common header: byte 0 type, byte 1 flags (HDGST 0x01, DDGST 0x02,
    LAST 0x04, SUCCESS 0x08), byte 2 hlen, byte 3 pdo, bytes 4-7 plen (the
    whole PDU: digests and padding included).
        ICReq/ICResp 0x00/0x01 hlen 128 = plen: PFV 8-9, HPDA/CPDA 10, DGST
                          11, MAXR2T/MAXH2CDATA 12-15, 112 reserved bytes
        TermReq     0x02/0x03 hlen 24
        CapsuleCmd  0x04  hlen 72: SQE opcode 8 (0x02 read, 0x01 write,
                          0x7f fabrics: fctype byte 12, 0x01 connect), CID
                          10-11, NSID 12-15, SGL identifier 47, NLB 56-57
                          (blocks - 1)
        CapsuleResp 0x05  hlen 24: SQHD 16-17, SQID 18-19, CID 20-21,
                          status 22-23 (bit 0: phase)
        H2CData     0x06  hlen 24: CCCID 8-9, TTAG 10-11, DATAO 12-15, DATAL 16-19
        C2HData     0x07  hlen 24: CCCID 8-9, DATAO 12-15, DATAL 16-19, flag SUCCESS
        R2T         0x09  hlen 24: CCCID 8-9, TTAG 10-11, R2TO 12-15, R2TL 16-19

Completion
    A read completes at the iSCSI SCSI Response, or at the Data-In with
    the S bit (LIO sends F|S on a read's last Data-In and often no
    Response); an NVMe read at the CapsuleResp, or at the C2HData with
    SUCCESS (sent when SQ head updates are off; otherwise a CapsuleResp
    follows: the tracker counts the first, the second finds no command).

Two levels of belief
    decode_*() is the walk's: where the previous header's length says a
    header is, it returns None only for bytes that break what every
    implementation must do -- an opcode or type the direction does not
    send, a length the protocol cannot have (an NVMe plen that disagrees
    with hlen, pdo and DATAL; an iSCSI data segment beyond the negotiated
    MaxRecvDataSegmentLength (`limit`), on an R2T, or on a command that
    writes nothing -- a READ carries no data segment). plausible_*() is the
    resync's, for bytes at a place nothing vouches for: every reserved
    field of that opcode or type zero, the flags combinations the
    standard allows, the iSCSI command window (MaxCmdSN - ExpCmdSN + 1) at
    most MAX_CMD_WINDOW, a header digest that matches (CRC32C) when one is
    expected. Random bytes pass it about once in 10^9 offsets; bytes that
    merely look like a header (zeros, text) fail on the fields that must
    not be zero or must be.

Bounds
    No data segment over MAX_DATA_BYTES (iSCSI's 24-bit field is the
    limit) and no AHS over 64 words are a header at all.

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
# iSCSI's DataSegmentLength field is 24 bits: no data segment is longer; NVMe's plen
# is held to the same (no transfer of one PDU is near it).
MAX_DATA_BYTES = (1 << 24) - 1
# The widest iSCSI command window a header is believed with (MaxCmdSN - ExpCmdSN + 1:
# targets open a few hundred; the standard allows up to 2^31).
MAX_CMD_WINDOW = 1 << 20
# Sequence-number steps one header may make from the one before it in its direction
# (ExpStatSN to the target, ExpCmdSN to the initiator): the responses (commands) that
# crossed in between, either way a little (an initiator fills ExpStatSN when it
# builds a PDU, not when it sends it).
SN_STEP_MAX = 1 << 16

# What a PDU is to the tracker.
CMD = 1  # a command (op READ, WRITE, or 0: another one): its completion will come
DONE = 2  # completes the command with the tag
DATA_OUT = 3  # write data for the command with the tag (NVMe H2CData)
LOGIN = 4  # iSCSI login request or response (op: its flags): their text names the
# target, the initiator and the digests
CONNECT = 5  # NVMe fabrics connect: its data names the subsystem and the host
IC = 6  # NVMe/TCP ICReq or ICResp: a connection's start (its digests, MAXH2CDATA)
OTHER = 0

READ = 1
WRITE = 2

# iSCSI opcodes (byte 0 & 0x3f)
_IS_NOP_OUT, _IS_CMD, _IS_TMF, _IS_LOGIN, _IS_TEXT, _IS_DATA_OUT, _IS_LOGOUT = range(7)
_IS_SNACK = 0x10
_IS_NOP_IN, _IS_RESP, _IS_TMF_RESP, _IS_LOGIN_RESP, _IS_TEXT_RESP, _IS_DATA_IN = range(0x20, 0x26)
_IS_LOGOUT_RESP, _IS_R2T, _IS_ASYNC, _IS_REJECT = 0x26, 0x31, 0x32, 0x3F
# logins are never digested (the digests they negotiate start after them)
LOGIN_OPCODES = frozenset({_IS_LOGIN, _IS_LOGIN_RESP})
_IS_VENDOR_TO_TARGET = frozenset({0x1C, 0x1D, 0x1E})
_IS_VENDOR_TO_INITIATOR = frozenset({0x3C, 0x3D, 0x3E})
ISCSI_TO_TARGET = frozenset(
    {_IS_NOP_OUT, _IS_CMD, _IS_TMF, _IS_LOGIN, _IS_TEXT, _IS_DATA_OUT, _IS_LOGOUT, _IS_SNACK}
    | _IS_VENDOR_TO_TARGET
)
ISCSI_TO_INITIATOR = frozenset(  # NOP-In to Logout Response are 0x20-0x26
    {*range(_IS_NOP_IN, _IS_LOGOUT_RESP + 1), _IS_R2T, _IS_ASYNC, _IS_REJECT}
    | _IS_VENDOR_TO_INITIATOR
)
_SCSI_READS = frozenset({0x08, 0x28, 0x88, 0xA8})
_SCSI_WRITES = frozenset({0x0A, 0x2A, 0x8A, 0xAA})
# flag bits that must be zero (RFC 7143 11.3, 11.4, 11.7, 11.8)
_IS_CMD_RESERVED = 0x18
_IS_RESP_RESERVED = 0x61  # and bit 0x80 set
_IS_DATA_IN_RESERVED = 0x38
_F, _R, _W = 0x80, 0x40, 0x20
_LOGIN_T, _LOGIN_C = 0x80, 0x40
FULL_FEATURE = 3  # a login stage (CSG, NSG)

# NVMe/TCP PDU types and their header lengths: ICReq and ICResp 128, CapsuleCmd 72, the
# TermReqs, CapsuleResp, H2CData, C2HData and R2T 24
NVME_HLEN = {0x00: 128, 0x01: 128, 0x04: 72} | dict.fromkeys((2, 3, 5, 6, 7, 9), 24)
NVME_TO_CONTROLLER = frozenset({0x00, 0x02, 0x04, 0x06})
NVME_TO_HOST = frozenset({0x01, 0x03, 0x05, 0x07, 0x09})
_NV_IC_REQ, _NV_IC_RESP, _NV_CMD, _NV_RESP, _NV_H2C, _NV_C2H, _NV_R2T = 0, 1, 4, 5, 6, 7, 9
_NV_HDGST, _NV_DDGST, _NV_LAST, _NV_SUCCESS = 0x01, 0x02, 0x04, 0x08
# the flags each type may carry (NVMe/TCP 1.0 section 3.6)
_NV_FLAGS = dict.fromkeys((0, 1, 2, 3), 0) | {4: 0x03, 5: 0x01, 6: 0x07, 7: 0x0F, 9: 0x01}
_NVME_READ, _NVME_WRITE, _NVME_FABRICS = 0x02, 0x01, 0x7F
_FABRICS_CONNECT = 0x01
TERM_DATA_MAX = 152  # a TermReq carries at most the PDU header it rejects

# the whole BHS in one unpack: b0, flags, b2, b3, ahs, dsl (hi byte, lo 16 bits), lun,
# itt, words at 20, 24, 28, 32, 36, 40, 44
_BHS = struct.Struct(">BBBBBBHQIIIIIIII")
_BHS_DECODE = struct.Struct(">BBBBBBHQII4xIB")  # decode_iscsi's: 0-19, 20, 28, CDB byte 0
_NVME_CH = struct.Struct("<BBBBI")  # type, flags, hlen, pdo, plen
_NV_SMALL = struct.Struct("<HHIII")  # bytes 8-23 of the 24-byte headers
_NVME_SQE = struct.Struct("<BBHI")  # opcode, flags, CID, NSID (from byte 8)
_U16_LE = struct.Struct("<H")
_U32_LE = struct.Struct("<I")
_NV_RESP_END = struct.Struct("<HH")  # a CapsuleResp's CID and status (bytes 20-23)
# The decoders make a Pdu as tuple.__new__(Pdu, (its 11 fields in order)): Pdu(...) runs
# NamedTuple's __new__ in Python, a third of a decode (test_bridge_pdu checks the length).
_pdu = tuple.__new__


class Pdu(NamedTuple):
    """One decoded header. tag: ITT or CID; volume: LUN (iSCSI, the 8 bytes
    as a number: first-level addressing puts LUN n at n << 48) or NSID;
    data_bytes: an iSCSI command's expected transfer, the data an NVMe
    capsule carries in itself, an H2CData's or C2HData's DATAL, a login's
    data segment; blocks: an NVMe read's or write's block count (the wire
    does not tell the block size); header_bytes: where the PDU's data
    starts (iSCSI: after the AHS and header digest; NVMe: pdo); sn: the
    direction's acknowledgement number (iSCSI ExpStatSN to the target,
    ExpCmdSN to the initiator; 0: none). A tuple: one is made per header,
    hundreds of thousands a second."""

    kind: int
    tag: int
    op: int
    volume: int
    length: int
    data_bytes: int = 0
    status: int = 0
    header_bytes: int = 0
    blocks: int = 0
    sn: int = 0
    segment: int = 0  # iSCSI: the DataSegmentLength (NVMe: the data's bytes)


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
    limit: int = MAX_DATA_BYTES,
) -> Pdu | None:
    """The iSCSI PDU whose BHS starts at buf[off] (48 bytes needed), or None (module
    header: the walk's belief). limit: the data segment the receiver declared it takes
    (MaxRecvDataSegmentLength), for every PDU but a login's."""
    if len(buf) - off < ISCSI_BHS_BYTES:
        return None
    b0, flags, _, status, ahs, dhi, dlo, lun, itt, w20, w28, cdb0 = _BHS_DECODE.unpack_from(
        buf, off
    )
    op = b0 & 0x3F
    dsl = dhi << 16 | dlo
    if b0 & 0x80 or ahs > 64:
        return None
    hdr = ISCSI_BHS_BYTES + 4 * ahs + (DIGEST_BYTES if header_digest else 0)
    length = hdr + (((dsl + 3) & ~3) + (DIGEST_BYTES if data_digest else 0) if dsl else 0)
    if to_target:
        if op == _IS_CMD:
            if flags & _IS_CMD_RESERVED or itt == 0xFFFFFFFF or dsl > limit:
                return None
            if dsl and (not flags & _W or dsl > w20):  # only a write carries data
                return None
            rw = READ if cdb0 in _SCSI_READS else WRITE if cdb0 in _SCSI_WRITES else 0
            return _pdu(Pdu, (CMD, itt, rw, lun, length, w20, 0, hdr, 0, w28, dsl))
        if op in (_IS_DATA_OUT, _IS_NOP_OUT):
            if dsl > limit:
                return None
            kind = DATA_OUT if op == _IS_DATA_OUT else OTHER
            return _pdu(Pdu, (kind, itt, 0, lun, length, dsl, 0, hdr, 0, w28, dsl))
        if op == _IS_LOGIN:  # its text: the target, the initiator, the digests
            return _login(itt, flags, ahs, dsl)
        if op not in ISCSI_TO_TARGET or dsl > limit:
            return None
        if (op in (_IS_TMF, _IS_LOGOUT, _IS_SNACK)) and dsl:
            return None
        return _pdu(Pdu, (OTHER, itt, 0, 0, length, dsl, 0, hdr, 0, w28, dsl))
    if op == _IS_DATA_IN:
        if flags & _IS_DATA_IN_RESERVED or dsl > limit:
            return None
        if flags & 0x01:  # S: the status is in this PDU
            return _pdu(Pdu, (DONE, itt, 0, 0, length, dsl, status, hdr, 0, w28, dsl))
        return _pdu(Pdu, (OTHER, itt, 0, 0, length, dsl, 0, hdr, 0, w28, dsl))
    if op == _IS_RESP:
        if not flags & 0x80 or flags & _IS_RESP_RESERVED or dsl > limit:
            return None
        return _pdu(Pdu, (DONE, itt, 0, 0, length, dsl, status, hdr, 0, w28, dsl))
    if op == _IS_LOGIN_RESP:
        return _login(itt, flags, ahs, dsl)
    if op not in ISCSI_TO_INITIATOR or dsl > limit:
        return None
    if (op in (_IS_R2T, _IS_TMF_RESP, _IS_LOGOUT_RESP)) and dsl:
        return None
    return _pdu(Pdu, (OTHER, itt, 0, 0, length, dsl, 0, hdr, 0, w28, dsl))


def _login(itt: int, flags: int, ahs: int, dsl: int) -> Pdu:
    """A login request or response: never digested (the digests a login negotiates
    start after it), so its data segment says nothing of them (segment 0)."""
    hdr = ISCSI_BHS_BYTES + 4 * ahs
    return _pdu(Pdu, (LOGIN, itt, flags, 0, hdr + ((dsl + 3) & ~3), dsl, 0, hdr, 0, 0, 0))


def _login_flags_ok(flags: int) -> bool:
    """A Login's T, C, CSG and NSG as RFC 7143 11.12 allows them."""
    if flags & 0x30:
        return False
    csg, nsg = flags >> 2 & 3, flags & 3
    if csg == 2:
        return False
    if flags & _LOGIN_T:
        return not flags & _LOGIN_C and nsg != 2 and nsg > csg
    return True  # NSG means nothing without T


def plausible_iscsi(
    buf: bytes | memoryview, off: int, to_target: bool, header_digest: bool = False
) -> bool:
    """Whether the 48 bytes at off (and its digest, when header_digest) keep every rule
    of their opcode (module header: the resync's belief); decode_iscsi() first."""
    f = _BHS.unpack_from(buf, off)
    b0, flags, b2, b3, ahs, dhi, dlo, lun, itt, w20, w24, w28, w32, w36, w40, w44 = f
    op = b0 & 0x3F
    dsl = dhi << 16 | dlo
    if header_digest and op not in LOGIN_OPCODES:
        end = off + ISCSI_BHS_BYTES + 4 * ahs
        if len(buf) < end + DIGEST_BYTES:
            return False
        if int.from_bytes(buf[end : end + DIGEST_BYTES], "little") != crc32c(buf[off:end]):
            return False
    if to_target:
        if op == _IS_CMD:
            if b2 or (flags & 7) > 4 or (not flags & _F and not flags & _W):
                return False
            cdb0 = w32 >> 24
            if (cdb0 in _SCSI_READS and not flags & _R) or (
                cdb0 in _SCSI_WRITES and not flags & _W
            ):
                return False
            return bool(ahs <= 16)
        if ahs:
            return False
        if op == _IS_DATA_OUT:
            return not (flags & 0x7F or b2 or b3 or w24 or w32 or w44) and dsl > 0
        if op == _IS_NOP_OUT:
            return flags == 0x80 and not (b2 or b3 or w32 or w36 or w40 or w44)
        if op == _IS_LOGIN:
            if b0 != 0x43 or not _login_flags_ok(flags):
                return False
            return not (b2 or b3 or w20 & 0xFFFF or w32 or w36 or w40 or w44)
        if op == _IS_TEXT:
            return not (
                flags & 0x3F or (flags & 0xC0) == 0xC0 or b2 or b3 or w32 or w36 or w40 or w44
            )
        if op == _IS_TMF:
            return flags & 0x80 and 1 <= flags & 0x7F <= 14 and not (b2 or b3 or dsl or w40 or w44)
        if op == _IS_LOGOUT:
            if not flags & 0x80 or flags & 0x7F > 2:
                return False
            return not (b2 or b3 or dsl or lun or w20 & 0xFFFF or w32 or w36 or w40 or w44)
        if op == _IS_SNACK:
            if flags & 0xF0 != 0x80 or flags & 0x0F > 3:
                return False
            return not (b2 or b3 or dsl or w24 or w32 or w36)
        return False  # vendor-specific: only where a walk puts them
    if op != _IS_LOGIN_RESP and (w32 - w28 + 1) & 0xFFFFFFFF > MAX_CMD_WINDOW:
        return False  # MaxCmdSN - ExpCmdSN + 1: the command window
    if b0 != op or (ahs and op != _IS_RESP):
        return False
    if op == _IS_DATA_IN:
        if flags & 0x01:  # S: on the final one, with the status
            return bool(flags & 0x80) and not b2
        return not (b2 or b3) and dsl > 0  # data, no status
    if op == _IS_RESP:
        return b2 <= 1 and not lun and ahs <= 2
    if op == _IS_R2T:
        return flags == 0x80 and not (b2 or b3) and w44 > 0
    if op == _IS_NOP_IN:
        return flags == 0x80 and not (b2 or b3 or w36 or w40 or w44)
    if op == _IS_LOGIN_RESP:
        return _login_flags_ok(flags) and not (b2 or b3 or w20 or w36 & 0xFFFF or w40 or w44)
    if op == _IS_TEXT_RESP:
        return not (flags & 0x3F or (flags & 0xC0) == 0xC0 or b2 or b3 or w36 or w40 or w44)
    if op == _IS_TMF_RESP:
        return flags == 0x80 and not (b3 or dsl or lun or w20 or w36 or w40 or w44)
    if op == _IS_LOGOUT_RESP:
        return flags == 0x80 and b2 <= 3 and not (b3 or dsl or lun or w20 or w36 or w44)
    if op == _IS_ASYNC:
        return flags == 0x80 and not (b2 or b3) and itt == 0xFFFFFFFF
    if op == _IS_REJECT:
        return flags == 0x80 and not (b3 or lun) and itt == 0xFFFFFFFF and dsl >= 48
    return False


def decode_nvme(
    buf: bytes | memoryview,
    off: int,
    to_controller: bool,
    header_digest: bool = False,
    data_digest: bool = False,
    limit: int = MAX_DATA_BYTES,
) -> Pdu | None:
    """The NVMe/TCP PDU whose header starts at buf[off] (its hlen needed), or None
    (module header: the walk's belief: hlen, pdo and plen as the type has them, DATAL
    within limit on an H2CData -- the controller's MAXH2CDATA). The digests are in each
    PDU's flags: the arguments are decode_iscsi()'s, and ignored."""
    if len(buf) - off < NVME_CH_BYTES:
        return None
    ptype, flags, hlen, pdo, plen = _NVME_CH.unpack_from(buf, off)
    if NVME_HLEN.get(ptype) != hlen:
        return None
    if ptype not in (NVME_TO_CONTROLLER if to_controller else NVME_TO_HOST):
        return None
    if len(buf) - off < hlen:
        return None
    hd = DIGEST_BYTES if flags & _NV_HDGST else 0
    dd = DIGEST_BYTES if flags & _NV_DDGST else 0
    if ptype == _NV_CMD:
        if pdo:
            if pdo < hlen + hd or plen < pdo + dd:
                return None
            data = plen - pdo - dd
        elif plen != hlen + hd:
            return None
        else:
            data = 0
        opcode, _, cid, nsid = _NVME_SQE.unpack_from(buf, off + 8)
        if opcode in (_NVME_READ, _NVME_WRITE):
            nlb = _U16_LE.unpack_from(buf, off + 56)[0]
            rw = READ if opcode == _NVME_READ else WRITE
            return _pdu(Pdu, (CMD, cid, rw, nsid, plen, data, 0, pdo, nlb + 1, 0, data))
        if opcode == _NVME_FABRICS and buf[off + 12] == _FABRICS_CONNECT:
            return _pdu(Pdu, (CONNECT, cid, 0, 0, plen, data, 0, pdo, 0, 0, data))
        return _pdu(Pdu, (CMD, cid, 0, nsid, plen, data, 0, pdo, 0, 0, data))  # completes too
    if ptype == _NV_RESP:
        if pdo or plen != hlen + hd:
            return None
        cid, status = _NV_RESP_END.unpack_from(buf, off + 20)
        return _pdu(Pdu, (DONE, cid, 0, 0, plen, 0, status >> 1, 0, 0, 0, 0))  # bit 0: phase
    if ptype in (_NV_C2H, _NV_H2C):
        cid, _, _, datal, _ = _NV_SMALL.unpack_from(buf, off + 8)
        if pdo < hlen + hd or plen != pdo + datal + dd or datal > MAX_DATA_BYTES:
            return None
        if ptype == _NV_H2C:
            if datal > limit:
                return None
            return _pdu(Pdu, (DATA_OUT, cid, 0, 0, plen, datal, 0, pdo, 0, 0, datal))
        if flags & _NV_SUCCESS:
            return _pdu(Pdu, (DONE, cid, 0, 0, plen, datal, 0, pdo, 0, 0, datal))
        return _pdu(Pdu, (OTHER, cid, 0, 0, plen, datal, 0, pdo, 0, 0, datal))
    if ptype == _NV_R2T:
        if pdo or plen != hlen + hd:
            return None
        cid = _U16_LE.unpack_from(buf, off + 8)[0]
        return _pdu(Pdu, (OTHER, cid, 0, 0, plen, 0, 0, 0, 0, 0, 0))
    if ptype <= _NV_IC_RESP:
        if pdo or plen != hlen or flags:
            return None
        maxdata = _U32_LE.unpack_from(buf, off + 12)[0]  # MAXR2T or MAXH2CDATA
        return _pdu(Pdu, (IC, 0, buf[off + 11], 0, plen, maxdata, 0, 0, 0, 0, 0))
    # TermReq: the header it rejects
    if pdo or not hlen + hd <= plen <= hlen + hd + TERM_DATA_MAX:
        return None
    return _pdu(Pdu, (OTHER, 0, 0, 0, plen, 0, 0, 0, 0, 0, 0))


def plausible_nvme(buf: bytes | memoryview, off: int) -> bool:
    """Whether the header at off (decode_nvme() first) keeps every rule of its type
    (module header: the resync's belief): its flags, its reserved fields zero."""
    ptype, flags, hlen, _, _ = _NVME_CH.unpack_from(buf, off)
    if flags & ~_NV_FLAGS[ptype]:
        return False
    if ptype == _NV_CMD:
        opcode, sqe_flags, _, _ = _NVME_SQE.unpack_from(buf, off + 8)
        if sqe_flags & 0x3C or sqe_flags >> 6 == 3 or sqe_flags & 3 == 3:
            return False
        sgl_id = buf[off + 47]
        # SGL descriptor: a (transport) data block, its sub type address, offset or
        # transport-specific (0x5A: NVMe/TCP's command data in C2H/H2C PDUs)
        if sgl_id >> 4 not in (0, 5) or sgl_id & 0x0F not in (0, 1, 0x0A):
            return opcode == _NVME_FABRICS and not sqe_flags
        return True
    if ptype == _NV_RESP:
        return True
    if ptype == _NV_C2H:
        _cid, rsvd, _, datal, rsvd2 = _NV_SMALL.unpack_from(buf, off + 8)
        if flags & _NV_SUCCESS and not flags & _NV_LAST:
            return False
        return not rsvd and not rsvd2 and datal > 0
    if ptype == _NV_H2C:
        _, _, _, datal, rsvd2 = _NV_SMALL.unpack_from(buf, off + 8)
        return not rsvd2 and datal > 0
    if ptype == _NV_R2T:
        _, _, _, r2tl, rsvd2 = _NV_SMALL.unpack_from(buf, off + 8)
        return not rsvd2 and r2tl > 0
    if ptype <= _NV_IC_RESP:
        if _U16_LE.unpack_from(buf, off + 8)[0] or buf[off + 10] > 31 or buf[off + 11] & ~3:
            return False
        if ptype == _NV_IC_RESP and _U32_LE.unpack_from(buf, off + 12)[0] < 4096:
            return False
        return not any(buf[off + 16 : off + hlen])
    return True


# CRC32C (Castagnoli, reflected polynomial 0x82f63b78): iSCSI's header and data digests.
def _crc32c_table() -> tuple[int, ...]:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        out.append(c)
    return tuple(out)


_CRC32C = _crc32c_table()


def crc32c(data: bytes | memoryview) -> int:
    """CRC32C of data, as iSCSI sends it (RFC 7143 13.1: the digest's bytes on the
    wire are the CRC's, least significant first)."""
    c = 0xFFFFFFFF
    t = _CRC32C
    for b in bytes(data):
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
