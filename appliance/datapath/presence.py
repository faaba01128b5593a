"""The drift check's presence read: a few small netlink requests, every convergence.

Problem
    The full comparison (datapath/drift.py, find_drift) reads every device's
    whole tc tree through pyroute2: ~20 ms of CPU for the default ladder's 193
    objects on the development host, many times that in the one-vCPU lab guest,
    too much for every convergence (1 s).  Whether the objects are there at
    all is a far smaller question: pyroute2's asyncio machinery alone costs
    more per request than the kernel's answer.

What it owns
    Netlink: one raw netlink socket of a protocol, opened inside the namespace
    at its first request and kept (the namespace's Host.inside()); request()
    sends one message and returns the answers' (type, payload), a dump's up to
    its NLMSG_DONE.  Presence holds three (rtnetlink, nfnetlink for ipset and
    nftables) and reads:
      root(dev)         the device's root qdisc: (kind, handle), one
                        RTM_GETQDISC with NLM_F_ECHO (the kernel answers a get
                        to its asker only then)
      set_summary()     our sets: name -> (CADT flags, member count), one
                        header-only IPSET_CMD_LIST dump (what `ipset list -t`
                        prints)
      set_members(name) one of our sets' members -> their skbprio: one
                        IPSET_CMD_LIST dump of that set (what `ipset save NAME`
                        prints, without the counters; no process)
      nft_generation()  nftables' ruleset generation: one NFT_MSG_GETGEN.  It
                        changes with every nftables transaction in the
                        namespace (iptables-nft's included): while it is the
                        one read with what the data path left, nothing in
                        nftables changed.
      tree(dev)         a digest of the device's tc tree as configured: every
                        class's and qdisc's handle, parent, kind and
                        options (one class dump, one qdisc dump), their
                        statistics, the root's direct-queue count and the
                        glide leaves' options left out (datapath/glide.py
                        changes those at every handoff)
      nft_table(family, name)  whether nftables has that table: one
                        NFT_MSG_GETTABLE (the bridge's `table bridge
                        santhrottle`).

Cost
    On the development host (2026-11-29, a namespace with the default
    ladder's tree): a root 7 us of CPU, the sets' summary 73 us against
    880 us for pyroute2's header dump, the generation 6 us; the whole
    presence read 0.09 ms a convergence (tests/bench/bench_drift.py).

Worked example
    p = Presence(Host("tgt")); p.root("eth1") -> ("htb", 0x53740000);
    p.set_summary()["santhrottle-all"] -> (IPSET_FLAG_WITH_COUNTERS |
    IPSET_FLAG_WITH_SKBINFO, 3); p.nft_generation() -> 17; p.close().
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import struct
from collections.abc import Iterator

from santhrottle.appliance.datapath.host import Host
from santhrottle.appliance.datapath.names import OWNED_SETS, DatapathError, is_glide_minor

NETLINK_ROUTE, NETLINK_NETFILTER = 0, 12
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ECHO, NLM_F_DUMP = 0x1, 0x2, 0x8, 0x300
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
# linux/rtnetlink.h, linux/pkt_sched.h
RTM_GETQDISC, RTM_GETTCLASS = 38, 42
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_HTB_INIT = 2  # inside a root HTB's TCA_OPTIONS: tc_htb_glob
TC_H_ROOT = 0xFFFFFFFF
# linux/netfilter/nfnetlink.h, nf_tables.h, ipset/ip_set.h
NFNL_SUBSYS_IPSET, NFNL_SUBSYS_NFTABLES = 6, 10
IPSET_CMD_LIST = 7
IPSET_PROTOCOL = 7
IPSET_ATTR_PROTOCOL, IPSET_ATTR_SETNAME, IPSET_ATTR_FLAGS, IPSET_ATTR_DATA = 1, 2, 6, 7
IPSET_ATTR_CADT_FLAGS, IPSET_ATTR_ELEMENTS = 8, 24  # inside IPSET_ATTR_DATA
IPSET_ATTR_ADT = 8  # a list's members: one IPSET_ATTR_DATA each
IPSET_ATTR_IP, IPSET_ATTR_SKBPRIO = 1, 28  # inside a member's IPSET_ATTR_DATA
IPSET_ATTR_IPADDR_IPV4, IPSET_ATTR_IPADDR_IPV6 = 1, 2  # inside IPSET_ATTR_IP
IPSET_FLAG_LIST_HEADER = 1 << 2
NFT_MSG_GETTABLE, NFT_MSG_GETGEN = 1, 16
NFTA_TABLE_NAME, NFTA_GEN_ID = 1, 1
NFPROTO_BRIDGE = 7

_HDR = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_TCMSG = struct.Struct("=BxxxiIII")  # family, ifindex, handle, parent, info
_NFGEN = struct.Struct("=BBH")  # nfgenmsg: family, version, res_id
_NLA = struct.Struct("=HH")  # len, type
_ROW = struct.Struct("=BII")  # a tree digest's row: kind, handle, parent
_ROW_ATTR = struct.Struct("=HI")  # and each attribute: type, length


def attrs(data: bytes, off: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each netlink attribute in data[off:end]."""
    end = len(data) if end is None else end
    while off + _NLA.size <= end:
        length, kind = _NLA.unpack_from(data, off)
        if length < _NLA.size or off + length > end:
            return
        yield kind & NLA_TYPE_MASK, data[off + _NLA.size : off + length]
        off += (length + 3) & ~3


