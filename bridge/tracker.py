"""Storage commands matched to their completions, per connection: the wire's samples.

Problem
    The controller wants, per resource, the mean read latency and the read
    count of each tick, and per (resource, initiator) the write rate of
    each convergence -- what diskstats gives on a target host. On a bridge
    they come from the PDUs (pdu.py) that the stream walker (flow.py)
    finds: a read's latency is the time from its command to its
    completion, as the bridge sees them (so it includes the hop from the
    bridge to the array), a write's bytes are in its command (iSCSI's
    expected transfer length) or in its data PDUs (NVMe: the capsule's own
    data and each H2CData; the wire does not say a namespace's block size).

State
    Per TCP connection (initiator address and port, target address and
    port): its protocol (by the target's port: ISCSI_PORT or
    NVME_TCP_PORT), a Stream per direction, the target's name once the
    login (iSCSI TargetName) or the connect (NVMe SUBNQN) was seen, the
    initiator's name from the same (InitiatorName, HOSTNQN: logins.py reads
    both, across parts and PDUs), and the commands in flight by tag (ITT;
    the whole 16-bit CID: Linux hosts put a generation counter in its top
    bits). A connection first seen in mid-session takes its names from
    known_targets and known_initiators (targets() and initiator_logins() of
    an earlier run: sessions outlive a restart of the sensor; one that
    starts with a SYN logs in again and is named by that). Per volume --
    (protocol, portal, target name or "" before the login was seen, LUN or
    NSID) -- the reads completed, their latency sum and the write bytes
    since the last take_tick(), and per (volume, initiator address) the
    write bytes since the last take_writes().

Law, per PDU
    command (to the target): in flight under its tag (a tag reused before
    its completion replaces the old command: counted, the capture lost
    the completion); a write adds its bytes at once.
    completion (to the initiator): the command with its tag leaves; a read
    adds (now - its start) to its volume. No such command (the sensor
    started after it, or a second completion of one command): counted.
    NVMe H2CData: its bytes go to its command's volume and initiator.
    Every AGE_SWEEP_S, commands in flight longer than INFLIGHT_MAX_S are
    aged out and counted (aborted, or their completion lost); connections
    silent for CONN_IDLE_S are forgotten (a capture may miss the FIN).

Bounds
    Target names are decoded as ASCII with errors replaced and cut at
    logins.NAME_MAX_BYTES (223); an initiator name that is not printable
    ASCII of at most that many bytes is ignored and counted in bad_names;
    initiator_names() gives at most logins.MAX_NAMES_PER_INITIATOR (16) per
    address. At most MAX_CONNS connections (a new one beyond drops the oldest made,
    its names with it), MAX_INFLIGHT commands in flight over all of them
    (a new one beyond drops its connection's oldest), and
    MAX_VOLUMES_PER_CONN volumes named per connection; each drop counts in
    evicted. Nothing here reads a clock: every call passes now_s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .flow import Emitted, Iscsi, NvmeTcp, Stream
from .logins import Login, Said, by_address
from .pdu import (
    CMD,
    CONNECT,
    DATA_OUT,
    DONE,
    ISCSI_PORT,
    LOGIN,
    NVME_TCP_PORT,
    READ,
    WRITE,
    Pdu,
)

# A command this long in flight has been aborted or its completion was not
# captured: initiators time commands out well before (open-iscsi 30 s,
# Linux NVMe 30 s I/O timeout).
INFLIGHT_MAX_S = 60.0
AGE_SWEEP_S = 1.0
CONN_IDLE_S = 600.0
# NSIDs that name no namespace: 0 (the fabrics connect, keep-alive, admin commands)
# and the broadcast NSID (a flush of every namespace).
NO_NAMESPACE = (0, 0xFFFFFFFF)
# Bounds on what the wire can make the tracker hold (docs/bridge.md, "Bounds"): the
# connections (the oldest made goes first), the commands in flight over all of them
# (the oldest of the connection goes first), the volumes one connection names.
MAX_CONNS = 8192
MAX_INFLIGHT = 1 << 20
MAX_VOLUMES_PER_CONN = 4096

ISCSI = "iscsi"
NVME = "nvme"


@dataclass(frozen=True, slots=True, order=True)
class Volume:
    """What the wire can name: a LUN of an iSCSI target or a namespace of an NVMe
    subsystem, at a portal; target "" until the login or connect was seen."""

    proto: str
    portal: str  # target address:port
    target: str  # IQN or NQN
    unit: int  # LUN or NSID

    def __str__(self) -> str:
        kind = "lun" if self.proto == ISCSI else "nsid"
        return f"{self.proto} {self.portal} {self.target or '?'} {kind} {self.unit}"


@dataclass(slots=True)
class VolumeReads:
    reads: int = 0
    latency_sum_s: float = 0.0
    writes: int = 0  # write commands completed (per initiator: take_initiator_ios)

    @property
    def mean_s(self) -> float:
        return self.latency_sum_s / self.reads if self.reads else math.nan


@dataclass(slots=True)
class Counters:
    commands: int = 0
    completions: int = 0
    unmatched: int = 0  # completions of commands not seen
    replaced: int = 0  # a tag reused while its command was in flight
    aged: int = 0  # commands that never completed
    connections: int = 0
    evicted: int = 0  # commands and connections dropped at the bounds (MAX_*)
    bad_names: int = 0  # initiator names in logins and connects that are garbage


def portal_name(addr: str, port: int) -> str:
    """A target's address and port as a volume name writes them ([v6]:port for IPv6)."""
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def lun_number(raw: int) -> int:
    """The LUN of the 8-byte LUN field (SAM: peripheral and flat addressing)."""
    method = raw >> 62
    if method == 0:
        return (raw >> 48) & 0xFF
    if method == 1:
        return (raw >> 48) & 0x3FFF
    return raw


