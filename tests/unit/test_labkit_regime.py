"""labkit.regime: which thresholds an uncontrolled phase admits, and the plant slope that
brings a slow host's emulated writers into the paper's regime; labkit.search: the best
static delay's search on the ladder."""

from __future__ import annotations

import pytest
from labkit import regime
from labkit.search import smallest_holding

PAPER_S = [0.010, 0.015, 0.020]


def test_the_regime_admits_a_threshold_at_half_the_uncontrolled_p95():
    assert regime.verdict(0.055, PAPER_S) == ("reached", PAPER_S)
    assert regime.verdict(0.040, PAPER_S) == ("reached", PAPER_S)  # exactly 2 T
    assert regime.verdict(0.035, PAPER_S) == ("partly", [0.010, 0.015])
    # the run: 6.43 ms uncontrolled, a table of thresholds a 0.5 ms delay holds
    assert regime.verdict(0.00643, PAPER_S) == ("not reached", [])


def test_a_slow_hosts_writers_get_a_steeper_slope():
    # the docs' slow host: each emulated writer IO costs ~50 ms outside the array, so 12
    # writers keep ~3 IOs at an m = 5 ms array and the reader waits ~17 ms
    u = regime.Uncontrolled(m_ms=5, c_ms=2, writers=12, p95_s=0.017, q=3.0, iops=180)
    assert regime.overhead_s(u) == pytest.approx(0.0497, abs=1e-4)
    m = regime.next_slope(u, 0.020)
    assert m == 9.0  # the smallest slope predicted to reach 2.5 x 20 ms
    assert regime.predicted_p95_s(u, m) >= regime.AIM_X * 0.020
    assert regime.predicted_p95_s(u, m - regime.SLOPE_STEP_MS) < regime.AIM_X * 0.020
    # the fixed point of the plant's line with that overhead: Q = N L / (L + o)
    o = regime.overhead_s(u)
    lat = regime.array_latency_s(0.002, 0.009, 12, o)
    q = 12 * lat / (lat + o)
    assert lat == pytest.approx(0.002 + 0.009 * q)


def test_a_host_already_in_the_regime_keeps_its_slope_and_a_hopeless_one_stops():
    fast = regime.Uncontrolled(m_ms=5, c_ms=2, writers=12, p95_s=0.055, q=10.0, iops=190)
    assert regime.verdict(fast.p95_s, PAPER_S)[0] == "reached"
    assert regime.overhead_s(fast) < 0.25 * 0.052  # the array, 52 ms an IO, limits them
    # writers that move nothing: no slope helps, the cap is said as such
    idle = regime.Uncontrolled(m_ms=5, c_ms=2, writers=12, p95_s=0.004, q=0.0, iops=0.0)
    assert regime.predicted_p95_s(idle, 50) == 0.0
    assert regime.next_slope(idle, 0.020) == regime.MAX_SLOPE_MS
    top = regime.Uncontrolled(
        m_ms=regime.MAX_SLOPE_MS, c_ms=2, writers=12, p95_s=0.03, q=0.5, iops=10
    )
    assert regime.next_slope(top, 0.020) is None


def test_cis_threshold_is_half_the_uncontrolled_p95_on_a_grid_within_its_range():
    assert regime.auto_threshold(0.0265, "auto:10ms-20ms") == "13.25ms"
    assert regime.auto_threshold(0.050, "auto:10ms-20ms") == "20ms"
    assert regime.auto_threshold(0.012, "auto:10ms-20ms") == "10ms"
    assert regime.auto_threshold(0.0039) == "1.75ms"


def test_the_static_search_gallops_then_bisects_to_the_smallest_holding_class():
    made = smallest_holding(lambda k: k >= 57, start=30, max_class=88, step=5, probes=8)
    assert made == [
        (30, False),
        (35, False),
        (45, False),
        (65, True),
        (55, False),
        (60, True),
        (57, True),
        (56, False),
    ]
    assert min(k for k, ok in made if ok) == 57
    # everything holds: it walks down to class 1 and stops there
    down = smallest_holding(lambda k: True, start=10, max_class=88, step=5, probes=8)
    assert [k for k, _ in down] == [10, 5, 1]
    # nothing holds: up to the ladder's top, then it stops
    up = smallest_holding(lambda k: False, start=80, max_class=88, step=5, probes=8)
    assert [k for k, _ in up] == [80, 85, 88]


def test_each_controlled_threshold_is_judged_against_the_bounds_a_run_must_show():
    held = {
        "threshold_s": 0.020,
        "read_latency_p95_s": 0.0174,
        "target_retrans_segs": 0,
        "static": {"best": {"class": 40}},
        "sim_vs_lab_p95": 0.07,
        "vs_static_writes": 0.99,
    }
    missed = {  # over T, a retransmission, a 0.5 ms pin holds, the simulator 18 % off
        "threshold_s": 0.010,
        "read_latency_p95_s": 0.0112,
        "target_retrans_segs": 1,
        "static": {"best": {"class": 1}},
        "sim_vs_lab_p95": -0.18,
        "vs_static_writes": 1.2,
    }
    unjudged = {"threshold_s": 0.015, "read_latency_p95_s": 0.013, "target_retrans_segs": 0}
    b = regime.bounds([held, missed, unjudged])
    assert all(b["20"].values())
    assert b["10"] == {
        "p95_within_t": False,
        "no_target_retrans": False,
        "best_static_above_class_1": False,
        "sim_within": False,
        "writes_vs_static": True,
    }
    assert b["15"]["best_static_above_class_1"] is None and b["15"]["sim_within"] is None
