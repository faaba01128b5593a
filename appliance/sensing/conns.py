"""Established TCP connections on the storage ports, from sock_diag (pyroute2).

On a target whose TPGs generate their ACLs (generate_node_acls=1) LIO
keeps no initiator addresses, and nvmet never does: the peers of the
established connections to the portal ports are the connected initiators.
One dump of all established IPv4 + IPv6 TCP sockets, filtered here by local
port.

A dump can be captured as JSON (`santhrottle-capture` in the lab) and parsed
with parse_diag_dump(), the same code path as a live dump.

Errors: a live dump raises OSError (the socket) or its subclass SockDiagError,
whose message is one line: the kernel answered NLMSG_ERROR (errno set), no reply
came within RECV_TIMEOUT_S, or a datagram is not a well-formed netlink dump
(parse_datagram(), pure: a message shorter than its header or longer than what
is left of the datagram, a truncated NLMSG_ERROR, an empty datagram). A record
of another type or too short for a socket id is skipped; parse_diag_dump() skips
every record it cannot read. For example:

    >>> parse_datagram(struct.pack("=IHHII", 40, 18, 2, 1, 0), 18, None, {})
    Traceback (most recent call last):
    SockDiagError: sock_diag: nlmsg_len 40 runs past the datagram (16 byte(s) left)
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import os
import socket
import struct
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Any

from santhrottle.appliance.netns import entered

TCP_ESTABLISHED = 1
_PORT_MAX = 65535


@dataclass(frozen=True, slots=True)
class TcpConn:
    local_ip: str
    local_port: int
    peer_ip: str
    peer_port: int


class SockDiagError(OSError):
    """A sock_diag dump that failed: the kernel's NLMSG_ERROR (errno set), no reply in
    time, or a malformed datagram. The message is one line."""


def _norm(ip: str) -> str:
    """Canonical text form; IPv4-mapped IPv6 (::ffff:a.b.c.d) as IPv4. ValueError
    (or TypeError) for anything that is not an address."""
    try:  # a dotted quad as the kernel prints it is already canonical (C calls only)
        if socket.inet_ntop(socket.AF_INET, socket.inet_pton(socket.AF_INET, ip)) == ip:
            return ip
    except OSError:
        pass
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def parse_diag_dump(records: Iterable[Mapping[str, Any]], ports: Iterable[int]) -> list[TcpConn]:
    """sock_diag records (dicts with the idiag_* fields) -> established conns on `ports`."""
    wanted = set(ports)
    out: list[TcpConn] = []
    for r in records:
        try:
            if r.get("idiag_state", TCP_ESTABLISHED) != TCP_ESTABLISHED:
                continue
            sport = int(r["idiag_sport"])
            if sport not in wanted:
                continue
            dport = int(r["idiag_dport"])
            if not 0 <= dport <= _PORT_MAX:
                continue
            out.append(TcpConn(_norm(r["idiag_src"]), sport, _norm(r["idiag_dst"]), dport))
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError):
            continue  # a record we cannot read is not a connection we can use
    return out


# Raw sock_diag (linux/inet_diag.h). pyroute2 0.9.7's DiagSocket decodes about
# 10k messages/s: a dump of 10,000 sockets took 0.8-1.2 s here, over the whole
# 1 s discovery budget. The request and the fixed-size inet_diag_msg are two
# structs, so this reads them directly (about 100x faster; make bench).
#
# One request for both families: TCPDIAG_GETSOCK, the inet_diag request of
# Linux < 3.3 that every kernel still serves (sock_diag's compat path), dumps
# IPv4 and IPv6 sockets in one walk of the TCP hash table; a SOCK_DIAG_BY_FAMILY
# request per family walks the whole table twice (262,144 buckets here, ~0.6 ms
# a walk; 9.9 -> 9.0 ms for 10,000 sockets, make bench). A kernel that refuses
# it gets the two requests.
NETLINK_SOCK_DIAG = 4
TCPDIAG_GETSOCK = 18
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
_NLMSGHDR = struct.Struct("=IHHII")
_REQ_V1 = struct.Struct("=BBBB48xII")  # family, src/dst len, ext, sockid (zeros), states, dbs
_REQ_V2 = struct.Struct("=BBBxI48x")  # family, protocol, ext, states, sockid (zeros)
_REFUSED = frozenset((errno.EINVAL, errno.ENOENT, errno.EOPNOTSUPP))  # request not served
_RECV_BYTES = 1 << 20
# A dump the kernel does not finish in this time fails (recv would block forever)
RECV_TIMEOUT_S = 5.0


# One socket as the dump gives it: inet_diag_sockid's first 36 bytes, sport and
# dport (network order), src and dst (16 bytes each; an IPv4 address in the
# first 4). Compared as bytes (an unchanged dump is one list comparison) and
# decoded only when the dump changed.
_SockId = bytes
_Raw = tuple[int, list[_SockId]]  # (family, ids) per address family
# A buffer of messages that all have the same length (88 bytes of nlmsghdr +
# inet_diag_msg, plus the attributes this kernel always adds: 124 bytes on 6.x
# even with ext = 0) is decoded by one struct for the whole buffer (C speed, one
# tuple: nlmsg_len, nlmsg_type, idiag_family, sockid[:36] per message), anything
# else message by message. A dump comes in datagrams of at most 32 KiB (netlink
# caps a dump's allocation), so there are few message counts per buffer: full
# buffers, and the last one.
_MSG_MIN_BYTES = 88
_FAMILY_OFFSET = 16  # after nlmsghdr
_ID_OFFSET = 16 + 4  # nlmsghdr, then family/state/timer/retrans
_BUFFER_STRUCTS_CACHED = 64


@functools.lru_cache(maxsize=_BUFFER_STRUCTS_CACHED)
def _buffer_struct(msg_bytes: int, count: int) -> struct.Struct:
    """(len, type, family, sockid[:36]) of `count` messages of `msg_bytes` each."""
    return struct.Struct("=" + f"IH10xB3x36s{msg_bytes - _ID_OFFSET - 36}x" * count)


def _buffer_ids(
    data: memoryview, mtype: int, wanted: tuple[bytes, ...] | None, out: dict[int, list[_SockId]]
) -> bool:
    """Appends the ids of a buffer of equal-length `mtype` messages (with a local
    port in `wanted`: 2 bytes each, network order) to out[family]; False, and
    nothing appended, for any other buffer."""
    size = int.from_bytes(data[:4], sys.byteorder) if len(data) >= _NLMSGHDR.size else 0
    if size < _MSG_MIN_BYTES or size % 4 or len(data) % size:
        return False
    count = len(data) // size
    fields = _buffer_struct(size, count).unpack(data)
    if fields[0::4].count(size) != count or fields[1::4].count(mtype) != count:
        return False
    ids: Iterable[_SockId] = fields[3::4]
    families: Iterable[int] = fields[2::4]
    if wanted is not None:  # an id starts with its local port
        keep = list(map(bytes.startswith, ids, repeat(wanted)))
        ids, families = list(compress(ids, keep)), list(compress(families, keep))
    present = set(families)
    for fam in present:
        dst = out.setdefault(fam, [])
        dst.extend(ids if len(present) == 1 else compress(ids, map(fam.__eq__, families)))
    return True


def _strerror(err: int) -> str:
    try:
        return os.strerror(err)
    except (ValueError, OverflowError):  # not an errno this platform knows
        return f"error {err}"


def parse_datagram(
    data: bytes | memoryview,
    mtype: int,
    wanted: tuple[bytes, ...] | None,
    out: dict[int, list[_SockId]],
) -> bool:
    """One received datagram of a dump: the ids of its `mtype` records (with a local
    port in `wanted`, all if None) appended to out[family]; True when it ends the dump
    (NLMSG_DONE). Pure. Raises SockDiagError for the kernel's NLMSG_ERROR (errno set)
    and for a malformed datagram; a record of another type or too short for an id is
    skipped. Every message advances the offset by at least a header: it ends."""
    if _buffer_ids(data, mtype, wanted, out):
        return False
    if not len(data):
        raise SockDiagError("sock_diag: empty datagram")
    data = bytes(data)
    unpack_hdr, hlen, end = _NLMSGHDR.unpack_from, _NLMSGHDR.size, len(data)
    off = 0
    while off < end:
        if end - off < hlen:
            raise SockDiagError(f"sock_diag: {end - off} trailing byte(s), less than a header")
        length, msg_type, _flags, _seq, _pid = unpack_hdr(data, off)
        if length < hlen:
            raise SockDiagError(f"sock_diag: nlmsg_len {length} is shorter than its header")
        if length > end - off:
            raise SockDiagError(
                f"sock_diag: nlmsg_len {length} runs past the datagram ({end - off} byte(s) left)"
            )
        if msg_type == NLMSG_DONE:
            return True
        if msg_type == NLMSG_ERROR:
            if length < hlen + 4:
                raise SockDiagError(f"sock_diag: NLMSG_ERROR of {length} bytes, truncated")
            err = -struct.unpack_from("=i", data, off + hlen)[0]
            if err == 0:
                raise SockDiagError("sock_diag: an acknowledgement inside a dump")
            raise SockDiagError(err, f"sock_diag: {_strerror(err)}")
        if msg_type == mtype and length >= _ID_OFFSET + 36:
            sid = data[off + _ID_OFFSET : off + _ID_OFFSET + 36]
            if wanted is None or sid.startswith(wanted):
                out.setdefault(data[off + _FAMILY_OFFSET], []).append(sid)
        off += (length + 3) & ~3
    return False


def _dump(
    sock: socket.socket,
    mtype: int,
    request: bytes,
    seq: int,
    wanted: tuple[bytes, ...] | None,
    buf: bytearray,
) -> dict[int, list[_SockId]]:
    """One dump request, its replies until NLMSG_DONE: family -> socket ids.
    `buf` is the receive buffer (received into: a fresh 1 MiB object per datagram
    cost ~1 ms per dump of 10,000 sockets)."""
    sock.send(
        _NLMSGHDR.pack(_NLMSGHDR.size + len(request), mtype, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
        + request
    )
    out: dict[int, list[_SockId]] = {}
    view = memoryview(buf)
    while True:
        try:
            received = view[: sock.recv_into(buf)]
        except TimeoutError:
            raise SockDiagError(f"sock_diag: no reply within {RECV_TIMEOUT_S:g} s") from None
        if parse_datagram(received, mtype, wanted, out):
            return out


def _decode(family: int, sid: _SockId) -> tuple[int, int, bytes, bytes]:
    """sport, dport, src, dst (packed addresses of the family's length)."""
    alen = 4 if family == socket.AF_INET else 16
    return (
        int.from_bytes(sid[0:2], "big"),
        int.from_bytes(sid[2:4], "big"),
        sid[4 : 4 + alen],
        sid[20 : 20 + alen],
    )


def _dump_sockets(
    sock: socket.socket, ports: frozenset[int] | None, buf: bytearray, one_walk: bool = True
) -> list[_Raw]:
    """IPv4 then IPv6 established sockets with a local port in `ports` (all if
    None), through a bound NETLINK_SOCK_DIAG socket; one_walk=False: a request per
    family, what a kernel that refuses TCPDIAG_GETSOCK gets."""
    wanted = None if ports is None else tuple(p.to_bytes(2, "big") for p in sorted(ports))
    established = 1 << TCP_ESTABLISHED
    ids: dict[int, list[_SockId]] | None = None
    if one_walk:
        try:
            req = _REQ_V1.pack(socket.AF_UNSPEC, 0, 0, 0, established, 0)
            ids = _dump(sock, TCPDIAG_GETSOCK, req, 1, wanted, buf)
        except OSError as e:
            if e.errno not in _REFUSED:
                raise
    if ids is None:  # the refusal was the request's only reply: the socket is clean
        ids = {}
        for seq, fam in enumerate((socket.AF_INET, socket.AF_INET6), start=2):
            req = _REQ_V2.pack(fam, socket.IPPROTO_TCP, 0, established)
            ids.update(_dump(sock, SOCK_DIAG_BY_FAMILY, req, seq, wanted, buf))
    return [(fam, ids.get(fam, [])) for fam in (socket.AF_INET, socket.AF_INET6)]


def _dump_raw(
    netns: str | None,
    ports: frozenset[int] | None,
    buf: bytearray | None = None,
    one_walk: bool = True,
) -> list[_Raw]:
    """_dump_sockets() through a socket of its own, in `netns` if given."""
    buf = bytearray(_RECV_BYTES) if buf is None else buf
    with entered(netns or None):  # the socket is the namespace's for its life
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    with sock:
        sock.settimeout(RECV_TIMEOUT_S)
        sock.bind((0, 0))
        return _dump_sockets(sock, ports, buf, one_walk)


def dump_established(
    netns: str | None = None, ports: Iterable[int] | None = None
) -> list[dict[str, Any]]:
    """Live dump of established TCP sockets (IPv4 and IPv6) with a local port in
    `ports` (all if None), as the idiag_* dicts pyroute2 produces (the format of
    the captured fixtures)."""
    ntop = socket.inet_ntop
    out = []
    for fam, ids in _dump_raw(netns, None if ports is None else frozenset(ports)):
        for sid in ids:
            sport, dport, src, dst = _decode(fam, sid)
            out.append(
                {
                    "idiag_src": ntop(fam, src),
                    "idiag_sport": sport,
                    "idiag_dst": ntop(fam, dst),
                    "idiag_dport": dport,
                    "idiag_state": TCP_ESTABLISHED,  # the dump asks for no other state
                }
            )
    return out


class ConnectionSensor:
    """Established connections to the given local ports, optionally inside a netns."""

    def __init__(self, ports: Iterable[int], netns: str | None = None) -> None:
        self.ports = tuple(sorted(set(ports)))
        self.netns = netns
        self._last_raw: list[_Raw] = []
        self._last_conns: list[TcpConn] = []
        self._buf = bytearray(_RECV_BYTES)  # one receive buffer for every dump

    def connections(self) -> list[TcpConn]:
        """The dump straight to TcpConn, each distinct address converted once;
        an unchanged dump returns the previous list."""
        raw = _dump_raw(self.netns, frozenset(self.ports), self._buf)
        if raw == self._last_raw:
            return self._last_conns
        names: dict[bytes, str] = {}

        def name(fam: int, raw: bytes) -> str:
            n = names.get(raw)
            if n is None:
                n = names[raw] = _norm(socket.inet_ntop(fam, raw))
            return n

        self._last_raw = raw
        conns = []
        for fam, ids in raw:
            for sid in ids:
                sport, dport, src, dst = _decode(fam, sid)
                conns.append(TcpConn(name(fam, src), sport, name(fam, dst), dport))
        self._last_conns = conns
        return conns
