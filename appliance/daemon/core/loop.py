"""santhrottled: the loop that wires sensors, the controller and the actuator, and its public face.

Cadences (paper 2.3): a fixed-rate controller tick (100 ms) and a 1 s
convergence. The tick is scheduled from the previous deadline, never from
the end of the work: a late tick runs once, the missed deadlines are logged
and counted (santhrottle_tick_overruns_total), never run back to back.

Per tick (main thread): read the per-resource samples (one /proc/diskstats
read), decide() the controller with them and with the write samples the
convergence worker left, and send the changes of the initiators' classes to
the kernel (one netlink message each; a bulk restore past a threshold); once
a second (WATCHDOG_PING_S) the tick pings systemd's watchdog.
Per convergence (worker thread): discovery (LIO through rtslib-fb, nvmet,
sock_diag, LVM) and write rates. The worker may be slow (a large configfs
tree); the tick never waits for it and uses the last discovery it finished.
A failing sensor read is counted and logged; the controller holds.
The counters and raw I/O totals the metrics export are accumulated from
those samples (core/counters.py): per tick under the lock, per
convergence in the worker behind their own lock.

A [hosts.NAME] is one initiator to the controller: its addresses' write
samples are summed before decide() and its class is every address's
(core/hosts.py).
With [fleet] (core/fleetmode.py), decide() runs on this appliance's samples merged
with the other appliances' of the same array, and a resource another appliance
leads follows its published classes; the engine is talked to by the agent's own
thread (fleet/agent.py), never by the tick.

The public face
    What a command does is a method here, and nothing else changes the
    daemon's state: set_threshold / reset_threshold, pin / unpin, pause /
    resume, set_group / reset_group, reload, restore (at start).  Each takes
    the daemon's lock for its change, then saves the runtime state
    (core/state.py) before it returns, outside the lock (the tick never waits
    for an fsync): the control socket's commands (control/commands.py) and
    the fleet call them alike.  A refusal is CommandError, one line.
    The runtime state (pins, pause, overrides, adoption) is core/runtime.py's
    Runtime; what the kernel holds is the actuator's own record.  Readers
    (status/build.py) take the lock and read the public attributes: config,
    runtime, ctl, counters, discovery, last_reads, hosts, written, fleet,
    restart_pending, `revision` (what changed since a view was built).
Pins (`santhrottle pin`) override the controller for their initiator.
Pause removes every delay but keeps measuring; resume re-applies.
Commands only change the daemon's state; the kernel is changed by the tick
(main thread) alone, within one tick: a single writer, and the netlink
sockets of a data path in another netns belong to the thread that made them.
Reload (SIGHUP, `santhrottle reload`) validates the new file the way the start
does (the same loader) and keeps the last good config when it is invalid.

Time and sleep are injected (clock, sleep), so the loop is tested in virtual
time with fake sensors and a fake actuator (tests/unit/test_daemon.py); the
real adapters are tested in the privileged and lab tiers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from santhrottle.appliance.config import Config, ConfigError
from santhrottle.appliance.daemon.core import grouping, reloading, resources, why
from santhrottle.appliance.daemon.core.audit import Audit
from santhrottle.appliance.daemon.core.cadence import Cadence
from santhrottle.appliance.daemon.core.counters import Counters, WrittenBytes
from santhrottle.appliance.daemon.core.drift import DriftWatch
from santhrottle.appliance.daemon.core.errors import CommandError
from santhrottle.appliance.daemon.core.fleetmode import FleetMode
from santhrottle.appliance.daemon.core.gcwatch import GcFreezer
from santhrottle.appliance.daemon.core.group_overrides import GroupOverride, prune
from santhrottle.appliance.daemon.core.hosts import HostMap
from santhrottle.appliance.daemon.core.runtime import (
    ADOPT_HOLD_CONVERGES,
    Pin,
    Runtime,
    recent_classes,
)
from santhrottle.appliance.daemon.core.sensors import Actuator, BridgeSensors, Discovery, Sensors
from santhrottle.appliance.daemon.core.state import Saved, StateKeeper, StateStore
from santhrottle.controller.decide import decide
from santhrottle.controller.domain import ReadSample, Samples, WriteSample
from santhrottle.controller.restate import reconfigure
from santhrottle.controller.state import ControllerState, new_state

log = logging.getLogger("santhrottled")

__all__ = ["CommandError", "Daemon"]

# The tick pings systemd's watchdog (WatchdogSec=10s) at most this often: every tick
# (100 ms) was a socket, a connect and a send ten times a second for a 10 s watchdog.
WATCHDOG_PING_S = 1.0


class Watchdog:
    """systemd's watchdog, pinged from the tick at most once per WATCHDOG_PING_S: a hung
    tick stops the pings."""

    def __init__(self, notify: Callable[[str], None]) -> None:
        self.notify = notify
        self.pinged_s: float | None = None  # the last ping

    def ping(self, now: float) -> None:
        if self.pinged_s is None or now - self.pinged_s >= WATCHDOG_PING_S:
            self.pinged_s = now
            self.notify("WATCHDOG=1")


class Daemon:
    def __init__(
        self,
        config: Config,
        sensors: Sensors,
        actuator: Actuator,
        *,
        bridge: BridgeSensors | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        load_config: Callable[[str], Config] | None = None,
        notify: Callable[[str], None] | None = None,
        store: StateStore | None = None,
        fleet: FleetMode | None = None,
    ) -> None:
        self.config, self.sensors, self.actuator, self.clock = config, sensors, actuator, clock
        self.bridge = bridge  # bridge mode: the wire sensor's extension (the same object)
        self._load_config, self.notify = load_config, notify or (lambda _msg: None)
        self.lock = threading.RLock()
        self.runtime = Runtime()
        self._actuator_faults = 0  # exceptions out of the actuator (its refusals: its own)
        self.discovery: Discovery | None = None  # the last convergence's
        self.last_reads: dict[str, ReadSample] = {}  # resource -> the last tick's sample
        self._pending_writes: list[WriteSample] = []
        self._pending_ios = grouping.PendingIos()  # initiator groups and levels
        self.counters = Counters()
        self.written = WrittenBytes()  # per (initiator, resource); the worker's, own lock
        self.ctl: ControllerState = new_state(config.controller, [])
        self.cadence = Cadence(clock, sleep, lambda: self.config.controller)  # reloadable
        self._resources_dirty = True  # a new discovery or config: reconcile at the next tick
        self._gc = GcFreezer()
        self.watchdog = Watchdog(lambda msg: self.notify(msg))  # pinged by the tick
        self.drift, self.audit = DriftWatch(), Audit()  # core/drift.py, core/audit.py
        self.keeper = StateKeeper(store)  # no store: nothing survives a restart (tests)
        self.seed_classes: dict[str, int] = {}  # resource -> class, from the last run
        self.restart_pending: list[str] = []  # keys a reload could not change
        self._changes = 0  # changes made through the public methods (revision)
        self.group_map = grouping.build(config)  # GroupMapError: a host does not resolve
        self.hosts = HostMap.of(config.hosts)  # [hosts.NAME]: one initiator each (hosts.py)
        self.fleet = fleet  # [fleet]: merged samples, the leaders' classes (fleetmode.py)

    # ----------------------------------------------------------- resources
    def threshold_of(self, name: str) -> float | str | None:
        """The threshold asked for: seconds, "auto" (fitted), None (observed)."""
        return resources.threshold_of(self.config, self.runtime, name)

    def known_resources(self) -> set[str]:
        return resources.known(self.config, self.discovery)

    @property
    def revision(self) -> tuple[int, ...]:
        """What a view of the daemon is built from changed (status/build.py StatusCache)."""
        c = self.counters
        return (c.ticks, c.converges, c.reloads, c.actuator_errors, self._changes)

    def _placement(self) -> grouping.Placement:
        return grouping.placement(self.config, self.discovery, self.group_map, self.sensors)

    def _reconcile_resources(self, placement: grouping.Placement | None = None) -> None:
        """Controller resources = known resources that have a threshold or groups."""
        known = self.known_resources()
        group_of, loads = placement if placement is not None else self._placement()
        grouped = grouping.grouped_resources(self.config, known, group_of, loads)
        resources.reconcile(self.ctl, self.config, self.runtime, known, grouped, self.seed_classes)
        if self.fleet is not None:  # lead these when nobody does
            self.fleet.agent.want(self.ctl.resources)

    def _refresh_groups(self, placement: grouping.Placement | None = None) -> None:
        p = placement if placement is not None else self._placement()
        grouping.refresh(self.ctl, self.config, self.runtime.group_overrides, p, self.sensors)

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
        converge_s = self.config.controller.converge_s
        self.written.add(writes, converge_s, live)
        s = self.sensors
        with self.lock:
            self.discovery = disc
            self._pending_writes.extend(self.hosts.fold_writes(writes))  # a host once
            self._pending_ios.add(s.io_samples, s.io_span_s, converge_s)
            self.counters.converges += 1
            self._resources_dirty = True
        self.save_state()  # the resource classes, once per convergence when they changed
        self._gc.after_convergence(s.discoveries)
        if not self.cadence.stopping.is_set():  # stopping: no set dump under the cleanup
            self.drift.check(self.actuator, self.lock, self.clock())  # as the data path left it

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
                placement = self._placement()  # who is in which group, once
                self._reconcile_resources(placement)
                self._refresh_groups(placement)
                self._resources_dirty = False
            writes, self._pending_writes = self._pending_writes, []
            ios, batches = self._pending_ios.take()
            for r in reads:
                self.last_reads[r.resource] = r
            self.counters.add_reads(reads if read_ok else None, self.config.controller.tick_s)
            self.ctl.groups.applied = not self.runtime.paused  # paused: no delay is seen
            util = self.sensors.utilization_samples()
            samples = Samples(reads, writes, devices, ios, util, io_batches=batches)
            if self.fleet is not None:
                samples = self.fleet.samples(self, samples, now)
            self.ctl, out = decide(self.ctl, samples, now)
            why.released(self, out.futile, out.futile_refuted, now)  # controller/futile.py
            if self.fleet is not None:
                self.fleet.after_decide(self)
            self.runtime.age_adopted(
                now,
                self.config.controller.class_decrease_max_per_tick,
                lambda ip: self.ctl.effective.get(self.hosts.key(ip), 0),  # a host's: its key's
            )
            self.drift.repair(self.actuator, self.counters, now)  # what the last check found
            self._actuate()
            self.counters.record_tick(self.clock() - t0)
        self.watchdog.ping(now)

    def desired(self) -> dict[str, Pin]:
        """ip -> (class, mode) the kernel should have now: the controller's classes per
        address (a host's alike, core/hosts.py) under the runtime's (core/runtime.py)."""
        eff = self.ctl.effective if self.fleet is None else self.fleet.effective(self.ctl.effective)
        return self.runtime.desired(self.hosts.spread(eff), self.config.write_mode)

    def _actuate(self, ordered: bool = True) -> None:
        """The kernel to desired() (the data path diffs it against its record, quarantines
        what the kernel refuses: datapath/reconcile.py); glide leaves settled."""
        try:
            changed = self.actuator.reconcile(self.desired(), ordered=ordered)
            why.record(self, changed, self.clock())  # each change, why (core/audit.py)
            self.actuator.advance_glides()
        except Exception as e:  # a bug below: counted and logged, the next tick tries again
            self._actuator_faults += 1
            log.error("actuator: %s", e)
        self.counters.actuator_errors = self._actuator_faults + self.actuator.errors

    # ----------------------------------------------------------- the loop
    def run(self) -> None:
        """Ticks at a fixed rate until stop(); the convergence in its worker (cadence.py)."""
        if self.fleet is not None:
            self.fleet.agent.start()  # the engine's thread: the tick never waits for it
        self.cadence.run(self.tick, self.converge_once, self._overrun, self._ready)

    def run_once(self) -> None:
        """Sleep until the next deadline, then tick once."""
        self.cadence.run_once(self.tick, self._overrun)

    def _overrun(self, missed: int) -> None:
        self.counters.tick_overruns += missed

    def _ready(self) -> None:  # systemd: started
        self.notify("READY=1")

    def stop(self) -> None:
        self.cadence.stop()

    # ------------------------------------------------------- start and stop
    def restore(self, now: float, wall: float | None = None) -> Saved:
        """At start, after the data path is applied: the saved runtime state and the
        kernel's members (the actuator's record; core/runtime.py).  Returns what loaded."""
        saved = self.keeper.load(self.config.max_class)
        hold_s = ADOPT_HOLD_CONVERGES * self.config.controller.converge_s
        with self.lock:
            members = dict(self.actuator.members())
            self.runtime.restore(saved, members, self.config.groups, now, hold_s)
            self.seed_classes = recent_classes(saved, time.time() if wall is None else wall)
        return saved

    def shutdown(self) -> None:
        """Remove every delay; the static state too unless configured to keep it."""
        self.notify("STOPPING=1")  # systemd: the stop has begun (sd_notify(3))
        if self.fleet is not None:  # leave first: another appliance leads at once
            self.fleet.agent.stop()
        with self.lock:
            self.runtime.paused = True
            self.runtime.pins.clear()
            self._actuate(ordered=False)  # unordered: no glide leaf advances after the stop
            if not self.config.keep_static_state:
                try:
                    log.info("cleanup: %s", self.actuator.cleanup().summary())
                except Exception as e:
                    log.error("cleanup: %s", e)

    # ------------------------------------------------------- the public face
    def set_threshold(self, resource: str, threshold_s: float | str) -> None:
        """A runtime threshold (seconds or "auto") over the file's; `resource` is known."""
        with self.lock:
            self.runtime.thresholds[resource] = threshold_s
            self._reconcile_resources()
        self._changed()

    def reset_threshold(self, resource: str) -> float | str | None:
        """The file's threshold again; returns the override removed (None: none)."""
        with self.lock:
            removed = self.runtime.thresholds.pop(resource, None)
            self._reconcile_resources()
        self._changed()
        return removed

    def pin(self, initiator: str, klass: int, mode: str) -> None:
        """Hold a checked address at klass in mode (0: never delayed), whatever the
        controller says; the next tick applies it.  CommandError past MAX_PINS."""
        with self.lock:
            self.runtime.pin(initiator, klass, mode)
        self._changed()

    def unpin(self, initiator: str) -> None:
        """The controller decides again; CommandError when it is not pinned."""
        with self.lock:
            self.runtime.unpin(initiator)
        self._changed()

    def set_paused(self, paused: bool) -> None:
        """Pause: every delay off at the next tick, measuring goes on; or resume."""
        with self.lock:
            self.runtime.paused = paused
        self._changed()

    def set_group(self, group: str, override: GroupOverride) -> None:
        """A runtime override of a configured group's targets or priority, merged over
        an earlier one; the controller has it before this returns."""
        with self.lock:
            self.runtime.set_group(group, override)
            self._refresh_groups()
        self._changed()

    def reset_group(self, group: str) -> GroupOverride | None:
        """The file's values again; returns the override removed (None: none)."""
        with self.lock:
            removed = self.runtime.group_overrides.pop(group, None)
            self._refresh_groups()
        self._changed()
        return removed

    def reload(self) -> list[str]:
        """Read and check the config file the way the start does (outside the lock);
        a bad one is CommandError and the running config stays.  A good one takes
        effect at once but for the restart keys (config/schema.py, Key.restart),
        which keep their running values: returns those (status' restart_needed)."""
        if self._load_config is None:
            raise CommandError("this daemon was started without a config file")
        try:
            got = reloading.read(self._load_config, self.config.path)
        except ConfigError as e:
            with self.lock:
                self.counters.reload_failures += 1
            raise CommandError(f"reload refused, keeping the running config: {e}") from None
        with self.lock:
            self.group_map, self.hosts, old = got.group_map, got.hosts, self.config
            self.restart_pending = got.config.restart_changes(old)
            self.config = got.config.keeping_restart_keys_of(old)
            prune(self.runtime.group_overrides, self.config.groups, "reload")  # logged
            if self.config.controller != old.controller:
                self.ctl = reconfigure(self.ctl, self.config.controller)
            if self.bridge is not None:
                self.bridge.reconfigure(self.config.volumes())  # the resources' volumes
            self._resources_dirty = True
            self.counters.reloads += 1
            pending = list(self.restart_pending)
        reloading.log_reloaded(got.config.path, pending)
        self._changed()
        return pending

    def _changed(self) -> None:
        """After a public method's change (the lock released): a new revision, and the
        runtime state on disk before the caller answers."""
        with self.lock:
            self._changes += 1
        self.save_state()

    def save_state(self) -> None:
        """Write pause, pins, overrides and classes when they changed since the last
        write (core/state.py StateKeeper).  A failure is logged and counted, never
        raised: the daemon keeps controlling, and the next change tries again.  Never
        called with the daemon's lock held."""
        if not self.keeper.save(self._snapshot):
            with self.lock:
                self.counters.state_save_errors += 1

    def _snapshot(self) -> Saved:
        with self.lock:
            return self.runtime.snapshot({n: r.delay_class for n, r in self.ctl.resources.items()})
