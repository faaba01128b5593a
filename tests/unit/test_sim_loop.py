"""sim/: the sensors' samples per path and in all, the latency window, the paths."""

import math

import pytest

from santhrottle.controller.domain import ReadSample, WriteSample
from santhrottle.sim.measure import LatencyWindow
from santhrottle.sim.paths import Paths
from santhrottle.sim.sensors import Sensed


def test_sensors_worked_example():
    """sim/sensors.py's example: per path, and one appliance on both."""
    s = Sensed(["vg"], 2, 0.1)
    s.read_sum[0]["vg"], s.read_n[0]["vg"], s.write_res[0]["vg"] = 0.040, 4.0, 1.2e6
    s.read_sum[1]["vg"], s.read_n[1]["vg"] = 0.030, 2.0
    assert s.part(0).reads == [ReadSample("vg", 4, pytest.approx(0.010), pytest.approx(12e6))]
    assert s.part(1).reads == [ReadSample("vg", 2, pytest.approx(0.015), 0.0)]
    (whole,) = s.whole().reads
    assert whole == ReadSample("vg", 6, pytest.approx(0.07 / 6), pytest.approx(12e6))
    assert s.part(0).writes == []  # the pairs' writes only at a convergence


def test_pair_writes_at_a_convergence_then_cleared():
    s = Sensed(["vg"], 1, 0.1)
    s.write_pair[0][("vg", "h1")] = 2e6
    s.span_s = 1.0
    assert s.converging and s.whole().writes == [WriteSample("vg", "h1", 2e6)]
    s.clear()
    assert not s.converging and s.write_pair[0] == {} and s.read_n[0]["vg"] == 0.0
    s.write_pair[0][("vg", "h1")] = 1e6
    s.clear()  # a tick without a convergence keeps the pairs' bytes
    assert s.write_pair[0] == {("vg", "h1"): 1e6}


def test_latency_window_worked_example():
    w = LatencyWindow()
    w.add(0.2, 0.008)
    w.add(0.9, 0.012)
    assert w.mean(1.0) == pytest.approx(0.010)
    assert w.mean(1.3) == pytest.approx(0.012)
    assert w.mean(2.0) is None


def test_paths_rotate_the_split_and_refuse_bad_ones():
    p = Paths((0.7, 0.3))
    assert p.fractions(0) == (0.7, 0.3) and p.fractions(1) == (0.3, 0.7)
    assert Paths((0.7, 0.3), rotate=False).fractions(1) == (0.7, 0.3)
    for bad in ({"split": (0.5, 0.4)}, {"split": ()}, {"policy": "random"}):
        with pytest.raises(ValueError):
            Paths(**bad)
    assert math.isclose(sum(Paths((0.25,) * 4).fractions(3)), 1.0)
