"""Work conservation (sim/scenarios/stalls.toml): on a plant whose read latency stays under
the thresholds, stalls of the array (a guest's, an array's) make the 1 s latency spike far
above T; the delay they buy must not outlive them, and the writers move what they move
uncontrolled."""

from pathlib import Path

import pytest

from santhrottle.sim.experiment import simulate
from santhrottle.sim.scenario import parse_scenario

pytestmark = pytest.mark.sim
STALLS = Path(__file__).parents[2] / "sim" / "scenarios" / "stalls.toml"
# after a stall ends: the spike's reads complete, the EWMA comes back under the
# setpoint, the PID winds down to its floor, RELEASE_FLOOR_TICKS, a class a tick
RELEASED_WITHIN_S = 5.0


@pytest.fixture(scope="module")
def result():
    sc = parse_scenario(STALLS.read_text())
    return sc, simulate(sc, baseline=False)


def test_the_plant_needs_no_delay(result):
    sc, out = result
    unc = out["uncontrolled"]
    assert unc["read_latency_p95_s"] < min(sc.thresholds_s)  # the premise
    assert unc["read_latency_p99_s"] > 5 * max(sc.thresholds_s)  # and it spikes


def test_the_writers_lose_nothing_and_the_delay_does_not_outlive_a_stall(result):
    sc, out = result
    unc_bps = out["uncontrolled"]["write_throughput_bps"]
    for run in out["controlled"]:
        assert run["write_throughput_bps"] >= 0.99 * unc_bps, run["label"]
        assert run["read_latency_p95_s"] <= run["threshold_s"]
        series = out["series"][run["label"]]
        for start, end in sc.stalls:
            after = [
                c
                for t, c in zip(series["t_s"], series["delay_class"], strict=True)
                if end + RELEASED_WITHIN_S <= t < end + RELEASED_WITHIN_S + 1.0
            ]
            assert after and max(after) == 0, (run["label"], start, after)
