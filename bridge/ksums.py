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
    known_initiators, as the tracker's do. sweep() forgets connections
    idle for CONN_IDLE_S, or ended (ENDED_S).

The large maps
    The flows (out_of_sync(), sync_rows(), the sweep's ended connections)
    and the commands in flight (in_flight(), their ageing: older than
    INFLIGHT_MAX_S, deleted and counted in aged) are walked by
    kwalks.py's Walker in a thread of its own, which install()s its
    results under the sensor's lock; those methods give the last walk's.
    Without a walker (walker False: a command-line measure, a test) they
    walk when asked: the flows at each out_of_sync(), the commands in
    flight at most once a SWEEP_S in in_flight() and each AGE_S in the
    sweep.

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
from dataclasses import dataclass, field, replace

from .capture import CaptureCounters
from .conns import ConnKey, SyncRow, SyncSummary, summary
from .esp import esp_row
from .kbusy import KernelBusy, lost
from .kernel import (
    EV_BODY,
    EV_CONNECT,
    EV_LOGIN,
    Conn,
    Event,
    KernelWire,
    VolumeSums,
)
from .kwalks import (
    AGE_S,
    FlowWalk,
    InflightWalk,
    Moved,
    conn_key,
    flow_walk,
    inflight_walk,
    sync_row,
)
from .logins import Login, Said, by_address, put_bounded
from .pdu import FULL_FEATURE, ISCSI_PORT, NVME_TCP_PORT
from .sums import ISCSI, NO_NAMESPACE, NVME, Sums, Volume, VolumeReads, lun_number, portal_name
from .tracker import CONN_IDLE_S, MAX_CONNS, Counters

SWEEP_S = 1.0
# a connection whose flows the program dropped (a FIN or an RST) and whose sums did not
# grow for this long is over (a completion may follow the initiator's FIN)
ENDED_S = 5.0


@dataclass(slots=True)
class Negotiated:
    """A login's digests and segment limits (to_target -> bytes) as its text said them;
    final: the connection, once its target's answer moved it to full feature."""

    digests: tuple[bool, bool] | None = None
    limits: dict[bool, int] = field(default_factory=dict)
    final: Conn | None = None


def portal_of(c: Conn) -> str:
    return portal_name(c.target, c.target_port)


class KernelSums:
    """Tracker's reading interface over a KernelWire (module header)."""

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
        self.busy = KernelBusy(self.volume)  # per volume, time with a command in flight
        self._next_sweep = -math.inf
        self.kernel: dict[str, int] = {}  # the program's own counts, as last read
        self.flows_evicted = 0  # the flow walks' (kwalks.FlowWalk.evicted), the most
        # each connection's login or connect, read as its events come up, and what it
        # negotiated, until it reaches full feature
        self._logins: dict[ConnKey, Login] = {}
        self._pending: dict[ConnKey, Negotiated] = {}
        # the large maps (module header): their walks' last results, walked by a
        # kwalks.Walker when walker is set; each flow's mark, the walker's own
        self.walker = False
        self._moved: Moved = {}
        self._flow_walk: FlowWalk | None = None
        self._inflight: InflightWalk | None = None
        self.inflight_wanted = False  # in_flight() asked since the last walk of them
        self._next_age = -math.inf

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
        totals = self.wire.volume_sums()
        self.busy.read(totals.items(), time.monotonic_ns())  # the program's clock
        for (c, raw), s in totals.items():
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
        """Forget idle and ended connections; without a walker, age out commands that
        never completed (each AGE_S)."""
        self._next_sweep = now + SWEEP_S
        if not self.walker and now >= self._next_age:  # they age in 60 s: each AGE_S
            self._next_age = now + AGE_S
            self.install(None, self.walk_inflight(now))
        # a connection whose flows went (its FIN or RST) and whose sums did not grow
        # for ENDED_S is over; one idle for CONN_IDLE_S too. Its sums leave the map
        # (a hash of 65,536 that connections coming and going would fill, after which
        # no new one is measured) and it is no longer seen.
        walk = self._flow_walk
        flowing = walk.flowing if walk is not None else frozenset()
        for c, t in list(self._active.items()):
            ended = walk is not None and c not in flowing and now - t >= ENDED_S
            if ended or now - t >= CONN_IDLE_S:
                del self._active[c]
                self._units.pop(c, None)
                for held in (self.names, self.initiators, self._logins, self._pending):
                    held.pop(conn_key(c), None)
        if walk is not None:
            keep = self._active.keys() | flowing
            for c, raw in [k for k in self._totals if k[0] not in keep]:
                del self._totals[c, raw]
                self.busy.forget((c, raw))
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

    # ------------------------------------------------------------ the large maps
    def walk_flows(self, now: float) -> FlowWalk:
        """Read and walk the flows (kwalks.flow_walk); changes nothing but each flow's
        mark, which only the walker (or, without one, the caller) keeps."""
        added = self.wire.counters().get("flows_added", 0)
        flows = self.wire.flows()
        removed = self.wire.counters().get("flows_removed", 0)
        esp = [esp_row(e.src, e.dst, e.spi, e.seconds, e.bytes) for e in self.wire.esp_flows()]
        walk, self._moved = flow_walk(flows, self._moved, now, self._target_of, esp)
        return replace(walk, evicted=max(0, added - removed - len(flows)))

    def walk_inflight(self, now: float) -> InflightWalk:
        """Read the commands in flight, age out the old ones (kwalks.inflight_walk), and
        retire those counted in flight that the map lost (kbusy.py)."""
        self.inflight_wanted = False
        # the program's clock is CLOCK_MONOTONIC (bpf_ktime_get_ns), whatever self.clock is
        start_ns = time.monotonic_ns()
        before = self.wire.volume_sums()
        walk = inflight_walk(self.wire.inflight(), now, start_ns, self.volume, self._age)
        gone = lost(before, self.wire.volume_sums(), walk.held, self.busy.retired)
        for key, n in gone.items():
            self.wire.retire(*key, *self.busy.retire(key, n, start_ns))
        return walk

    def _age(self, c: Conn, tag: int, raw: int) -> None:
        """A command that never completed leaves the map; its volume's count in flight
        goes down with it (the program's, through the map retired: kbusy.py)."""
        if self.wire.forget_inflight(c, tag):
            self.wire.retire(c, raw, *self.busy.retire((c, raw), 1, time.monotonic_ns()))

    def install(self, flows: FlowWalk | None, inflight: InflightWalk | None) -> None:
        """A walk's results, for the methods below (the caller holds the sensor's lock)."""
        if flows is not None:
            self._flow_walk = flows
            self.flows_evicted = max(self.flows_evicted, flows.evicted)
        if inflight is not None:
            self._inflight = inflight
            self.counters.aged += inflight.aged

    def _target_of(self, key: ConnKey) -> str:
        return self.names.get(key) or self.known_targets.get(key, "")

    def sync_rows(self, now_s: float) -> list[SyncRow]:
        """Each connection direction the program walks (conns.sync_rows()), as the last
        walk of the flows read them (a status does not walk 65,536 map entries under
        the daemon's lock), or read now before the first."""
        walk = self._flow_walk
        flows = walk.flows if walk is not None else self.wire.flows()
        rows = [sync_row(f, self._target_of(conn_key(f.conn))) for f in flows]
        esp = self.wire.esp_flows()
        return rows + [esp_row(e.src, e.dst, e.spi, e.seconds, e.bytes) for e in esp]

    def sync_summary(self, now_s: float) -> SyncSummary:
        """What a status shows of sync_rows() (conns.SyncSummary): the last walk's;
        none before the walker's first, all of them read now without a walker."""
        walk = self._flow_walk
        if walk is not None:
            return walk.summary
        return SyncSummary({}, 0.0, []) if self.walker else summary(self.sync_rows(now_s))

    def out_of_sync(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """(protocol, portal, target) -> (its connections, those with a direction not in
        sync), measurable connections that carried a segment in the last SYNC_VOTE_S
        only (tracker.py's): a flow whose walk (its next sequence number, its bytes out
        of sync) did not move since the last look, for that long, is silent. The last
        walk's; without a walker, walked now."""
        if not self.walker:
            self.install(self.walk_flows(self.clock()), None)
        walk = self._flow_walk
        return walk.out_of_sync if walk is not None else {}

    def in_flight(self) -> dict[Volume, int]:
        """Reads in flight per volume, as the last walk of them found (it asks for the
        next one); without a walker, read now when the last is SWEEP_S old (the map
        holds up to 2^20 commands, too many to walk each tick)."""
        self.inflight_wanted = True
        now = self.clock()
        last = self._inflight
        if not self.walker and (last is None or now - last.at >= SWEEP_S):
            self.install(None, self.walk_inflight(now))
        return dict(self._inflight.reads) if self._inflight is not None else {}