@dataclass(slots=True)
class _Command:
    start_s: float
    op: int
    volume: Volume | None  # None: an NVMe command of no namespace (connect, keep-alive)


@dataclass(slots=True)
class Connection:
    proto: str
    initiator: str  # the initiator's address
    portal: str
    to_target: Stream
    to_initiator: Stream
    target: str = ""
    initiator_name: str = ""  # the IQN or host NQN it logged in with
    login: Login | None = None  # its login's or connect's text, as far as read
    last_s: float = 0.0
    inflight: dict[int, _Command] = field(default_factory=dict)
    volumes: set[Volume] = field(default_factory=set)  # every volume it sent a command to


ConnKey = tuple[str, int, str, int]  # initiator address, port, target address, port


class Tracker:
    """Feed it each TCP segment of storage traffic; take_tick() and take_writes() the sums."""

    def __init__(
        self,
        known_targets: dict[ConnKey, str] | None = None,
        known_initiators: dict[ConnKey, str] | None = None,
    ) -> None:
        # names learnt before (a restart): a connection first seen in mid-session
        # takes its names from here; one that starts with a SYN logs in again
        self.known_targets = dict(known_targets or {})
        self.known_initiators = dict(known_initiators or {})
        self.conns: dict[ConnKey, Connection] = {}
        self.reads: dict[Volume, VolumeReads] = {}
        self.writes: dict[tuple[Volume, str], int] = {}
        self.volume_writes: dict[Volume, int] = {}  # per tick, for the resource's write rate
        # per (volume, initiator) per convergence, for initiator groups: reads and writes
        self.initiator_ios: dict[tuple[Volume, str], VolumeReads] = {}
        self.counters = Counters()
        self.inflight_total = 0  # commands in flight over every connection
        self._next_sweep_s = -math.inf

    def segment(
        self,
        now_s: float,
        src: str,
        sport: int,
        dst: str,
        dport: int,
        seq: int,
        payload: bytes | memoryview,
        syn: bool = False,
        fin_or_rst: bool = False,
    ) -> None:
        """One TCP segment, either direction (the target's port tells which)."""
        if dport in (ISCSI_PORT, NVME_TCP_PORT):
            key, to_target = (src, sport, dst, dport), True
        elif sport in (ISCSI_PORT, NVME_TCP_PORT):
            key, to_target = (dst, dport, src, sport), False
        else:
            return
        conn = self.conns.get(key)
        if conn is None or (syn and to_target):  # the initiator's SYN: a new connection
            if fin_or_rst:
                return
            if conn is not None:
                self._forget(key)
            conn = self._connect(key, fresh=syn)
        conn.last_s = now_s
        stream = conn.to_target if to_target else conn.to_initiator
        if syn:
            stream.start(seq)
        elif payload:
            for pdu in stream.feed(seq, payload):
                self._pdu(conn, pdu, to_target, now_s)
        if fin_or_rst:
            self._forget(key)  # its commands in flight go with it
        if now_s >= self._next_sweep_s:
            self._sweep(now_s)

    def _forget(self, key: ConnKey) -> None:
        conn = self.conns.pop(key, None)
        if conn is not None:
            self.inflight_total -= len(conn.inflight)

    def _connect(self, key: ConnKey, fresh: bool = False) -> Connection:
        if len(self.conns) >= MAX_CONNS:  # the oldest made goes
            self._forget(next(iter(self.conns)))
            self.counters.evicted += 1
        ini, _, tgt, tport = key
        portal = portal_name(tgt, tport)
        if tport == ISCSI_PORT:
            conn = Connection(ISCSI, ini, portal, Stream(Iscsi(True)), Stream(Iscsi(False)))
            # iSCSI digests are the connection's: what one direction found holds for both
            conn.to_target.on_digests = conn.to_initiator.set_digests
            conn.to_initiator.on_digests = conn.to_target.set_digests
        else:
            conn = Connection(NVME, ini, portal, Stream(NvmeTcp(True)), Stream(NvmeTcp(False)))
        if not fresh:
            conn.target = self.known_targets.get(key, "")
            conn.initiator_name = self.known_initiators.get(key, "")
        self.conns[key] = conn
        self.counters.connections += 1
        return conn

    def _pdu(self, conn: Connection, emitted: Emitted, to_target: bool, now_s: float) -> None:
        pdu, body = emitted
        kind = pdu.kind
        if kind == CONNECT and to_target:  # names the subsystem and host; a command too
            self._login(conn, pdu, body, True, True)
            kind = CMD
        if kind == CMD and to_target:
            unit = lun_number(pdu.volume) if conn.proto == ISCSI else pdu.volume
            vol: Volume | None = None
            if conn.proto == ISCSI or unit not in NO_NAMESPACE:
                vol = Volume(conn.proto, conn.portal, conn.target, unit)
                if len(conn.volumes) < MAX_VOLUMES_PER_CONN or vol in conn.volumes:
                    conn.volumes.add(vol)
            if pdu.tag in conn.inflight:
                self.counters.replaced += 1
            else:
                if self.inflight_total >= MAX_INFLIGHT:
                    self.counters.evicted += 1
                    if not conn.inflight:
                        return  # nothing of its own to give up: not tracked
                    del conn.inflight[next(iter(conn.inflight))]
                    self.inflight_total -= 1
                self.inflight_total += 1
            self.counters.commands += 1
            conn.inflight[pdu.tag] = _Command(now_s, pdu.op, vol)
            if pdu.op == WRITE and vol is not None:
                nbytes = pdu.data_bytes  # iSCSI: the whole write; NVMe: in-capsule data
                if nbytes:
                    self._wrote(vol, conn.initiator, nbytes)
        elif kind == DONE and not to_target:
            cmd = conn.inflight.pop(pdu.tag, None)
            if cmd is None:
                self.counters.unmatched += 1
                return
            self.inflight_total -= 1
            self.counters.completions += 1
            if cmd.op == READ and cmd.volume is not None:
                r = self.reads.get(cmd.volume)
                if r is None:
                    r = self.reads[cmd.volume] = VolumeReads()
                lat = now_s - cmd.start_s
                r.reads += 1
                r.latency_sum_s += lat
                self._initiator_io(cmd.volume, conn.initiator).reads += 1
                self._initiator_io(cmd.volume, conn.initiator).latency_sum_s += lat
            elif cmd.op == WRITE and cmd.volume is not None:
                self._initiator_io(cmd.volume, conn.initiator).writes += 1
        elif kind == DATA_OUT and to_target:
            cmd = conn.inflight.get(pdu.tag)
            if cmd is not None and cmd.op == WRITE and cmd.volume is not None:
                self._wrote(cmd.volume, conn.initiator, pdu.data_bytes)
        elif kind == LOGIN:
            self._login(conn, pdu, body, False, to_target)

    def _login(
        self, conn: Connection, pdu: Pdu, body: bytes, connect: bool, to_target: bool
    ) -> None:
        """A login's or connect's text (the PDU's data segment, as far as captured)."""
        text = body[pdu.header_bytes : pdu.header_bytes + pdu.data_bytes]
        if conn.login is None:
            conn.login = Login()
        flags = 0 if connect else pdu.op  # an iSCSI login's flags (pdu.py)
        self._said(conn, conn.login.start(connect, to_target, flags, pdu.data_bytes, text))

    def _said(self, conn: Connection, said: Said) -> None:
        if said.target:
            conn.target = said.target
        if said.initiator:
            conn.initiator_name = said.initiator
        if said.digests is not None:  # the target's answer: what was negotiated
            conn.to_target.set_digests(said.digests)
            conn.to_initiator.set_digests(said.digests)
        self.counters.bad_names += said.bad_names

    def _wrote(self, vol: Volume, initiator: str, nbytes: int) -> None:
        k = (vol, initiator)
        self.writes[k] = self.writes.get(k, 0) + nbytes
        self.volume_writes[vol] = self.volume_writes.get(vol, 0) + nbytes

    def _sweep(self, now_s: float) -> None:
        self._next_sweep_s = now_s + AGE_SWEEP_S
        oldest = now_s - INFLIGHT_MAX_S
        for key, conn in list(self.conns.items()):
            if now_s - conn.last_s >= CONN_IDLE_S:
                self._forget(key)
                continue
            stale = [tag for tag, c in conn.inflight.items() if c.start_s < oldest]
            for tag in stale:
                del conn.inflight[tag]
            self.counters.aged += len(stale)
            self.inflight_total -= len(stale)

    def take_tick(self) -> tuple[dict[Volume, VolumeReads], dict[Volume, int]]:
        """Reads completed and write bytes per volume since the last call (a tick)."""
        reads, self.reads = self.reads, {}
        writes, self.volume_writes = self.volume_writes, {}
        return reads, writes

    def take_writes(self) -> dict[tuple[Volume, str], int]:
        """Write bytes per (volume, initiator address) since the last call (a convergence)."""
        out, self.writes = self.writes, {}
        return out

    def _initiator_io(self, vol: Volume, initiator: str) -> VolumeReads:
        k = (vol, initiator)
        r = self.initiator_ios.get(k)
        if r is None:
            r = self.initiator_ios[k] = VolumeReads()
        return r

    def take_initiator_ios(self) -> dict[tuple[Volume, str], VolumeReads]:
        """Reads (their latency) and writes completed per (volume, initiator address)
        since the last call (a convergence)."""
        out, self.initiator_ios = self.initiator_ios, {}
        return out

    def targets(self) -> dict[ConnKey, str]:
        """The target name of every live connection whose login or connect was seen
        (or that was named by known_targets): what a restart needs to name them again."""
        return {k: c.target for k, c in self.conns.items() if c.target}

    def initiator_logins(self) -> dict[ConnKey, str]:
        """The initiator name of every live connection whose login or connect was seen
        (or that was named by known_initiators): what a restart needs."""
        return {k: c.initiator_name for k, c in self.conns.items() if c.initiator_name}

    def initiator_names(self) -> dict[str, tuple[str, ...]]:
        """Initiator address -> the names its live connections logged in with."""
        return by_address((c.initiator, c.initiator_name) for c in self.conns.values()
                          if c.initiator_name)  # fmt: skip

    def seen(self) -> dict[Volume, set[str]]:
        """Every volume the live connections have sent commands to, with the
        initiators that did (what `santhrottle resources` lists in bridge mode)."""
        out: dict[Volume, set[str]] = {}
        for conn in self.conns.values():
            for v in conn.volumes:
                out.setdefault(v, set()).add(conn.initiator)
        return out

    def in_flight(self) -> dict[Volume, int]:
        """Commands in flight per volume (a stalled reader is not an idle one)."""
        out: dict[Volume, int] = {}
        for conn in self.conns.values():
            for c in conn.inflight.values():
                if c.op == READ and c.volume is not None:
                    out[c.volume] = out.get(c.volume, 0) + 1
        return out
