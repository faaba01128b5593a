import pytest

from santhrottle.controller.pid import SingleSidedPid


def pid(kp=400.0, ti=0.5, td=0.0, t=0.1, max_class=100):
    return SingleSidedPid(kp, ti, td, t, max_class)


def test_worked_example_from_header():
    p = pid()
    got = []
    for ms in (14, 12, 9, 5):
        got.append(p.update(ms / 1000, 0.010))
    assert got == [2, 2, 0, 0]


def test_hand_computed_sequence_with_derivative():
    # Kp=100, T=0.1, Ti=1 (T/Ti=0.1), Td=0.2 (Td/T=2); threshold 0.
    # e: 0.01, 0.03, 0.02
    # k0: du = 100*(0.01 + 0.001 + 2*(0.01))             = 3.1    u=3.1   -> 4
    # k1: du = 100*(0.02 + 0.003 + 2*(0.03-0.02+0))      = 4.3    u=7.4   -> 8
    # k2: du = 100*(-0.01 + 0.002 + 2*(0.02-0.06+0.01))  = -6.8   u=0.6   -> 1
    p = SingleSidedPid(100.0, 1.0, 0.2, 0.1, 50)
    assert [p.update(e, 0.0) for e in (0.01, 0.03, 0.02)] == [4, 8, 1]
    assert p.u == pytest.approx(0.6)


def test_ceil_of_fraction():
    p = SingleSidedPid(100.0, 1.0, 0.0, 0.1, 10)
    # du = 100 * (0.0001 + 0.1*0.0001) = 0.011 -> ceil = 1
    assert p.update(0.0101, 0.010) == 1
    assert 0 < p.u < 0.02


def test_clamped_at_max_class_is_anti_windup():
    p = pid(max_class=20)
    for _ in range(50):  # a long, large error would wind an unclamped integral far up
        assert p.update(0.100, 0.010) <= 20
    assert p.u == 20.0
    # one tick of negative error already brings it down: nothing stored above the clamp
    assert p.update(0.005, 0.010) < 20


def test_clamped_at_zero_single_sided():
    p = pid()
    for _ in range(20):
        assert p.update(0.001, 0.010) == 0
    assert p.u == 0.0
    # after a long negative error, a positive one throttles at once (no wound-down integral)
    assert p.update(0.015, 0.010) > 0


def test_reset_and_bad_parameters():
    p = pid()
    p.update(0.05, 0.01)
    p.reset()
    assert p.u == 0.0 and p.delay_class == 0
    with pytest.raises(ValueError, match="interval"):
        SingleSidedPid(1.0, 1.0, 0.0, 0.0, 10)
    with pytest.raises(ValueError, match="Ti"):
        SingleSidedPid(1.0, 0.0, 0.0, 0.1, 10)
    with pytest.raises(ValueError, match="max_class"):
        SingleSidedPid(1.0, 1.0, 0.0, 0.1, -1)


def test_track_continues_from_the_applied_class():
    p = pid()
    assert p.update(0.030, 0.010) > 3  # far over: a large first output
    p.track(3)  # a rate limit applied 3
    assert p.u == 3.0 and p.delay_class == 3
    nxt = p.update(0.030, 0.010)  # same error: only the integral step is added to 3
    assert nxt == 5  # ceil(3 + 400 * 0.2 * 0.020); untracked it would be 12
    p.track(50)  # tracking never raises u
    assert p.delay_class == nxt
