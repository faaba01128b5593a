"""The bridge sensor: the controller's samples from the wire, in bridge mode.

BridgeSensor reads the array-side port of the bridge -- in the kernel
(bridge/kernel.py's tc program, whose sums bridge/ksums.py reads each tick
and convergence) when it loads, else in Python (bridge/capture.py's ring,
in a thread of its own, every storage segment to bridge/tracker.py) -- and
gives the daemon what TargetSensor gives it on a target host, so the
controller cannot tell the two apart:

    read_samples()   per tick, one ReadSample per configured resource:
                     its volumes' reads, their mean latency, the write rate
                     (bridge/volumes.py's law), and the reads in flight when
                     none completed (a stalled reader is not an idle one);
    converge()       per convergence, a Discovery (the configured resources;
                     every initiator the wire saw send commands, with the
                     resources its volumes are in) and one WriteSample per
                     (resource, initiator) that wrote;
    device_samples() empty: the wire sees no device queue (threshold "auto"
                     is target mode's, config/parse.py refuses it here);
    utilization_samples() per tick, per resource, the busiest of its volumes'
                     share of the tick with a command in flight (the capture's
                     tracker: bridge/busy.py; the kernel's program: kbusy.py);
    initiator_names() the names each initiator address logged in with (iSCSI
                     InitiatorName, NVMe host NQN) over its live connections,
                     for the daemon's group map (iqn.* and nqn.* members);
                     a convergence's InitiatorViews carry them too.

Names across restarts
    wirenames.py's SavedNames: the target and initiator names of the live
    connections, kept in the daemon's state_dir (names_path).

Threads
    The capture thread holds `lock` while it walks FRAMES_PER_TURN frames of
    the ring (a few ms), never while it waits for a block; the tick and the
    convergence take the tracker's sums under the same lock, so a
    completion is counted in exactly one tick. The lock is a FifoLock
    (capture.py): through a burst of SYNs a tick waits for the turn being
    walked, not for the burst. A capture that fails (the
    port went away) is logged; the thread opens the ring again every
    REOPEN_S and, until it has, read_samples() raises CaptureDown, which
    the daemon counts as a sensor error (the controller holds). In the
    kernel, read_samples() checks every REOPEN_S that the port is still the
    one the program is on, and attaches it again when it was made anew; the
    program's large maps (flows, commands in flight) are walked by a thread
    of their own (bridge/kwalks.py) that takes the lock only to hand its
    results over, so neither the tick nor a status waits on a walk of
    65,536 flows.

Worked example
    resources {"array1": ["iscsi://10.0.0.9/*/*"]}; in one 0.1 s tick the
    wire shows two reads of LUN 2 at that portal, 4 and 10 ms:
    read_samples() -> [ReadSample("array1", 2, 0.007, 0.0, None)].
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, suppress
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from santhrottle.appliance.netns import entered
from santhrottle.appliance.sensing.discovery import Discovery, InitiatorView
from santhrottle.appliance.sensing.diskstats import MIN_INTERVAL_S
from santhrottle.appliance.sensing.wirenames import SavedNames
from santhrottle.bridge.capture import CaptureCounters, Esp, FifoLock, Ring, Segment
from santhrottle.bridge.conns import SyncRow, SyncSummary
from santhrottle.bridge.tracker import Tracker, Volume, VolumeReads
from santhrottle.bridge.volumes import VolumeMap, VolumeRow, volume_rows
from santhrottle.controller.domain import (
    DeviceSample,
    IoSample,
    ReadSample,
    UtilizationSample,
    WriteSample,
)

log = logging.getLogger(__name__)

POLL_MS = 100  # the capture thread's longest wait: how soon close() is seen
REOPEN_S = 1.0
WIRE = "wire"  # Discovery's write source of every pair: the wire's own bytes
WALK_COUNTS = ("desyncs", "resyncs", "retracted", "gaps")  # the walks', as counters()' walk_*


class CaptureDown(OSError):
    """The capture on the array-side port is not running; the message says why."""


class CaptureSource(Protocol):
    """What the sensor needs of a capture (bridge/capture.py's Ring)."""

    def poll(
        self,
        timeout_ms: int,
        segment: Segment,
        guard: AbstractContextManager[Any] | None = None,
        esp: Esp | None = None,
    ) -> int: ...

    def close(self) -> None: ...

    def kernel_stats(self) -> tuple[int, int]: ...

    @property
    def counters(self) -> CaptureCounters: ...


class BridgeSensor:
    def __init__(
        self,
        *,
        port: str,
        resources: Mapping[str, Iterable[str]],
        netns: str | None = None,
        open_capture: Callable[[str], CaptureSource] = Ring,
        clock: Callable[[], float] = time.monotonic,
        names_path: str | Path | None = None,
        save_names: bool = True,
        sensor: str = "auto",
        open_kernel: Callable[[str], Any] | None = None,
        initiators_path: str | Path | None = None,
    ) -> None:
        self.port = port
        self.netns = netns
        self.vmap = VolumeMap(resources)
        self.saved = SavedNames(names_path, initiators_path, save_names)
        self.tracker: Any = Tracker(self.saved.targets, self.saved.initiators)
        self.sensor = sensor  # kernel, capture or auto: the first that starts
        self._open_kernel = open_kernel
        self._kernel: Any = None  # the loaded program, when it walks the wire
        self._walker: Any = None  # its maps' walks (bridge/kwalks.py)
        self._kernel_checked = -1e18  # when its attachment was last checked
        self.lock = FifoLock()  # taken in turn: see Threads
        self.clock = clock
        self._open = open_capture
        self._stop = threading.Event()
        self._down: str | None = "not started"
        self._thread: threading.Thread | None = None
        self._capture: CaptureSource | None = None
        self._capture_counters = CaptureCounters()  # of the captures before this one too
        self._tick_at = self._converge_at = clock()
        self.last_tick: dict[Volume, VolumeReads] = {}
        self._utilization: list[UtilizationSample] = []  # of the last tick
        self.io_samples: list[IoSample] = []  # the last convergence's, per (resource, initiator)
        self.io_span_s: float | None = None  # the time io_samples cover
        # the resources whose connections are mostly out of sync (volumes.py): their
        # ticks show no reads and reads in flight, so the controller holds their class;
        # found at each convergence
        self.held: frozenset[str] = frozenset()

    # -- the capture thread ----------------------------------------------
    def start(self) -> None:
        """Load the in-kernel sensor (sensor kernel or auto), else open the capture and
        start reading it; CaptureDown (an OSError) when neither can read the port."""
        if self.sensor in ("kernel", "auto"):
            why = self._start_kernel()
            if why is None:
                return
            if self.sensor == "kernel":
                raise CaptureDown(f"cannot read {self.port} in the kernel: {why}")
            msg = "the in-kernel wire sensor cannot run (%s): reading %s in Python"
            log.warning(msg, why, self.port)
        try:
            self._capture = self._opened()
        except OSError as e:
            raise CaptureDown(f"cannot capture on {self.port}: {e.strerror or e}") from None
        self._down = None
        self._thread = threading.Thread(target=self._run, name="wire", daemon=True)
        self._thread.start()

    def _start_kernel(self) -> str | None:
        """Load bridge/bpf's program onto the port; None, or why it cannot."""
        from santhrottle.bridge.kernel import KernelWire, KernelWireError
        from santhrottle.bridge.ksums import KernelSums
        from santhrottle.bridge.kwalks import Walker

        try:
            with entered(self.netns):  # its netlink socket, opened in the bridge's namespace
                wire = (self._open_kernel or KernelWire)(self.port)
        except (KernelWireError, OSError) as e:
            return str(e)
        with self.lock:
            self._kernel = wire
            self.tracker = KernelSums(wire, self.saved.targets, self.clock, self.saved.initiators)
        self._walker = Walker(self.tracker, self.lock, self.clock)
        self._walker.start()
        self._down = None
        log.info("wire sensor: in the kernel on %s", self.port)
        return None

    def _check_kernel(self, now: float) -> None:
        """Every REOPEN_S: is the program still on the port? If the port went away or
        was made anew, attach it again; until then the ticks raise CaptureDown."""
        wire = self._kernel
        if wire is None or now - self._kernel_checked < REOPEN_S:
            return
        self._kernel_checked = now
        if wire.attached():
            return
        from santhrottle.bridge.kernel import KernelWireError

        try:
            with entered(self.netns):
                wire.reattach()
        except (KernelWireError, OSError) as e:
            if self._down is None:
                log.error("in-kernel wire sensor on %s: %s", self.port, e)
            self._down = f"in-kernel wire sensor on {self.port}: {e}"
            return
        if self._down is not None:
            log.info("in-kernel wire sensor on %s running again", self.port)
        self._down = None

    @property
    def kind(self) -> str:
        """Where the wire is walked: "kernel" (bridge/bpf) or "capture" (Python)."""
        return "kernel" if self._kernel is not None else "capture"

    def _opened(self) -> CaptureSource:
        with entered(self.netns):
            return self._open(self.port)

    def _run(self) -> None:
        segment = self.tracker.segment
        while not self._stop.is_set():
            try:
                if self._capture is None:
                    self._capture = self._opened()
                    self._down = None
                    log.info("capture on %s running again", self.port)
                self._capture.poll(POLL_MS, segment, self.lock, self.tracker.encrypted)
            except OSError as e:
                if self._down is None:
                    log.error("capture on %s: %s", self.port, e)
                self._down = f"capture on {self.port}: {e.strerror or e}"
                self._close_capture()
                self._stop.wait(REOPEN_S)

    def _close_capture(self) -> None:
        cap, self._capture = self._capture, None
        if cap is not None:
            self._fold(cap)
            with suppress(OSError):
                cap.close()

    def _fold(self, cap: CaptureSource) -> None:
        """Move a capture's counts into the sensor's totals (the ring's drops read first)."""
        with suppress(OSError):
            cap.kernel_stats()
        with self.lock:
            mine, theirs = self._capture_counters, cap.counters
            for k, v in asdict(theirs).items():
                setattr(mine, k, getattr(mine, k) + v)
                setattr(theirs, k, 0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * POLL_MS / 1000 + 1)
        self._close_capture()
        walker, self._walker = self._walker, None
        if walker is not None:
            walker.close()
        wire, self._kernel = self._kernel, None
        if wire is not None:
            wire.close()

    # -- the daemon's sensor interface (daemon/core/sensors.py) ------------
    # no long-lived discovery to freeze for the garbage collector (GcFreezer)
    discoveries = 0

    def want_io_samples(self, resources: Iterable[str]) -> None:
        """Every resource's IoSamples are made from the wire anyway: nothing to narrow."""

    def reconfigure(self, resources: Mapping[str, Iterable[str]]) -> None:
        """New resource definitions (a reload); the tracker keeps its state."""
        vmap = VolumeMap(resources)
        with self.lock:
            self.vmap = vmap

    def read_samples(self, hold: bool = True) -> list[ReadSample]:
        """The tick's samples; hold: a resource in `held` shows no reads and reads in
        flight (the controller holds its class); the command line's measure shows them."""
        now = self.clock()
        self._check_kernel(now)
        if self._down is not None:
            raise CaptureDown(self._down)
        with self.lock:
            if now - self._tick_at < MIN_INTERVAL_S:
                return []
            reads, writes = self.tracker.take_tick()
            busy = None if self.tracker.busy is None else self.tracker.busy.take(now)
            vmap = self.vmap
        dt, self._tick_at = now - self._tick_at, now
        self.last_tick = reads
        self._utilization = [] if busy is None else _utilization(vmap, busy, dt)
        got = {s.resource: s for s in vmap.read_samples(reads, writes, dt)}
        stalled: dict[str, int] | None = None
        out = []
        held = self.held if hold else frozenset()
        for name in vmap.patterns:
            s = got.get(name)
            if s is not None and s.reads and name not in held:
                out.append(s)
                continue
            if stalled is None:
                with self.lock:
                    stalled = _per_resource(vmap, self.tracker.in_flight())
            wbps = s.write_bps if s is not None else 0.0
            inflight = stalled.get(name, 0)
            if name in held:  # a partial sample: the class holds (reads not gone)
                inflight = max(1, inflight)
            out.append(ReadSample(name, 0, 0.0, wbps, inflight))
        return out

    def device_samples(self) -> list[DeviceSample]:
        return []

    def utilization_samples(self) -> list[UtilizationSample]:
        """The last tick's busiest volume per resource (bridge/busy.py, bridge/kbusy.py)."""
        return self._utilization

    def converge(self) -> tuple[Discovery, list[WriteSample]]:
        cap = self._capture
        if cap is not None:
            self._fold(cap)  # once per convergence: the ring's drops, the counts
        now = self.clock()
        with self.lock:
            writes = self.tracker.take_writes()
            per_initiator = self.tracker.take_initiator_ios()
            seen = self.tracker.seen()
            logged_in = self.tracker.initiator_names()
            vmap = self.vmap
            conns = self.tracker.out_of_sync()
        self.held = frozenset(vmap.out_of_sync(conns))
        dt, self._converge_at = max(now - self._converge_at, MIN_INTERVAL_S), now
        initiators = _initiator_views(vmap, seen, logged_in)
        samples = vmap.write_samples(writes, dt)
        self.io_samples = vmap.io_samples(per_initiator, writes)  # for initiator groups
        self.io_span_s = dt  # the time they cover
        for w in samples:  # a writer whose connection closed within the interval
            initiators.setdefault(w.initiator, InitiatorView(w.initiator)).resources.add(w.resource)
        if self.saved.save:
            with self.lock:
                names, logins = self.tracker.targets(), self.tracker.initiator_logins()
            self.saved.store(names, logins)
        disc = Discovery(
            resources=dict.fromkeys(vmap.patterns, ()),
            exports=[],
            initiators=initiators,
            device_writers={},
            acl_write_bytes={},
            ambiguous=[],
        )
        return disc, samples

    def initiator_names(self) -> dict[str, tuple[str, ...]]:
        """Initiator address -> the names it logged in with (iSCSI InitiatorName,
        NVMe host NQN), over its live connections: for the daemon's group map."""
        with self.lock:
            return dict(self.tracker.initiator_names())

    # -- what the admin sees -------------------------------------------------
    def volume_rows(self) -> list[VolumeRow]:
        """Every volume the wire has shown, its initiators and last tick's latency."""
        with self.lock:
            seen = self.tracker.seen()
            vmap = self.vmap
        return volume_rows(seen, self.last_tick, vmap)

    def counters(self) -> dict[str, int]:
        """The tracker's and the capture's counts since the start, and the walks' (sync:
        desyncs, resyncs, provisional headers retracted, gaps)."""
        with self.lock:
            out = asdict(self.tracker.counters)
            kernel = self._kernel is not None
            cap = self.tracker.capture if kernel else self._capture_counters
            out.update({f"capture_{k}": v for k, v in asdict(cap).items()})
            if kernel:  # the program's own counts of its walk
                k = self.tracker.kernel
                out.update({f"kernel_{n}": v for n, v in k.items()})
                out["kernel_flows_evicted"] = self.tracker.flows_evicted  # the last walk's
                walk = {n: k.get(n, 0) for n in WALK_COUNTS}
            else:
                w = self.tracker.walk_totals()
                walk = {n: getattr(w, n) for n in WALK_COUNTS}
        out.update({f"walk_{n}": v for n, v in walk.items()})
        return out

    def sync(self) -> list[SyncRow]:
        """Each connection direction the wire shows: in sync or not, the bytes and
        seconds it was not, its desyncs, why it is not measurable (conns.py)."""
        now = self.clock() if self._kernel is None else time.monotonic()
        with self.lock:
            return list(self.tracker.sync_rows(now))

    def sync_summary(self) -> SyncSummary:
        """What a status shows of sync(): each state's count, the seconds out of sync,
        the first conns.LISTED rows (in the kernel: the last walk's, made by its thread)."""
        now = self.clock() if self._kernel is None else time.monotonic()
        with self.lock:
            return self.tracker.sync_summary(now)

    @property
    def running(self) -> bool:
        return self._down is None


def _per_resource(vmap: VolumeMap, per_volume: Mapping[Volume, int]) -> dict[str, int]:
    """Per configured resource, the sum over its volumes (the reads in flight)."""
    out: dict[str, int] = {}
    for v, n in per_volume.items():
        for name in vmap.resources_of(v):
            out[name] = out.get(name, 0) + n
    return out


def _initiator_views(
    vmap: VolumeMap, seen: Mapping[Volume, set[str]], logged_in: Mapping[str, Iterable[str]]
) -> dict[str, InitiatorView]:
    """Each initiator the wire saw use a volume: the resources of its volumes, written
    as the wire shows, and the names it logged in with."""
    initiators: dict[str, InitiatorView] = {}
    for v, addrs in seen.items():
        names = vmap.resources_of(v)
        for ip in addrs:
            view = initiators.get(ip)
            if view is None:
                view = initiators[ip] = InitiatorView(ip, set(logged_in.get(ip, ())))
            view.resources.update(names)
            view.write_sources.update(dict.fromkeys(names, WIRE))
    return initiators


def _utilization(
    vmap: VolumeMap, busy: Mapping[Volume, float], dt: float
) -> list[UtilizationSample]:
    """Per configured resource, the busiest of its volumes' busy share of dt (a
    sample of span dt: the controller weighs a late tick by its length)."""
    out = dict.fromkeys(vmap.patterns, 0.0)
    for v, s in busy.items():
        for name in vmap.resources_of(v):
            out[name] = max(out.get(name, 0.0), min(1.0, s / dt))
    return [UtilizationSample(name, u, dt) for name, u in out.items()]
