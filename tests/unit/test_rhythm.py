import pytest

from santhrottle.controller.rhythm import GAP_FOLD_MAX_X, GAP_WEIGHT, Rhythm

TICK_S = 0.1


def every_tick(r, n, t=0.0):
    for _ in range(n):
        t = round(t + TICK_S, 6)
        r.observe(True, t, TICK_S)
    return t


def test_before_any_write_it_is_silent():
    r = Rhythm()
    r.observe(False, 0.1, TICK_S)
    assert r.silent(0.1, TICK_S) and r.steady(TICK_S)


def test_writers_that_write_every_tick_are_silent_after_one_tick_without():
    r = Rhythm()
    t = every_tick(r, 20)
    assert r.gap_s == pytest.approx(TICK_S) and r.steady(TICK_S)
    assert not r.silent(t, TICK_S)
    r.observe(False, t + TICK_S, TICK_S)
    assert r.silent(round(t + TICK_S, 6), TICK_S)


def test_worked_example_from_header():
    r = Rhythm()
    t = every_tick(r, 20)
    gaps, patience = [], []
    for _ in range(4):  # a burst every 2 s
        t += 2.0
        r.observe(True, t, TICK_S)
        gaps.append(r.gap_s)
        patience.append(r.patience_s(TICK_S))
    assert gaps == pytest.approx([0.175, 0.306, 0.536, 0.902], abs=1e-3)
    assert patience == pytest.approx([0.3, 0.7, 1.4, 2.5])
    assert not r.steady(TICK_S)
    assert not r.silent(t + 2.4, TICK_S) and r.silent(t + 2.5, TICK_S)
    for _ in range(40):
        t += 2.0
        r.observe(True, t, TICK_S)
    assert r.patience_s(TICK_S) == pytest.approx(5.8, abs=0.01)


def test_a_pause_teaches_the_rhythm_little_and_steady_gaps_take_it_back():
    r = Rhythm()
    t = every_tick(r, 20)
    t += 5.0  # the paper's off-period
    r.observe(True, t, TICK_S)
    assert r.gap_s == pytest.approx(TICK_S * (1 + GAP_WEIGHT * (GAP_FOLD_MAX_X - 1)))
    assert r.patience_s(TICK_S) == pytest.approx(0.3)
    t = every_tick(r, 6, t)
    assert r.patience_s(TICK_S) == pytest.approx(TICK_S) and r.steady(TICK_S)
    r.observe(False, round(t + TICK_S, 6), TICK_S)
    assert r.silent(round(t + TICK_S, 6), TICK_S)


def test_ticks_without_writes_do_not_move_it():
    r = Rhythm()
    t = every_tick(r, 5)
    before = (r.last_s, r.gap_s)
    r.observe(False, t + 1.0, TICK_S)
    assert (r.last_s, r.gap_s) == before and r.silent(t + 1.0, TICK_S)
