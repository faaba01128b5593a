"""The daemon loop in virtual time, with fake sensors and a fake actuator.

The fakes implement the same methods as TargetSensor and Datapath (the
Sensors / Actuator protocols); the real ones are tested in the privileged
and lab tiers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pytest

from santhrottle.appliance.config import ConfigError, parse_config
from santhrottle.appliance.daemon.control.commands import Commands
from santhrottle.appliance.daemon.core.loop import CommandError, Daemon
from santhrottle.appliance.daemon.status.build import status
from santhrottle.appliance.daemon.status.views import to_json
from santhrottle.appliance.datapath.cleanup import CleanupReport
from santhrottle.appliance.datapath.names import DatapathError
from santhrottle.appliance.datapath.reconcile import Reconciler
from santhrottle.controller.domain import (
    DeviceSample,
    IoSample,
    ReadSample,
    UtilizationSample,
    WriteSample,
)

MIB = 1024 * 1024
CONF = """
[datapath]
devices = ["eth1"]
[controller]
class_hysteresis = 0
[resources.vg0]
threshold = "10ms"
"""


@dataclass
class View:
    resources: set[str]


@dataclass
class FakeDiscovery:
    resources: dict[str, tuple[str, ...]]
    initiators: dict[str, View]


def handle(d: Daemon, cmd: str, args: dict[str, Any]) -> Any:
    """One control-socket command, as the server dispatches it (control/commands.py)."""
    return Commands(d).handle(cmd, args)


def status_of(d: Daemon) -> Any:
    """`santhrottle status --json`'s data: the status view as the socket sends it."""
    with d.lock:
        return to_json(status(d))


class NoGroupSensing:
    """The part of the Sensors protocol (daemon/core/sensors.py) a fake without
    initiator groups, login names or utilization has: nothing."""

    io_samples: list[IoSample] = []  # noqa: RUF012 (never changed in place)
    io_span_s: float | None = None
    discoveries = 0

    def initiator_names(self) -> dict[str, tuple[str, ...]]:
        return {}

    def want_io_samples(self, resources) -> None:
        pass

    def utilization_samples(self) -> list[UtilizationSample]:
        return []  # not measured

    def close(self) -> None:
        pass


class FakeSensors(NoGroupSensing):
    def __init__(self) -> None:
        self.latency_s = 0.030
        self.write_bps = 20 * MIB
        self.fail_reads = False
        self.writers = {"10.0.0.3": "vg0"}

    def read_samples(self) -> list[ReadSample]:
        if self.fail_reads:
            raise OSError("diskstats: gone")
        return [ReadSample("vg0", 6, self.latency_s, self.write_bps)]

    def device_samples(self) -> list[DeviceSample]:
        """The devices as an LQ line L = 2 ms + 3 ms x Q would show them."""
        q = max(0.0, (self.latency_s - 0.002) / 0.003)
        return [DeviceSample("vg0", 60, self.latency_s, q)]

    def utilization_samples(self) -> list[UtilizationSample]:
        """As the LQ line would be busy: 1 - C / L."""
        return [UtilizationSample("vg0", max(0.0, 1.0 - 0.002 / self.latency_s))]

    def converge(self):
        d = FakeDiscovery(
            {"vg0": ("dm-0",), "vg1": ("dm-1",)},
            {ip: View({r}) for ip, r in self.writers.items()},
        )
        return d, [WriteSample(r, ip, self.write_bps) for ip, r in self.writers.items()]


