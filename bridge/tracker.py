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
    silent for CONN_IDLE_S are forgotten (a capture may miss the FIN). A FIN
    or RST ends a connection's walks; its commands in flight wait for the
    next connection of that key (a completion may follow the initiator's
    FIN), aged alike: the in-kernel program's commands outlive their flows.
    Every command of a volume, from its start to when it leaves, keeps the
    volume busy (busy.py): its utilization, as io_ticks counts it.

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
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from .belief import SYNCED
from .belief import Counters as StreamCounters
from .busy import Busy
from .conns import Command, Connection, ConnKey, SyncViews, fold
from .esp import EspFlows
from .flow import Stream
from .logins import Login, Said, by_address
from .pdu import (
    CMD,
    CONNECT,
    DATA_OUT,
    DONE,
    FULL_FEATURE,
    IC,
    ISCSI_PORT,
    LOGIN,
    NVME_TCP_PORT,
    READ,
    WRITE,
    Pdu,
)
from .protocols import ISCSI as ISCSI_WALK
from .protocols import NVME as NVME_WALK
from .sides import Side
from .sums import (  # noqa: F401  (the names the bridge's other modules take from here)
    ISCSI,
    NO_NAMESPACE,
    NVME,
    Sums,
    Volume,
    VolumeReads,
    lun_number,
    portal_name,
)

# A command this long in flight has been aborted or its completion was not
# captured: initiators time commands out well before (open-iscsi 30 s,
# Linux NVMe 30 s I/O timeout).
INFLIGHT_MAX_S = 60.0
AGE_SWEEP_S = 1.0
CONN_IDLE_S = 600.0
# A connection that carried no segment for this long has no say in its resource's hold
# (volumes.py's out_of_sync): a partial sample misses reads only on connections that
# carry them, and a burst of garbage on connections that then fall silent (a scan, an
# attacker) would otherwise hold the resource blind until they are forgotten.
SYNC_VOTE_S = 5.0
# Bounds on what the wire can make the tracker hold (docs/bridge.md, "Bounds"): the
# connections (the oldest made goes first), the commands in flight over all of them
# (the oldest of the connection goes first), the volumes one connection names.
MAX_CONNS = 8192
MAX_INFLIGHT = 1 << 20
MAX_VOLUMES_PER_CONN = 4096
# Completions in a row that match no command in flight, while the commands' direction
# is in sync, that make the completions' walk a desync: more than a session keeps in
# flight (open-iscsi's cmds_max and Linux NVMe's queue are 128), so a sensor that
# starts in mid-session, whose first completions are of commands it never saw, does
# not take them for one.
UNMATCHED_RUN = 256
# The smallest MaxRecvDataSegmentLength (RFC 7143 13.12) and MAXH2CDATA (NVMe/TCP 3.6.2.3)
# a login or ICResp may declare: a smaller one is not believed.
MIN_SEGMENT_LIMIT = 512


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
    unmeasurable: int = 0  # not measurable: connections (TLS, another protocol), IPsec SAs


