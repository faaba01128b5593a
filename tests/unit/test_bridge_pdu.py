"""bridge/pdu.py: one header decoded from bytes built field by field (storage_pdus.py)."""

from __future__ import annotations

import struct

import pytest

from santhrottle.bridge import pdu as P
from tests.unit import storage_pdus as B


def test_the_module_headers_worked_example():
    raw = bytes.fromhex("01c000000000000000010000000000000000000700001000") + bytes(8)
    raw += bytes([0x28]) + bytes(15)
    got = P.decode_iscsi(raw, 0, to_target=True)
    assert got == P.Pdu(P.CMD, 7, P.READ, 1 << 48, 48, 4096, 0, 48)


def test_iscsi_read_and_write_commands():
    r = P.decode_iscsi(B.scsi_read(9, lun=3, nbytes=8192), 0, True)
    assert (r.kind, r.tag, r.op, r.volume, r.data_bytes, r.length) == (
        P.CMD, 9, P.READ, 3 << 48, 8192, 48,
    )  # fmt: skip
    w = P.decode_iscsi(B.scsi_write(10, nbytes=65536, immediate=b"x" * 1000), 0, True)
    assert (w.kind, w.op, w.data_bytes, w.length) == (P.CMD, P.WRITE, 65536, 48 + 1000)


def test_iscsi_completions_response_and_data_in_with_status():
    done = P.decode_iscsi(B.scsi_response(5, status=2), 0, False)
    assert (done.kind, done.tag, done.status) == (P.DONE, 5, 2)
    last = P.decode_iscsi(B.data_in(6, b"d" * 4096), 0, False)
    assert (last.kind, last.tag, last.length) == (P.DONE, 6, 48 + 4096)
    mid = P.decode_iscsi(B.data_in(6, b"d" * 4096, final_status=False), 0, False)
    assert mid.kind == P.OTHER


@pytest.mark.parametrize("hd", [False, True])
@pytest.mark.parametrize("dd", [False, True])
def test_iscsi_lengths_with_digests_and_padding(hd, dd):
    raw = B.data_in(1, b"z" * 4097, header_digest=hd, data_digest=dd)
    got = P.decode_iscsi(raw, 0, False, hd, dd)
    assert got.length == len(raw)
    assert got.header_bytes == 48 + (4 if hd else 0)


def test_iscsi_direction_and_reserved_bits_reject():
    assert P.decode_iscsi(B.scsi_response(1), 0, to_target=True) is None
    assert P.decode_iscsi(B.scsi_read(1), 0, to_target=False) is None
    bad = bytearray(B.data_in(1, b"x"))
    bad[1] |= 0x08  # a reserved Data-In flag
    assert P.decode_iscsi(bytes(bad), 0, False) is None
    bad = bytearray(B.scsi_response(1))
    bad[0] |= 0x80  # reserved bit of byte 0
    assert P.decode_iscsi(bytes(bad), 0, False) is None
    assert P.decode_iscsi(B.scsi_read(1)[:47], 0, True) is None  # too short


def test_nvme_read_write_and_in_capsule_data():
    r = P.decode_nvme(B.capsule_cmd(0x1234, 0x02, nsid=7, nlb=7), 0, True)
    assert (r.kind, r.tag, r.op, r.volume, r.blocks, r.length) == (P.CMD, 0x1234, P.READ, 7, 8, 72)
    w = P.decode_nvme(B.capsule_cmd(3, 0x01, nsid=2, nlb=1, data=b"w" * 1024), 0, True)
    assert (w.op, w.data_bytes, w.length, w.header_bytes) == (P.WRITE, 1024, 72 + 1024, 72)
    wd = P.decode_nvme(B.capsule_cmd(3, 0x01, data=b"w" * 512, flags=B.HDGST | B.DDGST), 0, True)
    assert (wd.data_bytes, wd.length, wd.header_bytes) == (512, 72 + 4 + 512 + 4, 76)


def test_nvme_completions():
    resp = P.decode_nvme(B.capsule_resp(0x5001, status=0x02), 0, False)
    assert (resp.kind, resp.tag, resp.status) == (P.DONE, 0x5001, 0x02)
    ok = P.decode_nvme(B.c2h_data(9, b"r" * 4096, success=True), 0, False)
    assert (ok.kind, ok.tag, ok.data_bytes, ok.length) == (P.DONE, 9, 4096, 24 + 4096)
    more = P.decode_nvme(B.c2h_data(9, b"r" * 4096), 0, False)
    assert more.kind == P.OTHER
    h2c = P.decode_nvme(B.h2c_data(4, b"w" * 8192), 0, True)
    assert (h2c.kind, h2c.tag, h2c.data_bytes) == (P.DATA_OUT, 4, 8192)


def test_nvme_connect_and_rejects():
    c = P.decode_nvme(B.nvme_connect("nqn.2026-11.lab:sub"), 0, True)
    assert (c.kind, c.data_bytes, c.header_bytes) == (P.CONNECT, 1024, 72)
    assert P.decode_nvme(B.capsule_resp(1), 0, to_controller=True) is None  # wrong direction
    bad = bytearray(B.capsule_resp(1))
    bad[2] = 72  # the header length of another type
    assert P.decode_nvme(bytes(bad), 0, False) is None
    bad = bytearray(B.capsule_resp(1))
    bad[4:8] = (10).to_bytes(4, "little")  # plen under hlen
    assert P.decode_nvme(bytes(bad), 0, False) is None


def _every_decoded_header() -> list[P.Pdu]:
    """A header of each iSCSI opcode (flags with and without F and S, data or none, a
    CDB that reads) and of each NVMe/TCP type, both directions: what the decoders make."""
    out = []
    for opcode in range(0x40):
        for flags in (0x00, 0x01, 0x80, 0x81, 0xA1, 0xC1, 0x87):
            for data in (b"", b"t" * 8):
                raw = B.iscsi(opcode, flags=flags, data=data, edtl=8, cdb=b"\x28")
                out += [P.decode_iscsi(raw, 0, d) for d in (True, False)]
    h2c = struct.pack("<HHII", 1, 1, 0, 8)
    for ptype, hlen in P.NVME_HLEN.items():
        for header, data in ((b"", b""), (h2c, b"d" * 8)):
            raw = B.nvme(ptype, hlen, header, data)
            out += [P.decode_nvme(raw, 0, d) for d in (True, False)]
    out += [P.decode_nvme(B.capsule_cmd(1, op, nlb=7), 0, True) for op in (0x01, 0x02, 0x00)]
    out.append(P.decode_nvme(B.nvme_connect("nqn.2026-11.lab:sub"), 0, True))
    out.append(P.decode_nvme(B.c2h_data(9, b"r" * 8, success=True), 0, False))
    return [p for p in out if p is not None]


def test_every_decoded_header_is_a_whole_pdu():
    """The decoders build Pdu tuples directly (tuple.__new__, not Pdu's __new__): each
    has every field, equal to the Pdu made of them."""
    got = _every_decoded_header()
    assert {p.kind for p in got} == {P.CMD, P.DONE, P.DATA_OUT, P.LOGIN, P.CONNECT, P.IC, P.OTHER}
    for p in got:
        assert type(p) is P.Pdu and len(p) == len(P.Pdu._fields), p
        assert p == P.Pdu(*p)
