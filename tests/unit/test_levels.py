"""Elastic levels (controller/levels.py): promote, demote, hold, the cap as a delay, and
their place in decide() (headroom.py, effective.py), in virtual time."""

import pytest

from santhrottle.controller.decide import decide
from santhrottle.controller.domain import (
    ControllerConfig,
    IoSample,
    ReadSample,
    Resource,
    Samples,
    UtilizationSample,
    WriteSample,
)
from santhrottle.controller.groups import Group
from santhrottle.controller.ladder import Ladder
from santhrottle.controller.levels import (
    DEMOTE_AFTER_INTERVALS,
    Levels,
    LevelsError,
    LevelsState,
    LevelState,
    advance,
    interval,
)
from santhrottle.controller.ramp import rise_table
from santhrottle.controller.restate import configure_groups
from santhrottle.controller.state import new_state

LADDER = Ladder()
IOPS = Levels((600.0, 1200.0, 2400.0, 4800.0))


def _state(*levels: Levels) -> LevelsState:
    st = LevelsState()
    st.configure({"t": levels or (IOPS,)})
    return st


def _one(st, rate, lat=0.002, headroom=True, delay=0.0, reads=None, nbytes=4096.0):
    """One interval of one initiator of group t at `rate` IOs/s."""
    reads = rate if reads is None else reads
    s = IoSample("vg", "10.0.0.1", rate, rate * nbytes, reads, lat, lat)
    interval(st, {"10.0.0.1": "t"}, [s], 1.0, LADDER, lambda r: headroom, lambda i: delay)
    return st.groups["t"]


def test_the_worked_example():
    st = _state()
    ls = _one(st, 1500.0)  # depth 3 at 2 ms, headroom
    assert ls.ladders[0].level == 1 and ls.ladders[0].promotions == 1
    assert ls.delay_s == 0.0  # rising: not held back
    ls = _one(st, 1500.0, headroom=False)
    assert ls.ladders[0].level == 1
    assert ls.delay_s == pytest.approx(0.0005)  # q = 3 IOs, 3 / 1200 - 2 ms
    assert ls.target_class == 1
    ls = _one(st, 1200.0, delay=0.0005)  # 3 / 2.5 ms: at its cap, headroom again
    assert ls.ladders[0].level == 2
    assert ls.delay_s == 0.0 and ls.target_class == 0
    # under 0.8 x 1,200 = 960: demoted after two intervals
    _one(st, 900.0)
    assert ls.ladders[0].level == 2
    _one(st, 900.0)
    assert ls.ladders[0].level == 1 and ls.ladders[0].demotions == 1


def test_at_most_one_level_per_decision_and_not_past_the_top():
    st = _state()
    for want in (1, 2, 3, 3, 3):
        ls = _one(st, 100_000.0)
        assert ls.ladders[0].level == want
    assert ls.ladders[0].promotions == 3


def test_no_headroom_no_promotion_but_the_cap_holds():
    st = _state()
    ls = _one(st, 3000.0, lat=0.002, headroom=False)
    assert ls.ladders[0].level == 0 and not ls.headroom
    # q = 3000 x 2 ms = 6 IOs: 6 / 600 - 2 ms = 8 ms
    assert ls.delay_s == pytest.approx(0.008)
    assert LADDER.delay_s(ls.target_class) >= 0.008 > LADDER.delay_s(ls.target_class - 1)


def test_hysteresis_between_the_lines():
    st = _state()
    _one(st, 700.0)  # 700 >= 540: level 1 (cap 1,200)
    ls = _one(st, 500.0)  # between 0.8 x 600 = 480 and 0.9 x 1,200: hold
    assert ls.ladders[0].level == 1 and ls.ladders[0].below == 0
    for _ in range(DEMOTE_AFTER_INTERVALS - 1):
        _one(st, 100.0)
    assert ls.ladders[0].level == 1
    _one(st, 700.0)  # back above the line: the count starts again
    for _ in range(DEMOTE_AFTER_INTERVALS - 1):
        _one(st, 100.0)
    assert ls.ladders[0].level == 1
    _one(st, 100.0)
    assert ls.ladders[0].level == 0


