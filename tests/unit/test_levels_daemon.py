"""Levels and utilization in the daemon (virtual time, the unit tests' fake sensors): the
groups' levels reach the controller, `status` shows them, the metrics export them."""

from santhrottle.appliance.cli.statusview import print_status
from santhrottle.appliance.daemon.core.metering import Metering
from santhrottle.appliance.daemon.status.build import StatusCache, status
from santhrottle.appliance.daemon.status.metrics import registry_for
from santhrottle.appliance.daemon.status.tenancy import MeterCollector
from santhrottle.appliance.daemon.status.views import to_json
from santhrottle.controller.domain import IoSample
from tests.unit.test_daemon import CONF, make, run_for
from tests.unit.test_daemon_groups import GroupSensors

LEVELS = CONF + '[groups.gold]\nmembers = ["10.0.0.3"]\niops_levels = [100, 200, 400]\n'


class LevelSensors(GroupSensors):
    """The writer 10.0.0.3's IoSamples: a closed stream of depth 9 at 20 ms, delayed by
    the class its daemon applies (450 IOPS undelayed)."""

    def __init__(self, inner, daemon) -> None:
        super().__init__(inner)
        self.d = daemon

    def converge(self):
        out = self.inner.converge()
        lat = 0.020
        k = self.d.ctl.effective.get("10.0.0.3", 0)
        x = 9 / (lat + self.d.config.ladder.delay_s(k))
        self.io_samples = [IoSample("vg0", "10.0.0.3", x, 131072 * x, 0.0, None, lat)]
        return out


def _daemon():
    d, vt, s, _act = make(LEVELS)
    d.sensors = LevelSensors(s, d)
    s.latency_s = 0.008
    run_for(d, vt, 12.0)
    return d


def test_a_group_with_levels_climbs_to_its_top_and_is_capped_there(capsys):
    d = _daemon()
    assert d.ctl.grouped == frozenset()  # levels alone: vg0 keeps its threshold
    (row,) = status(d).levels
    assert row.group == "gold" and row.level == 2 and row.promotions == 2
    assert 0.9 * 400 <= row.rate <= 400 + 1e-6  # capped by its delay: 9 / (20 ms + d)
    assert row.delay_class > 0 and row.headroom
    print_status(to_json(status(d)))
    out = capsys.readouterr().out
    assert "UTIL" in out and " 75% " in out  # the LQ line's 1 - C / L at 8 ms
    assert "gold             iops                 2        400" in out


def test_levels_and_utilization_are_exported_and_the_meter_counts():
    d = _daemon()
    m = Metering(d)
    reg = registry_for(StatusCache(d), meter=MeterCollector(m, d.lock))
    got = {(m.name, tuple(sorted(s.labels.items()))): s.value for m in reg.collect()
           for s in m.samples}  # fmt: skip
    assert got[("santhrottle_group_level", (("group", "gold"), ("levels", "iops")))] == 2.0
    assert got[("santhrottle_resource_utilization_ratio", (("resource", "vg0"),))] == 0.75
    m.once()  # the meter samples: the levels' seconds since
    d.converge_once()
    m.once()
    reg = registry_for(StatusCache(d), meter=MeterCollector(m, d.lock))
    seconds = [s for m in reg.collect() if m.name == "santhrottle_group_level_seconds"
               for s in m.samples if s.name.endswith("_total")]  # fmt: skip
    assert seconds and all(s.labels["group"] == "gold" for s in seconds)


def levels_registry():
    """A daemon with a group with levels, its meter sampled twice: the registry the
    dashboard's test scrapes (tests/unit/exported_series.py)."""
    d = _daemon()
    m = Metering(d)
    m.once()
    m.once()
    return registry_for(StatusCache(d), meter=MeterCollector(m, d.lock))


class SlowLevelSensors(LevelSensors):
    """The same stream, the sensor's convergence taking 3 s: each brings 3 s of IOs."""

    io_span_s = 3.0

    def converge(self):
        out = super().converge()
        self.io_samples = [s._replace(ios=3 * s.ios, bytes=3 * s.bytes) for s in self.io_samples]
        return out


def test_a_worker_converging_every_3_s_leaves_the_levels_held_in_between():
    """The controller converges every second; the IoSamples come every third: the
    convergences between hold the level and its cap (no rate of 0, no demotion)."""
    d, vt, s, _act = make(LEVELS)
    d.sensors = SlowLevelSensors(s, d)
    s.latency_s = 0.008
    run_for(d, vt, 24.0, converge_every_s=3.0)
    (row,) = status(d).levels
    assert row.level == 2 and row.promotions == 2 and row.demotions == 0
    assert 0.9 * 400 <= row.rate <= 400 + 1e-6 and row.delay_class > 0


def test_the_meter_counts_every_io_a_slow_convergence_saw():
    d, vt, s, _act = make(LEVELS)
    d.sensors = SlowLevelSensors(s, d)
    run_for(d, vt, 1.0)
    m = Metering(d)
    m.once()
    d.converge_once()
    m.once()
    (got,) = d.sensors.io_samples
    assert m.meter.totals["gold"].ios == got.ios  # 3 s of IOs, not scaled to one second
