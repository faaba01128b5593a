"""Captures read as they come and written back: the frames the oracle (oracle.py) and the
replays (tests/privileged/test_bridge_corpus.py) work on.

read_pcap() takes classic pcap (either byte order, micro- or nanoseconds) and pcapng,
gzipped or not, of Ethernet, Linux cooked (v1, v2), raw IP or BSD loopback frames, and
gives every frame as an Ethernet frame of its IP packet (link type 1): what the sensor
reads on a bridge port. write_pcap() writes frames as a nanosecond pcap.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from santhrottle.bridge.conns import ConnKey
from santhrottle.bridge.esp import spi_of
from santhrottle.bridge.pdu import ISCSI_PORT, NVME_TCP_PORT

STORAGE_PORTS = (ISCSI_PORT, NVME_TCP_PORT)

_PCAP_HEAD = struct.Struct("<IHHiIII")
_REC = struct.Struct("<IIII")


@dataclass
class Frame:
    ts: float
    data: bytes
    index: int  # its place in the original capture (0-based)


# link types read (pcap LINKTYPE_*): each frame becomes an Ethernet frame of its IP packet
_ETHERNET, _NULL, _LOOP, _SLL, _SLL2 = 1, 0, 108, 113, 276
_RAW, _RAW_BSD, _RAW_OPENBSD, _IPV4, _IPV6 = 101, 12, 14, 228, 229
_ETH_HEAD = b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01"  # dst, src MACs


def _ethernet(linktype: int, data: bytes) -> bytes | None:
    """The frame as Ethernet (module header: any capture's link type), or None."""
    if linktype == _ETHERNET:
        return data
    if linktype in (_NULL, _LOOP):  # a 4-byte address family, host or network order
        ip = data[4:]
    elif linktype in (_RAW, _RAW_BSD, _RAW_OPENBSD, _IPV4, _IPV6):
        ip = data
    elif linktype == _SLL and len(data) >= 16:
        et = struct.unpack_from("!H", data, 14)[0]
        return _ETH_HEAD + data[14:16] + data[16:] if et in (0x0800, 0x86DD, 0x8100) else None
    elif linktype == _SLL2 and len(data) >= 20:
        et = struct.unpack_from("!H", data, 0)[0]
        return _ETH_HEAD + data[0:2] + data[20:] if et in (0x0800, 0x86DD, 0x8100) else None
    else:
        return None
    if not ip:
        return None
    version = ip[0] >> 4
    if version not in (4, 6):
        return None
    return _ETH_HEAD + (b"\x08\x00" if version == 4 else b"\x86\xdd") + ip


def read_pcap(path: Path) -> tuple[int, list[Frame]]:
    """(link type, frames) of a capture, gzipped or not: classic pcap (either byte order,
    micro- or nanoseconds) or pcapng, of Ethernet, Linux cooked (v1, v2), raw IP or BSD
    loopback frames -- all given as Ethernet (link type 1): what the sensor reads."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    packets = _pcapng(raw, path) if raw[:4] == b"\n\r\r\n" else _pcap(raw, path)
    frames = []
    for ts, linktype, data in packets:
        eth = _ethernet(linktype, data)
        if eth is not None:
            frames.append(Frame(ts, eth, len(frames)))
    return _ETHERNET, frames


def _pcap(raw: bytes, path: Path) -> Iterator[tuple[float, int, bytes]]:
    magic = raw[:4]
    orders = {b"\xd4\xc3\xb2\xa1": ("<", 1e-6), b"\x4d\x3c\xb2\xa1": ("<", 1e-9),
              b"\xa1\xb2\xc3\xd4": (">", 1e-6), b"\xa1\xb2\x3c\x4d": (">", 1e-9)}  # fmt: skip
    if magic not in orders:
        raise ValueError(f"{path}: neither pcap nor pcapng")
    order, scale = orders[magic]
    linktype = struct.unpack_from(order + "I", raw, 20)[0] & 0x0FFFFFFF
    rec = struct.Struct(order + "IIII")
    pos = _PCAP_HEAD.size
    while pos + rec.size <= len(raw):
        sec, frac, incl, _ = rec.unpack_from(raw, pos)
        pos += rec.size
        yield sec + frac * scale, linktype, raw[pos : pos + incl]
        pos += incl


def _pcapng(raw: bytes, path: Path) -> Iterator[tuple[float, int, bytes]]:
    """pcapng's blocks: section headers (byte order), interfaces (link type, time
    resolution), enhanced and simple packets."""
    pos, order = 0, "<"
    links: list[tuple[int, int]] = []  # (link type, time units a second)
    while pos + 12 <= len(raw):
        btype = struct.unpack_from(order + "I", raw, pos)[0]
        if btype == 0x0A0D0D0A:  # a section: its byte-order magic, new interfaces
            order = "<" if raw[pos + 8 : pos + 12] == b"\x4d\x3c\x2b\x1a" else ">"
            links = []
        blen = struct.unpack_from(order + "I", raw, pos + 4)[0]
        if blen < 12 or pos + blen > len(raw):
            break
        body = raw[pos + 8 : pos + blen - 4]
        if btype == 1:  # interface description: link type, if_tsresol option
            linktype = struct.unpack_from(order + "H", body, 0)[0]
            links.append((linktype, _tsresol(body[8:], order)))
        elif btype == 6 and len(body) >= 20:  # enhanced packet
            iface, hi, lo, cap, _ = struct.unpack_from(order + "IIIII", body, 0)
            if iface < len(links):
                linktype, per = links[iface]
                ticks = (hi << 32) | lo
                yield ticks // per + (ticks % per) / per, linktype, body[20 : 20 + cap]
        elif btype == 3 and links and len(body) >= 4:  # simple packet: no time
            yield 0.0, links[0][0], body[4:]
        pos += blen


def _tsresol(options: bytes, order: str) -> int:
    """An interface's time units a second (if_tsresol, option 9; microseconds else)."""
    pos = 0
    while pos + 4 <= len(options):
        code, length = struct.unpack_from(order + "HH", options, pos)
        if code == 0:
            break
        if code == 9 and length >= 1:
            v = options[pos + 4]
            return 2 ** (v & 0x7F) if v & 0x80 else 10**v
        pos += 4 + ((length + 3) & ~3)
    return 10**6


