"""santhrottled: the loop that wires sensors, the controller and the actuator.

Cadences (paper 2.3): a fixed-rate controller tick (100 ms) and a 1 s
convergence. The tick is scheduled from the previous deadline, never from
the end of the work: a late tick runs once, the missed deadlines are logged
and counted (santhrottle_tick_overruns_total), never run back to back.

Per tick (main thread): read the per-resource samples (one /proc/diskstats
read), step() the controller with them and with the write samples the
convergence worker left, and send the changes of the initiators' classes to
the kernel (one netlink message each; a bulk restore past a threshold).
Per convergence (worker thread): discovery (LIO through rtslib-fb, nvmet,
sock_diag, LVM) and write rates. The worker may be slow (a large configfs
tree); the tick never waits for it and uses the last discovery it finished.
A failing sensor read is counted and logged; the controller holds.
The counters and raw I/O totals the metrics export are accumulated from
those samples (daemon/core/counters.py): per tick under the lock, per
convergence in the worker behind their own lock.

A [hosts.NAME] is one initiator to the controller: its addresses' write
samples are summed before step() and its class is every address's
(daemon/core/hosts.py).
With [fleet] (daemon/core/fleetmode.py), step() runs on this appliance's samples merged
with the other appliances' of the same array, and a resource another appliance
leads follows its published classes; the engine is talked to by the agent's own
thread (fleet/agent.py), never by the tick.
Pins (`santhrottle pin`) override the controller for their initiator.
Pause removes every delay but keeps measuring; resume re-applies.
Commands only change the daemon's state; the kernel is changed by the tick
(main thread) alone, within one tick: a single writer, and the netlink
sockets of a data path in another netns belong to the thread that made them.
Reload (SIGHUP, `santhrottle reload`) validates the new file first and
keeps the last good config when it is invalid.

Time and sleep are injected (clock, sleep), so the loop is tested in virtual
time with fake sensors and a fake actuator (tests/unit/test_daemon.py); the
real adapters are tested in the privileged and lab tiers.
"""

from __future__ import annotations

import gc
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from santhrottle.appliance.config import Config
from santhrottle.appliance.config.kinds import AUTO
from santhrottle.appliance.daemon.control import commands

# CommandError: what commands raise; importable from here as from commands
from santhrottle.appliance.daemon.control.commands import CommandError as CommandError
from santhrottle.appliance.daemon.core import grouping, reloading
from santhrottle.appliance.daemon.core.counters import Counters, WrittenBytes
from santhrottle.appliance.daemon.core.fleetmode import FleetMode
from santhrottle.appliance.daemon.core.group_overrides import GroupOverride
from santhrottle.appliance.daemon.core.hosts import HostMap
from santhrottle.appliance.daemon.core.restore import age_adopted, snapshot
from santhrottle.appliance.daemon.core.state import Saved, StateStore
from santhrottle.appliance.daemon.status import build as view
from santhrottle.controller.domain import (
    DeviceSample,
    IoSample,
    ReadSample,
    Resource,
    Samples,
    WriteSample,
)
from santhrottle.controller.restate import remove_resource, seed_class
from santhrottle.controller.state import ControllerState, new_state
from santhrottle.controller.step import step

log = logging.getLogger("santhrottled")


class Sensors(Protocol):
    def read_samples(self) -> list[ReadSample]: ...

    def device_samples(self) -> list[DeviceSample]: ...

    def converge(self) -> tuple[Any, list[WriteSample]]: ...


class Actuator(Protocol):
    def apply(self) -> Any: ...

    def set_classes(
        self, classes: Mapping[str, int], mode: str | None = None, *, ordered: bool = True
    ) -> int: ...

    def settle(self) -> int: ...

    def cleanup(self) -> Any: ...

    # descents through a glide leaf (in order) and without one (every leaf busy)
    @property
    def glided(self) -> int: ...

    @property
    def unordered_moves(self) -> int: ...


@dataclass
class ResourceView:
    last: ReadSample | None = None


