"""Groups on a resource: shares to delays, membership, idling, the tick's moves
(controller/groups.py), and their place in decide() (controller/decide.py, restate.py)."""

import pytest

from santhrottle.controller.decide import decide
from santhrottle.controller.domain import (
    ControllerConfig,
    IoSample,
    ReadSample,
    Resource,
    Samples,
    WriteSample,
)
from santhrottle.controller.groups import (
    DEFAULT_GROUP,
    GROUP_IDLE_INTERVALS,
    Group,
    GroupsState,
    advance,
    interval,
    regroup,
    share_delay_s,
)
from santhrottle.controller.ladder import Ladder
from santhrottle.controller.restate import configure_groups, remove_resource
from santhrottle.controller.state import new_state

LADDER = Ladder.linear(500, 100)
DB = Group("db", priority=2.0, latency_target_s=0.010)
BACKUP = Group("backup", priority=1.0)


def _samples(l_s=0.020, db_q=1.0, backup_q=9.0):
    """One second of IOs: db reads (q = 1), backup's writes (q = 9), at latency l_s."""
    return [
        IoSample("vg", "db1", db_q / l_s, 4096 * db_q / l_s, db_q / l_s, l_s, l_s),
        IoSample("vg", "bk1", backup_q / l_s, 131072 * backup_q / l_s, 0.0, None, l_s),
    ]


def _state():
    st = GroupsState()
    regroup(st, [DB, BACKUP], {"db1": "db", "bk1": "backup"})
    return st


def test_share_delay_of_the_worked_example():
    assert share_delay_s(0.020, 0.9, 0.8) == pytest.approx(0.0025)
    assert share_delay_s(0.020, 0.9, 0.5) == pytest.approx(0.016)
    assert share_delay_s(0.020, 0.1, 0.2) == 0.0  # a share above the demand: no delay


def test_interval_of_the_worked_example():
    st = _state()
    interval(st, "vg", _samples(), 1.0, LADDER, None)
    gr = st.resources["vg"]
    db, backup = gr.groups["db"], gr.groups["backup"]
    assert gr.overloaded
    assert db.demand == pytest.approx(0.1) and backup.demand == pytest.approx(0.9)
    assert db.y == pytest.approx(0.5) and backup.y is None  # no target: y = 1 in the claims
    assert db.share == pytest.approx(0.2) and backup.share == pytest.approx(0.8)
    assert backup.delay_s == pytest.approx(0.0025) and backup.target_class == 5
    assert db.target_class == 0
    assert db.pwfte == pytest.approx(1.0)  # 2 x (1 - 0.5)
    assert db.members == frozenset({"db1"})


def test_shares_keep_moving_while_db_is_short_and_the_ticks_apply_them():
    st = _state()
    rise_to = [min(k + 4, 100) for k in range(101)]
    for _ in range(4):
        interval(st, "vg", _samples(), 1.0, LADDER, None)
        for _ in range(10):
            advance(st, rise_to, 1, LADDER)
    backup = st.resources["vg"].groups["backup"]
    assert backup.share < 0.6
    assert backup.delay_class == backup.target_class > 5
    assert st.class_by_initiator() == {"bk1": backup.delay_class}


def test_advance_ramps_up_and_decreases_gradually():
    st = _state()
    interval(st, "vg", _samples(), 1.0, LADDER, None)
    backup = st.resources["vg"].groups["backup"]
    backup.target_class = 20
    rise_to = [min(k + 3, 100) for k in range(101)]
    moved = advance(st, rise_to, 2, LADDER)
    assert backup.delay_class == 3 and moved == {"vg": {"bk1"}}
    backup.delay_class, backup.target_class = 20, 0
    advance(st, rise_to, 2, LADDER)
    assert backup.delay_class == 18


def test_paused_a_group_sees_no_delay_and_nothing_is_decided():
    """The daemon paused (applied False): the class in force is not in the latency the
    group sees, as the data path applies none, and the shares and classes stay; applied
    again, the delay is in it."""
    for applied, seen in ((False, 0.020), (True, 0.020 + LADDER.delay_s(20))):
        st = _state()
        interval(st, "vg", _samples(), 1.0, LADDER, None)
        backup = st.resources["vg"].groups["backup"]
        backup.delay_class = backup.target_class = 20
        share_db = st.resources["vg"].groups["db"].share
        st.applied = applied
        for _ in range(10):
            advance(st, list(range(1, 102)), 1, LADDER)
        interval(st, "vg", _samples(), 1.0, LADDER, None)
        assert backup.latency_s == pytest.approx(seen)  # its IOs' 20 ms (+ the delay)
        db = st.resources["vg"].groups["db"]
        assert db.latency_s == pytest.approx(0.020) and db.y == pytest.approx(0.5)
        assert db.pwfte == pytest.approx(1.0)  # priority 2 x (1 - 0.5)
        if not applied:  # nothing decided: db's share stays short of what it asks
            assert (db.share, backup.target_class) == (share_db, 20)
        else:
            assert db.share > share_db


