"""The daemon loop in virtual time, with fake sensors and a fake actuator.

The fakes implement the same methods as TargetSensor and Datapath (the
Sensors / Actuator protocols); the real ones are tested in the privileged
and lab tiers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from santhrottle.appliance.config import ConfigError, parse_config
from santhrottle.appliance.daemon.core.loop import CommandError, Daemon
from santhrottle.controller.domain import DeviceSample, ReadSample, WriteSample

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


class FakeSensors:
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

    def converge(self):
        d = FakeDiscovery(
            {"vg0": ("dm-0",), "vg1": ("dm-1",)},
            {ip: View({r}) for ip, r in self.writers.items()},
        )
        return d, [WriteSample(r, ip, self.write_bps) for ip, r in self.writers.items()]


@dataclass
class FakeActuator:
    kernel: dict[str, tuple[int, str]] = field(default_factory=dict)
    calls: int = 0
    settles: int = 0
    unordered: int = 0  # calls with ordered=False
    fail: bool = False
    cleaned: bool = False
    glided: int = 0
    unordered_moves: int = 0

    def apply(self):
        return None

    def set_classes(self, classes, mode=None, *, ordered=True):
        if self.fail:
            raise OSError("netlink: busy")
        self.calls += 1
        self.unordered += not ordered
        for ip, k in classes.items():
            if k:
                self.kernel[ip] = (k, mode)
            else:
                self.kernel.pop(ip, None)
        return len(classes)

    def settle(self):
        self.settles += 1
        return 0

    def cleanup(self):
        self.cleaned = True
        self.kernel.clear()


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
    sensors, act = FakeSensors(), FakeActuator()
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
    assert d._next_tick == pytest.approx(start + 5.0)
    assert d.counters.tick_overruns == 0


def test_every_tick_settles_the_glide_leaves_once_after_its_changes():
    d, vt, _s, act = make()
    run_for(d, vt, 1.0)
    assert d.counters.ticks > 5 and act.settles == d.counters.ticks  # also when nothing changed


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
    st = d.status()
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
    act.fail = False
    d.run_once()
    assert act.kernel


def test_pause_resume_pin_unpin():
    d, vt, _s, act = make()
    run_for(d, vt, 2.0)
    assert act.kernel
    assert d.handle("pause", {}) == {"paused": True}
    d.run_once()  # the kernel is changed by the next tick
    assert act.kernel == {}
    run_for(d, vt, 1.0)
    assert act.kernel == {}  # measured, not throttled
    assert d.counters.ticks > 20
    d.handle("resume", {})
    d.run_once()
    assert act.kernel
    d.handle("pin", {"initiator": "10.0.0.9", "class": 10, "mode": "read"})
    d.run_once()
    assert act.kernel["10.0.0.9"] == (10, "read")
    d.handle("unpin", {"initiator": "10.0.0.9"})
    d.run_once()
    assert "10.0.0.9" not in act.kernel
    with pytest.raises(CommandError, match="not pinned"):
        d.handle("unpin", {"initiator": "10.0.0.9"})
    with pytest.raises(CommandError, match="class"):
        d.handle("pin", {"initiator": "10.0.0.9", "class": 10_000, "mode": "all"})


def test_threshold_set_takes_effect_next_tick_and_rejects_unknown():
    d, vt, s, act = make()
    s.latency_s = 0.015
    run_for(d, vt, 1.0)
    assert act.kernel  # 15 ms > 10 ms threshold
    d.handle("threshold_set", {"resource": "vg0", "threshold_s": 0.050})
    assert d.ctl.resources["vg0"].resource.threshold_s == 0.050
    with pytest.raises(CommandError, match="unknown resource 'nope'"):
        d.handle("threshold_set", {"resource": "nope", "threshold_s": 0.01})
    with pytest.raises(CommandError, match="threshold"):
        d.handle("threshold_set", {"resource": "vg0", "threshold_s": -1})
    # vg1 was observe-only: a threshold puts it under control at once
    d.handle("threshold_set", {"resource": "vg1", "threshold_s": 0.02})
    assert "vg1" in d.ctl.resources


def test_reload_keeps_last_good_config(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(CONF)
    from santhrottle.appliance.config import load_config

    d, _vt, _s, _a = make(load_config=load_config)
    d.config = load_config(f)
    f.write_text(CONF.replace('"10ms"', '"10"'))
    with pytest.raises(CommandError, match=r"s.toml:7: resources.vg0.threshold"):
        d.handle("reload", {})
    assert d.config.threshold_of("vg0") == 0.010 and d.counters.reload_failures == 1
    f.write_text(CONF.replace('"10ms"', '"25ms"'))
    d.handle("reload", {})
    assert d.config.threshold_of("vg0") == 0.025
    # a key that needs a restart: the rest takes effect, that one is named and kept
    f.write_text(CONF.replace('"eth1"', '"eth2"').replace('"10ms"', '"30ms"'))
    out = d.handle("reload", {})
    assert out["restart_needed"] == ["datapath.devices"]
    assert d.config.devices == ("eth1",) and d.config.threshold_of("vg0") == 0.030
    assert d.status()["restart_needed"] == ["datapath.devices"]
    f.write_text(CONF.replace('"10ms"', '"30ms"'))  # back as it runs: nothing pending
    assert d.handle("reload", {})["restart_needed"] == []


def test_shutdown_removes_every_delay_and_the_static_state():
    d, vt, _s, act = make()
    run_for(d, vt, 2.0)
    d.handle("pin", {"initiator": "10.0.0.9", "class": 3, "mode": "all"})
    d.shutdown()
    assert act.kernel == {} and act.cleaned
    d2, vt2, _s2, act2 = make(CONF + "[daemon]\nkeep_static_state = true\n")
    run_for(d2, vt2, 2.0)
    unordered = act2.unordered
    d2.shutdown()
    assert act2.kernel == {} and not act2.cleaned
    # the stop releases directly: no glide leaf would be settled after it
    assert act2.unordered == unordered + 1


def test_unknown_command():
    d, _vt, _s, _a = make()
    with pytest.raises(CommandError, match="unknown command"):
        d.handle("frobnicate", {})


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
    import types

    from santhrottle.appliance.daemon.core.loop import GcFreezer

    sensors = types.SimpleNamespace(discoveries=1)
    f = GcFreezer()
    try:
        f.after_convergence(sensors)
        frozen = gc.get_freeze_count()
        assert frozen > 0
        keep = [[i] for i in range(1000)]  # new tracked objects
        f.after_convergence(sensors)  # the same discovery: no freeze
        assert gc.get_freeze_count() == frozen
        sensors.discoveries = 2
        f.after_convergence(sensors)
        assert gc.get_freeze_count() >= frozen + len(keep)
        f.after_convergence(types.SimpleNamespace())  # a sensor without the counter
        assert f.frozen_at == 2
    finally:
        gc.unfreeze()
