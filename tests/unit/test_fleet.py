"""controller/fleet.py: merging appliances' samples, fresh reports, the leaders' fence."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from santhrottle.controller.domain import (
    DeviceSample,
    IoSample,
    ReadSample,
    Samples,
    WriteSample,
)
from santhrottle.controller.fleet import (
    STALE_SAMPLES_S,
    Decision,
    DecisionFence,
    Report,
    fresh,
    leader_decision,
    merge,
)


def test_worked_example():
    a = Samples([ReadSample("vg", 30, 0.012, 7e6)], [WriteSample("vg", "h1", 7e6)])
    b = Samples([ReadSample("vg", 10, 0.008, 3e6)], [WriteSample("vg", "h1", 3e6)])
    m = merge([a, b])
    assert m.reads == [ReadSample("vg", 40, pytest.approx(0.011), pytest.approx(10e6))]
    assert m.writes == [WriteSample("vg", "h1", pytest.approx(10e6))]


def test_one_part_is_itself():
    s = Samples(
        [ReadSample("vg", 5, 0.01, 1e6, 2)],
        [WriteSample("vg", "h1", 1e6)],
        [DeviceSample("vg", 50, 0.004, 1.5)],
        [IoSample("vg", "h1", 50.0, 4096.0 * 50, 5.0, 0.01, 0.004)],
    )
    assert merge([s]) == s


def test_empty():
    assert merge([]) == Samples([], [], [], [])
    assert merge([Samples(), Samples()]) == Samples([], [], [], [])


def test_no_reads_anywhere_is_zero_reads_zero_latency():
    m = merge([Samples([ReadSample("vg", 0, 0.5, 2e6)]), Samples([ReadSample("vg", 0, 0.0)])])
    assert m.reads == [ReadSample("vg", 0, 0.0, 2e6, None)]


def test_parts_without_reads_do_not_weigh():
    m = merge([Samples([ReadSample("vg", 0, 0.9)]), Samples([ReadSample("vg", 4, 0.01)])])
    assert m.reads[0].reads == 4 and m.reads[0].read_latency_s == pytest.approx(0.01)


def test_write_bps_none_only_if_nobody_knows():
    none = merge([Samples([ReadSample("vg", 1, 0.01)]), Samples([ReadSample("vg", 1, 0.02)])])
    assert none.reads[0].write_bps is None
    some = merge([Samples([ReadSample("vg", 1, 0.01, 5e5)]), Samples([ReadSample("vg", 1, 0.02)])])
    assert some.reads[0].write_bps == 5e5


def test_reads_in_flight_summed_where_known():
    m = merge(
        [
            Samples([ReadSample("vg", 0, 0.0, None, 2)]),
            Samples([ReadSample("vg", 0, 0.0, None, None)]),
            Samples([ReadSample("vg", 0, 0.0, None, 1)]),
        ]
    )
    assert m.reads[0].reads_in_flight == 3


def test_devices_and_ios_weighted():
    m = merge(
        [
            Samples(
                devices=[DeviceSample("vg", 30, 0.010, 1.0)],
                ios=[IoSample("vg", "h", 30.0, 3e5, 10.0, 0.020, 0.010)],
            ),
            Samples(
                devices=[DeviceSample("vg", 10, 0.002, 0.5)],
                ios=[IoSample("vg", "h", 10.0, 1e5, 0.0, None, 0.002)],
            ),
        ]
    )
    assert m.devices == [DeviceSample("vg", 40, pytest.approx(0.008), 1.5)]
    io = m.ios[0]
    assert (io.ios, io.bytes, io.reads) == (40.0, 4e5, 10.0)
    assert io.read_latency_s == pytest.approx(0.020)  # the part without reads does not weigh
    assert io.latency_s == pytest.approx(0.008)
    unknown = merge([Samples(ios=[IoSample("vg", "h", 1.0, 1.0, 0.0)])] * 2)
    assert unknown.ios[0].read_latency_s is None and unknown.ios[0].latency_s is None


def test_order_is_deterministic():
    a = Samples(
        [ReadSample("vg2", 1, 0.01), ReadSample("vg1", 1, 0.01)],
        [WriteSample("vg2", "b", 1.0), WriteSample("vg1", "z", 1.0)],
    )
    b = Samples([ReadSample("vg1", 2, 0.02)], [WriteSample("vg1", "a", 1.0)])
    m1, m2 = merge([a, b]), merge([b, a])
    assert [r.resource for r in m1.reads] == ["vg1", "vg2"]
    assert [(w.resource, w.initiator) for w in m1.writes] == [
        ("vg1", "a"),
        ("vg1", "z"),
        ("vg2", "b"),
    ]
    assert m1.writes == m2.writes
    assert [(r.resource, r.reads) for r in m1.reads] == [(r.resource, r.reads) for r in m2.reads]


@st.composite
def split_samples(draw):
    """One appliance's tick (per resource its reads' latencies, per pair a write rate), and
    the same traffic split over 1-4 appliances."""
    n = draw(st.integers(1, 4))
    resources = draw(st.lists(st.sampled_from(["vg0", "vg1", "vg2"]), min_size=1, unique=True))
    whole_reads, whole_writes = [], []
    parts = [([], []) for _ in range(n)]
    lat = st.floats(1e-4, 1.0, allow_nan=False)
    for r in resources:
        lats = draw(st.lists(lat, min_size=1, max_size=20))
        where = draw(st.lists(st.integers(0, n - 1), min_size=len(lats), max_size=len(lats)))
        whole_reads.append(ReadSample(r, len(lats), sum(lats) / len(lats)))
        for p in range(n):
            mine = [x for x, w in zip(lats, where, strict=True) if w == p]
            if mine:
                parts[p][0].append(ReadSample(r, len(mine), sum(mine) / len(mine)))
        for ini in draw(st.lists(st.sampled_from(["h1", "h2", "h3"]), unique=True)):
            bps = draw(st.floats(0.0, 1e9, allow_nan=False))
            fr = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
            total = sum(fr) or 1.0
            whole_writes.append(WriteSample(r, ini, bps))
            for p in range(n):
                parts[p][1].append(
                    WriteSample(r, ini, bps * (fr[p] / total) if sum(fr) else bps / n)
                )
    return Samples(whole_reads, whole_writes), [Samples(rs, ws) for rs, ws in parts]


@settings(max_examples=200, deadline=None)
@given(split_samples())
def test_merging_a_split_gives_back_the_totals(case):
    whole, parts = case
    m = merge(parts)
    want_r = {r.resource: r for r in whole.reads}
    assert sorted(want_r) == [r.resource for r in m.reads]
    for r in m.reads:
        assert r.reads == want_r[r.resource].reads
        assert math.isclose(r.read_latency_s, want_r[r.resource].read_latency_s, rel_tol=1e-9)
    want_w = {(w.resource, w.initiator): w.write_bps for w in whole.writes}
    assert sorted(want_w) == [(w.resource, w.initiator) for w in m.writes]
    for w in m.writes:
        assert math.isclose(
            w.write_bps, want_w[(w.resource, w.initiator)], rel_tol=1e-9, abs_tol=1e-6
        )


def test_fence_orders_epoch_then_seq():
    f = DecisionFence()
    assert f.accept("vg", 3, 41)
    assert not f.accept("vg", 2, 977)  # a deposed leader, however far its seq
    assert not f.accept("vg", 3, 41)  # a duplicate
    assert not f.accept("vg", 3, 40)  # reordered
    assert f.accept("vg", 3, 42)
    assert f.accept("vg", 4, 0)  # a new leader starts its seqs again
    assert f.accept("other", 1, 0)  # per resource
    assert f.refused == 3


def test_fence_keeps_the_last_classes_and_takes_the_max_over_resources():
    f = DecisionFence()
    assert f.offer(Decision("vg1", 1, 1, {"h1": 10, "h2": 0}))
    assert f.offer(Decision("vg2", 5, 1, {"h1": 4, "h3": 7}))
    assert not f.offer(Decision("vg1", 0, 9, {"h1": 88}))  # stale: ignored, classes kept
    assert f.initiator_classes() == {"h1": 10, "h3": 7}
    assert f.offer(Decision("vg1", 1, 2, {}))  # vg1 no longer throttles anybody
    assert f.initiator_classes() == {"h1": 4, "h3": 7}
    f.forget("vg2")
    assert f.initiator_classes() == {}
    assert f.accept("vg2", 0, 0)  # a forgotten resource's fence starts over


def test_leader_decision_names_every_member():
    d = leader_decision("vg", 2, 7, {"h2", "h1"}, {"h1": 12, "h9": 3})
    assert d == Decision("vg", 2, 7, {"h1": 12, "h2": 0})


def test_fresh_drops_old_reports_and_keeps_the_newest_per_appliance():
    s = Samples()
    reports = [
        Report("b", 8, 10.0, s),
        Report("a", 5, 9.9, s),
        Report("a", 6, 10.0, s),
        Report("c", 2, 10.0 - STALE_SAMPLES_S - 0.01, s),  # dead appliance
    ]
    got = fresh(reports, 10.05)
    assert [(r.appliance, r.seq) for r in got] == [("a", 6), ("b", 8)]
    assert [r.appliance for r in fresh(reports, 10.05, stale_s=10.0)] == ["a", "b", "c"]
    assert fresh(reports, 100.0) == []


def test_a_follower_moves_toward_the_leaders_class_as_decide_moves_a_class():
    """follow(): up by the ramp, down one class a tick (the decrease limit), the PID
    continuing from the class it got, the members' effective classes along."""
    from santhrottle.controller.decide import decide
    from santhrottle.controller.domain import ControllerConfig, Resource
    from santhrottle.controller.fleet import follow
    from santhrottle.controller.ramp import move_toward
    from santhrottle.controller.state import new_state

    c = ControllerConfig()
    s = new_state(c, [Resource("vg", 0.010)])
    s, _ = decide(s, Samples(writes=[WriteSample("vg", "h1", 8e6)]), 0.0)
    s, _ = decide(s, Samples(writes=[WriteSample("vg", "h1", 8e6)]), 1.0)  # h1 joins
    assert s.members("vg") == {"h1"}
    seen = []
    for _ in range(30):
        before = s.resources["vg"].delay_class
        changed = follow(s, "vg", 40)
        k = s.resources["vg"].delay_class
        assert k == move_toward(before, 40, s.rise_to, c.class_decrease_max_per_tick)
        assert s.resources["vg"].pid.delay_class == k  # the PID continues from it
        if k != before:
            assert changed  # h1 follows, through its own ramp
        seen.append(k)
    assert seen[0] == s.rise_to[0] and seen[-1] == 40 and seen == sorted(seen)
    assert follow(s, "vg", 37) and s.resources["vg"].delay_class == 39  # down one a tick
    assert follow(s, "vg", 10**6) is not None and s.resources["vg"].delay_class <= c.max_class
    assert follow(s, "vg", s.resources["vg"].delay_class) == {}  # no move, no change


def test_move_toward_is_the_ramp_up_and_the_decrease_limit_down():
    from santhrottle.controller.domain import ControllerConfig
    from santhrottle.controller.ramp import move_toward, rise_table

    rise_to = rise_table(ControllerConfig())
    assert move_toward(20, 60, rise_to, 1) == rise_to[20] == 25  # 10 ms x 1.25: 12.5 ms
    assert move_toward(20, 21, rise_to, 1) == 21
    assert move_toward(20, 5, rise_to, 1) == 19
    assert move_toward(20, 5, rise_to, 0) == 5  # no limit
    assert move_toward(20, 5, rise_to, 3) == 17
    assert move_toward(20, 20, rise_to, 1) == 20
