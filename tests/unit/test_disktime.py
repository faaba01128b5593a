"""Utilization as a signal (controller/utilization.py, headroom.py) and disk-time
reservations (controller/disktime.py, their place in groups.py), in virtual time."""

import math

import pytest

from santhrottle.controller.decide import decide
from santhrottle.controller.disktime import attribute, over_reserved, reservation_y
from santhrottle.controller.domain import (
    ControllerConfig,
    IoSample,
    ReadSample,
    Resource,
    Samples,
    UtilizationSample,
    WriteSample,
)
from santhrottle.controller.groups import Group, GroupsState, interval, regroup
from santhrottle.controller.headroom import headroom
from santhrottle.controller.ladder import Ladder
from santhrottle.controller.state import new_state
from santhrottle.controller.utilization import UtilizationState, close, observe


def test_utilization_is_the_mean_over_a_convergence_and_triggers_above_its_threshold():
    st = UtilizationState()
    observe(st, [UtilizationSample("a", 0.97), UtilizationSample("b", 0.5)])
    observe(st, [UtilizationSample("a", 0.94), UtilizationSample("b", math.nan)])
    res = {"a": _Res(Resource("a", 0.01, utilization_threshold=0.95)), "b": _Res(Resource("b", 1))}
    close(st, res)
    assert st.last == {"a": pytest.approx(0.955), "b": pytest.approx(0.25)}
    assert st.saturated == {"a"}
    close(st, res)  # a convergence without samples: nothing known
    assert st.last == {} and st.saturated == frozenset()


def test_utilization_is_busy_time_over_time_as_iostat_counts_it():
    """A ratio of sums: a late tick weighs its length; a tick above 1 (io_ticks took a
    completed IO's whole time) and the one below it add up; one clamp, at the end."""
    st = UtilizationState()
    res = {"a": _Res(Resource("a", 0.01))}
    # 0.1 s at 0.9, then a tick late by 0.2 s (0.3 s) idle: 0.09 busy s of 0.4 s
    observe(st, [UtilizationSample("a", 0.9, 0.1)])
    observe(st, [UtilizationSample("a", 0.0, 0.3)])
    close(st, res)
    assert st.last["a"] == pytest.approx(0.225)  # the mean of the ratios said 0.45
    # a 30 ms IO ending 10 ms into the next tick, counted there whole: 0.8 then 1.2
    observe(st, [UtilizationSample("a", 0.8, 0.1)])
    observe(st, [UtilizationSample("a", 1.2, 0.1)])
    close(st, res)
    assert st.last["a"] == pytest.approx(1.0)  # clamping each tick said 0.9
    observe(st, [UtilizationSample("a", 1.5, 0.1), UtilizationSample("a", math.inf, 0.1)])
    close(st, res)
    assert st.last["a"] == 1.0  # never above 1


class _Res:
    def __init__(self, r):
        self.resource = r


def _pid_run(trigger, util, seconds=4.0):
    """A resource at 8 ms against 10 ms, a writer member, busy `util` of the time."""
    st = new_state(ControllerConfig(), [Resource("vg", 0.010, utilization_threshold=trigger)])
    t = 0.0
    for i in range(round(seconds * 10)):
        t = round(t + 0.1, 6)
        ws = [WriteSample("vg", "w", 20 * 2**20)] if i % 10 == 0 else []
        us = [UtilizationSample("vg", util)]
        st, _ = decide(st, Samples([ReadSample("vg", 50, 0.008, 20 * 2**20)], ws, (), (), us), t)
    return st


def test_a_saturated_resource_counts_as_over_its_threshold():
    assert _pid_run(None, 0.99).resources["vg"].delay_class == 0  # no trigger: 8 ms is fine
    assert _pid_run(0.95, 0.90).resources["vg"].delay_class == 0  # under the trigger
    hot = _pid_run(0.95, 0.99)
    assert hot.utilization.saturated == {"vg"}
    assert hot.resources["vg"].delay_class > 0
    assert hot.effective["w"] > 0


