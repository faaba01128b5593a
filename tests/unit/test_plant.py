import math

import pytest

from santhrottle.sim.plant import (
    Closed,
    Device,
    SaturatedError,
    closed_latency,
    solve_latency,
)

DEV = Device(intercept_s=0.002, slope_s_per_io=0.003)


def test_hand_solved_closed_stream_with_delay():
    # header example: L^2 + (d - C - m q) L - C d = 0 with C=2ms, m=3ms, q=4, d=10ms
    b = 0.010 - 0.002 - 0.003 * 4
    want = (-b + math.sqrt(b * b + 4 * 0.002 * 0.010)) / 2
    assert want == pytest.approx(0.006899, abs=1e-6)
    assert solve_latency(DEV, 0.0, [(4, 0.010)]) == pytest.approx(want, rel=1e-9)


def test_no_delay_is_the_lq_line():
    # d = 0: all q IOs sit in the device, L = C + m * sum(q)
    assert solve_latency(DEV, 0.0, [(1, 0.0)] * 12) == pytest.approx(0.002 + 0.003 * 12)


def test_open_loop_only():
    # L = C + m * lambda * L  ->  L = C / (1 - m lambda)
    assert solve_latency(DEV, 100.0, []) == pytest.approx(0.002 / (1 - 0.3))


def test_fixed_point_holds_for_a_mix():
    closed = [(1, 0.0), (4, 0.02), (2, 0.005)]
    lat = solve_latency(DEV, 64.0, closed)
    q = 64.0 * lat + sum(qi * lat / (lat + d) for qi, d in closed)
    assert lat == pytest.approx(0.002 + 0.003 * q, rel=1e-9)


def test_more_delay_means_lower_latency():
    lats = [solve_latency(DEV, 64.0, [(1, d)] * 12) for d in (0.0, 0.01, 0.05, 0.1)]
    assert lats == sorted(lats, reverse=True)


def test_saturated_open_load_is_an_error():
    with pytest.raises(SaturatedError, match="saturates"):
        solve_latency(DEV, 400.0, [])


def test_a_closed_stream_at_its_rate_cap_loads_the_device_as_an_open_one():
    """fio's --rate at QD1: depth / (L + d) IOs per second, at most the rate. Over its cap
    the device sees its rate (and nothing more); under it, it is closed."""
    dev = Device(intercept_s=0.010, slope_s_per_io=0.005)
    lat, (reader, writer) = closed_latency(dev, 0.0, [Closed(1, 0.0, 25.0), Closed(2, 0.0)])
    assert lat == pytest.approx(solve_latency(dev, 25.0, [(2, 0.0)]))  # 1 / L > 25/s
    assert reader == 25.0 and writer == pytest.approx(2 / lat)
    # delayed by 50 ms it cannot keep its rate: closed again, 1 / (L + d)
    lat, (reader, _) = closed_latency(dev, 0.0, [Closed(1, 0.050, 25.0), Closed(2, 0.0)])
    assert lat == pytest.approx(solve_latency(dev, 0.0, [(1, 0.050), (2, 0.0)]))
    assert reader == pytest.approx(1 / (lat + 0.050))
    # no cap: solve_latency's
    lat, _ = closed_latency(dev, 10.0, [Closed(4, 0.010)])
    assert lat == pytest.approx(solve_latency(dev, 10.0, [(4, 0.010)]))
