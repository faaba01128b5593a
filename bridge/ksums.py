"""The in-kernel sensor's sums as the tracker's: per volume and tick, per initiator and convergence.

Problem
    bridge/kernel.py's program keeps, per (connection, volume), running
    totals since its load: reads, their latency in ns, write bytes. The
    bridge sensor (appliance/sensing/bridge.py) takes what tracker.py's
    Tracker gives it: the reads and write bytes of each tick per Volume,
    the write bytes of each convergence per (Volume, initiator), the
    volumes the live connections used, the target names, the reads in
    flight. KernelSums gives the same from the kernel's maps, so the sensor
    does not care which one walks the wire.

Law
    refresh() reads the totals, and what grew since the last refresh() is
    added to the tick's and the convergence's pending sums (a total that
    went down -- the map's entry was made anew -- counts from zero).
    Each take_* refreshes first, then hands its sums over and starts
    afresh. Names: the program passes up each login's and connect's text
    in events (its start with the PDU's flags and text length, then
    EV_BODY parts), which logins.py reads part by part: a login's
    TargetName (iSCSI, to the target) or a connect's SUBNQN (NVMe) names
    its connection's target, its InitiatorName or HOSTNQN its initiator;
    what the login negotiated (HeaderDigest / DataDigest, each side's
    MaxRecvDataSegmentLength) goes to the program's walks of the connection
    (kernel.set_login) once the target's answer moves it to full feature. A connection first
    seen in mid-session takes its names from known_targets and
    known_initiators, as the tracker's do. sweep() ages out commands in
    flight longer than INFLIGHT_MAX_S (counted in aged) and forgets
    connections idle for CONN_IDLE_S.

Bounds
    The names and the logins being read are kept for at most MAX_CONNS
    connections each (the oldest first goes, counted in evicted): a
    connection that logs in and never sends a command is never idle here.

Worked example
    refresh() sees (conn 10.0.0.2:51000 -> 10.0.0.11:3260, LUN field 0) at
    reads 10, read_ns 50e6; later at 12 and 60e6: take_tick() ->
    {Volume("iscsi", "10.0.0.11:3260", "", 0): VolumeReads(2, 0.010)}.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .belief import STATE_NAMES, SYNCED, UNMEASURABLE
from .capture import CaptureCounters
from .conns import ConnKey, SyncRow
from .esp import esp_row
from .kernel import (
    EV_BODY,
    EV_CONNECT,
    EV_LOGIN,
    Conn,
    Event,
    FlowState,
    KernelWire,
    VolumeSums,
)
from .logins import Login, Said, by_address, put_bounded
from .pdu import FULL_FEATURE, ISCSI_PORT, NVME_TCP_PORT, READ
from .protocols import TLS, UNPARSED
from .sums import ISCSI, NO_NAMESPACE, NVME, Sums, Volume, VolumeReads, lun_number, portal_name
from .tracker import CONN_IDLE_S, INFLIGHT_MAX_S, MAX_CONNS, SYNC_VOTE_S, Counters

SWEEP_S = 1.0
# a connection whose flows the program dropped (a FIN or an RST) and whose sums did not
# grow for this long is over (a completion may follow the initiator's FIN)
ENDED_S = 5.0
_REASONS = {1: TLS, 2: UNPARSED}  # the program's reasons for not measurable


@dataclass(slots=True)
class Negotiated:
    """A login's digests and segment limits (to_target -> bytes) as its text said them;
    final: the connection, once its target's answer moved it to full feature."""

    digests: tuple[bool, bool] | None = None
    limits: dict[bool, int] = field(default_factory=dict)
    final: Conn | None = None


def conn_key(c: Conn) -> ConnKey:
    return (c.initiator, c.initiator_port, c.target, c.target_port)


def portal_of(c: Conn) -> str:
    return portal_name(c.target, c.target_port)