def test_headroom_needs_the_latency_and_the_utilization_under_their_lines():
    st = new_state(ControllerConfig(promote_below_utilization=0.8), [Resource("vg", 0.010)])
    assert headroom(st, "vg") and headroom(st, "unknown")  # nothing measured yet
    st.resources["vg"].ewma.update(0.012, 0.0)
    assert not headroom(st, "vg")
    st.resources["vg"].ewma.value = 0.005
    assert headroom(st, "vg")
    st.utilization.last["vg"] = 0.85
    assert not headroom(st, "vg")
    st.utilization.last["unknown"] = 0.5
    assert headroom(st, "unknown")
    inf = new_state(ControllerConfig(), [Resource("g", math.inf)])  # grouped: observes only
    inf.resources["g"].ewma.update(1.0, 0.0)
    assert headroom(inf, "g")


def test_reservation_y_of_the_worked_example():
    assert reservation_y(0.7, 0.5, False, 1.0, 0.5, 0.5) == pytest.approx(0.5 / 0.7)
    assert reservation_y(0.3, 0.5, True, 1.0, 0.5, 0.5) == pytest.approx(0.5 / 0.3)
    # not held back, the device has time to spare: met, and a share it does not use
    assert reservation_y(0.3, 0.1, False, 0.5, 0.1, 0.1) == 1.0
    assert reservation_y(0.3, 0.1, False, 0.5, 0.3, 0.1) == pytest.approx(3.0)
    # held back: it wants its time whatever the device's utilization
    assert reservation_y(0.3, 0.1, True, 0.5, 0.1, 0.2) == pytest.approx(1 / 3)
    # utilization unknown: counted as saturated
    assert reservation_y(0.3, 0.1, False, None, 0.1, 0.1) == pytest.approx(1 / 3)


def test_over_reserved_names_the_groups_in_one_line():
    assert over_reserved([("a", 0.7, ()), ("b", 0.3, ())]) is None
    line = over_reserved([("a", 0.7, ()), ("b", 0.4, ())])
    assert line is not None and "\n" not in line
    assert "a (70 %), b (40 %)" in line and "110 %" in line
    # groups on different resources do not add up; one on every resource does
    assert over_reserved([("a", 0.7, ("vg0",)), ("b", 0.7, ("vg1",))]) is None
    line = over_reserved([("a", 0.7, ("vg0",)), ("b", 0.7, ("vg1",)), ("c", 0.4, ())])
    assert line is not None and "vg0" in line and "c (40 %), a (70 %)" in line


LADDER = Ladder()


def _ps_plant(delay_s):
    """Two closed groups of 8 IOs on a processor-sharing disk (m = 8 ms, C = 0):
    seq's IOs cost 0.02 of rand's. Each keeps 8 L / (L + d) IOs at the device; its
    share of the busy time is its share of the IOs there."""
    cost = {"seq": 0.02, "rand": 1.0}
    lo, hi = 0.0, 16.0  # the fixed point of Q = sum 8 L_g / (L_g + d_g), L_g = c_g m Q
    for _ in range(60):
        q = (lo + hi) / 2
        got = sum(8 * c * 0.008 * q / (c * 0.008 * q + delay_s[g]) for g, c in cost.items())
        lo, hi = (q, hi) if got > q else (lo, q)
    out = []
    for g, ini in (("seq", "s1"), ("rand", "r1")):
        lat = cost[g] * 0.008 * q
        x = 8 / (lat + delay_s[g])
        out.append(IoSample("vg", ini, x, x * 4096, x, lat, lat))
    return out


def test_reservations_bring_each_group_to_its_share_of_the_busy_time():
    st = GroupsState()
    specs = [Group("seq", utilization_target=0.7), Group("rand", utilization_target=0.3)]
    regroup(st, specs, {"s1": "seq", "r1": "rand"})
    interval(st, "vg", _ps_plant({"seq": 0.0, "rand": 0.0}), 1.0, LADDER, None, 1.0)
    gr = st.resources["vg"]
    assert gr.groups["seq"].busy_share == pytest.approx(0.5, abs=0.01)
    for _ in range(60):
        delays = {g: LADDER.delay_s(gs.delay_class) for g, gs in gr.groups.items()}
        interval(st, "vg", _ps_plant(delays), 1.0, LADDER, None, 1.0)
        for gs in gr.groups.values():  # the class in force reaches its target in a second
            gs.delay_class = gs.target_class
    seq, rand = gr.groups["seq"], gr.groups["rand"]
    assert seq.busy_share == pytest.approx(0.7, abs=0.035)
    assert rand.busy_share == pytest.approx(0.3, abs=0.035)
    assert rand.delay_class > 0 and seq.delay_class == 0