class FakeActuator:
    """The Actuator protocol over a dict for the kernel: the real Reconciler
    (datapath/reconcile.py: the record, the diff, the quarantine) sends to it."""

    def __init__(self, clock=lambda: 0.0) -> None:
        self._kernel: dict[str, tuple[int, str]] = {}
        self.calls = 0
        self.advances = 0
        self.unordered = 0  # calls with ordered=False
        self.fail = False  # every change refused
        self.refuse: set[str] = set()  # these initiators refused
        self.cleaned = False
        self.repairs = 0
        self.glided = 0
        self.unordered_moves = 0
        self.reconciler = Reconciler(self._send, lambda: self.clock())
        self.clock = clock

    @property
    def kernel(self) -> dict[str, tuple[int, str]]:
        return self._kernel

    @kernel.setter
    def kernel(self, members: dict[str, tuple[int, str]]) -> None:
        """What a previous run left: the kernel, read back as a start does."""
        self._kernel = members
        self.reconciler.adopt(members)

    def apply(self):
        return None

    def set_classes(self, classes, mode=None, *, ordered=True):
        return self._send(classes, mode, ordered)

    def _send(self, classes, mode, ordered):
        if self.fail:
            raise OSError("netlink: busy")
        bad = self.refuse & set(classes)
        if bad:
            raise DatapathError(f"ipset add {min(bad)}: refused")
        self.calls += 1
        self.unordered += not ordered
        for ip, k in classes.items():
            if k:
                self._kernel[ip] = (k, mode)
            else:
                self._kernel.pop(ip, None)
        return len(classes)

    def reconcile(self, want, *, ordered=True):
        return self.reconciler.reconcile(want, ordered)

    def members(self):
        return self.reconciler.members()

    def quarantined(self):
        return self.reconciler.quarantine

    @property
    def errors(self) -> int:
        return self.reconciler.errors

    @property
    def quarantines(self):
        return self.reconciler.quarantined_total

    def advance_glides(self):
        self.advances += 1
        return 0

    # drift: the fake kernel (a dict someone may change) against the record
    def expected(self):
        return dict(self.reconciler.targets)

    def missing(self, expected):  # the presence read: who is there, not in which class
        if set(self._kernel) != set(expected):
            return [f"members: {len(self._kernel)} in the kernel, {len(expected)} left"]
        return []

    def drift(self, expected):
        return [
            f"member {ip}: {self._kernel.get(ip)} in the kernel, {km} left"
            for ip, km in sorted(expected.items())
            if self._kernel.get(ip) != km
        ]

    def repair(self):
        self.repairs += 1
        self.reconciler.adopt(self._kernel)  # what apply() does: read the members back
        return 1

    def cleanup(self):
        self.cleaned = True
        self._kernel.clear()
        return CleanupReport(qdiscs=["st0"])


class VirtualTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def make(conf: str = CONF, **kw):
    vt = VirtualTime()
    sensors, act = FakeSensors(), FakeActuator(lambda: vt.now)
    d = Daemon(parse_config(conf, "t.toml"), sensors, act, clock=vt.clock, sleep=vt.sleep, **kw)
    return d, vt, sensors, act


def run_for(d: Daemon, vt: VirtualTime, seconds: float, converge_every_s: float = 1.0) -> None:
    end = vt.now + seconds
    next_conv = vt.now
    while vt.now < end:
        if vt.now >= next_conv:
            d.converge_once()
            next_conv += converge_every_s
        d.run_once()


def test_fixed_rate_ticks_without_drift():
    d, vt, _s, _a = make()
    start = vt.now
    for _ in range(50):
        d.run_once()
        vt.now += 0.013  # the work of a tick takes 13 ms
    # 50 ticks at 100 ms from the first deadline; sleeps absorb the work time
    assert d.counters.ticks == 50
    assert d.cadence.next_tick == pytest.approx(start + 5.0)
    assert d.counters.tick_overruns == 0


def test_every_tick_advances_the_glide_leaves_once_after_its_changes():
    d, vt, _s, act = make()
    run_for(d, vt, 1.0)
    assert d.counters.ticks > 5 and act.advances == d.counters.ticks  # also when nothing changed


def test_late_tick_counted_not_bunched():
    d, vt, _s, _a = make()
    d.run_once()
    vt.now += 0.35  # a stall: the +0.1 tick runs late, +0.2 and +0.3 are skipped
    d.run_once()
    assert d.counters.ticks == 2 and d.counters.tick_overruns == 2
    d.run_once()  # next deadline on the grid, after a sleep
    assert d.counters.ticks == 3 and vt.slept[-1] == pytest.approx(0.05)


def test_throttles_writer_then_releases_when_latency_is_low():
    d, vt, s, act = make()
    run_for(d, vt, 3.0)
    assert act.kernel["10.0.0.3"][0] > 0 and act.kernel["10.0.0.3"][1] == "all"
    st = status_of(d)
    (vg0,) = [r for r in st["resources"] if r["resource"] == "vg0"]
    assert vg0["mode"] == "control" and vg0["members"] == ["10.0.0.3"]
    (vg1,) = [r for r in st["resources"] if r["resource"] == "vg1"]
    assert vg1["mode"] == "observe"  # discovered, no threshold
    s.latency_s = 0.002
    cls = act.kernel["10.0.0.3"][0]
    seen = []
    while "10.0.0.3" in act.kernel and len(seen) < 200:  # down one class per tick
        run_for(d, vt, 0.1)
        seen.append(act.kernel.get("10.0.0.3", (0,))[0])
    assert seen[-1] == 0 and all(a - b <= 1 for a, b in zip([cls, *seen], seen, strict=False))