def _without_counts(options: bytes) -> bytes:
    """A root HTB's options without the packets its direct queue counted (tc_htb_glob's
    direct_pkts, its last u32): the rest is configuration."""
    out = []
    for t, v in attrs(options):
        out.append(struct.pack("=H", t) + (v[:16] if t == TCA_HTB_INIT else v))
    return b"".join(out)


def _address(kind: int, packed: bytes) -> str | None:
    """An ipset member's address as the kernel prints it (names.check_ip's form)."""
    if kind == IPSET_ATTR_IPADDR_IPV4 and len(packed) == 4:
        return socket.inet_ntop(socket.AF_INET, packed)
    if kind == IPSET_ATTR_IPADDR_IPV6 and len(packed) == 16:
        return socket.inet_ntop(socket.AF_INET6, packed)
    return None


def _attr(kind: int, payload: bytes) -> bytes:
    raw = _NLA.pack(_NLA.size + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


class Netlink:
    """One raw netlink socket of `protocol` in the host's namespace (module header)."""

    def __init__(self, host: Host, protocol: int, timeout_s: float = 5.0) -> None:
        self.host = host
        self.protocol = protocol
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._seq = 0

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _socket(self) -> socket.socket:
        if self._sock is None:
            with self.host.inside():
                s = socket.socket(
                    socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, self.protocol
                )
            s.settimeout(self.timeout_s)
            s.bind((0, 0))
            self._sock = s
        return self._sock

    def request(self, kind: int, flags: int, payload: bytes, what: str) -> list[tuple[int, bytes]]:
        """The answers (type, the message after its header) to one request; a negative
        error as OSError, what names it."""
        self._seq = self._seq % 0xFFFFFFFF + 1
        seq = self._seq
        msg = _HDR.pack(_HDR.size + len(payload), kind, NLM_F_REQUEST | flags, seq, 0) + payload
        out: list[tuple[int, bytes]] = []
        try:
            s = self._socket()
            s.send(msg)
            while True:
                data = s.recv(1 << 16)
                off, more = 0, False
                while off + _HDR.size <= len(data):
                    length, typ, mflags, mseq, _pid = _HDR.unpack_from(data, off)
                    if length < _HDR.size:
                        break
                    body = data[off + _HDR.size : off + length]
                    off += (length + 3) & ~3
                    if mseq != seq:
                        continue  # the answer to an earlier request that timed out
                    if typ == NLMSG_ERROR:
                        (err,) = struct.unpack_from("=i", body)
                        if err:
                            raise OSError(-err, os.strerror(-err))
                        return out  # an acknowledgement
                    if typ == NLMSG_DONE:
                        return out
                    out.append((typ, body))
                    more = more or bool(mflags & NLM_F_MULTI)
                if out and not more:
                    return out
        except OSError as e:
            if e.errno not in (errno.ENODEV, errno.ENOENT):
                self.close()  # opened again at the next request
            raise OSError(e.errno, f"{what}: {e.strerror or e}") from None


class Presence:
    """The presence read's sockets, kept from one convergence to the next: one
    thread's (the convergence worker's)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._route = Netlink(host, NETLINK_ROUTE)
        self._nf = Netlink(host, NETLINK_NETFILTER)

    def close(self) -> None:
        """Its sockets (the host's are its owner's)."""
        self._route.close()
        self._nf.close()

    def _tc(
        self, device: str, kind: int, flags: int, req: bytes, what: str
    ) -> list[tuple[int, bytes]]:
        """One rtnetlink request about the device's tc objects; DatapathError when the
        device is gone or the kernel cannot say."""
        try:
            return self._route.request(kind, flags, req, what)
        except OSError as e:
            if e.errno in (errno.ENODEV, errno.ENOENT):
                self.host.forget(device)
                raise DatapathError(f"no network device {device}") from None
            raise DatapathError(f"cannot read the {e.strerror}") from None

    def root(self, device: str) -> tuple[str | None, int]:
        """(kind, handle) of the device's root qdisc; the kernel's default root has
        handle 0.  DatapathError when the device is gone or the kernel cannot say."""
        req = _TCMSG.pack(0, self.host.ifindex(device), 0, TC_H_ROOT, 0)
        got = self._tc(device, RTM_GETQDISC, NLM_F_ECHO, req, f"root qdisc of {device}")
        if not got:
            raise DatapathError(f"cannot read the root qdisc of {device}: no answer")
        body = got[0][1]
        handle = _TCMSG.unpack_from(body)[2]
        kind = next((v for t, v in attrs(body, _TCMSG.size) if t == TCA_KIND), None)
        return (kind.rstrip(b"\0").decode(errors="replace") if kind is not None else None), handle

    def set_summary(self) -> dict[str, tuple[int, int]]:
        """Our sets that exist -> (CADT flags, member count): one header-only dump."""
        req = (
            _NFGEN.pack(socket.AF_INET, 0, 0)
            + _attr(IPSET_ATTR_PROTOCOL, bytes([IPSET_PROTOCOL]))
            + _attr(IPSET_ATTR_FLAGS, struct.pack(">I", IPSET_FLAG_LIST_HEADER))
        )
        try:
            got = self._nf.request(
                NFNL_SUBSYS_IPSET << 8 | IPSET_CMD_LIST, NLM_F_DUMP, req, "ipset list"
            )
        except OSError as e:
            raise DatapathError(f"cannot list ipsets: {e.strerror}") from None
        out: dict[str, tuple[int, int]] = {}
        for _typ, body in got:
            name, flags, count = None, 0, 0
            for t, v in attrs(body, _NFGEN.size):
                if t == IPSET_ATTR_SETNAME:
                    name = v.rstrip(b"\0").decode(errors="replace")
                elif t == IPSET_ATTR_DATA:
                    for dt, dv in attrs(v):
                        if dt == IPSET_ATTR_CADT_FLAGS and len(dv) == 4:
                            (flags,) = struct.unpack(">I", dv)
                        elif dt == IPSET_ATTR_ELEMENTS and len(dv) == 4:
                            (count,) = struct.unpack(">I", dv)
            if name in OWNED_SETS:
                out[name] = (flags, count)
        return out

    def set_members(self, name: str) -> dict[str, int]:
        """The members of the set `name` -> their skbprio (major << 16 | minor; 0 for
        none): one dump of that set.  DatapathError when it cannot be listed."""
        req = (
            _NFGEN.pack(socket.AF_INET, 0, 0)
            + _attr(IPSET_ATTR_PROTOCOL, bytes([IPSET_PROTOCOL]))
            + _attr(IPSET_ATTR_SETNAME, name.encode() + b"\0")
        )
        try:
            got = self._nf.request(
                NFNL_SUBSYS_IPSET << 8 | IPSET_CMD_LIST, NLM_F_DUMP, req, "ipset list"
            )
        except OSError as e:
            raise DatapathError(f"cannot list ipset {name}: {e.strerror}") from None
        out: dict[str, int] = {}
        for _typ, body in got:
            for t, adt in attrs(body, _NFGEN.size):
                if t != IPSET_ATTR_ADT:
                    continue
                for _dt, member in attrs(adt):
                    ip, prio = None, 0
                    for mt, mv in attrs(member):
                        if mt == IPSET_ATTR_IP:
                            ip = next((_address(at, av) for at, av in attrs(mv)), None)
                        elif mt == IPSET_ATTR_SKBPRIO and len(mv) == 4:
                            (prio,) = struct.unpack(">I", mv)
                    if ip is not None:
                        out[ip] = prio
        return out

    def nft_generation(self) -> int:
        """nftables' ruleset generation in the namespace (module header)."""
        req = _NFGEN.pack(socket.AF_UNSPEC, 0, 0)
        try:
            got = self._nf.request(NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETGEN, 0, req, "nft gen")
        except OSError as e:
            raise DatapathError(f"cannot read nftables' generation: {e.strerror}") from None
        for _typ, body in got:
            for t, v in attrs(body, _NFGEN.size):
                if t == NFTA_GEN_ID and len(v) == 4:
                    return int(struct.unpack(">I", v)[0])
        raise DatapathError("cannot read nftables' generation: no answer")

    def nft_table(self, family: int, name: str) -> bool:
        """Whether nftables has the table `name` of `family` (NFPROTO_*) in the namespace."""
        req = _NFGEN.pack(family, 0, 0) + _attr(NFTA_TABLE_NAME, name.encode() + b"\0")
        try:
            kind = NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETTABLE
            got = self._nf.request(kind, 0, req, "nft table")
        except OSError as e:
            if e.errno == errno.ENOENT:
                return False
            raise DatapathError(f"cannot read nftables' table {name}: {e.strerror}") from None
        return bool(got)

    def tree(self, device: str) -> bytes:
        """A digest of the device's classes and qdiscs as configured (module header)."""
        index = self.host.ifindex(device)
        req = _TCMSG.pack(0, index, 0, 0, 0)
        digest = hashlib.blake2b(digest_size=16)
        for kind in (RTM_GETTCLASS, RTM_GETQDISC):
            got = self._tc(device, kind, NLM_F_DUMP, req, f"tc tree of {device}")
            rows = [row for _typ, body in got if (row := _tree_row(kind, index, body))]
            for row in sorted(rows):
                digest.update(struct.pack("=I", len(row)) + row)
        return digest.digest()


def _tree_row(kind: int, index: int, body: bytes) -> bytes:
    """One class's or qdisc's part of the tree's digest: its handle, parent, kind and
    options (a glide leaf's without them, a root HTB's without its counts); b"" for
    another device's.  The kernel puts TCA_KIND and TCA_OPTIONS before the statistics
    (tc_fill_qdisc, tc_fill_tclass): the walk ends at the first other attribute after
    them, so the statistics, most of the message, are never sliced (a loop in
    place of attrs(): the presence read's largest cost in the lab guest)."""
    ifindex, handle, parent = _TCMSG.unpack_from(body)[1:4]
    if ifindex != index:
        return b""  # a qdisc dump may answer for every device
    glide = kind == RTM_GETQDISC and is_glide_minor(parent & 0xFFFF)
    row = [_ROW.pack(kind, handle, parent)]
    off, end, seen = _TCMSG.size, len(body), 0
    while off + _NLA.size <= end:
        length, t = _NLA.unpack_from(body, off)
        if length < _NLA.size or off + length > end:
            break
        t &= NLA_TYPE_MASK
        if t in (TCA_KIND, TCA_OPTIONS):
            seen += 1
            if t == TCA_KIND or not glide:
                v = body[off + _NLA.size : off + length]
                if t == TCA_OPTIONS and kind == RTM_GETQDISC and parent == TC_H_ROOT:
                    v = _without_counts(v)
                row.append(_ROW_ATTR.pack(t, len(v)) + v)
        elif seen == 2:
            break
        off += (length + 3) & ~3
    return b"".join(row)
