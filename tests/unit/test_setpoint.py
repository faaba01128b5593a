"""controller/setpoint.py: the noise gauge and the setpoint it allows."""

import math
import random

import pytest

from santhrottle.controller.domain import ControllerConfig, Resource
from santhrottle.controller.setpoint import PRIOR_SPREAD, SPREAD_CLIP, NoiseGauge
from santhrottle.controller.state import new_state

pytestmark = pytest.mark.unit

TICK_S = 0.1
FLOOR, CEILING, Z = 0.9, 0.97, 2.33


def feed(g: NoiseGauge, ticks: int, reads: int, rel_sd: float, level=0.01, seed=1, t0=0.0):
    """Ticks of `reads` reads whose latencies scatter by rel_sd around level (normal)."""
    rng = random.Random(seed)
    t = t0
    for _ in range(ticks):
        t += TICK_S
        mean = level * (1.0 + rng.gauss(0.0, rel_sd / math.sqrt(reads)))
        g.observe(reads, mean, t)
    return t


def test_before_any_measurement_the_setpoint_is_the_floor():
    g = NoiseGauge()
    assert g.spread == PRIOR_SPREAD
    assert g.setpoint(FLOOR, CEILING, Z) == FLOOR  # no reads yet: cv infinite
    g.observe(0, 0.0, 0.1)  # a tick without reads changes nothing
    assert g.reads_per_s == 0.0


@pytest.mark.parametrize(("reads", "rel_sd"), [(20, 0.3), (5, 1.0), (50, 0.1)])
def test_the_gauge_measures_the_relative_sd_of_the_1s_mean(reads, rel_sd):
    g = NoiseGauge()
    feed(g, 3000, reads, rel_sd)
    want = rel_sd / math.sqrt(reads / TICK_S)
    assert g.reads_per_s == pytest.approx(reads / TICK_S, rel=0.01)
    assert g.cv == pytest.approx(want, rel=0.2)


def test_a_quiet_resource_is_held_closer_to_its_threshold_a_noisy_one_at_the_floor():
    quiet, noisy = NoiseGauge(), NoiseGauge()
    feed(quiet, 600, 20, 0.1)
    feed(noisy, 600, 2, 1.5)
    assert quiet.setpoint(FLOOR, CEILING, Z) == CEILING
    assert noisy.setpoint(FLOOR, CEILING, Z) == FLOOR
    middle = NoiseGauge()
    feed(middle, 1200, 5, 0.5)  # cv ~ 0.5 / sqrt(50) = 0.071 -> 1 - 2.33 x 0.071 = 0.835
    assert middle.setpoint(0.8, CEILING, Z) == pytest.approx(1 - Z * middle.cv)
    assert 0.8 < middle.setpoint(0.8, CEILING, Z) < CEILING


def test_a_fixed_setpoint_when_the_quiet_fraction_is_not_above_the_floor():
    g = NoiseGauge()
    feed(g, 600, 20, 0.05)
    assert g.setpoint(0.9, 0.9, Z) == 0.9
    assert g.setpoint(0.9, 0.0, Z) == 0.9


def test_a_slow_change_of_level_is_not_noise():
    """The loop moving the latency (a ramp over seconds) leaves the gauge quiet."""
    g = NoiseGauge()
    t = 0.0
    for k in range(600):
        t += TICK_S
        level = 0.01 * (1.0 + 0.5 * math.sin(k / 50.0))  # +-50 % over ~30 s
        g.observe(20, level, t)
    assert g.setpoint(FLOOR, CEILING, Z) == CEILING


def test_a_transient_is_clipped_not_taken_for_noise():
    g = NoiseGauge()
    t = feed(g, 600, 20, 0.1)
    before = g.spread
    for k in range(10):  # a writer switches on: 50 x the level from the 5th tick
        t += TICK_S
        g.observe(20, 0.01 if k < 5 else 0.5, t)
    assert g.spread <= before * SPREAD_CLIP
    assert g.setpoint(FLOOR, CEILING, Z) > FLOOR


def test_the_controller_regulates_to_the_gauge_setpoint():
    state = new_state(ControllerConfig(), [Resource("vg", 0.010)])
    rs = state.resources["vg"]
    assert rs.setpoint(state.config) == FLOOR
    feed(rs.noise, 600, 20, 0.05, level=0.005)
    assert rs.setpoint(state.config) == CEILING
    fixed = ControllerConfig(setpoint_quiet_fraction=0.0)
    assert rs.setpoint(fixed) == fixed.setpoint_fraction