class Tracker(SyncViews):
    """Feed it each TCP segment of storage traffic; take_tick() and take_writes() the sums."""

    def __init__(
        self,
        known_targets: dict[ConnKey, str] | None = None,
        known_initiators: dict[ConnKey, str] | None = None,
        learn_logins: bool = True,
    ) -> None:
        # names learnt before (a restart): a connection first seen in mid-session
        # takes its names from here; one that starts with a SYN logs in again
        self.known_targets = dict(known_targets or {})
        self.known_initiators = dict(known_initiators or {})
        self.conns: dict[ConnKey, Connection] = {}
        self.sums = Sums()
        self.take_tick = self.sums.take_tick
        self.take_writes = self.sums.take_writes
        self.take_initiator_ios = self.sums.take_initiator_ios
        self.counters = Counters()
        self.walk = StreamCounters()  # the walks of the connections forgotten
        self.inflight_total = 0  # commands in flight over every connection
        self.busy: Busy[Volume] = Busy()  # per volume, time with a command in flight
        self._next_sweep_s = -math.inf
        self._now = 0.0
        # each read and write completed: (connection, tag, READ or WRITE, its command's
        # time, its completion's); for tests against a reference (tests/wire)
        self.on_io: Callable[[ConnKey, int, int, float, float], None] | None = None
        self.esp = EspFlows()  # IPsec security associations: not measurable (esp.py)
        # False: a login's digests and segment limits are not applied, the walks find the
        # digests themselves -- the in-kernel walk until userspace has read the login
        # (kernel.py's set_login), which the tests compare this one with
        self.learn_logins = learn_logins
        # the commands in flight of connections gone (a FIN, an RST), by key (_forget)
        self.orphans: dict[ConnKey, dict[int, Command]] = {}

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
                self._forget(key, keep=True)
            conn = self._connect(key, fresh=syn)
        conn.last_s = now_s
        self._now = now_s
        stream = conn.to_target if to_target else conn.to_initiator
        if syn:
            stream.start(seq)
        elif payload:
            stream.feed(seq, payload, now_s)
        if fin_or_rst:
            self._forget(key, keep=True)  # its commands in flight wait for their end
        if now_s >= self._next_sweep_s:
            self._sweep(now_s)

    def _forget(self, key: ConnKey, keep: bool = False) -> None:
        """The connection is gone; keep: its commands in flight stay, for the next
        connection of that key (a FIN or RST, a SYN anew: a completion may follow the
        initiator's FIN, and the kernel's commands in flight outlive their flows alike)."""
        conn = self.conns.pop(key, None)
        if conn is None:
            return
        fold(self.walk, conn, self._now)
        if keep and conn.inflight:
            if len(self.orphans) >= MAX_CONNS:  # the oldest left go
                _gone(self, self.orphans.pop(next(iter(self.orphans))))
            self.orphans[key] = conn.inflight
        else:
            _gone(self, conn.inflight)

    def _connect(self, key: ConnKey, fresh: bool = False) -> Connection:
        if len(self.conns) >= MAX_CONNS:  # the oldest made goes
            self._forget(next(iter(self.conns)))
            self.counters.evicted += 1
        ini, _, tgt, tport = key
        portal = portal_name(tgt, tport)
        proto, walks = (ISCSI, ISCSI_WALK) if tport == ISCSI_PORT else (NVME, NVME_WALK)
        conn = Connection(proto, ini, portal, Stream(walks[True]), Stream(walks[False]))
        conn.key = key
        left = self.orphans.pop(key, None)  # the commands its last connection left
        if left:
            conn.inflight = left
        for stream, to_target in ((conn.to_target, True), (conn.to_initiator, False)):
            stream.sink = partial(self._pdu, conn, to_target)
            stream.hooks = Side(self, conn, to_target)
        if not fresh:
            conn.target = self.known_targets.get(key, "")
            conn.initiator_name = self.known_initiators.get(key, "")
        self.conns[key] = conn
        self.counters.connections += 1
        return conn

    def _pdu(self, conn: Connection, to_target: bool, pdu: Pdu, body: bytes) -> bool:
        """One PDU of a walk in sync; False: it shows the walk is off (UNMATCHED_RUN)."""
        kind = pdu.kind
        if kind == DONE and not to_target:
            cmd = conn.inflight.pop(pdu.tag, None)
            if cmd is None:
                self.counters.unmatched += 1
                conn.unmatched_run += 1
                if conn.unmatched_run >= UNMATCHED_RUN and conn.to_target.state == SYNCED:
                    conn.unmatched_run = 0
                    return False
                return True
            conn.unmatched_run = 0
            self._completed(conn, cmd, pdu.tag)
        elif kind == CMD and to_target:
            self._command(conn, pdu, False)
        elif kind == DATA_OUT and to_target:
            # NVMe H2CData (an iSCSI write's bytes are its command's, _command)
            cmd = conn.inflight.get(pdu.tag) if conn.proto == NVME else None
            if cmd is not None and cmd.op == WRITE and cmd.volume is not None:
                self.sums.wrote(cmd.volume, conn.initiator, pdu.data_bytes)
        elif kind == LOGIN:
            self._login(conn, pdu, body, False, to_target)
        elif kind == CONNECT and to_target:  # names the subsystem and host; a command too
            self._login(conn, pdu, body, True, True)
            self._command(conn, pdu, False)
        elif kind == IC and not to_target and pdu.data_bytes >= MIN_SEGMENT_LIMIT:
            conn.to_target.limit = pdu.data_bytes  # the controller's MAXH2CDATA
        return True

    def _command(self, conn: Connection, pdu: Pdu, provisional: bool) -> Command | None:
        tag, op, now, inflight = pdu.tag, pdu.op, self._now, conn.inflight
        unit = lun_number(pdu.volume) if conn.proto == ISCSI else pdu.volume
        vol = conn.units.get(unit)
        if vol is None or vol.target != conn.target:  # a unit new to it, or named since
            vol = None
            if conn.proto == ISCSI or unit not in NO_NAMESPACE:
                vol = Volume(conn.proto, conn.portal, conn.target, unit)
                if len(conn.volumes) < MAX_VOLUMES_PER_CONN or vol in conn.volumes:
                    conn.volumes.add(vol)
                    conn.units[unit] = vol
        if tag in inflight:
            self.counters.replaced += 1
            self.busy.down(inflight[tag].volume, now)
        else:
            if self.inflight_total >= MAX_INFLIGHT:
                self.counters.evicted += 1
                if not inflight:
                    return None  # nothing of its own to give up: not tracked
                self.busy.down(inflight.pop(next(iter(inflight))).volume, now)
                self.inflight_total -= 1
            self.inflight_total += 1
        self.counters.commands += 1
        cmd = inflight[tag] = Command(now, op, vol)
        self.busy.up(vol, now)
        if op == WRITE and vol is not None:
            nbytes = pdu.data_bytes  # iSCSI: the whole write; NVMe: in-capsule data
            if provisional:
                cmd.held_bytes = nbytes
            elif nbytes:
                self.sums.wrote(vol, conn.initiator, nbytes)
        return cmd

    def _completed(self, conn: Connection, cmd: Command, tag: int) -> None:
        self.inflight_total -= 1
        self.counters.completions += 1
        vol, op, now = cmd.volume, cmd.op, self._now
        self.busy.down(vol, now)
        if vol is None:
            return
        if cmd.held_bytes:  # a provisional write its completion proves
            self.sums.wrote(vol, conn.initiator, cmd.held_bytes)
            cmd.held_bytes = 0
        if op == READ:
            self.sums.read(vol, conn.initiator, now - cmd.start_s)
        elif op == WRITE:
            self.sums.write_done(vol, conn.initiator)
        if self.on_io is not None and op:
            self.on_io(conn.key, tag, op, cmd.start_s, now)

    def _unmeasurable(self, conn: Connection, reason: str) -> None:
        """Its streams are not iSCSI or NVMe/TCP to read: nothing of it is counted."""
        if conn.unmeasurable:
            return
        conn.unmeasurable = reason
        self.counters.unmeasurable += 1
        for st in (conn.to_target, conn.to_initiator):
            st.set_unmeasurable(self._now)
        _gone(self, conn.inflight)
        conn.inflight.clear()
        conn.volumes.clear()
        conn.units.clear()

    # ------------------------------------------------------------ logins
    def _login(
        self, conn: Connection, pdu: Pdu, body: bytes, connect: bool, to_target: bool
    ) -> None:
        """A login's or connect's text (the PDU's data segment, as far as captured)."""
        text = body[pdu.header_bytes : pdu.header_bytes + pdu.data_bytes]
        if conn.login is None:
            conn.login = Login()
        flags = 0 if connect else pdu.op  # an iSCSI login's flags (pdu.py)
        said = conn.login.start(connect, to_target, flags, pdu.data_bytes, text)
        self._said(conn, said, to_target)
        # the target's answer that moves to full feature: what was negotiated applies
        if not connect and not to_target and flags & 0x80 and flags & 3 == FULL_FEATURE:
            if not self.learn_logins:  # the kernel's walk, before userspace read the text
                conn.to_target.unknown_digests()
                conn.to_initiator.unknown_digests()
                return
            digests = conn.pending_digests or (False, False)
            conn.to_target.set_digests(digests)
            conn.to_initiator.set_digests(digests)
            for side, limit in conn.pending_limits.items():
                (conn.to_target if side else conn.to_initiator).limit = limit

    def _said(self, conn: Connection, said: Said, to_target: bool) -> None:
        if said.target:
            conn.target = said.target
        if said.initiator:
            conn.initiator_name = said.initiator
        if said.digests is not None:  # the target's answer: what was negotiated
            conn.pending_digests = said.digests
        if said.segment_limit is not None and said.segment_limit >= MIN_SEGMENT_LIMIT:
            # declared by the sender of this text: the most it takes, the other way
            conn.pending_limits[not to_target] = said.segment_limit
        self.counters.bad_names += said.bad_names

    def encrypted(self, now_s: float, src: str, dst: str, spi: int, nbytes: int) -> None:
        """One IPsec ESP frame (capture.py: Esp): its security association is not
        measurable (esp.py), counted once."""
        if self.esp.frame(now_s, src, dst, spi, nbytes):
            self.counters.unmeasurable += 1

    def _sweep(self, now_s: float) -> None:
        self._next_sweep_s = now_s + AGE_SWEEP_S
        oldest = now_s - INFLIGHT_MAX_S
        self.esp.sweep(now_s, CONN_IDLE_S)
        for key, left in list(self.orphans.items()):
            stale = [tag for tag, c in left.items() if c.start_s < oldest]
            for tag in stale:
                self.busy.down(left.pop(tag).volume, now_s)
            self.counters.aged += len(stale)
            self.inflight_total -= len(stale)
            if not left:
                del self.orphans[key]
        for key, conn in list(self.conns.items()):
            if now_s - conn.last_s >= CONN_IDLE_S:
                self._forget(key)
                continue
            stale = [tag for tag, c in conn.inflight.items() if c.start_s < oldest]
            for tag in stale:
                self.busy.down(conn.inflight.pop(tag).volume, now_s)
            self.counters.aged += len(stale)
            self.inflight_total -= len(stale)

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
        return by_address(
            (c.initiator, c.initiator_name) for c in self.conns.values() if c.initiator_name
        )

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


def _gone(tr: Tracker, inflight: dict[int, Command]) -> None:
    """Commands in flight dropped with their connection (or the orphans of one)."""
    tr.inflight_total -= len(inflight)
    for cmd in inflight.values():
        tr.busy.down(cmd.volume, tr._now)
