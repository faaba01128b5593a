"""iSCSI data digests made part of their data segments, so that Wireshark can be the reference.

Wireshark 4.0 (Debian 12's tshark) reads iSCSI header digests but not data digests
(its data digest preferences are gone): on a session that negotiated DataDigest=CRC32C
it takes each data digest for the next PDU's first bytes and loses most PDUs. This
module gives tshark the same traffic with each data digest counted in its PDU's data
segment, framed independently of the sensor:

  * per iSCSI connection direction, the bytes from its SYN on, reassembled by sequence
    number;
  * the login phase walked (its PDUs carry no digests) to the target's last login
    answer, whose text says what was negotiated (HeaderDigest, DataDigest);
  * with both digests CRC32C, every later header is proven by its own header digest
    (a CRC32C over it: one chance in 2^32 for bytes that are not one); from one
    header the next is where its lengths say, and after a hole (bytes the capture
    lost) the first offset whose header digest matches;
  * each header with a data segment gets DataSegmentLength = its padded length + 4 (the
    digest's bytes are then data to Wireshark) and its header digest computed anew,
    in every frame that holds those bytes.

No byte moves: the PDUs end where they end, in the frames they end in, and Wireshark
times them there, as the sensor does. A session with a data digest but no header digest
is left as it is (nothing independent frames it).
"""

from __future__ import annotations

import struct

from santhrottle.bridge.pdu import ISCSI_PORT
from tests.wire.pcaps import Frame, conn_key, flow_of

BHS = 48
MASK = (1 << 32) - 1
TO_INITIATOR_OPCODES = frozenset({0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x31, 0x32, 0x3F})
TO_TARGET_OPCODES = frozenset({0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x10})


def _crc32c_table() -> list[int]:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        out.append(c)
    return out


_T = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _pad(n: int) -> int:
    return (n + 3) & ~3


class _Direction:
    """One direction's bytes from its SYN (None where the capture has none)."""

    def __init__(self, isn: int) -> None:
        self.base = (isn + 1) & MASK
        self.data = bytearray()
        self.known = bytearray()  # 1 where a byte was captured
        self.headers: dict[int, tuple[int, int]] = {}  # data digest -> (header, length)

    def put(self, seq: int, payload: bytes) -> None:
        at = (seq - self.base) & MASK
        if at > 1 << 30:  # before the SYN's: not this session's
            return
        end = at + len(payload)
        if end > len(self.data):
            self.data.extend(bytes(end - len(self.data)))
            self.known.extend(bytes(end - len(self.known)))
        self.data[at:end] = payload
        self.known[at:end] = b"\x01" * len(payload)

    def have(self, a: int, b: int) -> bool:
        return b <= len(self.data) and all(self.known[a:b])


def _login_end(d: _Direction) -> tuple[int, dict[str, str]] | None:
    """Where the login phase ends in d, and the keys its PDUs' texts said."""
    pos, keys = 0, {}
    while d.have(pos, pos + BHS):
        op, flags = d.data[pos] & 0x3F, d.data[pos + 1]
        if op not in (0x03, 0x23):
            return pos, keys
        dsl = int.from_bytes(d.data[pos + 5 : pos + 8], "big")
        hdr = BHS + 4 * d.data[pos + 4]
        text = bytes(d.data[pos + hdr : pos + hdr + dsl])
        for pair in text.split(b"\0"):
            k, _, v = pair.decode("ascii", "replace").partition("=")
            if k:
                keys[k] = v
        pos += hdr + _pad(dsl)
        if op == 0x23 and flags & 0x80 and flags & 3 == 3:  # the last answer
            return pos, keys
    return None


def _header_at(d: _Direction, p: int, opcodes: frozenset[int]) -> int | None:
    """The header at p proven by its digest: the end of its data segment, else None."""
    if not d.have(p, p + BHS) or d.data[p] & 0x3F not in opcodes or d.data[p + 4] > 16:
        return None
    hdr = BHS + 4 * d.data[p + 4]
    if not d.have(p + hdr, p + hdr + 4):
        return None
    if crc32c(bytes(d.data[p : p + hdr])) != struct.unpack_from("<I", d.data, p + hdr)[0]:
        return None
    dsl = int.from_bytes(d.data[p + 5 : p + 8], "big")
    return p + hdr + 4 + _pad(dsl) if dsl else -(p + hdr + 4)  # negative: no data


def _digests(d: _Direction, start: int, opcodes: frozenset[int]) -> list[int]:
    """The offsets of d's data digests after start (module header); d.headers maps each
    to its header (offset, length with its AHS)."""
    out, p = [], start
    while p + BHS <= len(d.data):
        end = _header_at(d, p, opcodes)
        if end is None:  # a hole or damage: the next header its digest proves
            p += 1
            continue
        if end < 0:
            p = -end
            continue
        out.append(end)
        d.headers[end] = (p, BHS + 4 * d.data[p + 4])
        p = end + 4
    return out


def _patches(d: _Direction, start: int, opcodes: frozenset[int]) -> dict[int, int]:
    """Byte offset -> new value: each data segment's length with its digest, and the
    header digest over the header so changed (module header)."""
    out: dict[int, int] = {}
    for end in _digests(d, start, opcodes):
        p, hdr = d.headers[end]
        dsl = _pad(int.from_bytes(d.data[p + 5 : p + 8], "big")) + 4
        head = bytearray(d.data[p : p + hdr])
        head[5:8] = dsl.to_bytes(3, "big")
        for i, v in enumerate(head[5:8], p + 5):
            out[i] = v
        for i, v in enumerate(crc32c(bytes(head)).to_bytes(4, "little"), p + hdr):
            out[i] = v
    return out


def readable_data_digests(frames: list[Frame]) -> list[Frame]:
    """frames with the data digests of sessions that negotiated both digests made part
    of their data segments (module header); the others as they are."""
    dirs: dict[tuple[object, bool], _Direction] = {}
    for fr in frames:  # each direction from its SYN
        f = flow_of(fr.data)
        key = conn_key(f) if f is not None else None
        if f is None or key is None or key[0][3] != ISCSI_PORT:
            continue
        if f.flags & 0x02:
            dirs[key] = _Direction(f.seq)
        elif key in dirs and f.payload_end > f.payload_at:
            dirs[key].put(f.seq, fr.data[f.payload_at : f.payload_end])
    patches: dict[tuple[object, bool], dict[int, int]] = {}
    for (conn, to_target), d in dirs.items():
        answer = dirs.get((conn, False))
        login = _login_end(answer) if answer is not None else None
        if login is None:
            continue
        keys = login[1]
        if keys.get("HeaderDigest") != "CRC32C" or keys.get("DataDigest") != "CRC32C":
            continue
        mine = _login_end(d) if to_target else login
        if mine is not None:
            opcodes = TO_TARGET_OPCODES if to_target else TO_INITIATOR_OPCODES
            patches[conn, to_target] = _patches(d, mine[0], opcodes)
    if not patches:
        return frames
    out = []
    for fr in frames:
        f = flow_of(fr.data)
        key = conn_key(f) if f is not None else None
        todo = patches.get(key) if key is not None else None
        if f is None or key is None or not todo or f.flags & 0x02:
            out.append(fr)
            continue
        a = (f.seq - dirs[key].base) & MASK
        data = bytearray(fr.data)
        for i in range(f.payload_end - f.payload_at):
            v = todo.get(a + i)
            if v is not None:
                data[f.payload_at + i] = v
        out.append(Frame(fr.ts, bytes(data), fr.index))
    return out
