"""Work conservation (sim/scenarios/futile.toml): a read latency over T that is not the
writers' doing (a slow path to the target, as a bridge's wire sensor sees it).  The
delay takes the writers' throughput and does not bring the latency down: the controller
releases it, holds it at 0 for a backoff that grows, and tries again."""

from itertools import pairwise
from pathlib import Path

import pytest

from santhrottle.controller.futile import (
    FUTILE_BACKOFF_MAX_S,
    FUTILE_BACKOFF_S,
    FUTILE_CONVERGES,
)
from santhrottle.sim.experiment import simulate
from santhrottle.sim.scenario import parse_scenario

pytestmark = pytest.mark.sim
SCENARIOS = Path(__file__).parents[2] / "sim" / "scenarios"


def _episodes(series: dict) -> list[tuple[float, float]]:
    """(start, end) of each run of ticks with a class above 0."""
    out: list[tuple[float, float]] = []
    start = None
    for t, c in zip(series["t_s"], series["delay_class"], strict=True):
        if c and start is None:
            start = t
        elif not c and start is not None:
            out.append((start, t))
            start = None
    if start is not None:
        out.append((start, series["t_s"][-1]))
    return out


@pytest.fixture(scope="module")
def futile():
    sc = parse_scenario((SCENARIOS / "futile.toml").read_text())
    return sc, simulate(sc, baseline=False)


def test_no_delay_holds_the_threshold(futile):
    sc, out = futile
    (run,) = out["controlled"]
    assert out["uncontrolled"]["read_latency_p50_s"] > sc.thresholds_s[0]  # the premise
    assert run["read_latency_p50_s"] > sc.thresholds_s[0]  # with the delay too


def test_the_delay_is_released_and_tried_again_later_and_later(futile):
    _, out = futile
    (run,) = out["controlled"]
    eps = _episodes(out["series"][run["label"]])
    assert len(eps) >= 3, eps
    # each episode ends: the ramp up, FUTILE_CONVERGES convergences, the descent
    assert all(end - start < FUTILE_CONVERGES + 30 for start, end in eps), eps
    gaps = [b[0] - a[1] for a, b in pairwise(eps)]
    # the backoff runs from the release, before the descent ends: a little less
    assert gaps[0] >= FUTILE_BACKOFF_S - 15, gaps
    assert gaps[1] >= min(2 * FUTILE_BACKOFF_S, FUTILE_BACKOFF_MAX_S) - 15, gaps


def test_the_writers_keep_most_of_their_throughput(futile):
    _, out = futile
    (run,) = out["controlled"]
    assert run["write_throughput_bps"] >= 0.75 * out["uncontrolled"]["write_throughput_bps"]


@pytest.mark.parametrize("scenario", ["paper.toml", "stalls.toml"])
def test_a_delay_that_works_is_never_released(scenario):
    sc = parse_scenario((SCENARIOS / scenario).read_text())
    out = simulate(sc, baseline=False)
    for run in out["controlled"]:
        assert run["futile_releases"] == 0, run["label"]