def test_a_reservation_it_does_not_use_goes_back_to_the_others():
    """rand reserved 0.5 and took it; now it hardly asks (device at 40 %): the share
    above its demand goes back, a change limit at a time."""
    st = GroupsState()
    regroup(st, [Group("rand", utilization_target=0.5)], {"r1": "rand", "b1": "default"})
    gr_samples = [
        IoSample("vg", "r1", 10.0, 40960.0, 10.0, 0.002, 0.002),
        IoSample("vg", "b1", 500.0, 2048000.0, 500.0, 0.002, 0.002),
    ]
    interval(st, "vg", gr_samples, 1.0, LADDER, None, 0.4)
    gr = st.resources["vg"]
    gr.groups["rand"].share, gr.groups["default"].share = 0.5, 0.5  # from its busy days
    shares = []
    for _ in range(30):
        interval(st, "vg", gr_samples, 1.0, LADDER, None, 0.4)
        shares.append(gr.groups["rand"].share)
    assert shares == sorted(shares, reverse=True) and shares[-1] < 0.05
    assert gr.groups["default"].target_class == 0  # nobody delayed for it


def test_disk_time_by_weight_capped_by_each_groups_own_busy_time():
    # taking turns, a at depth 4 for 0.3 s, b at depth 1 for 0.4 s: weights (IOs in
    # flight x time) say a 75 %, their LUNs' io_ticks say 0.3 and 0.4 s: 3/7, 4/7
    assert attribute({"a": 1.2, "b": 0.4}, {"a": 0.3, "b": 0.4}, 0.7) == pytest.approx(
        {"a": 0.3, "b": 0.4}
    )
    # overlapping all the time (both LUNs 100 % busy): processor sharing's split
    got = attribute({"seq": 8.0, "rand": 3.4}, {"seq": 1.0, "rand": 1.0}, 1.0)
    assert got == pytest.approx({"seq": 8 / 11.4, "rand": 3.4 / 11.4})
    # a group on a shared LUN has no cap; a capped group's rest goes to it
    got = attribute({"a": 3.0, "b": 1.0, "c": 1.0}, {"a": 0.2, "b": None, "c": 0.5}, 1.0)
    assert got == pytest.approx({"a": 0.2, "b": 0.4, "c": 0.4})
    # the device busier than every group's own time: the rest is nobody's
    assert attribute({"a": 1.0, "b": 1.0}, {"a": 0.1, "b": 0.2}, 0.9) == pytest.approx(
        {"a": 0.1, "b": 0.2}
    )
    assert attribute({"a": 0.0}, {"a": 0.5}, 0.5) == {}  # no IOs: no time
    assert attribute({"a": 2.0}, {"a": 0.5}, 0.0) == {"a": 2.0}  # no busy time known
    assert attribute({"a": 2.0}, {"a": None}, 0.5) == {"a": 2.0}  # no cap


def test_reservations_on_own_luns_see_the_time_each_lun_was_busy():
    """seq (its own LUN) bursts at depth 4 for 0.3 s of the second, rand (its own LUN) at
    depth 1 for the other 0.4 s; the device busy 0.7 s. The IOs' time alone gives seq
    75 % of the disk time; its LUN's io_ticks give it 0.3 of 0.7."""
    st = GroupsState()
    regroup(
        st,
        [Group("seq", utilization_target=0.5), Group("rand", utilization_target=0.5)],
        {"s1": "seq", "r1": "rand"},
    )
    ios = [
        IoSample("vg", "s1", 120.0, 120 * 4096.0, 120.0, 0.01, 0.01, 0.3),
        IoSample("vg", "r1", 40.0, 40 * 4096.0, 40.0, 0.01, 0.01, 0.4),
    ]
    interval(st, "vg", ios, 1.0, LADDER, None, 0.7)
    gr = st.resources["vg"]
    assert gr.groups["seq"].busy_share == pytest.approx(3 / 7)
    unknown = [s._replace(busy_s=None) for s in ios]
    interval(st, "vg", unknown, 1.0, LADDER, None, 0.7)
    assert gr.groups["seq"].busy_share == pytest.approx(0.75)  # the weights alone
    interval(st, "vg", ios, 1.0, LADDER, None, None)  # utilization unknown: the weights
    assert gr.groups["seq"].busy_share == pytest.approx(0.75)
