"""controller/futile.py: a delay that does not lower the latency is released, with a backoff."""

import math

import pytest

from santhrottle.controller.futile import (
    FUTILE_BACKOFF_MAX_S,
    FUTILE_BACKOFF_S,
    FUTILE_CONVERGES,
    FUTILE_REFUTE_X,
    Futility,
)

pytestmark = pytest.mark.unit
T = 0.020
P = 1.0  # the convergence period
RAW = 0.0  # a smoothing time constant that takes each value as it is


def _episode(
    f: Futility, t: float, lat: float, wr: float, n: int, k: int = 88
) -> tuple[float, bool]:
    """n convergences at class k with these EWMAs (taken as they are); the time after and
    whether one of them released."""
    released = False
    for _ in range(n):
        released |= f.converge(lat, wr, T, k, t)
        t += P
    return t, released


def test_the_worked_example_releases_after_ten_futile_convergences():
    f = Futility(tau_s=RAW)
    assert not f.converge(0.021, 40e6, T, 0, 0.0)  # undelayed: the peaks
    t, released = _episode(f, 1.0, 0.026, 40e6, 1)  # the latency's peak, still writing
    assert not released
    t, released = _episode(f, t, 0.0246, 3e6, FUTILE_CONVERGES - 1)
    assert not released
    assert f.converge(0.0246, 3e6, T, 88, t)  # the tenth
    assert f.released(t) and f.until_s == t + FUTILE_BACKOFF_S and f.releases == 1
    assert not f.released(t + FUTILE_BACKOFF_S)


def test_a_latency_that_comes_down_with_the_writes_is_not_futile():
    f = Futility(tau_s=RAW)
    f.converge(0.030, 40e6, T, 0, 0.0)
    # over T still, the writes cut, but the latency a third under its peak: the delay works
    _, released = _episode(f, 1.0, 0.022, 3e6, 5 * FUTILE_CONVERGES)
    assert not released and f.releases == 0


def test_writes_the_delay_did_not_take_are_not_futile():
    f = Futility(tau_s=RAW)
    f.converge(0.025, 40e6, T, 0, 0.0)
    _, released = _episode(f, 1.0, 0.025, 30e6, 5 * FUTILE_CONVERGES)
    assert not released


def test_a_held_threshold_is_not_futile():
    f = Futility(tau_s=RAW)
    f.converge(0.025, 40e6, T, 0, 0.0)
    _, released = _episode(f, 1.0, 0.0199, 3e6, 5 * FUTILE_CONVERGES)
    assert not released


def test_one_convergence_that_is_not_futile_starts_the_count_again():
    f = Futility(tau_s=RAW)
    f.converge(0.025, 40e6, T, 0, 0.0)
    t, _ = _episode(f, 1.0, 0.025, 3e6, FUTILE_CONVERGES - 1)
    t, _ = _episode(f, t, 0.019, 3e6, 1)  # held once
    t, released = _episode(f, t, 0.025, 3e6, FUTILE_CONVERGES - 1)
    assert not released
    assert _episode(f, t, 0.025, 3e6, 1)[1]


def test_the_backoff_doubles_to_its_cap_and_a_held_threshold_sets_it_back():
    f = Futility(tau_s=RAW)
    t = 0.0
    backoffs = []
    for _ in range(6):
        f.converge(0.025, 40e6, T, 0, t)  # class 0: a new episode's peaks
        t, released = _episode(f, t + P, 0.025, 3e6, FUTILE_CONVERGES)
        assert released
        backoffs.append(f.until_s - (t - P))
        t = f.until_s
        assert not f.released(t)
    assert backoffs == [60.0, 120.0, 240.0, 480.0, 480.0, 480.0]
    assert backoffs[0] == FUTILE_BACKOFF_S and backoffs[-1] == FUTILE_BACKOFF_MAX_S
    f.converge(0.015, 40e6, T, 0, t)  # under T: the next release starts over
    t, released = _episode(f, t + P, 0.025, 3e6, FUTILE_CONVERGES)
    assert released and f.until_s - (t - P) == FUTILE_BACKOFF_S


def test_during_a_release_no_episode_counts():
    f = Futility(tau_s=RAW)
    f.converge(0.025, 40e6, T, 0, 0.0)
    t, released = _episode(f, 1.0, 0.025, 3e6, FUTILE_CONVERGES)
    assert released
    # the class comes down a class a tick: still above 0, but released
    _, again = _episode(f, t, 0.025, 3e6, 3 * FUTILE_CONVERGES, k=40)
    assert not again and f.releases == 1


def test_the_smoothing_keeps_one_noisy_second_from_making_a_peak():
    f = Futility()
    f.converge(0.025, 40e6, T, 0, 0.0)
    f.converge(0.050, 3e6, T, 88, 1.0)  # one second at twice the latency, over a 5 s tau
    assert f.latency.value is not None and f.latency.value < 0.031
    assert math.isclose(f.peak_latency_s, f.latency.value)


def test_a_release_the_latency_refutes_ends_at_once_and_sets_the_backoff_back():
    """Released at 25 ms (its peak 25 ms); without the delay the latency climbs: at 1.2 x
    the peak the release holds, past FUTILE_REFUTE_X x the peak it ends at that
    convergence, the backoff is 60 s again and the next episode starts from there."""
    f = Futility(tau_s=RAW)
    f.converge(0.025, 40e6, T, 0, 0.0)
    t, released = _episode(f, 1.0, 0.025, 3e6, FUTILE_CONVERGES)
    assert released and f.backoff_s == 2 * FUTILE_BACKOFF_S
    t, _ = _episode(f, t, 0.030, 40e6, 3, k=40)  # 1.2 x: the plant as it was undelayed
    assert f.released(t) and f.refutations == 0
    f.converge(FUTILE_REFUTE_X * 0.025 * 1.04, 40e6, T, 30, t)  # 1.3 x the peak
    assert not f.released(t) and f.until_s == t
    assert f.refutations == 1 and f.releases == 1 and f.backoff_s == FUTILE_BACKOFF_S
    # a new episode: futile again only against its own peak, ten convergences on
    t, released = _episode(f, t + P, 0.0325, 3e6, FUTILE_CONVERGES - 1, k=60)
    assert not released
    assert _episode(f, t, 0.0325, 3e6, 1, k=60)[1]
    assert f.until_s - t == FUTILE_BACKOFF_S  # the backoff set back: 60 s, not 120 s


def test_a_futile_delay_is_not_refuted_by_the_plant_it_was_released_to():
    """The latency back at its episode's start (the plant undelayed, 1.2 x the delayed
    latency, under FUTILE_REFUTE_X x the peak that start set): the release runs its
    backoff."""
    f = Futility(tau_s=RAW)
    f.converge(0.030, 40e6, T, 0, 0.0)  # undelayed: 30 ms, the episode's peak
    t, released = _episode(f, 1.0, 0.025, 3e6, FUTILE_CONVERGES)  # 0.83 of it, delayed
    assert released
    t, _ = _episode(f, t, 0.030, 40e6, 40, k=0)
    assert f.released(t) and f.refutations == 0
