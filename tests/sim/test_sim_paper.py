"""The spine's acceptance, on the shipped paper scenario with the default gains."""

from pathlib import Path

import pytest

from santhrottle.sim.experiment import simulate
from santhrottle.sim.measure import TRANSIENT_S
from santhrottle.sim.scenario import parse_scenario

PAPER = Path(__file__).parents[2] / "sim" / "scenarios" / "paper.toml"


@pytest.fixture(scope="module")
def result():
    return simulate(parse_scenario(PAPER.read_text()), baseline=True)


def test_uncontrolled_exceeds_twice_every_threshold(result):
    for c in result["controlled"]:
        assert c["uncontrolled_p95_s"] >= 2 * c["threshold_s"]


@pytest.mark.parametrize("i", [0, 1, 2], ids=["10ms", "15ms", "20ms"])
def test_controlled_holds_threshold(result, i):
    c = result["controlled"][i]
    t = c["threshold_s"]
    assert c["read_latency_p95_s"] <= 1.1 * t
    assert c["read_latency_p99_outside_transients_s"] <= 1.1 * t
    assert len(c["switch_ons"]) == 4  # every burst after the learning one is judged
    for on in c["switch_ons"]:
        assert on["peak_s"] <= 1.5 * t, on
        assert on["recovered_after_s"] <= TRANSIENT_S, on


@pytest.mark.parametrize("i", [0, 1, 2], ids=["10ms", "15ms", "20ms"])
def test_writer_throughput_close_to_best_constant_delay(result, i):
    c = result["controlled"][i]
    best = c["best_constant"]
    assert best is not None and best["delay_class"] > 0
    assert c["write_throughput_bps"] >= 0.9 * best["write_throughput_bps"]


def test_series_are_complete(result):
    n = 130 * 10  # 130 s at 100 ms ticks
    for label, s in result["series"].items():
        assert len(s["t_s"]) == n, label
        assert len(s["delay_class"]) == len(s["write_bps"]) == n
    assert max(result["series"]["uncontrolled"]["delay_class"]) == 0
    assert max(result["series"]["T=10ms"]["delay_class"]) > 0