class KernelSums:
    """Tracker's reading interface over a KernelWire (module header)."""

    busy = None  # the program keeps no time in flight per volume: no utilization

    def __init__(
        self,
        wire: KernelWire,
        known_targets: Mapping[ConnKey, str] | None = None,
        clock: Callable[[], float] | None = None,
        known_initiators: Mapping[ConnKey, str] | None = None,
    ) -> None:
        self.wire = wire
        self.clock = clock or time.monotonic
        self.known_targets = dict(known_targets or {})
        self.known_initiators = dict(known_initiators or {})
        self.names: dict[ConnKey, str] = {}  # target names
        self.initiators: dict[ConnKey, str] = {}  # initiator names
        self.counters = Counters()
        self.capture = CaptureCounters()
        self._totals: dict[tuple[Conn, int], VolumeSums] = {}
        self._active: dict[Conn, float] = {}  # a connection's last growth
        self._units: dict[Conn, set[int]] = {}
        self.sums = Sums()
        self._next_sweep = -math.inf
        self.kernel: dict[str, int] = {}  # the program's own counts, as last read
        # each connection's login or connect, read as its events come up, and what it
        # negotiated, until it reaches full feature
        self._logins: dict[ConnKey, Login] = {}
        self._pending: dict[ConnKey, Negotiated] = {}
        # each flow's walk as out_of_sync() last saw it, and since when it is so
        self._moved: dict[tuple[ConnKey, bool], tuple[tuple[int, int], float]] = {}
        self._flows: list[FlowState] | None = None  # as out_of_sync() last read them
        self._inflight: dict[tuple[Conn, int], tuple[int, int, int]] = {}  # the last sweep's

    # ------------------------------------------------------------ reading
    def volume(self, c: Conn, raw: int) -> Volume | None:
        key = conn_key(c)
        name = self.names.get(key) or self.known_targets.get(key, "")
        if c.target_port == ISCSI_PORT:
            return Volume(ISCSI, portal_of(c), name, lun_number(raw))
        if c.target_port == NVME_TCP_PORT and raw not in NO_NAMESPACE:
            return Volume(NVME, portal_of(c), name, raw)
        return None

    def refresh(self) -> None:
        now = self.clock()
        for ev in self.wire.events():
            self._event(ev)
        self._apply_logins()
        for (c, raw), s in self.wire.volume_sums().items():
            old = self._totals.get((c, raw))
            self._totals[c, raw] = s
            if old is None or s.reads < old.reads or s.write_bytes < old.write_bytes:
                old = VolumeSums(0, 0, 0)
            dr, dns = s.reads - old.reads, s.read_ns - old.read_ns
            dw = s.write_bytes - old.write_bytes
            dn = s.writes - old.writes
            if not (dr or dw or dn):
                continue
            if c not in self._active:
                self.counters.connections += 1
            self._active[c] = now
            v = self.volume(c, raw)
            if v is None:
                continue
            self._units.setdefault(c, set()).add(raw)
            if dr:
                self.sums.read(v, c.initiator, dns / 1e9, dr)
            if dn:
                self.sums.write_done(v, c.initiator, dn)
            if dw:
                self.sums.wrote(v, c.initiator, dw)
        k = self.wire.counters()
        self.counters.commands = k.get("commands", 0)
        self.counters.completions = k.get("completions", 0)
        self.counters.unmatched = k.get("unmatched", 0)
        self.counters.replaced = k.get("replaced", 0)
        self.capture.frames = k.get("frames", 0)
        self.capture.segments = k.get("segments", 0)
        self.capture.acks = max(0, self.capture.frames - self.capture.segments)
        self.kernel = k
        if now >= self._next_sweep:
            self.sweep(now)

    def _event(self, ev: Event) -> None:
        """A login's or connect's text, as it comes up (its start, then EV_BODY parts:
        a header may come alone in its segment)."""
        key = conn_key(ev.conn)
        login = self._logins.get(key)
        if ev.kind == EV_BODY:
            if login is not None:
                self._said(ev.conn, login.more(ev.to_target, ev.data), ev.to_target)
            return
        if ev.kind not in (EV_LOGIN, EV_CONNECT):
            return
        if login is None:
            login = Login()
            self.counters.evicted += put_bounded(self._logins, key, login, MAX_CONNS)
        connect = ev.kind == EV_CONNECT
        said = login.start(connect, ev.to_target, ev.flags, ev.total, ev.data)
        self._said(ev.conn, said, ev.to_target)
        if not connect and not ev.to_target and ev.flags & 0x80 and ev.flags & 3 == FULL_FEATURE:
            self._negotiated(key).final = ev.conn  # applied once its text is read (refresh)

    def _said(self, conn: Conn, said: Said, to_target: bool) -> None:
        key = conn_key(conn)
        if said.target:
            self.counters.evicted += put_bounded(self.names, key, said.target, MAX_CONNS)
        if said.initiator:
            self.counters.evicted += put_bounded(self.initiators, key, said.initiator, MAX_CONNS)
        if said.digests is not None:
            self._negotiated(key).digests = said.digests
        if said.segment_limit is not None:  # declared by its sender: the most it takes
            self._negotiated(key).limits[not to_target] = said.segment_limit
        self.counters.bad_names += said.bad_names

    def _negotiated(self, key: ConnKey) -> Negotiated:
        n = self._pending.get(key)
        if n is None:
            n = Negotiated()
            self.counters.evicted += put_bounded(self._pending, key, n, MAX_CONNS)
        return n

    def _apply_logins(self) -> None:
        """The logins that reached full feature: what they negotiated, to the program."""
        for key, n in list(self._pending.items()):
            if n.final is not None:
                self.wire.set_login(n.final, n.digests, n.limits)
                del self._pending[key]

    def sweep(self, now: float) -> None:
        """Age out commands that never completed; forget idle connections."""
        self._next_sweep = now + SWEEP_S
        # the program's clock is CLOCK_MONOTONIC (bpf_ktime_get_ns), whatever self.clock is
        oldest_ns = time.monotonic_ns() - int(INFLIGHT_MAX_S * 1e9)
        self._inflight = self.wire.inflight()  # in_flight()'s until the next sweep
        for (c, tag), (start_ns, _op, _raw) in list(self._inflight.items()):
            if start_ns < oldest_ns:
                self.wire.forget_inflight(c, tag)
                del self._inflight[c, tag]
                self.counters.aged += 1
        # a connection whose flows went (its FIN or RST) and whose sums did not grow
        # for ENDED_S is over; one idle for CONN_IDLE_S too. Its sums leave the map
        # (a hash of 65,536 that connections coming and going would fill, after which
        # no new one is measured) and it is no longer seen.
        flowing = {f.conn for f in (self._flows if self._flows is not None else ())}
        for c, t in list(self._active.items()):
            ended = self._flows is not None and c not in flowing and now - t >= ENDED_S
            if ended or now - t >= CONN_IDLE_S:
                del self._active[c]
                self._units.pop(c, None)
                for held in (self.names, self.initiators, self._logins, self._pending):
                    held.pop(conn_key(c), None)
        if self._flows is not None:
            keep = self._active.keys() | flowing
            for c, raw in [k for k in self._totals if k[0] not in keep]:
                del self._totals[c, raw]
                self.wire.forget_sums(c, raw)

    # ------------------------------------------------------------ Tracker's
    def take_tick(self) -> tuple[dict[Volume, VolumeReads], dict[Volume, int]]:
        self.refresh()
        return self.sums.take_tick()

    def take_writes(self) -> dict[tuple[Volume, str], int]:
        self.refresh()
        return self.sums.take_writes()

    def take_initiator_ios(self) -> dict[tuple[Volume, str], VolumeReads]:
        self.refresh()
        return self.sums.take_initiator_ios()

    def targets(self) -> dict[ConnKey, str]:
        live = {conn_key(c) for c in self._active}
        named = {**{k: v for k, v in self.known_targets.items() if k in live}, **self.names}
        return {k: v for k, v in named.items() if k in live}

    def initiator_logins(self) -> dict[ConnKey, str]:
        live = {conn_key(c) for c in self._active}
        named = {**{k: v for k, v in self.known_initiators.items() if k in live}, **self.initiators}
        return {k: v for k, v in named.items() if k in live}

    def initiator_names(self) -> dict[str, tuple[str, ...]]:
        return by_address((k[0], n) for k, n in self.initiator_logins().items())

    def seen(self) -> dict[Volume, set[str]]:
        out: dict[Volume, set[str]] = {}
        for c, units in self._units.items():
            for raw in units:
                v = self.volume(c, raw)
                if v is not None:
                    out.setdefault(v, set()).add(c.initiator)
        return out

    # ------------------------------------------------------------ the walks' state
    def sync_rows(self, now_s: float) -> list[SyncRow]:
        """Each connection direction the program walks (conns.sync_rows()), as the last
        out_of_sync() read them (a convergence's: a status does not walk 65,536 map
        entries under the daemon's lock), or read now before the first."""
        out = []
        for f in self.wire.flows() if self._flows is None else self._flows:
            c = f.conn
            target = self.names.get(conn_key(c)) or self.known_targets.get(conn_key(c), "")
            way = "to_target" if f.to_target else "to_initiator"
            out.append(SyncRow(c.initiator, c.initiator_port, portal_of(c), target, way,
                               STATE_NAMES[min(f.state, 3)], f.out_of_sync_bytes,
                               round(f.out_of_sync_s, 6), f.desyncs,
                               _REASONS.get(f.reason, "")))  # fmt: skip
        out += [esp_row(e.src, e.dst, e.spi, e.seconds, e.bytes) for e in self.wire.esp_flows()]
        return out

    def out_of_sync(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """(protocol, portal, target) -> (its connections, those with a direction not in
        sync), measurable connections that carried a segment in the last SYNC_VOTE_S
        only (tracker.py's): a flow whose walk (its next sequence number, its bytes out
        of sync) did not move since the last look, for that long, is silent."""
        conns: dict[ConnKey, tuple[Conn, bool]] = {}  # -> (conn, a direction not in sync)
        gone: set[ConnKey] = set()
        now = self.clock()
        flows = self._flows = self.wire.flows()
        seen, self._moved = self._moved, {}
        talking: set[ConnKey] = set()  # a direction moved in the last SYNC_VOTE_S
        for f in flows:
            key = conn_key(f.conn)
            mark = (f.next_seq, f.out_of_sync_bytes)
            was = seen.get((key, f.to_target))
            at = was[1] if was is not None and was[0] == mark else now
            self._moved[key, f.to_target] = (mark, at)
            if now - at <= SYNC_VOTE_S:
                talking.add(key)
        for f in flows:
            key = conn_key(f.conn)
            if key not in talking:
                continue
            if f.state == UNMEASURABLE:
                gone.add(key)
            lost = f.state != SYNCED or conns.get(key, (f.conn, False))[1]
            conns[key] = (f.conn, lost)
        out: dict[tuple[str, str, str], list[int]] = {}
        for key, (c, lost) in conns.items():
            if key in gone:
                continue
            proto = ISCSI if c.target_port == ISCSI_PORT else NVME
            target = self.names.get(key) or self.known_targets.get(key, "")
            a = out.setdefault((proto, portal_of(c), target), [0, 0])
            a[0] += 1
            a[1] += lost
        return {k: (n, m) for k, (n, m) in out.items()}

    def in_flight(self) -> dict[Volume, int]:
        """Reads in flight per volume, as the last sweep read them (at most SWEEP_S old:
        the program's map holds up to 2^20 commands, too many to walk each tick)."""
        out: dict[Volume, int] = {}
        for (c, _tag), (_start, op, raw) in self._inflight.items():
            v = self.volume(c, raw) if op == READ else None
            if v is not None:
                out[v] = out.get(v, 0) + 1
        return out
