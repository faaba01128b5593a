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
    afresh. Names: a login's TargetName (iSCSI, to the target) or a
    connect's SUBNQN (NVMe) names its connection; the target's login
    answer with HeaderDigest / DataDigest = CRC32C sets the connection's
    digests in the kernel's flows. A connection first seen in mid-session
    takes its name from known_targets, as the tracker's do. sweep() ages
    out commands in flight longer than INFLIGHT_MAX_S (counted in aged)
    and forgets connections idle for CONN_IDLE_S.

Worked example
    refresh() sees (conn 10.0.0.2:51000 -> 10.0.0.11:3260, LUN field 0) at
    reads 10, read_ns 50e6; later at 12 and 60e6: take_tick() ->
    {Volume("iscsi", "10.0.0.11:3260", "", 0): VolumeReads(2, 0.010)}.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping

from .capture import CaptureCounters
from .kernel import EV_BODY, EV_CONNECT, EV_LOGIN, Conn, Event, KernelWire, VolumeSums
from .pdu import ISCSI_PORT, NVME_TCP_PORT, READ
from .tracker import (
    CONN_IDLE_S,
    INFLIGHT_MAX_S,
    ISCSI,
    NAME_MAX_BYTES,
    NO_NAMESPACE,
    NVME,
    SUBNQN,
    ConnKey,
    Counters,
    Volume,
    VolumeReads,
    lun_number,
    portal_name,
    text_value,
)

SWEEP_S = 1.0
BODY_MAX_BYTES = 4096  # the most of one login's or connect's text kept (wire.bpf.c's BODY_MAX)


def conn_key(c: Conn) -> ConnKey:
    return (c.initiator, c.initiator_port, c.target, c.target_port)


def portal_of(c: Conn) -> str:
    return portal_name(c.target, c.target_port)


class KernelSums:
    """Tracker's reading interface over a KernelWire (module header)."""

    def __init__(
        self,
        wire: KernelWire,
        known_targets: Mapping[ConnKey, str] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.wire = wire
        self.clock = clock or time.monotonic
        self.known_targets = dict(known_targets or {})
        self.names: dict[ConnKey, str] = {}
        self.counters = Counters()
        self.capture = CaptureCounters()
        self._totals: dict[tuple[Conn, int], VolumeSums] = {}
        self._active: dict[Conn, float] = {}  # a connection's last growth
        self._units: dict[Conn, set[int]] = {}
        self.reads: dict[Volume, VolumeReads] = {}
        self.volume_writes: dict[Volume, int] = {}
        self.writes: dict[tuple[Volume, str], int] = {}
        self.initiator_ios: dict[tuple[Volume, str], VolumeReads] = {}
        self._next_sweep = -math.inf
        self.kernel: dict[str, int] = {}  # the program's own counts, as last read
        # the last login's or connect's text per connection and direction, as it came up
        self._texts: dict[tuple[ConnKey, bool], tuple[int, bytes]] = {}

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
                r = self.reads.get(v)
                if r is None:
                    r = self.reads[v] = VolumeReads()
                r.reads += dr
                r.latency_sum_s += dns / 1e9
                ri = self._initiator_io(v, c.initiator)
                ri.reads += dr
                ri.latency_sum_s += dns / 1e9
            if dn:
                self._initiator_io(v, c.initiator).writes += dn
            if dw:
                self.volume_writes[v] = self.volume_writes.get(v, 0) + dw
                k = (v, c.initiator)
                self.writes[k] = self.writes.get(k, 0) + dw
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
        a header may come alone in its segment); read again as each part arrives."""
        key = (conn_key(ev.conn), ev.to_target)
        if ev.kind == EV_BODY:
            held = self._texts.get(key)
            if held is None:
                return
            kind, text = held
            text = (text + ev.data)[:BODY_MAX_BYTES]
        else:
            kind, text = ev.kind, ev.data
        self._texts[key] = (kind, text)
        self._read_text(ev.conn, kind, ev.to_target, text)

    def _read_text(self, conn: Conn, kind: int, to_target: bool, text: bytes) -> None:
        key = conn_key(conn)
        if kind == EV_LOGIN and to_target:
            name = text_value(text, 0, b"TargetName")
            if name:
                self.names[key] = name
        elif kind == EV_LOGIN:
            hd = text_value(text, 0, b"HeaderDigest")
            dd = text_value(text, 0, b"DataDigest")
            if hd is not None or dd is not None:
                self.wire.set_digests(conn, hd == "CRC32C", dd == "CRC32C")
        elif kind == EV_CONNECT and len(text) >= SUBNQN.start:
            nqn = text[SUBNQN].split(b"\0", 1)[0]
            if nqn:
                self.names[key] = nqn[:NAME_MAX_BYTES].decode("ascii", "replace")

    def sweep(self, now: float) -> None:
        """Age out commands that never completed; forget idle connections."""
        self._next_sweep = now + SWEEP_S
        # the program's clock is CLOCK_MONOTONIC (bpf_ktime_get_ns), whatever self.clock is
        oldest_ns = time.monotonic_ns() - int(INFLIGHT_MAX_S * 1e9)
        for (c, tag), (start_ns, _op, _raw) in self.wire.inflight().items():
            if start_ns < oldest_ns:
                self.wire.forget_inflight(c, tag)
                self.counters.aged += 1
        for c, t in list(self._active.items()):
            if now - t >= CONN_IDLE_S:
                del self._active[c]
                self._units.pop(c, None)
                self.names.pop(conn_key(c), None)
                for d in (True, False):
                    self._texts.pop((conn_key(c), d), None)

    # ------------------------------------------------------------ Tracker's
    def take_tick(self) -> tuple[dict[Volume, VolumeReads], dict[Volume, int]]:
        self.refresh()
        reads, self.reads = self.reads, {}
        writes, self.volume_writes = self.volume_writes, {}
        return reads, writes

    def take_writes(self) -> dict[tuple[Volume, str], int]:
        self.refresh()
        out, self.writes = self.writes, {}
        return out

    def _initiator_io(self, v: Volume, initiator: str) -> VolumeReads:
        r = self.initiator_ios.get((v, initiator))
        if r is None:
            r = self.initiator_ios[v, initiator] = VolumeReads()
        return r

    def take_initiator_ios(self) -> dict[tuple[Volume, str], VolumeReads]:
        self.refresh()
        out, self.initiator_ios = self.initiator_ios, {}
        return out

    def targets(self) -> dict[ConnKey, str]:
        live = {conn_key(c) for c in self._active}
        named = {**{k: v for k, v in self.known_targets.items() if k in live}, **self.names}
        return {k: v for k, v in named.items() if k in live}

    def seen(self) -> dict[Volume, set[str]]:
        out: dict[Volume, set[str]] = {}
        for c, units in self._units.items():
            for raw in units:
                v = self.volume(c, raw)
                if v is not None:
                    out.setdefault(v, set()).add(c.initiator)
        return out

    def in_flight(self) -> dict[Volume, int]:
        out: dict[Volume, int] = {}
        for (c, _tag), (_start, op, raw) in self.wire.inflight().items():
            v = self.volume(c, raw) if op == READ else None
            if v is not None:
                out[v] = out.get(v, 0) + 1
        return out