def test_an_idle_group_is_demoted_level_by_level_and_released():
    st = _state()
    for _ in range(3):
        _one(st, 100_000.0, delay=0.001)
    ls = st.groups["t"]
    assert ls.ladders[0].level == 3
    levels = []
    for _ in range(3 * DEMOTE_AFTER_INTERVALS):
        interval(st, {}, [], 1.0, LADDER, lambda r: True, lambda i: 0.0)
        levels.append(ls.ladders[0].level)
    assert levels == [3, 2, 2, 1, 1, 0]
    assert ls.target_class == 0


def test_a_closed_stream_is_held_at_its_cap():
    """A closed stream of depth 16 at L = 2 ms (8,000 IOPS uncapped), no headroom:
    its level 0 cap of 600 holds from the first decision on."""
    st = _state()
    rate, delay = 16 / 0.002, 0.0
    for _ in range(4):
        ls = _one(st, rate, headroom=False, delay=delay)
        delay = LADDER.delay_s(ls.target_class)
        rate = 16 / (0.002 + delay)
        assert 0.9 * 600 <= rate <= 600.0
    assert ls.ladders[0].level == 0


def test_an_open_stream_is_capped_once_it_queues():
    """Arrivals at 3,000/s with at most 32 outstanding: the delay grows by the rate's
    ratio to the cap every interval until the initiator's queue fills."""
    st = _state()
    delay, delays = 0.0, []
    for _ in range(12):
        rate = min(3000.0, 32 / (0.002 + delay))
        ls = _one(st, rate, headroom=False, delay=delay)
        delay = LADDER.delay_s(ls.target_class)
        delays.append(delay)
    assert delays == sorted(delays[:7]) + delays[7:]  # rises while unqueued
    assert min(3000.0, 32 / (0.002 + delay)) <= 600.0  # capped in the end
    assert 32 / 600 - 0.002 <= delay <= (32 / 600 - 0.002) * 1.1


def test_the_largest_cap_delay_wins_and_directions_count_their_own_ios():
    reads = Levels((100.0, 200.0), direction="read")
    writes = Levels((1000.0,), direction="write")
    mib = Levels((1.0 * 2**20,), measure="bandwidth")
    st = _state(reads, writes, mib)
    # 500 IOs/s of 64 KiB, 400 of them reads: reads 400 (cap 100 -> 200), writes 100
    ls = _one(st, 500.0, reads=400.0, nbytes=65536.0)
    r, w, b = ls.ladders
    assert (r.rate, w.rate) == (400.0, 100.0)
    assert b.rate == pytest.approx(500 * 65536.0)
    assert r.level == 1 and w.level == 0 and b.level == 0
    assert ls.delay_s == max(r.delay_s, w.delay_s, b.delay_s) > 0.0
    assert w.delay_s == 0.0  # 100 writes under a cap of 1,000


def test_levels_are_checked():
    for bad in [(), (0.0,), (100.0, 100.0), (200.0, 100.0)]:
        with pytest.raises(LevelsError):
            Levels(bad)
    with pytest.raises(LevelsError):
        Levels((1.0,), measure="ops")
    assert Levels((1.0,), direction="write", measure="bandwidth").name == "write_bandwidth"


def test_configure_keeps_unchanged_levels_and_drops_the_rest():
    st = _state()
    _one(st, 100_000.0)
    assert st.groups["t"].ladders[0].level == 1
    assert st.configure({"t": (IOPS,)}) == set()
    assert st.groups["t"].ladders[0].level == 1
    st.configure({"t": (Levels((10.0, 20.0)),)})
    assert st.groups["t"].ladders[0].level == 0
    assert st.configure({}) == {"10.0.0.1"}
    assert st.groups == {}


def test_advance_moves_the_class_by_the_ramp():
    st = LevelsState()
    st.groups["t"] = LevelState(target_class=30, members=frozenset({"a"}))
    rise = rise_table(ControllerConfig())
    seen = []
    while st.groups["t"].delay_class < 30:
        assert advance(st, rise, 1) == {"a"}
        seen.append(st.groups["t"].delay_class)
    assert seen[:3] == [2, 4, 6] and len(seen) > 5
    st.groups["t"].target_class = 0
    advance(st, rise, 1)
    assert st.groups["t"].delay_class == 29


def _ctl(threshold_s=0.010):
    c = ControllerConfig()
    st = new_state(c, [Resource("vg", threshold_s)])
    configure_groups(st, [Group("t", levels=(IOPS,))], {"10.0.0.1": "t"}, [])
    return st