def write_pcap(path: Path, frames: list[Frame], linktype: int = 1) -> None:
    out = [_PCAP_HEAD.pack(0xA1B23C4D, 2, 4, 0, 0, 262144, linktype)]
    for f in frames:
        ns = round(f.ts * 1e9)
        out.append(_REC.pack(ns // 10**9, ns % 10**9, len(f.data), len(f.data)))
        out.append(f.data)
    path.write_bytes(b"".join(out))


@dataclass
class Flow:
    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    flags: int
    payload_at: int  # the payload's offset in the frame
    payload_end: int
    tcp_at: int = 0  # the TCP header's offset in the frame


def ether_type(data: bytes) -> tuple[int, int]:
    """An Ethernet frame's type past its 802.1Q tags, and where its payload starts
    ((0, 0) when it is too short to have one)."""
    if len(data) < 14:
        return 0, 0
    et, p = struct.unpack_from("!H", data, 12)[0], 14
    while et in (0x8100, 0x88A8) and len(data) >= p + 4:
        et, p = struct.unpack_from("!H", data, p + 2)[0], p + 4
    return et, p


def flow_of(data: bytes) -> Flow | None:
    """Ethernet (802.1Q tags skipped), IPv4 or IPv6, TCP: the segment's flow, or None."""
    et, p = ether_type(data)
    if et == 0x0800 and len(data) >= p + 20:
        ihl = (data[p] & 15) * 4
        if data[p + 9] != 6 or struct.unpack_from("!H", data, p + 6)[0] & 0x3FFF:
            return None
        end = min(len(data), p + struct.unpack_from("!H", data, p + 2)[0])
        src = ".".join(map(str, data[p + 12 : p + 16]))
        dst = ".".join(map(str, data[p + 16 : p + 20]))
        t = p + ihl
    elif et == 0x86DD and len(data) >= p + 40:
        import ipaddress

        if data[p + 6] != 6:
            return None
        end = min(len(data), p + 40 + struct.unpack_from("!H", data, p + 4)[0])
        src = str(ipaddress.IPv6Address(data[p + 8 : p + 24]))
        dst = str(ipaddress.IPv6Address(data[p + 24 : p + 40]))
        t = p + 40
    else:
        return None
    if len(data) < t + 20:
        return None
    sport, dport, seq = struct.unpack_from("!HHI", data, t)
    off = t + (data[t + 12] >> 4) * 4
    return Flow(src, sport, dst, dport, seq, data[t + 13], off, max(off, end), t)


def conn_key(f: Flow) -> tuple[ConnKey, bool] | None:
    """The connection (initiator first) and whether the segment goes to the target."""
    if f.dport in STORAGE_PORTS:
        return (f.src, f.sport, f.dst, f.dport), True
    if f.sport in STORAGE_PORTS:
        return (f.dst, f.dport, f.src, f.sport), False
    return None


def esp_of(data: bytes) -> tuple[str, str, int, int] | None:
    """An IPsec ESP frame's (source, destination, SPI, bytes) as the sensor counts them
    (bridge/esp.py's spi_of), or None."""
    import ipaddress

    et, p = ether_type(data)
    if et == 0x0800 and len(data) >= p + 20:
        if struct.unpack_from("!H", data, p + 6)[0] & 0x3FFF:
            return None
        ihl = (data[p] & 15) * 4
        proto, l4, n = data[p + 9], p + ihl, struct.unpack_from("!H", data, p + 2)[0] - ihl
        src, dst = (
            str(ipaddress.IPv4Address(data[p + 12 : p + 16])),
            str(ipaddress.IPv4Address(data[p + 16 : p + 20])),
        )
    elif et == 0x86DD and len(data) >= p + 40:
        proto, l4, n = data[p + 6], p + 40, struct.unpack_from("!H", data, p + 4)[0]
        src = str(ipaddress.IPv6Address(data[p + 8 : p + 24]))
        dst = str(ipaddress.IPv6Address(data[p + 24 : p + 40]))
    else:
        return None
    got = spi_of(proto, data[l4:], n)
    return None if got is None else (src, dst, got[0], got[1])