def test_failing_sensor_counts_and_holds():
    d, vt, s, act = make()
    run_for(d, vt, 2.0)
    before = dict(act.kernel)
    s.fail_reads = True
    run_for(d, vt, 1.0)
    assert d.counters.sensor_errors >= 9
    assert act.kernel == before  # held, not released and not crashed


def test_actuator_failure_is_retried():
    d, vt, _s, act = make()
    act.fail = True
    run_for(d, vt, 1.0)
    assert d.counters.actuator_errors > 0 and not act.kernel
    errors = d.counters.actuator_errors
    act.fail = False
    run_for(d, vt, 0.5)  # quarantined: retried with backoff (datapath/reconcile.py), not every tick
    assert d.counters.actuator_errors <= errors + 1
    run_for(d, vt, 4.0)
    assert act.kernel and act.quarantined() == {}


def test_pause_resume_pin_unpin():
    d, vt, _s, act = make()
    run_for(d, vt, 2.0)
    assert act.kernel
    assert handle(d, "pause", {}) == {"paused": True}
    d.run_once()  # the kernel is changed by the next tick
    assert act.kernel == {}
    run_for(d, vt, 1.0)
    assert act.kernel == {}  # measured, not throttled
    assert d.counters.ticks > 20
    handle(d, "resume", {})
    d.run_once()
    assert act.kernel
    handle(d, "pin", {"initiator": "10.0.0.9", "class": 10, "mode": "read"})
    d.run_once()
    assert act.kernel["10.0.0.9"] == (10, "read")
    handle(d, "unpin", {"initiator": "10.0.0.9"})
    d.run_once()
    assert "10.0.0.9" not in act.kernel
    with pytest.raises(CommandError, match="not pinned"):
        handle(d, "unpin", {"initiator": "10.0.0.9"})
    with pytest.raises(CommandError, match="class"):
        handle(d, "pin", {"initiator": "10.0.0.9", "class": 10_000, "mode": "all"})


def test_threshold_set_takes_effect_next_tick_and_rejects_unknown():
    d, vt, s, act = make()
    s.latency_s = 0.015
    run_for(d, vt, 1.0)
    assert act.kernel  # 15 ms > 10 ms threshold
    handle(d, "threshold_set", {"resource": "vg0", "threshold_s": 0.050})
    assert d.ctl.resources["vg0"].resource.threshold_s == 0.050
    with pytest.raises(CommandError, match="unknown resource 'nope'"):
        handle(d, "threshold_set", {"resource": "nope", "threshold_s": 0.01})
    with pytest.raises(CommandError, match="threshold"):
        handle(d, "threshold_set", {"resource": "vg0", "threshold_s": -1})
    # vg1 was observe-only: a threshold puts it under control at once
    handle(d, "threshold_set", {"resource": "vg1", "threshold_s": 0.02})
    assert "vg1" in d.ctl.resources