def test_ungrouped_initiators_form_the_default_group():
    st = _state()
    extra = IoSample("vg", "other", 100.0, 1e6, 0.0, None, 0.020)
    interval(st, "vg", [*_samples(), extra], 1.0, LADDER, None)
    gr = st.resources["vg"]
    assert gr.groups[DEFAULT_GROUP].members == frozenset({"other"})
    assert sum(g.share for g in gr.groups.values()) == pytest.approx(1.0)


def test_an_idle_group_keeps_its_share_then_leaves():
    st = _state()
    for _ in range(3):
        interval(st, "vg", _samples(), 1.0, LADDER, None)
    backup = st.resources["vg"].groups["backup"]
    kept = backup.share
    only_db = _samples()[:1]
    interval(st, "vg", only_db, 1.0, LADDER, None)
    assert backup.share == kept and backup.idle_intervals == 1  # a pause
    for _ in range(GROUP_IDLE_INTERVALS):
        interval(st, "vg", only_db, 1.0, LADDER, None)
    assert backup.share == 0.0 and backup.target_class == 0  # gone
    for _ in range(100):
        advance(st, list(range(1, 102)), 1, LADDER)
    assert "backup" not in st.resources["vg"].groups


def test_no_latency_holds_everything():
    st = _state()
    interval(st, "vg", [IoSample("vg", "bk1", 10.0, 1e5, 0.0)], 1.0, LADDER, None)
    assert st.resources["vg"].groups == {}


def test_a_removed_group_leaves_and_its_initiators_fall_to_default():
    st = _state()
    interval(st, "vg", _samples(), 1.0, LADDER, None)
    regroup(st, [DB], {"db1": "db"})
    interval(st, "vg", _samples(), 1.0, LADDER, None)
    gr = st.resources["vg"]
    assert gr.groups["backup"].share == 0.0
    assert gr.groups[DEFAULT_GROUP].members == frozenset({"bk1"})


CFG = ControllerConfig(ladder=LADDER, class_increase_max_ratio_per_tick=0.0)


def test_step_on_a_grouped_resource_delays_the_group_not_the_sets():
    st = new_state(CFG, [Resource("vg", 0.010)])
    configure_groups(st, [DB, BACKUP], {"db1": "db", "bk1": "backup"}, ["vg"])
    classes = {}
    for k in range(1, 41):
        t = k * 0.1
        ios = _samples() if k % 10 == 0 else []
        st, d = decide(
            st,
            Samples(
                [ReadSample("vg", 20, 0.020)],
                [WriteSample("vg", "bk1", 50e6)],
                ios=ios,
            ),
            t,
        )
        classes.update(d.initiator_classes)
    assert st.resources["vg"].delay_class == 0  # the PID does not act on a grouped resource
    assert classes.get("bk1", 0) > 0 and "db1" not in classes
    assert st.effective_class("bk1") == st.groups.resources["vg"].groups["backup"].delay_class


def test_configure_groups_hands_a_resource_over_and_back():
    st = new_state(CFG, [Resource("vg", 0.010)])
    st, _ = decide(st, Samples(writes=[WriteSample("vg", "bk1", 50e6)]), 0.0)
    st, _ = decide(st, Samples([ReadSample("vg", 20, 0.030)]), 0.1)
    assert st.effective_class("bk1") > 0  # the PID throttles it
    changed = configure_groups(st, [BACKUP], {"bk1": "backup"}, ["vg"])
    assert changed == {"bk1": 0} and st.resources["vg"].delay_class == 0
    interval(st.groups, "vg", _samples(), 1.0, LADDER, None)
    st.groups.resources["vg"].groups["backup"].target_class = 7
    st, d = decide(st, Samples(), 0.2)  # a tick: the group's class comes into force
    assert d.initiator_classes == {"bk1": 7}
    assert configure_groups(st, [], {}, []) == {"bk1": 0}  # back to the PID, at 0
    assert "vg" not in st.groups.resources and st.grouped == frozenset()


def test_ios_without_groups_change_nothing():
    a = new_state(CFG, [Resource("vg", 0.010)])
    b = new_state(CFG, [Resource("vg", 0.010)])
    for k in range(30):
        t = k * 0.1
        s = Samples([ReadSample("vg", 20, 0.020 + 0.001 * k)], [WriteSample("vg", "w", 9e6)])
        a, da = decide(a, s, t)
        b, db = decide(b, Samples(s.reads, s.writes, ios=_samples()), t)
        assert da == db
    assert not b.ios


def test_a_removed_resource_takes_its_group_classes_with_it():
    st = new_state(CFG, [Resource("vg", 0.010)])
    configure_groups(st, [BACKUP], {"bk1": "backup"}, ["vg"])
    interval(st.groups, "vg", _samples(), 1.0, LADDER, None)
    st.groups.resources["vg"].groups["backup"].target_class = 7
    st, _ = decide(st, Samples(), 0.1)
    assert st.effective_class("bk1") == 7
    assert remove_resource(st, "vg") == {"bk1": 0}
    assert "vg" not in st.groups.resources
