import math
import random

import pytest

from santhrottle.controller.domain import DeviceSample
from santhrottle.controller.lqfit import (
    BIN_CAP_WINDOWS,
    DEFAULT_ALPHA,
    FORGET_TAU_S,
    MIN_WINDOWS,
    LqEstimator,
    LqFit,
)

pytestmark = pytest.mark.unit

TICK_S = 0.1


class Feed:
    """Ticks of 100 ms into one estimator, on a line L = C + m Q."""

    def __init__(self, est: LqEstimator | None = None) -> None:
        self.est = est or LqEstimator()
        self.t = 0.0
        self.k = 0
        self.est.observe(DeviceSample("vg0", 0, 0.0, 0.0), 0.0)  # starts the clock

    def tick(self, ios: float, latency_s: float, in_flight: float) -> LqFit | None:
        self.k += 1
        self.t = self.k * TICK_S
        return self.est.observe(DeviceSample("vg0", ios, latency_s, in_flight), self.t)

    def run(
        self,
        seconds: float,
        c: float,
        m: float,
        q: float,
        ios: int = 50,
        noise: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        for _ in range(round(seconds / TICK_S)):
            lat = c + m * q
            if noise and rng is not None:
                lat *= 1.0 + rng.gauss(0.0, noise / math.sqrt(ios))
            self.tick(ios, lat, q)

    @property
    def fit(self) -> LqFit:
        return self.est.fit


def test_worked_example_from_header():
    f = Feed()
    f.run(15.0, 0.002, 0.001, 2.0)
    assert f.fit.windows == pytest.approx(sum(math.exp(-j / 600) for j in range(15)))
    assert not f.fit.confident  # one Q: no line
    assert math.isnan(f.fit.intercept_s)
    assert f.fit.threshold_s() is None
    assert f.est.threshold_s() is None
    f.run(15.0, 0.002, 0.001, 8.0)
    fit = f.fit
    assert fit.confident
    assert fit.intercept_s == pytest.approx(0.002, rel=1e-9)
    assert fit.slope_s_per_io == pytest.approx(0.001, rel=1e-9)
    assert fit.r_squared == pytest.approx(1.0)
    assert (fit.q_lo, fit.q_hi) == pytest.approx((2.0, 8.0))
    assert fit.windows == pytest.approx(29.29, abs=0.005)
    assert fit.windows == pytest.approx(sum(math.exp(-j / FORGET_TAU_S) for j in range(30)))
    assert fit.intercept_se_s < 1e-9
    assert fit.peak_iops == pytest.approx(1000.0)
    assert fit.threshold_s(0.9) == pytest.approx(0.020)
    assert f.est.threshold_s() == pytest.approx(0.020)
    # Little at the threshold: Q = (L - C) / m = 18, X = 18 / 20 ms = 0.9 of the peak
    assert pytest.approx(0.9 * fit.peak_iops) == 18 / 0.020


def test_exact_line_recovered_from_clean_samples():
    f = Feed()
    c, m = 0.0007, 0.00023
    for _ in range(4):
        for q in (0.5, 3.0, 11.0, 40.0, 1.2):
            f.run(3.0, c, m, q, ios=int(q / (c + m * q) * TICK_S) + 1)
    fit = f.fit
    assert fit.confident
    assert fit.intercept_s == pytest.approx(c, rel=1e-9)
    assert fit.slope_s_per_io == pytest.approx(m, rel=1e-9)
    assert fit.r_squared == pytest.approx(1.0)
    assert fit.intercept_se_s < 1e-6 * c  # rounding only
    assert fit.threshold_s(DEFAULT_ALPHA) == pytest.approx(c / (1 - DEFAULT_ALPHA))
    assert fit.threshold_s(0.8) == pytest.approx(c / 0.2)
    assert fit.threshold_s(1.0) is None


def test_noise_is_averaged_out():
    rng = random.Random(7)
    f = Feed()
    c, m = 0.002, 0.0005
    for _ in range(6):
        for q in (1.0, 6.0, 20.0, 3.0):
            f.run(rng.uniform(2, 8), c, m, q, ios=30, noise=0.5, rng=rng)
    fit = f.fit
    assert fit.confident
    assert fit.intercept_s == pytest.approx(c, rel=0.05)
    assert fit.slope_s_per_io == pytest.approx(m, rel=0.05)
    assert 0.9 <= fit.r_squared < 1.0
    # the standard error says how far off C may be
    assert abs(fit.intercept_s - c) < 4 * fit.intercept_se_s


def test_mixed_windows_stay_on_the_line():
    # a writer switching every 0.3 s: every window mixes two loads, and the
    # busier ticks carry more IOs; IO-weighting Q as well as L keeps the point on the line
    f = Feed()
    c, m = 0.001, 0.002
    for i in range(600):
        q = 1.0 if (i // 3) % 2 else 9.0 + (i // 60)
        f.tick(round(q / (c + m * q) * TICK_S), c + m * q, q)
    assert f.fit.intercept_s == pytest.approx(c, rel=1e-6)
    assert f.fit.slope_s_per_io == pytest.approx(m, rel=1e-6)


def test_no_load_variation_is_not_confident():
    rng = random.Random(3)
    f = Feed()
    f.run(300.0, 0.002, 0.001, 4.0, noise=0.3, rng=rng)
    assert not f.fit.confident
    assert f.fit.threshold_s() is None
    assert f.est.last_confident is None
    assert f.est.threshold_s() is None


def test_one_q_only_is_not_confident():
    f = Feed()
    f.run(120.0, 0.002, 0.001, 4.0)  # exactly one point, many times
    assert not f.fit.confident
    assert math.isnan(f.fit.slope_s_per_io)
    assert f.fit.threshold_s() is None


def test_a_narrow_spread_is_not_confident():
    # Q between 4 and 5: a clean line, but C would be extrapolated 4 spreads away
    f = Feed()
    for _ in range(10):
        f.run(3.0, 0.002, 0.001, 4.0)
        f.run(3.0, 0.002, 0.001, 5.0)
    assert f.fit.r_squared == pytest.approx(1.0)
    assert not f.fit.confident


def test_too_few_windows_is_not_confident():
    f = Feed()
    f.run(5.0, 0.002, 0.001, 1.0)
    f.run(5.0, 0.002, 0.001, 10.0)
    assert f.fit.windows < MIN_WINDOWS
    assert not f.fit.confident


def test_a_flat_or_falling_line_is_not_confident():
    f = Feed()
    for _ in range(10):
        f.run(3.0, 0.010, -0.0001, 1.0)
        f.run(3.0, 0.010, -0.0001, 10.0)
    assert f.fit.slope_s_per_io < 0
    assert not f.fit.confident


def test_a_negative_intercept_is_not_confident():
    # latency proportional to more than Q: the line crosses 0 above Q = 0
    f = Feed()
    for _ in range(10):
        f.run(3.0, -0.001, 0.002, 2.0)
        f.run(3.0, -0.001, 0.002, 10.0)
    assert f.fit.intercept_s < 0
    assert not f.fit.confident


def test_forgetting_relearns_a_changed_line():
    rng = random.Random(11)
    f = Feed()

    def varied(seconds: float, c: float, m: float) -> None:
        # loads of 2-6 s, not aligned to the windows: mixed windows land between
        t = 0.0
        while t < seconds:
            q = rng.choice((0.5, 2.0, 8.0, 16.0))
            d = rng.uniform(2.0, 6.0)
            f.run(d, c, m, q, ios=40, noise=0.2, rng=rng)
            t += d

    varied(600.0, 0.001, 0.0005)
    assert f.fit.confident
    old = f.est.threshold_s()
    assert old == pytest.approx(0.001 / (1 - DEFAULT_ALPHA), rel=0.05)
    # the array changes (a rebuild): C and m double
    in_force = []
    for _ in range(30):
        varied(60.0, 0.002, 0.001)  # 30 min = 3 FORGET_TAU_S after the change
        in_force.append(f.est.threshold_s())
    # the last confident line stays in force, then lines between old and new
    # (R^2 over its floor again while the old windows decay), then the new one
    assert all(0.9 * old <= t <= 0.020 for t in in_force)
    assert in_force[1] == pytest.approx(old, rel=0.1)
    assert f.fit.confident
    assert f.est.threshold_s() == pytest.approx(0.002 / (1 - DEFAULT_ALPHA), rel=0.03)
    assert f.fit.slope_s_per_io == pytest.approx(0.001, rel=0.05)


def test_a_steady_load_does_not_drown_the_spread():
    f = Feed()
    f.run(12.0, 0.002, 0.001, 1.0)
    f.run(12.0, 0.002, 0.001, 10.0)
    assert f.fit.confident
    f.run(600.0, 0.002, 0.001, 10.0)  # ten minutes of one load
    fit = f.fit
    # its own bin is capped at 30 windows; the 12 at Q = 1 decay to 12/e
    assert fit.windows == pytest.approx(BIN_CAP_WINDOWS + 12 * math.exp(-1), rel=0.02)
    assert fit.confident
    assert fit.intercept_s == pytest.approx(0.002)
    f.run(1200.0, 0.002, 0.001, 10.0)  # 30 min: under one window left at Q = 1
    assert not f.fit.confident
    assert f.est.threshold_s() == pytest.approx(0.020)  # the last confident line holds
    f.run(25.0, 0.002, 0.001, 3.0)  # the load varies again
    assert f.fit.confident


@pytest.mark.parametrize(
    ("ios", "lat", "q"),
    [
        (0, 0.001, 1.0),
        (-5, 0.001, 1.0),
        (10, -0.001, 1.0),
        (10, 0.0, 1.0),
        (10, math.nan, 1.0),
        (10, math.inf, 1.0),
        (10, 0.001, -1.0),
        (10, 0.001, math.nan),
        (10, 0.001, math.inf),
        (math.nan, 0.001, 1.0),
        (math.inf, 0.001, 1.0),
    ],
)
def test_bad_samples_are_ignored(ios, lat, q):
    clean, dirty = Feed(), Feed()
    for i in range(400):
        qq = 1.0 if (i // 50) % 2 else 8.0
        clean.tick(20, 0.001 + 0.0005 * qq, qq)
        dirty.tick(20, 0.001 + 0.0005 * qq, qq)
        dirty.k -= 1
        dirty.tick(ios, lat, q)  # the same instant again: only its numbers could matter
    assert dirty.fit == clean.fit
    assert clean.fit.confident


def test_bad_clocks_never_raise():
    est = LqEstimator()
    s = DeviceSample("vg0", 20, 0.002, 1.0)
    for now in (math.nan, math.inf, -math.inf, 5.0, math.nan, 4.0, 3.0, 1e9, math.inf, 1e9 + 2):
        est.observe(s, now)
    assert isinstance(est.fit, LqFit)
    assert all(math.isfinite(v) or math.isnan(v) for v in est.fit[:7])


def test_few_ios_per_window_are_skipped():
    f = Feed()
    for _ in range(10):
        f.run(3.0, 0.002, 0.001, 1.0, ios=0)
        for _ in range(30):
            f.tick(1 if f.k % 10 == 0 else 0, 0.050, 30.0)  # 1 IO per window: skipped
    assert f.fit.windows == 0.0
    assert not f.fit.confident


def test_zero_in_flight_is_a_point_at_the_lowest_q():
    f = Feed()
    for _ in range(10):
        f.run(3.0, 0.002, 0.001, 0.0)
        f.run(3.0, 0.002, 0.001, 5.0)
    assert f.fit.confident
    assert f.fit.intercept_s == pytest.approx(0.002)


def test_a_window_closes_on_time_not_on_sample_count():
    est = LqEstimator(window_s=1.0)
    s = DeviceSample("vg0", 20, 0.002, 1.0)
    assert est.observe(s, 0.0) is None
    assert est.observe(s, 0.4) is None  # late ticks
    assert est.observe(s, 0.999_999_5) is not None  # ten float ticks: 0.9999999999999999
    assert est.observe(s, 1.3) is None
    assert est.observe(s, 5.0) is not None  # a gap: one window, forgetting for 4 s


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="window"):
        LqEstimator(window_s=0.0)
    with pytest.raises(ValueError, match="forgetting"):
        LqEstimator(forget_tau_s=-1.0)


def test_per_tick_cost_is_a_few_microseconds():
    import timeit

    f = Feed()
    s = DeviceSample("vg0", 20, 0.002, 1.0)
    est = f.est
    n = 20_000
    t = timeit.timeit(lambda: est.observe(s, 0.5), number=n)  # no window closes
    assert t / n < 20e-6  # ~1 us here; generous for a loaded CI machine