@dataclass
class DaemonState:
    paused: bool = False
    pins: dict[str, tuple[int, str]] = field(default_factory=dict)  # ip -> (class, mode)
    thresholds: dict[str, float | str] = field(default_factory=dict)  # runtime overrides
    group_overrides: dict[str, GroupOverride] = field(default_factory=dict)  # `group set`
    applied: dict[str, tuple[int, str]] = field(default_factory=dict)  # ip -> (class, mode)
    # members a previous run left that no pin explains: held, then lowered (restore.py)
    adopted: dict[str, tuple[int, str]] = field(default_factory=dict)
    adopt_until: float | None = None
    discovery: Any = None
    pending_writes: list[WriteSample] = field(default_factory=list)
    pending_ios: list[IoSample] = field(default_factory=list)  # initiator groups (grouping.py)
    last_reads: dict[str, ReadSample] = field(default_factory=dict)


class Daemon:
    def __init__(
        self,
        config: Config,
        sensors: Sensors,
        actuator: Actuator,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        load_config: Callable[[str], Config] | None = None,
        notify: Callable[[str], None] | None = None,
        store: StateStore | None = None,
        fleet: FleetMode | None = None,
    ) -> None:
        self.config = config
        self.sensors = sensors
        self.actuator = actuator
        self.clock = clock
        self.sleep = sleep
        self._load_config = load_config
        self.notify = notify or (lambda _msg: None)
        self.lock = threading.RLock()
        self.state = DaemonState()
        self.counters = Counters()
        self.written = WrittenBytes()  # per (initiator, resource); the worker's, own lock
        self.ctl: ControllerState = new_state(config.controller, [])
        self._stop = threading.Event()
        self._next_tick: float | None = None
        self._next_converge: float | None = None
        self._resources_dirty = True  # a new discovery or config: reconcile at the next tick
        self._gc = GcFreezer()
        self.store = store  # None: nothing survives a restart (tests)
        self.seed_classes: dict[str, int] = {}  # resource -> class, from the last run
        self._saved: Saved | None = None  # what the store holds
        self._save_lock = threading.Lock()
        self.restart_pending: list[str] = []  # keys a reload could not change
        self._changes = 0  # commands that changed the state (status' cache key)
        self._status: tuple[tuple[int, ...], dict[str, Any]] | None = None
        self.group_map = grouping.build(config)  # GroupMapError: a host does not resolve
        self.hosts = HostMap.of(config.hosts)  # [hosts.NAME]: one initiator each (hosts.py)
        self.fleet = fleet  # [fleet]: merged samples, the leaders' classes (fleetmode.py)

    # ----------------------------------------------------------- resources
    def threshold_of(self, name: str) -> float | str | None:
        """The threshold asked for: seconds, "auto" (fitted), None (observed)."""
        return self.state.thresholds.get(name, self.config.threshold_of(name))

    def _controller_resource(self, name: str, thr: float | str) -> Resource:
        if thr == AUTO:  # the fallback until the fit is confident; inf observes
            fallback = self.config.fallback_of(name)
            return Resource(name, math.inf if fallback is None else fallback, auto=True)
        return Resource(name, float(thr))

    def known_resources(self) -> set[str]:
        d = self.state.discovery
        names = set(self.config.resources)
        if d is not None:
            names |= set(d.resources)
        return names

    def _reconcile_resources(self, member: grouping.Membership | None = None) -> None:
        """Controller resources = known resources that have a threshold or groups."""
        known = self.known_resources()
        want = {n: t for n in known if (t := self.threshold_of(n)) is not None}
        for n in grouping.grouped_of(self, known, member):
            want.setdefault(n, math.inf)  # its groups decide; its PID only observes
        changed: dict[str, int] = {}
        for name in list(self.ctl.resources):
            if name not in want:
                changed.update(remove_resource(self.ctl, name))
        for name, thr in want.items():
            self.ctl.set_resource(self._controller_resource(name, thr))
            if name in self.seed_classes:  # the last run's class: continue from it
                seed_class(self.ctl, name, self.seed_classes.pop(name))
        if changed:
            log.info("resources removed; %d initiator class(es) changed", len(changed))
        if self.fleet is not None:  # lead these when nobody does
            self.fleet.agent.want(self.ctl.resources)

    # ----------------------------------------------------------- the tick
    def converge_once(self) -> None:
        """Discovery + write rates (worker thread; may be slow)."""
        try:
            disc, writes = self.sensors.converge()
        except Exception as e:  # an adapter failure must not kill the worker
            with self.lock:
                self.counters.sensor_errors += 1
            log.warning("convergence: sensor error: %s", e)
            return
        live = {ip: v.resources for ip, v in disc.initiators.items()} if disc is not None else None
        self.written.add(writes, self.config.controller.converge_s, live)
        ios = grouping.io_samples(self.sensors, self.config.controller.converge_s)
        with self.lock:
            self.state.discovery = disc
            self.state.pending_writes.extend(self.hosts.fold_writes(writes))  # a host once
            self.state.pending_ios.extend(ios)
            self.counters.converges += 1
            self._resources_dirty = True
        self.save_state()  # the resource classes, once per convergence when they changed
        self._gc.after_convergence(self.sensors)

    def tick(self, now: float) -> None:
        t0 = self.clock()
        read_ok = True
        try:
            reads = self.sensors.read_samples()
            devices = self.sensors.device_samples()  # of the same pass
        except Exception as e:
            reads, devices, read_ok = [], [], False
            self.counters.sensor_errors += 1
            log.warning("tick: read samples failed: %s", e)
        with self.lock:
            if self._resources_dirty:  # once per discovery, not every 100 ms
                member = grouping.membership(self)  # who is in which group, once
                self._reconcile_resources(member)
                grouping.refresh(self, member)
                self._resources_dirty = False
            writes, self.state.pending_writes = self.state.pending_writes, []
            ios, self.state.pending_ios = self.state.pending_ios, []
            for r in reads:
                self.state.last_reads[r.resource] = r
            self.counters.add_reads(reads if read_ok else None, self.config.controller.tick_s)
            self.ctl.groups.applied = not self.state.paused  # paused: no delay is seen
            samples = Samples(reads, writes, devices, ios)
            if self.fleet is not None:
                samples = self.fleet.samples(self, samples, now)
            self.ctl, _ = step(self.ctl, samples, now)
            if self.fleet is not None:
                self.fleet.after_step(self)
            age_adopted(self, now)
            self._actuate()
            self.counters.record_tick(self.clock() - t0)
        self.notify("WATCHDOG=1")

    def desired(self) -> dict[str, tuple[int, str]]:
        """ip -> (class, mode) the kernel should have now."""
        if self.state.paused:
            return {}
        wmode = self.config.write_mode  # a host's addresses alike (daemon/core/hosts.py)
        eff = self.ctl.effective if self.fleet is None else self.fleet.effective(self.ctl.effective)
        out = {ip: (k, wmode) for ip, k in self.hosts.spread(eff).items()}
        for ip, (k, mode) in self.state.adopted.items():
            if out.get(ip, (0, mode))[0] < k:
                out[ip] = (k, mode)
        out.update({ip: pin for ip, pin in self.state.pins.items() if pin[0] > 0})
        return out

    def _actuate(self, ordered: bool = True) -> None:
        want = self.desired()
        have = self.state.applied
        by_mode: dict[str, dict[str, int]] = {}
        for ip, (k, mode) in want.items():
            if have.get(ip) != (k, mode):
                by_mode.setdefault(mode, {})[ip] = k
        for ip, (_k, mode) in have.items():
            if ip not in want:
                by_mode.setdefault(mode, {})[ip] = 0
        try:
            for mode, classes in by_mode.items():
                self.actuator.set_classes(classes, mode, ordered=ordered)
                for ip, k in classes.items():
                    if k:
                        have[ip] = (k, mode)
                    elif have.get(ip, (0, mode))[1] == mode:
                        have.pop(ip, None)
            # glide leaves whose older packets have left hand their members
            # to the shared classes (a no-op unless one is due)
            self.actuator.settle()
        except Exception as e:  # keep `applied` as far as it got; retried next tick
            self.counters.actuator_errors += 1
            log.error("actuator: %s", e)

    # ----------------------------------------------------------- the loop
    def run(self) -> None:
        """Fixed-rate loop until stop(); the convergence runs in a worker thread."""
        worker = threading.Thread(target=self._converge_loop, name="converge", daemon=True)
        if self.fleet is not None:
            self.fleet.agent.start()  # the engine's thread: the tick never waits for it
        self.converge_once()  # a first discovery before the first tick
        # A first tick off the schedule: it opens the netlink sockets and loads what the
        # tick needs (seconds under an emulated CPU), so the fixed rate starts after it
        # instead of counting it as the first late tick.
        self.tick(self.clock())
        self._next_tick = self.clock() + self.config.controller.tick_s
        worker.start()
        self.notify("READY=1")
        while not self._stop.is_set():
            self.run_once()
        worker.join(timeout=5.0)

    def run_once(self) -> None:
        """Sleep until the next deadline, then tick once (fixed rate, no bunching)."""
        tick = self.config.controller.tick_s
        now = self.clock()
        if self._next_tick is None:
            self._next_tick = now
        if now < self._next_tick:
            self.sleep(self._next_tick - now)
            now = self.clock()
            if now < self._next_tick:
                return
        missed = math.floor((now - self._next_tick) / tick + 1e-9)
        if missed:
            self.counters.tick_overruns += missed
            log.warning(
                "tick late by %.0f ms: %d tick(s) skipped", (now - self._next_tick) * 1e3, missed
            )
        self._next_tick += (missed + 1) * tick
        self.tick(now)

    def _converge_loop(self) -> None:
        nxt = self.clock() + self.config.controller.converge_s
        while not self._stop.wait(max(0.0, nxt - self.clock())):
            self.converge_once()
            period = self.config.controller.converge_s  # a reload may change it
            nxt += period
            now = self.clock()
            if nxt < now:  # slower than its period: start again from now
                nxt = now + period

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Remove every delay; the static state too unless configured to keep it."""
        if self.fleet is not None:  # leave first: another appliance leads at once
            self.fleet.agent.stop()
        with self.lock:
            self.state.paused = True
            self.state.pins.clear()
            # unordered: nobody would settle glide leaves after the stop
            self._actuate(ordered=False)
            if not self.config.keep_static_state:
                try:
                    self.actuator.cleanup()
                except Exception as e:
                    log.error("cleanup: %s", e)
        self.notify("STOPPING=1")

    # ------------------------------------------------------- commands
    def reload(self) -> dict[str, Any]:
        """Reload the config file (daemon/core/reloading.py); CommandError keeps the running one."""
        return reloading.reload(self)

    def handle(self, cmd: str, args: dict[str, Any]) -> Any:
        """One control-socket request (daemon/control/server.py); raises CommandError.
        What it changed is on disk before the answer (save_state)."""
        out = commands.handle(self, cmd, args)
        if cmd not in commands.READ_ONLY:
            with self.lock:
                self._changes += 1
            self.save_state()
        return out

    def save_state(self) -> None:
        """Write pause, pins, overrides and classes when they changed since the
        last write.  A failure is logged and counted, never raised: the daemon
        keeps controlling, and the next change tries again."""
        if self.store is None:
            return
        with self._save_lock:  # the file's own lock: the tick never waits for an fsync
            with self.lock:
                snap = snapshot(self)
            if snap == self._saved:
                return
            try:
                self.store.save(snap)
            except OSError as e:
                with self.lock:
                    self.counters.state_save_errors += 1
                log.error("cannot save the runtime state to %s: %s", self.store.path, e)
                return
            self._saved = snap

    def status(self) -> dict[str, Any]:
        """The daemon's whole view: resources, initiators, counters (daemon/status/build.py).
        Built once per tick, convergence or change (callers hold the lock and only
        read it): a burst of `santhrottle status` calls holds the tick up once, not
        once per call."""
        c = self.counters
        key = (c.ticks, c.converges, c.reloads, c.actuator_errors, self._changes)
        if self._status is None or self._status[0] != key:
            self._status = (key, view.status(self))
        return self._status[1]


class GcFreezer:
    """gc.freeze() after the sensors rebuilt their discovery (TargetSensor.discoveries).

    A discovery of 10,000 initiators is 10,000s of long-lived objects; every full
    cyclic collection walked them all, 20-30 ms with the GIL held (the sensing
    pass's max went from ~22 to 37-52 ms, make bench). Frozen, they are left to
    reference counting (nothing in a discovery is cyclic) and full collections
    only walk what is newer. Sensors without that counter: nothing to do."""

    def __init__(self) -> None:
        self.frozen_at: int | None = None

    def after_convergence(self, sensors: Any) -> None:
        n = getattr(sensors, "discoveries", None)
        if isinstance(n, int) and n != self.frozen_at:
            gc.freeze()
            self.frozen_at = n