def test_reload_keeps_last_good_config(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(CONF)
    from santhrottle.appliance.config import load_config

    d, _vt, _s, _a = make(load_config=load_config)
    d.config = load_config(f)
    f.write_text(CONF.replace('"10ms"', '"10"'))
    with pytest.raises(CommandError, match=r"s.toml:7: resources.vg0.threshold"):
        handle(d, "reload", {})
    assert d.config.threshold_of("vg0") == 0.010 and d.counters.reload_failures == 1
    f.write_text(CONF.replace('"10ms"', '"25ms"'))
    handle(d, "reload", {})
    assert d.config.threshold_of("vg0") == 0.025
    # a key that needs a restart: the rest takes effect, that one is named and kept
    f.write_text(CONF.replace('"eth1"', '"eth2"').replace('"10ms"', '"30ms"'))
    out = handle(d, "reload", {})
    assert out["restart_needed"] == ["datapath.devices"]
    assert d.config.devices == ("eth1",) and d.config.threshold_of("vg0") == 0.030
    assert status_of(d)["restart_needed"] == ["datapath.devices"]
    f.write_text(CONF.replace('"10ms"', '"30ms"'))  # back as it runs: nothing pending
    assert handle(d, "reload", {})["restart_needed"] == []


def test_shutdown_removes_every_delay_and_the_static_state(caplog):
    d, vt, _s, act = make()
    run_for(d, vt, 2.0)
    handle(d, "pin", {"initiator": "10.0.0.9", "class": 3, "mode": "all"})
    with caplog.at_level(logging.INFO, logger="santhrottled"):
        d.shutdown()
    assert act.kernel == {} and act.cleaned
    assert "cleanup: removed root qdisc 5374: on st0" in caplog.text  # what the stop removed
    d2, vt2, _s2, act2 = make(CONF + "[daemon]\nkeep_static_state = true\n")
    run_for(d2, vt2, 2.0)
    unordered = act2.unordered
    d2.shutdown()
    assert act2.kernel == {} and not act2.cleaned
    # the stop releases directly: no glide leaf would be settled after it
    assert act2.unordered == unordered + 1


def test_systemd_hears_the_stop_begin_before_the_delays_are_removed():
    """STOPPING=1 (sd_notify(3): the service is beginning its shutdown) comes first."""
    said: list[str] = []
    d, vt, _s, act = make(notify=said.append)
    run_for(d, vt, 2.0)
    seen: list[str] = []
    real_reconcile = act.reconcile
    act.reconcile = lambda *a, **kw: (seen.append(said[-1]), real_reconcile(*a, **kw))[1]
    d.shutdown()
    assert seen == ["STOPPING=1"] and said[-1] == "STOPPING=1" and act.cleaned


def test_unknown_command():
    d, _vt, _s, _a = make()
    with pytest.raises(CommandError, match="unknown command"):
        handle(d, "frobnicate", {})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('threshold = "10ms"', 'threshold = "10"'), "t.toml:7: resources.vg0.threshold"),
        (('threshold = "10ms"', "threshold = 10"), "resources.vg0.threshold: 10 is not a duration"),
        (('threshold = "10ms"', 'threshold = "-3ms"'), "is not a duration"),
        (
            ("[datapath]", '[datapath]\nwrite_mode = "fast"'),
            "datapath.write_mode: 'fast' must be one of all, ack",
        ),
        (("[controller]", '[controller]\nti = "0s"'), "controller.ti: '0s' must be above 0"),
        (
            ("[controller]", "[controller]\nclass_increase_max_ratio_per_tick = 0.9"),
            "controller.class_increase_max_ratio_per_tick: must be 0 (no limit) or >= 1",
        ),
        (
            ("[controller]", "[controller]\nclass_increase_min_per_tick = 0"),
            "controller.class_increase_min_per_tick",
        ),
        (("[controller]", "[tuning]"), "tuning: unknown table"),
    ],
)
def test_config_errors_name_key_and_line(edit, message):
    with pytest.raises(ConfigError) as e:
        parse_config(CONF.replace(*edit), "t.toml")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_gc_freezer_freezes_once_per_rebuilt_discovery():
    import gc

    from santhrottle.appliance.daemon.core.gcwatch import GcFreezer

    f = GcFreezer()
    try:
        f.after_convergence(1)
        frozen = gc.get_freeze_count()
        assert frozen > 0
        keep = [[i] for i in range(1000)]  # new tracked objects
        f.after_convergence(1)  # the same discovery: no freeze
        assert gc.get_freeze_count() == frozen
        f.after_convergence(2)
        assert gc.get_freeze_count() >= frozen + len(keep)
        assert f.frozen_at == 2
    finally:
        gc.unfreeze()


def test_run_tells_systemd_ready_after_a_first_convergence_and_tick_then_stops():
    told: list[str] = []
    d, _vt, _s, act = make()

    def notify(msg: str) -> None:
        told.append(msg)
        if d.counters.ticks >= 5:
            d.stop()

    d.notify = notify
    d.run()  # the worker thread waits on a real event: stop() ends it at once
    assert told[1] == "READY=1" and told[0] == "WATCHDOG=1"
    assert d.counters.converges >= 1 and d.counters.ticks >= 5 and act.kernel


def test_the_watchdog_is_pinged_once_a_second_not_every_tick():
    """Before, every tick (100 ms) pinged systemd's watchdog (WatchdogSec=10s): a socket,
    a connect and a send ten times a second for nothing."""
    d, vt, _s, _a = make()
    told = []
    d.notify = told.append
    run_for(d, vt, 5.0)
    assert d.counters.ticks >= 45
    assert 5 <= told.count("WATCHDOG=1") <= 6


def test_a_stopping_daemon_converges_without_reading_the_kernel():
    """The convergence worker may outlive the loop's wait for it by a moment: once the
    daemon stops it leaves the drift check out (its dumps would hold a set the
    shutdown's cleanup destroys busy)."""
    d, vt, _s, act = make()
    run_for(d, vt, 2.0)
    reads = []
    act.missing = lambda expected: reads.append("missing") or []
    act.drift = lambda expected: reads.append("drift") or []
    d.drift._next_s = None  # the full check due at the next convergence
    d.stop()
    d.converge_once()
    assert reads == [] and d.counters.converges >= 3
    d.cadence.stopping.clear()  # running again: the same convergence reads
    d.converge_once()
    assert reads == ["drift"]
