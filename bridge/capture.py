"""Storage traffic off a bridge port: an AF_PACKET TPACKET_V3 ring behind a classic BPF filter.

Problem
    The wire sensor needs every TCP segment of the iSCSI and NVMe/TCP
    connections crossing the bridge, both directions, with the time it
    crossed, at hundreds of thousands of packets a second, and nothing
    else. A TPACKET_V3 ring maps the kernel's capture buffer into the
    process: the kernel fills blocks of frames, the reader walks a block in
    place and hands it back, one poll() per block instead of one recv()
    per packet. A classic BPF filter attached to the socket keeps every
    other packet out in the kernel.

Where to capture
    On the array-side port: commands leave the bridge towards the array
    there and completions arrive from it, so the time between the two is
    the array's latency plus the hop; the delay classes sit on the
    initiator-side port, whose egress would add our own delay to it.

Layouts (linux/if_packet.h)
    tpacket_req3: block size, block count, frame size, frame count,
    retire timeout (ms), sizeof_priv, feature word (7 x u32).
    A block: u32 version, u32 offset_to_priv, then tpacket_hdr_v1:
    u32 block_status (TP_STATUS_USER: ours), u32 num_pkts, u32
    offset_to_first_pkt, ... A frame: tpacket3_hdr: u32 tp_next_offset,
    u32 tp_sec, u32 tp_nsec, u32 tp_snaplen, u32 tp_len, u32 tp_status,
    u16 tp_mac, u16 tp_net, ...

Clock
    The kernel stamps each frame on CLOCK_REALTIME (tp_sec, tp_nsec); the
    tracker's times must be on the sensor's own clock, CLOCK_MONOTONIC by
    default (the in-kernel sensor's too), because the sensor closes busy
    spans (bridge/busy.py) at its tick's time. Each block's frames are moved
    by the two clocks' offset, read when the block is read: a step of the wall
    clock moves the offset and the stamps alike, so a latency or a busy span
    across it stays right. Worked example: a frame stamped 1,795,932,784.250
    s, read when time.time() is 1,795,932,784.300 and the monotonic clock
    80,000.300 s, is handed on at 80,000.250 s.
    Frames carry Ethernet (802.1Q tags already taken out by the kernel, or
    in line: skipped), IPv4 or IPv6 (no extension headers), TCP.

Bounds
    A frame longer than the snap length (a GRO'd skb over SNAP_BYTES) is
    cut: the walker sees a gap after it and resynchronises; counted in
    `truncated`. The kernel's own drops (ring full) are read from
    PACKET_STATISTICS. Frames are decoded in place: the walker copies what
    it keeps (flow.py) before the block goes back to the kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from .esp import ESP_SNAP_BYTES, spi_of

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_VERSION = 10
PACKET_STATISTICS = 6
TPACKET_V3 = 2
SO_ATTACH_FILTER = 26
TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1

# A GRO'd skb is at most 64 KiB of IP; the ring's frames hold that and the headers.
SNAP_BYTES = 65536 + 128
BLOCK_BYTES = 1 << 20  # a power of two times the page size
BLOCKS = 64  # 64 MiB of ring: 0.3 s of a 200 MB/s storage link
# The kernel hands over a block that is not full after this long.
RETIRE_MS = 10
# Frames walked under the lock at a time: a block holds up to ~8,000 (a burst of SYNs,
# each a new connection for the tracker: 0.2 s of Python), 64 take a few ms, the
# longest a tick, a convergence or a status waits for the walk (FifoLock).
FRAMES_PER_TURN = 64
# Addresses named at most: past this many (initiators churning, forged sources) the
# decoder forgets them all and names each again once.
NAMES_MAX = 65536

# `tcpdump -dd -s 262144 'tcp port 3260 or tcp port 4420'` (IPv4 and IPv6, either port
# either direction; returns 262144, i.e. the whole frame, for a match), its final reject
# replaced by `tcpdump -dd -s 128 'esp or udp port 4500'`: IPsec ESP (esp.py: storage the
# sensor cannot read, shown as not measurable) with ESP_SNAP_BYTES of each frame.
STORAGE_FILTER = (
    (0x28, 0, 0, 0x0000000C),
    (0x15, 0, 7, 0x000086DD),
    (0x30, 0, 0, 0x00000014),
    (0x15, 0, 18, 0x00000006),
    (0x28, 0, 0, 0x00000036),
    (0x15, 15, 0, 0x00000CBC),
    (0x15, 14, 0, 0x00001144),
    (0x28, 0, 0, 0x00000038),
    (0x15, 12, 11, 0x00000CBC),
    (0x15, 0, 12, 0x00000800),
    (0x30, 0, 0, 0x00000017),
    (0x15, 0, 10, 0x00000006),
    (0x28, 0, 0, 0x00000014),
    (0x45, 8, 0, 0x00001FFF),
    (0xB1, 0, 0, 0x0000000E),
    (0x48, 0, 0, 0x0000000E),
    (0x15, 4, 0, 0x00000CBC),
    (0x15, 3, 0, 0x00001144),
    (0x48, 0, 0, 0x00000010),
    (0x15, 1, 0, 0x00000CBC),
    (0x15, 0, 1, 0x00001144),
    (0x06, 0, 0, 0x00040000),
    (0x28, 0, 0, 0x0000000C),
    (0x15, 0, 10, 0x00000800),
    (0x30, 0, 0, 0x00000017),
    (0x15, 19, 0, 0x00000032),
    (0x15, 0, 19, 0x00000011),
    (0x28, 0, 0, 0x00000014),
    (0x45, 17, 0, 0x00001FFF),
    (0xB1, 0, 0, 0x0000000E),
    (0x48, 0, 0, 0x0000000E),
    (0x15, 13, 0, 0x00001194),
    (0x48, 0, 0, 0x00000010),
    (0x15, 11, 12, 0x00001194),
    (0x15, 0, 11, 0x000086DD),
    (0x30, 0, 0, 0x00000014),
    (0x15, 8, 0, 0x00000032),
    (0x15, 0, 2, 0x0000002C),
    (0x30, 0, 0, 0x00000036),
    (0x15, 5, 6, 0x00000032),
    (0x15, 0, 5, 0x00000011),
    (0x28, 0, 0, 0x00000036),
    (0x15, 2, 0, 0x00001194),
    (0x28, 0, 0, 0x00000038),
    (0x15, 0, 1, 0x00001194),
    (0x06, 0, 0, 0x00000080),
    (0x06, 0, 0, 0x00000000),
)

_REQ3 = struct.Struct("=7I")
_BLOCK = struct.Struct("=III")  # block_status, num_pkts, offset_to_first_pkt (from byte 8)
_FRAME = struct.Struct("=IIIII4xH")  # next, sec, nsec, snaplen, len, (status), mac
_STATS3 = struct.Struct("=III")  # packets, drops, freeze_q_cnt
_IP4 = struct.Struct("!BxHHHBBH4s4s")
# Ethernet, IPv4, TCP, for a frame of IPv4 with a 20-byte header and TCP: the Ethernet
# type, version and header length, total length, fragment, protocol, addresses, ports,
# sequence, data offset, flags
_FAST4 = struct.Struct("!12xHBxH2xH1xB2x4s4sHHI4xBB")
_TCP = struct.Struct("!HHIIBB")  # sport, dport, seq, ack, data offset, flags
_SYN, _FIN, _RST = 0x02, 0x01, 0x04

# (now_s, src, sport, dst, dport, seq, payload, syn, fin_or_rst): Tracker.segment's
Segment = Callable[[float, str, int, str, int, int, memoryview, bool, bool], None]
# (now_s, src, dst, spi, bytes): Tracker.encrypted's (IPsec ESP: esp.py)
Esp = Callable[[float, str, str, int, int], None]


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


@dataclass(slots=True)
class CaptureCounters:
    frames: int = 0
    segments: int = 0  # TCP segments handed on
    acks: int = 0  # pure ACKs (no payload, no SYN/FIN/RST): not handed on
    truncated: int = 0  # frames cut by the snap length
    not_tcp: int = 0  # frames the filter let through that are not plain TCP (nor ESP)
    esp: int = 0  # IPsec ESP frames (esp.py: not measurable)
    kernel_drops: int = 0  # the ring was full (PACKET_STATISTICS)


def attach_filter(sock: socket.socket, program: tuple[tuple[int, int, int, int], ...]) -> None:
    insns = (_SockFilter * len(program))(*(_SockFilter(*i) for i in program))
    prog = _SockFprog(len(program), insns)
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, bytes(memoryview(prog)))


class FifoLock:
    """A lock taken in the order it was asked for: the ring's walk shared with the tick.

    poll() takes its guard for FRAMES_PER_TURN frames and asks again as soon as it let
    go; with a plain threading.Lock the walking thread, which already runs, mostly takes
    it back before a waiting thread has woken, and through a burst (50,000 connections
    opening at once) the tick, a convergence or a status waits turn after turn. Here
    each taker draws a ticket and waits for it to come up, so a waiter goes before the
    walk's next turn: it waits for at most one turn's frames.
    """

    def __init__(self) -> None:
        self._turns = threading.Condition(threading.Lock())
        self._drawn = 0  # tickets given out
        self._served = 0  # the ticket whose turn it is
        self._gone: set[int] = set()  # tickets whose takers stopped waiting (^C)

    def acquire(self) -> None:
        with self._turns:
            ticket = self._drawn
            self._drawn += 1
            try:
                while ticket != self._served:
                    self._turns.wait()
            except BaseException:  # its turn passes the others by when it comes
                self._gone.add(ticket)
                self._pass_gone()
                raise

    def release(self) -> None:
        with self._turns:
            self._served += 1
            self._pass_gone()

    def _pass_gone(self) -> None:
        while self._served in self._gone:
            self._gone.discard(self._served)
            self._served += 1
        self._turns.notify_all()

    @property
    def asked(self) -> int:
        """The takers holding it or waiting for it."""
        with self._turns:
            return self._drawn - self._served - len(self._gone)

    def __enter__(self) -> FifoLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Ring:
    """A TPACKET_V3 capture on one interface (opened in the caller's network namespace)."""

    def __init__(
        self,
        ifname: str,
        block_bytes: int = BLOCK_BYTES,
        blocks: int = BLOCKS,
        retire_ms: int = RETIRE_MS,
        program: tuple[tuple[int, int, int, int], ...] = STORAGE_FILTER,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.counters = CaptureCounters()
        self.clock, self.wall_clock = clock, wall_clock  # the frames' times: on clock
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        try:
            attach_filter(self.sock, program)
            self.sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
            frame = SNAP_BYTES + 256
            req = _REQ3.pack(
                block_bytes, blocks, frame, block_bytes // frame * blocks, retire_ms, 0, 0
            )
            self.sock.setsockopt(SOL_PACKET, PACKET_RX_RING, req)
            self.sock.bind((ifname, ETH_P_ALL))
            self.map = mmap.mmap(self.sock.fileno(), block_bytes * blocks)
        except BaseException:
            self.sock.close()
            raise
        self.view = memoryview(self.map)
        self.block_bytes = block_bytes
        self.blocks = blocks
        self.next_block = 0
        self.poller = select.poll()
        self.poller.register(self.sock.fileno(), select.POLLIN | select.POLLERR)
        self.decoder = FrameDecoder(self.counters)

    def close(self) -> None:
        self.view.release()
        self.map.close()
        self.sock.close()

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def poll(
        self,
        timeout_ms: int,
        segment: Segment,
        guard: AbstractContextManager[Any] | None = None,
        esp: Esp | None = None,
    ) -> int:
        """Hand every TCP segment of the blocks ready within timeout_ms to segment()
        (and every IPsec ESP frame to esp()); returns the number of blocks read. guard (a
        lock; a FifoLock lets a waiter in between two turns) is held while
        FRAMES_PER_TURN frames of a block are read, not while waiting."""
        self.decoder.on_esp = esp
        guard = guard or contextlib.nullcontext()
        n = 0
        waited = False
        while True:
            off = self.next_block * self.block_bytes
            status = _BLOCK.unpack_from(self.map, off + 8)[0]
            if not status & TP_STATUS_USER:
                # one wait at most: an error on the socket (POLLERR) makes poll()
                # return at once, and a loop on it would spin
                if n or waited or not self.poller.poll(timeout_ms):
                    return n
                waited = True
                continue
            self._block(off, segment, guard)
            struct.pack_into("=I", self.map, off + 8, TP_STATUS_KERNEL)
            self.next_block = (self.next_block + 1) % self.blocks
            n += 1

    def kernel_stats(self) -> tuple[int, int]:
        """(packets, drops) since the last call (the kernel resets them on read)."""
        raw = self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _STATS3.size)
        packets, drops, _ = _STATS3.unpack(raw)
        self.counters.kernel_drops += drops
        return packets, drops

    def _block(self, off: int, segment: Segment, guard: AbstractContextManager[Any]) -> None:
        """A block's frames, FRAMES_PER_TURN of them at a time under guard."""
        view, c, frame = self.view, self.counters, self.decoder.frame
        _, num, first = _BLOCK.unpack_from(self.map, off + 8)
        pos = off + first
        shift_s = self.clock() - self.wall_clock()  # CLOCK_REALTIME stamps onto clock
        for turn in range(0, num, FRAMES_PER_TURN):
            with guard:
                for _ in range(min(FRAMES_PER_TURN, num - turn)):
                    nxt, sec, nsec, snap, length, mac = _FRAME.unpack_from(self.map, pos)
                    c.frames += 1
                    if snap < length and snap > ESP_SNAP_BYTES:  # (ESP is kept short)
                        c.truncated += 1
                    frame(view, pos + mac, snap, sec + nsec * 1e-9 + shift_s, segment)
                    pos += nxt


class FrameDecoder:
    """Ethernet / IPv4 or IPv6 / TCP, in place; addresses named once each."""

    def __init__(self, counters: CaptureCounters, on_esp: Esp | None = None) -> None:
        self.counters = counters
        self.on_esp = on_esp
        self._names: dict[bytes, str] = {}

    def name(self, raw: bytes) -> str:
        name = self._names.get(raw)
        if name is None:
            if len(self._names) >= NAMES_MAX:
                self._names.clear()
            fam = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
            name = self._names[raw] = socket.inet_ntop(fam, raw)
        return name

    def frame(self, view: memoryview, p: int, snap: int, t: float, segment: Segment) -> None:
        """The Ethernet frame of snap bytes at view[p], captured at t."""
        if snap >= 54:  # the common case in one unpack: IPv4 without options, TCP
            etype, vihl, total, frag, proto, src, dst, sport, dport, seq, doff, flags = (
                _FAST4.unpack_from(view, p)
            )
            if etype == 0x0800 and vihl == 0x45 and proto == 6 and not frag & 0x1FFF:
                data = p + 34 + (doff >> 4) * 4
                end = p + 14 + total  # not the Ethernet padding
                if end > p + snap:
                    end = p + snap
                if data >= end and not flags & (_SYN | _FIN | _RST):
                    self.counters.acks += 1  # a pure ACK: nothing for the walker
                    return
                self.counters.segments += 1
                names = self._names
                segment(
                    t,
                    names.get(src) or self.name(src),
                    sport,
                    names.get(dst) or self.name(dst),
                    dport,
                    seq,
                    view[data:end],  # empty for a SYN, FIN or RST without data
                    flags & _SYN != 0,
                    flags & (_FIN | _RST) != 0,
                )
                return
        self._frame(view, p, p + snap, t, segment)

    def _frame(self, view: memoryview, p: int, end: int, t: float, segment: Segment) -> None:
        """frame() for the rest: an 802.1Q tag in line, IPv4 with options, IPv6, not TCP."""
        etype = view[p + 12] << 8 | view[p + 13]
        ip = p + 14
        if etype == 0x8100:  # an 802.1Q tag left in line
            etype = view[p + 16] << 8 | view[p + 17]
            ip += 4
        if etype == 0x0800:
            vihl, total, _, frag, _, proto, _, src, dst = _IP4.unpack_from(view, ip)
            ihl = (vihl & 0x0F) * 4
            if proto != 6 or frag & 0x1FFF:
                self._other(view, proto, frag, ip + ihl, end, total - ihl, src, dst, t)
                return
            tcp = ip + ihl
            end = min(end, ip + total)
        elif etype == 0x86DD:
            src, dst = bytes(view[ip + 8 : ip + 24]), bytes(view[ip + 24 : ip + 40])
            if view[ip + 6] != 6:
                n = view[ip + 4] << 8 | view[ip + 5]
                self._other(view, view[ip + 6], 0, ip + 40, end, n, src, dst, t)
                return
            tcp = ip + 40
            end = min(end, tcp + (view[ip + 4] << 8 | view[ip + 5]))
        else:
            self.counters.not_tcp += 1
            return
        sport, dport, seq, _, doff, flags = _TCP.unpack_from(view, tcp)
        data = tcp + (doff >> 4) * 4
        if data >= end and not flags & (_SYN | _FIN | _RST):
            self.counters.acks += 1
            return
        self.counters.segments += 1
        segment(
            t,
            self.name(src),
            sport,
            self.name(dst),
            dport,
            seq,
            view[data:end],
            flags & _SYN != 0,
            flags & (_FIN | _RST) != 0,
        )

    def _other(
        self,
        view: memoryview,
        proto: int,
        frag: int,
        l4: int,
        end: int,
        l4_len: int,
        src: bytes,
        dst: bytes,
        t: float,
    ) -> None:
        """A frame that is not TCP: IPsec ESP goes to on_esp (esp.py), the rest is
        counted (the kernel's encrypted(), wire.bpf.c)."""
        got = None
        if self.on_esp is not None and not frag & 0x3FFF and l4 <= end:  # no fragment
            got = spi_of(proto, view[l4:end], l4_len)
        if got is None:
            self.counters.not_tcp += 1
            return
        self.counters.esp += 1
        self.on_esp(t, self.name(src), self.name(dst), got[0], got[1])  # type: ignore[misc]
