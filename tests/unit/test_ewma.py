import math

import pytest

from santhrottle.controller.ewma import Ewma, alpha_for


def test_first_sample_seeds():
    e = Ewma(0.5)
    assert e.update(10.0, 3.0) == 10.0


def test_worked_example_from_header():
    e = Ewma(0.5)
    e.update(10.0, 0.0)
    assert e.update(20.0, 0.1) == pytest.approx(11.8127, abs=1e-4)
    assert e.update(20.0, 0.6) == pytest.approx(16.988, abs=1e-3)


def test_irregular_intervals_compose():
    # A constant input observed at 0.1 s + 0.3 s must equal one 0.4 s step:
    # the filter is exact for the elapsed time, not for the number of samples.
    a, b = Ewma(0.25), Ewma(0.25)
    for e in (a, b):
        e.update(0.0, 0.0)
    a.update(5.0, 0.1)
    a.update(5.0, 0.4)
    b.update(5.0, 0.4)
    assert a.value == pytest.approx(b.value)
    assert b.value == pytest.approx(5.0 * (1 - math.exp(-0.4 / 0.25)))


def test_step_response_reaches_63_percent_after_tau():
    e = Ewma(2.0)
    e.update(0.0, 0.0)
    assert e.update(1.0, 2.0) == pytest.approx(1 - math.exp(-1))


@pytest.mark.parametrize("dt", [0.0, -1.0])
def test_non_positive_dt_changes_nothing(dt):
    e = Ewma(1.0)
    e.update(4.0, 10.0)
    assert e.update(100.0, 10.0 + dt) == 4.0
    assert alpha_for(dt, 1.0) == 0.0


def test_zero_tau_follows_input_and_negative_tau_rejected():
    e = Ewma(0.0)
    e.update(1.0, 0.0)
    assert e.update(7.0, 0.1) == 7.0
    with pytest.raises(ValueError, match="time constant"):
        Ewma(-1.0)


def test_reset_reseeds():
    e = Ewma(1.0)
    e.update(1.0, 0.0)
    e.reset()
    assert e.update(9.0, 5.0) == 9.0


def test_weighted_samples_are_a_ratio_of_sums_and_weight_one_is_the_plain_ewma():
    a = alpha_for(0.1, 0.2)
    e, plain, ones = Ewma(0.2), Ewma(0.2), Ewma(0.2)
    s = n = None
    for k, (x, w) in enumerate([(0.010, 10), (0.060, 2), (0.009, 8), (0.050, 1)]):
        v = e.update(x, k / 10, w)
        s, n = (x * w, w) if s is None else (s + a * (x * w - s), n + a * (w - n))
        assert v == pytest.approx(s / n)
        assert ones.update(x, k / 10, 1) == plain.update(x, k / 10)
    # one slow read among ten fast moves it far less than a tick of ten slow reads
    few, many = Ewma(0.2), Ewma(0.2)
    few.update(0.010, 0.0, 10)
    many.update(0.010, 0.0, 10)
    assert few.update(0.060, 0.1, 1) - 0.010 < (many.update(0.060, 0.1, 10) - 0.010) / 5


def test_follow_carries_value_time_and_weight():
    e = Ewma(0.2)
    e.update(0.010, 0.0, 10)
    f = Ewma(0.5)
    f.follow(e)
    g = Ewma(0.5)
    g.update(0.010, 0.0, 10)
    assert f.update(0.030, 0.1, 2) == g.update(0.030, 0.1, 2)
