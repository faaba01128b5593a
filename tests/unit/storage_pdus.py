"""Storage PDUs as bytes, laid out field by field from RFC 7143 (iSCSI) and the NVMe/TCP
transport spec, independently of bridge/pdu.py: the tests decode what these build."""

from __future__ import annotations

import struct

# iSCSI opcodes
NOP_OUT, SCSI_CMD, LOGIN_REQ, DATA_OUT = 0x00, 0x01, 0x03, 0x05
NOP_IN, SCSI_RESP, LOGIN_RESP, DATA_IN, R2T = 0x20, 0x21, 0x23, 0x25, 0x31
READ10, WRITE10, READ16 = 0x28, 0x2A, 0x88


def _pad4(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def crc32c(data: bytes) -> int:
    """CRC32C bit by bit (RFC 3720 appendix B.4's polynomial, reflected)."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def digest(data: bytes) -> bytes:
    """An iSCSI digest as the wire carries it (the CRC's low byte first)."""
    return crc32c(data).to_bytes(4, "little")


def iscsi(
    opcode: int,
    flags: int = 0x80,
    itt: int = 1,
    lun: int = 0,
    data: bytes = b"",
    edtl: int = 0,
    cdb: bytes = b"",
    status: int = 0,
    header_digest: bool = False,
    data_digest: bool = False,
    sn: tuple[int, int, int] = (0, 0, 0),
) -> bytes:
    """One iSCSI PDU: the BHS, its header digest, the data padded to 4, its data digest.
    sn: the words at 24, 28 and 32 (to the target CmdSN, ExpStatSN; to the initiator
    StatSN, ExpCmdSN, MaxCmdSN) where the opcode has them (not over a CDB)."""
    bhs = bytearray(48)
    bhs[0] = opcode
    bhs[1] = flags
    bhs[3] = status
    bhs[5:8] = len(data).to_bytes(3, "big")
    struct.pack_into(">QII", bhs, 8, lun << 48, itt, edtl)
    struct.pack_into(">II", bhs, 24, sn[0], sn[1])
    if opcode & 0x20:  # to the initiator: MaxCmdSN
        struct.pack_into(">I", bhs, 32, sn[2])
    bhs[32 : 32 + len(cdb)] = cdb
    out = bytes(bhs) + (digest(bytes(bhs)) if header_digest else b"")
    if data:
        out += _pad4(data) + (digest(_pad4(data)) if data_digest else b"")
    return out


def scsi_read(itt: int, lun: int = 1, nbytes: int = 4096, **kw: object) -> bytes:
    cdb = bytes([READ10]) + b"\0" * 9
    return iscsi(SCSI_CMD, 0x80 | 0x40, itt, lun, edtl=nbytes, cdb=cdb, **kw)  # type: ignore[arg-type]


def scsi_write(
    itt: int, lun: int = 1, nbytes: int = 4096, immediate: bytes = b"", **kw: object
) -> bytes:
    cdb = bytes([WRITE10]) + b"\0" * 9
    return iscsi(SCSI_CMD, 0x80 | 0x20, itt, lun, immediate, edtl=nbytes, cdb=cdb, **kw)  # type: ignore[arg-type]


def data_in(itt: int, data: bytes, final_status: bool = True, **kw: object) -> bytes:
    flags = 0x80 | (0x01 if final_status else 0)
    return iscsi(DATA_IN, flags, itt, data=data, **kw)  # type: ignore[arg-type]


def scsi_response(itt: int, status: int = 0, **kw: object) -> bytes:
    return iscsi(SCSI_RESP, 0x80, itt, status=status, **kw)  # type: ignore[arg-type]


def login_request(target: str, initiator: str = "iqn.2026-11.lab:ini", itt: int = 0) -> bytes:
    text = f"InitiatorName={initiator}\0TargetName={target}\0SessionType=Normal\0".encode()
    return iscsi(LOGIN_REQ | 0x40, 0x87, itt, data=text)


# NVMe/TCP PDU types
IC_REQ, IC_RESP, CAPSULE_CMD, CAPSULE_RESP, H2C_DATA, C2H_DATA, NV_R2T = 0, 1, 4, 5, 6, 7, 9
HDGST, DDGST, LAST, SUCCESS = 0x01, 0x02, 0x04, 0x08


def nvme(ptype: int, hlen: int, header: bytes, data: bytes = b"", flags: int = 0) -> bytes:
    """One NVMe/TCP PDU: common header, the type's header fields, digest(s), data."""
    hd = b"\xaa\xbb\xcc\xdd" if flags & HDGST else b""
    dd = b"\x11\x22\x33\x44" if flags & DDGST and data else b""
    pdo = hlen + len(hd) if data else 0
    plen = hlen + len(hd) + len(data) + len(dd)
    ch = struct.pack("<BBBBI", ptype, flags, hlen, pdo, plen)
    body = (ch + header).ljust(hlen, b"\0")
    return body + hd + data + dd


def capsule_cmd(cid: int, opcode: int = 0x02, nsid: int = 1, nlb: int = 0, data: bytes = b"",
                flags: int = 0) -> bytes:  # fmt: skip
    sqe = bytearray(64)
    sqe[0] = opcode
    struct.pack_into("<HI", sqe, 2, cid, nsid)
    struct.pack_into("<H", sqe, 48, nlb)
    return nvme(CAPSULE_CMD, 72, bytes(sqe), data, flags)


def nvme_connect(subnqn: str, cid: int = 0, hostnqn: str = "nqn.2026-11.lab:host") -> bytes:
    sqe = bytearray(64)
    sqe[0] = 0x7F  # fabrics
    struct.pack_into("<H", sqe, 2, cid)
    sqe[4] = 0x01  # fctype: connect
    data = bytearray(1024)
    data[256 : 256 + len(subnqn)] = subnqn.encode()
    data[512 : 512 + len(hostnqn)] = hostnqn.encode()
    return nvme(CAPSULE_CMD, 72, bytes(sqe), bytes(data))


def capsule_resp(cid: int, status: int = 0, flags: int = 0) -> bytes:
    cqe = bytearray(16)
    struct.pack_into("<HH", cqe, 12, cid, status << 1 | 1)
    return nvme(CAPSULE_RESP, 24, bytes(cqe), flags=flags)


def c2h_data(cid: int, data: bytes, success: bool = False, flags: int = 0) -> bytes:
    hdr = struct.pack("<HHII", cid, 0, 0, len(data))
    return nvme(C2H_DATA, 24, hdr, data, flags | LAST | (SUCCESS if success else 0))


def h2c_data(cid: int, data: bytes, ttag: int = 1, flags: int = 0) -> bytes:
    hdr = struct.pack("<HHII", cid, ttag, 0, len(data))
    return nvme(H2C_DATA, 24, hdr, data, flags | LAST)