def _run(st, seconds, depth, lat, util=None, t0=0.0, writes=0.0):
    """Ticks of 100 ms for `seconds`; each second an IoSample of a closed stream of
    `depth` at `lat`, delayed by its class in force."""
    t = t0
    for i in range(round(seconds * 10)):
        t = round(t + 0.1, 6)
        rate = depth / (lat + LADDER.delay_s(st.effective.get("10.0.0.1", 0)))
        ios = [IoSample("vg", "10.0.0.1", rate, rate * 4096, rate, lat, lat)] if i % 10 == 9 else []
        ws = [WriteSample("vg", "10.0.0.1", writes)] if i % 10 == 9 else []
        us = [UtilizationSample("vg", util)] if util is not None else []
        st, _ = decide(st, Samples([ReadSample("vg", 50, lat, writes)], ws, (), ios, us), t)
    return st, t


def test_in_decide_a_level_caps_a_group_whose_resource_keeps_its_pid():
    st = _ctl()
    assert st.grouped == frozenset()  # levels alone: the PID keeps the resource
    st, t = _run(st, 5, 12, 0.002, util=0.95)  # no headroom: utilization 0.95
    ls = st.levels.groups["t"]
    assert ls.ladders[0].level == 0 and ls.target_class > 0
    assert st.effective.get("10.0.0.1", 0) == ls.delay_class > 0
    assert 12 / (0.002 + LADDER.delay_s(ls.delay_class)) <= 600.0 + 1e-9  # capped
    st, t = _run(st, 5, 12, 0.002, util=0.5, t0=t)  # headroom: up a level a second
    assert ls.ladders[0].level == 3 and ls.ladders[0].promotions == 3
    assert ls.target_class <= 1  # 12 / 2 ms = 6,000 IOPS: 4,800 asks 0.5 ms at most


def test_in_decide_the_latency_over_the_threshold_stops_promotions():
    st = _ctl(threshold_s=0.001)
    st, _ = _run(st, 3, 12, 0.002, util=0.5)
    assert st.levels.groups["t"].ladders[0].level == 0


def test_in_decide_the_effective_class_is_the_max_of_the_pid_and_the_level():
    st = _ctl(threshold_s=0.010)
    st, _t = _run(st, 5, 12, 0.030, util=0.5, writes=20 * 2**20)  # PID throttles
    pid = st.resources["vg"].delay_class
    lvl = st.levels.groups["t"].delay_class
    assert pid > 0
    assert st.effective["10.0.0.1"] == max(pid, lvl)


def _run_sparse(st, seconds, depth, lat, every_s, batches=1, t0=0.0):
    """As _run, with no headroom (utilization 0.95), but the sensor's convergence comes
    every `every_s` seconds (the daemon's worker, late), bringing `batches` batches,
    each scaled to one convergence, and saying so (Samples.io_batches)."""
    t = t0
    every = round(every_s * 10)
    for i in range(round(seconds * 10)):
        t = round(t + 0.1, 6)
        rate = depth / (lat + LADDER.delay_s(st.effective.get("10.0.0.1", 0)))
        n = batches if i % every == every - 1 else 0
        ios = [IoSample("vg", "10.0.0.1", rate, rate * 4096, rate, lat, lat)] * n
        us = [UtilizationSample("vg", 0.95)]
        samples = Samples([ReadSample("vg", 50, lat, 0.0)], [], (), ios, us, io_batches=n)
        st, _ = decide(st, samples, t)
    return st, t


def test_a_convergence_without_the_sensors_ios_holds_the_levels():
    """A worker that converges every 3 s: the two convergences between its IoSamples
    read no rate of 0 (no demotion, no release of the cap's delay)."""
    st = _ctl()
    st, _ = _run_sparse(st, 12, 12, 0.002, every_s=3.0)
    ls = st.levels.groups["t"]
    assert ls.ladders[0].demotions == 0 and ls.ladders[0].rate > 0.0
    assert ls.target_class > 0 and st.effective.get("10.0.0.1", 0) == ls.delay_class
    assert 12 / (0.002 + LADDER.delay_s(ls.delay_class)) <= 600.0 + 1e-9  # capped


def test_two_sensor_convergences_in_one_are_averaged():
    one, _ = _run_sparse(_ctl(), 3, 12, 0.002, every_s=1.0, batches=1)
    two, _ = _run_sparse(_ctl(), 3, 12, 0.002, every_s=1.0, batches=2)
    assert two.levels.groups["t"].ladders[0].rate == pytest.approx(
        one.levels.groups["t"].ladders[0].rate
    )
