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
