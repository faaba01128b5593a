import dataclasses
import itertools
import math
import random

import pytest

from santhrottle.controller.decide import (
    RELEASE_FLOOR_TICKS,
    RESUME_AFTER_TICKS,
    RESUME_HOLD_S,
    decide,
)
from santhrottle.controller.domain import (
    ControllerConfig,
    PidGains,
    ReadSample,
    Resource,
    Samples,
    WriteSample,
)
from santhrottle.controller.futile import FUTILE_BACKOFF_S
from santhrottle.controller.ladder import Ladder
from santhrottle.controller.ramp import rise
from santhrottle.controller.restate import remove_resource
from santhrottle.controller.state import new_state

MIB = 1024.0 * 1024.0
CFG = ControllerConfig(
    law="paper",  # hand-computable in classes (the log law: test_logpid.py)
    ladder=Ladder.linear(500, 100),
    gains=PidGains(4.0, 0.5, 0.0),  # relative error: = 400 classes/s of error at 10 ms
    read_ewma_tau_s=0.0,  # the PID sees the raw sample: hand-computable
    setpoint_fraction=1.0,
    class_hysteresis=0.0,
    class_decrease_max_per_tick=0,  # decreases at once (tested on its own below)
    class_increase_max_ratio_per_tick=0.0,  # increases at once (the ramp, below)
)


def writes(resource, *initiators, rate=10 * MIB):
    return [WriteSample(resource, i, rate) for i in initiators]


def test_pid_tick_and_effective_class_of_a_member():
    st = new_state(CFG, [Resource("vg", 0.010)])
    st, d = decide(st, Samples(writes=writes("vg", "A")), 0.0)  # converge: A joins
    assert d.converged and d.joined == {"vg": {"A"}}
    st, d = decide(st, Samples([ReadSample("vg", 6, 0.014)]), 0.1)
    # pid.py's worked example, first update: u = 1.92 -> class 2
    assert d.ticked and d.resource_classes == {"vg": 2}
    assert d.initiator_classes == {"A": 2}
    assert st.effective_class("A") == 2


def test_max_over_resources():
    st = new_state(CFG, [Resource("vg1", 0.010), Resource("vg2", 0.010)])
    st, _ = decide(st, Samples(writes=writes("vg1", "A", "B") + writes("vg2", "A")), 0.0)
    # vg1 slightly over (class 2), vg2 far over (larger class)
    st, d = decide(st, Samples([ReadSample("vg1", 6, 0.014), ReadSample("vg2", 6, 0.030)]), 0.1)
    c1, c2 = d.resource_classes["vg1"], d.resource_classes["vg2"]
    assert c1 == 2 and c2 > c1
    assert d.initiator_classes == {"A": c2, "B": c1}
    # B leaves vg1's hot spot when vg1 is fine; A keeps vg2's class
    st, d = decide(st, Samples([ReadSample("vg1", 6, 0.001), ReadSample("vg2", 6, 0.030)]), 0.2)
    assert st.resources["vg1"].delay_class == 0
    assert st.effective_class("B") == 0 and d.initiator_classes["B"] == 0
    assert st.effective_class("A") == st.resources["vg2"].delay_class


@pytest.mark.parametrize("seed", range(5))
def test_every_initiator_has_the_max_of_its_resources_classes_or_ramps_to_it(seed):
    """Writers join and leave random sets of resources while the classes move: an
    initiator not rising has the max of its resources' classes, a rising one less."""
    rng = random.Random(seed)
    cfg = dataclasses.replace(CFG, class_increase_max_ratio_per_tick=1.25)
    names = [f"vg{i}" for i in range(6)]
    inis = [f"h{i}" for i in range(30)]
    st = new_state(cfg, [Resource(n, 0.010) for n in names])
    loads = {i: set(rng.sample(names, rng.choice((1, 1, 2, 3)))) for i in inis}
    for k in range(200):
        t = round(k * cfg.tick_s, 6)
        if k % 25 == 0:  # some writers move
            for i in rng.sample(inis, 5):
                loads[i] = set(rng.sample(names, rng.choice((0, 1, 1, 2))))
        ws = [WriteSample(r, i, 10 * MIB) for i, rs in loads.items() for r in sorted(rs)]
        reads = [ReadSample(n, 6, rng.uniform(0.002, 0.030)) for n in names]
        st, _ = decide(st, Samples(reads, ws if k % 10 == 0 else ()), t)
        for i in inis:
            want = max(
                (st.resources[r].delay_class for r in st.write_sets.member_of.get(i, ())),
                default=0,
            )
            if i in st.rising:
                assert 0 <= st.effective_class(i) < want, (k, i)
            else:
                assert st.effective_class(i) == want, (k, i)
        assert st.write_sets.multi == {
            i for i, rs in st.write_sets.member_of.items() if len(rs) > 1
        }
        for r, members in st.write_sets.members.items():  # the split follow_resources reads
            alone, shared = st.write_sets.split(r)
            assert sorted(alone + shared) == sorted(members), (k, r)
            assert not set(alone) & st.write_sets.multi and set(shared) <= st.write_sets.multi


def test_two_cadences_fixed_rate():
    st = new_state(CFG, [Resource("vg", 0.010)])
    ticks = converges = 0
    t = 0.0
    for _ in range(100):  # called every 50 ms for 5 s
        st, d = decide(st, Samples(), t)
        ticks += d.ticked
        converges += d.converged
        t = round(t + 0.05, 6)
    assert ticks == 50 and converges == 5


def test_late_call_counts_missed_ticks_and_does_not_bunch():
    st = new_state(CFG, [Resource("vg", 0.010)])
    st, _ = decide(st, Samples(), 0.0)
    st, d = decide(st, Samples(), 0.35)  # due at 0.1, 0.2, 0.3: one run, two missed
    assert d.ticked and d.late_ticks == 2
    st, d = decide(st, Samples(), 0.36)  # next deadline stays on the grid: 0.4
    assert not d.ticked
    st, d = decide(st, Samples(), 0.4)
    assert d.ticked and d.late_ticks == 0
    assert st.late_ticks_total == 2


def test_no_writers_holds_class():
    st = new_state(CFG, [Resource("vg", 0.010)])
    st, _ = decide(st, Samples(writes=writes("vg", "A")), 0.0)
    st, _ = decide(st, Samples([ReadSample("vg", 6, 0.030, write_bps=20 * MIB)]), 0.1)
    held = st.resources["vg"].delay_class
    assert held > 0
    # writers pause: latency is low, but nothing writes: class held, not wound down
    for k in range(2, 30):
        st, d = decide(st, Samples([ReadSample("vg", 6, 0.002, write_bps=0.0)]), k / 10)
        assert "vg" not in d.resource_classes
    assert st.resources["vg"].delay_class == held
    # writes resume and latency is low: the class holds while the writers' IOs
    # queue (RESUME_HOLD_S), then the negative error unwinds it
    resumed = [ReadSample("vg", 6, 0.002, write_bps=20 * MIB)]
    st, d = decide(st, Samples(resumed, writes("vg", "A")), 3.0)
    t = 3.1
    while t < 3.0 + RESUME_HOLD_S - 1e-9:
        st, d = decide(st, Samples(resumed, writes("vg", "A")), t)
        assert "vg" not in d.resource_classes, t
        t = round(t + 0.1, 1)
    while "vg" not in d.resource_classes and t < 3.0 + RESUME_HOLD_S + 1.0:
        st, d = decide(st, Samples(resumed, writes("vg", "A")), t)
        t = round(t + 0.1, 1)
    assert d.resource_classes["vg"] < held


def test_an_off_period_of_a_tick_or_two_holds_nothing_when_writes_resume():
    """A member at a long delay writes a few IOs a second: ticks without one are
    not a pause, and the class still comes down at once when the latency is low."""
    st = new_state(CFG, [Resource("vg", 0.010)])
    st, _ = decide(st, Samples(writes=writes("vg", "A")), 0.0)
    st, _ = decide(st, Samples([ReadSample("vg", 6, 0.030, write_bps=20 * MIB)]), 0.1)
    held = st.resources["vg"].delay_class
    quiet = [ReadSample("vg", 6, 0.002, write_bps=0.0)]
    for k in range(30 - (RESUME_AFTER_TICKS - 1), 30):  # up to 2.9; A's pause ends at 3.0
        st, _ = decide(st, Samples(quiet), k / 10)
    resumed = [ReadSample("vg", 6, 0.002, write_bps=20 * MIB)]
    st, _ = decide(st, Samples(resumed, writes("vg", "A")), 3.0)
    st, d = decide(st, Samples(resumed), 3.1)
    assert d.resource_classes["vg"] < held


def test_throttled_members_that_write_little_are_writers():
    """A member its long delay holds under the no-writers floor (but over the pause
    floor) is still a writer: a latency far under the setpoint winds its class down."""
    st = new_state(CFG, [Resource("vg", 0.010)])
    st, _ = decide(st, Samples(writes=writes("vg", "A")), 0.0)
    st, _ = decide(st, Samples([ReadSample("vg", 6, 0.030, write_bps=20 * MIB)]), 0.1)
    held = st.resources["vg"].delay_class
    trickle = 4 * st.write_sets.away_bps
    assert trickle < st.no_writers_bps
    for k in range(2, 150):  # past the write-drop hold (the rate fell 1,000-fold)
        a = writes("vg", "A", rate=trickle) if k % 10 == 0 else []
        st, _ = decide(st, Samples([ReadSample("vg", 6, 0.002, write_bps=trickle)], a), k / 10)
    assert "A" in st.members("vg")
    assert st.resources["vg"].delay_class < held


def test_read_idle_releases_after_configured_time():
    cfg = dataclasses.replace(CFG, read_idle_release_s=1.0)
    st = new_state(cfg, [Resource("vg", 0.010)])
    st, _ = decide(st, Samples(writes=writes("vg", "A")), 0.0)
    st, _ = decide(st, Samples([ReadSample("vg", 6, 0.030)]), 0.1)
    assert st.effective_class("A") > 0
    released_at = None
    for k in range(2, 20):
        st, d = decide(st, Samples(), k / 10)  # no reads
        if d.resource_classes:
            released_at = k / 10
            break
    assert released_at == pytest.approx(1.1)
    assert d.initiator_classes == {"A": 0}


def test_class_hysteresis_down_only():
    cfg = dataclasses.replace(CFG, class_hysteresis=2.0)
    st = new_state(cfg, [Resource("vg", 0.010)])
    st.resources["vg"].pid.u = 10.0
    st.resources["vg"].delay_class = 10
    st.resources["vg"].ewma.update(0.010, 0.0)
    st, _ = decide(st, Samples(), 0.0)
    # a small negative error: u 10 -> ~9.5; ceil(9.5 + 2) > 10: hold 10
    st, d = decide(st, Samples([ReadSample("vg", 6, 0.00900)]), 0.1)
    assert 9.0 < st.resources["vg"].pid.u < 10.0 and st.resources["vg"].delay_class == 10
    # a small positive error: up at once
    st, d = decide(st, Samples([ReadSample("vg", 6, 0.0130)]), 0.2)
    assert d.resource_classes["vg"] == st.resources["vg"].pid.delay_class > 10


def test_a_class_the_pid_no_longer_wants_is_released_past_the_hysteresis():
    """Work conservation: a class inside the hysteresis band (4 classes by default, so up
    to 2 ms) is no longer held once the PID's output has sat at its floor for
    RELEASE_FLOOR_TICKS ticks: it comes down a class a tick to 0. Before that, and for a
    PID that only hovers near the class, the band holds it."""
    cfg = ControllerConfig()  # law "log", hysteresis 4, a class a tick down
    st = new_state(cfg, [Resource("vg", 0.010)])
    st, _ = decide(st, Samples(writes=writes("vg", "A")), 0.0)  # A joins
    t, classes = 0.0, []

    def tick(latency_s):
        nonlocal st, t
        t = round(t + 0.1, 6)
        ws = writes("vg", "A") if round(t * 10) % 10 == 0 else []  # A writes on
        st, _ = decide(st, Samples([ReadSample("vg", 6, latency_s, 10 * MIB)], ws), t)

    for _ in range(6):  # a spike: the class rises by the ramp
        tick(0.200)
    spiked = st.resources["vg"].delay_class
    assert spiked > 0
    for _ in range(60):  # then 0.45 T, writers on: the PID winds down to its floor
        tick(0.0045)
        classes.append(st.resources["vg"].delay_class)
    assert classes[-1] == 0 and st.effective == {}
    # never more than a class a tick, and not before RELEASE_FLOOR_TICKS at the floor
    assert all(a - b <= 1 for a, b in itertools.pairwise([spiked, *classes]))
    first_zero = classes.index(0)
    assert first_zero >= RELEASE_FLOOR_TICKS
    # the band still holds a class against a PID that hovers near it: at 0.85 T (under
    # the setpoint, so never up) for as long, class 4 stays when the PID is not at its floor
    st.resources["vg"].delay_class = 4
    st.resources["vg"].pid.follow(4)
    st.resources["vg"].floor_ticks = 0
    for _ in range(RELEASE_FLOOR_TICKS + 5):
        tick(0.0088)
        if st.resources["vg"].pid.delay_class > 0:
            assert st.resources["vg"].delay_class == 4


def test_threshold_change_keeps_pid_and_remove_resource_releases_members():
    st = new_state(CFG, [Resource("vg", 0.010)])
    st, _ = decide(st, Samples(writes=writes("vg", "A")), 0.0)
    st, _ = decide(st, Samples([ReadSample("vg", 6, 0.030)]), 0.1)
    u = st.resources["vg"].pid.u
    st.set_resource(Resource("vg", 0.050))
    assert st.resources["vg"].pid.u == u
    assert remove_resource(st, "vg") == {"A": 0}
    assert st.effective == {}
    with pytest.raises(ValueError, match="threshold"):
        st.set_resource(Resource("x", 0.0))


def test_stalled_reader_is_not_idle():
    cfg = dataclasses.replace(CFG, read_idle_release_s=1.0)
    st = new_state(cfg, [Resource("vg", 0.010)])
    st, _ = decide(st, Samples(writes=writes("vg", "A")), 0.0)
    st, _ = decide(st, Samples([ReadSample("vg", 6, 0.030)]), 0.1)
    held = st.effective_class("A")
    for k in range(2, 40):  # 4 s without a completed read, but reads in flight
        st, d = decide(st, Samples([ReadSample("vg", 0, 0.0, reads_in_flight=1)]), k / 10)
        assert not d.resource_classes
    assert st.effective_class("A") == held


def test_decreases_are_gradual_release_included():
    cfg = dataclasses.replace(CFG, class_decrease_max_per_tick=2, read_idle_release_s=1.0)
    st = new_state(cfg, [Resource("vg", 0.010)])
    st, _ = decide(st, Samples(writes=writes("vg", "A")), 0.0)
    st, _ = decide(st, Samples([ReadSample("vg", 6, 0.030)]), 0.1)
    top = st.effective_class("A")
    assert top >= 6
    st, d = decide(st, Samples([ReadSample("vg", 6, 0.0001)]), 0.2)  # PID wants far less
    assert st.resources["vg"].pid.u < top - 2 and d.initiator_classes == {"A": top - 2}
    classes = []
    for k in range(3, 60):  # no more reads: held, then released, 2 classes per tick
        st, d = decide(st, Samples(), k / 10)
        if d.resource_classes:
            classes.append(d.resource_classes["vg"])
    assert classes == list(range(top - 4, -1, -2)) or classes == [*range(top - 4, 0, -2), 0]


RAMP = dataclasses.replace(
    CFG,
    class_increase_max_ratio_per_tick=1.25,
    delay_increase_min_s_per_tick=0.001,
    ladder=Ladder.linear(500, 200),
)


def test_rise_is_the_larger_of_the_minimum_and_the_ratio():
    assert [rise(k, RAMP) for k in (0, 1, 7, 8, 40, 100)] == [2, 3, 9, 10, 50, 125]
    assert rise(3, CFG) == CFG.max_class  # ratio 0: no limit


def test_a_resource_class_ramps_and_its_pid_tracks_what_it_got():
    st = new_state(RAMP, [Resource("vg", 0.010)])
    st, _ = decide(st, Samples(writes=writes("vg", "A")), 0.0)
    classes = []
    for k in range(1, 12):  # 5x the threshold every tick: the PID alone would jump far
        st, d = decide(st, Samples([ReadSample("vg", 6, 0.050)]), k / 10)
        classes.append(st.resources["vg"].delay_class)
        assert st.resources["vg"].pid.u <= classes[-1]  # tracked: no windup
        assert d.initiator_classes.get("A", classes[-1]) == classes[-1]
    assert classes[:6] == [2, 4, 6, 8, 10, 12]  # the PID asks for more: held to the ramp
    for lo, hi in itertools.pairwise(classes):
        assert lo < hi <= rise(lo, RAMP)
    assert st.effective_class("A") == classes[-1]


def test_a_writer_that_joins_a_throttled_set_climbs_to_its_class_one_tick_at_a_time():
    st = new_state(
        dataclasses.replace(RAMP, class_decrease_max_per_tick=1), [Resource("vg", 0.010)]
    )
    st, _ = decide(st, Samples(writes=writes("vg", "A")), 0.0)
    k = 1
    while st.resources["vg"].delay_class < 40:  # A alone drives the class up
        st, _ = decide(st, Samples([ReadSample("vg", 6, 0.050)]), k / 10)
        k += 1
    at_setpoint = Samples([ReadSample("vg", 6, 0.010)], writes("vg", "A"))
    for _ in range(30):  # the latency reaches the setpoint: the class settles
        st, _ = decide(st, at_setpoint, k / 10)
        k += 1
    top = st.resources["vg"].delay_class
    assert top >= 20
    seen = []
    for _ in range(30):  # B starts writing; the latency stays at the setpoint
        st, d = decide(st, Samples([ReadSample("vg", 6, 0.010)], writes("vg", "B")), k / 10)
        k += 1
        if "B" in d.initiator_classes:
            seen.append(d.initiator_classes["B"])
    assert st.resources["vg"].delay_class == top  # held at the setpoint
    expected = [2]
    while expected[-1] < top:
        expected.append(min(top, rise(expected[-1], RAMP)))
    assert seen == expected and "B" not in st.rising
    assert st.effective_class("B") == top


def test_a_write_drop_holds_the_class_until_the_sets_can_tell():
    """A throttled resource whose write rate stays under half its EWMA for
    WRITE_DROP_TICKS ticks in a row (a writer stopped; the sets learn which at a later
    convergence) does not go down for 2 convergences from then; a smaller dip does not
    hold it, nor do single low ticks among normal ones (a tick's few IOs)."""
    from santhrottle.controller.decide import (
        WRITE_DROP_FRACTION,
        WRITE_DROP_HOLD_CONVERGES,
        WRITE_DROP_TICKS,
    )

    cfg = dataclasses.replace(CFG, class_decrease_max_per_tick=1)  # one class a tick
    hold_s = WRITE_DROP_HOLD_CONVERGES * cfg.converge_s

    def classes(rate_of_tick):
        """The class after tick k (at k/10 s): 1 busy, then the rate rate_of_tick(k)."""
        st = new_state(cfg, [Resource("vg", 0.010)])
        st, _ = decide(st, Samples(writes=writes("vg", "A", "B")), 0.0)
        st, _ = decide(st, Samples([ReadSample("vg", 6, 0.030, write_bps=20 * MIB)]), 0.1)
        out = {1: st.resources["vg"].delay_class}
        for k in range(2, 60):
            both = writes("vg", "A", "B") if k % 10 == 0 else []  # no member away
            low = ReadSample("vg", 6, 0.002, write_bps=20 * MIB * rate_of_tick(k))
            st, _ = decide(st, Samples([low], both), k / 10)
            out[k] = st.resources["vg"].delay_class
        return out

    stop = classes(lambda k: WRITE_DROP_FRACTION * 0.8)
    assert stop[1] > WRITE_DROP_TICKS + 2
    for k in range(2, 1 + WRITE_DROP_TICKS):  # the first ticks of the drop: going down
        assert stop[k] == stop[k - 1] - 1
    start = 1 + WRITE_DROP_TICKS  # the tick the hold starts
    held = stop[start - 1]
    for k, cls in stop.items():
        if start <= k <= start + round(hold_s * 10):
            assert cls == held, k
    assert stop[59] < held  # the EWMA followed: the hold is over

    dip = classes(lambda k: WRITE_DROP_FRACTION * 1.2)  # a dip, not a stop
    assert dip[start] < dip[start - 1]
    flicker = classes(lambda k: 0.3 if k % 2 else 1.0)  # every other tick low
    assert all(flicker[k] == max(0, flicker[1] - (k - 1)) for k in range(2, 20))


def test_a_delay_that_does_not_lower_the_latency_is_released_then_tried_again():
    """Work conservation (controller/futile.py): the latency stays at 1.5 T whatever the
    class, while the delay takes the writer's rate from 10 to 1 MiB/s: the resource is
    released (Decisions.futile), its class comes down to 0 and stays there for the
    backoff, then the law acts again."""
    cfg = ControllerConfig()  # law "log", a class a tick down, 1 s convergences
    st = new_state(cfg, [Resource("vg", 0.010)])
    t, released_at, classes = 0.0, [], []
    while t < 120.0:
        t = round(t + 0.1, 6)
        k = st.resources["vg"].delay_class
        rate = 10 * MIB if k < 20 else 1 * MIB
        ws = writes("vg", "A", rate=rate) if round(t * 10) % 10 == 0 else []
        st, out = decide(st, Samples([ReadSample("vg", 6, 0.015, rate)], ws), t)
        if out.futile:
            assert out.futile == ["vg"]
            released_at.append(t)
        classes.append((t, st.resources["vg"].delay_class))
    assert released_at, max(k for _, k in classes)
    first = released_at[0]
    assert first < 40.0  # the ramp to the clamp, FUTILE_CONVERGES, the smoothing
    f = st.resources["vg"].futile
    # down a class a tick to 0, and 0 for the rest of the backoff, the PID at its floor
    during = [k for s, k in classes if first + 10.0 <= s < first + FUTILE_BACKOFF_S]
    assert during and max(during) == 0
    # then it acts again: the class rises, and the next release backs off for twice as long
    after = [k for s, k in classes if first + FUTILE_BACKOFF_S < s]
    assert after and max(after) > 0
    assert len(released_at) == 1 or f.until_s - released_at[1] == 2 * FUTILE_BACKOFF_S


def test_a_release_ends_when_the_latency_rises_without_the_delay():
    """The delay works, with a lag the futile test mistakes (the latency stays at 1.5 T
    while the class climbs and holds): released, the class comes down and the latency
    climbs with it to 5 T. The release ends (Decisions.futile_refuted) within seconds of
    the climb, long before the backoff, and the class rises again."""
    cfg = ControllerConfig()
    st = new_state(cfg, [Resource("vg", 0.010)])
    t, released_at, refuted_at, classes = 0.0, [], [], []
    while t < 90.0:
        t = round(t + 0.1, 6)
        k = st.resources["vg"].delay_class
        rate = 10 * MIB if k < 20 else 1 * MIB
        lat = 0.050 if released_at and k < 20 else 0.015
        ws = writes("vg", "A", rate=rate) if round(t * 10) % 10 == 0 else []
        st, out = decide(st, Samples([ReadSample("vg", 6, lat, rate)], ws), t)
        released_at += [t] if out.futile else []
        refuted_at += [t] if out.futile_refuted else []
        classes.append((t, st.resources["vg"].delay_class))
    assert released_at and refuted_at, (released_at, refuted_at)
    first = released_at[0]
    assert first < refuted_at[0] < first + 20.0 < first + FUTILE_BACKOFF_S
    assert out.futile_refuted == [] or out.futile_refuted == ["vg"]
    f = st.resources["vg"].futile
    assert f.refutations >= 1 and f.backoff_s <= 2 * FUTILE_BACKOFF_S
    after = [k for s, k in classes if refuted_at[0] < s < refuted_at[0] + 10.0]
    assert max(after) >= 20  # the law acts again: the class back up


def _bursts(st, t, until_s, every_ticks, burst_latency_s, latency_s, rate=1.3e6):
    """Ticks to until_s: a write burst (A's) every every_ticks ticks, whose reads take
    burst_latency_s, latency_s between; A's convergence sample only if it wrote."""
    out = []
    k = 0
    while t < until_s - 1e-9:
        t = round(t + 0.1, 6)
        k += 1
        burst = k % every_ticks == 0
        reads = ReadSample("vg", 6, burst_latency_s if burst else latency_s, rate if burst else 0.0)
        ws = writes("vg", "A", rate=rate / every_ticks) if round(t * 10) % 10 == 0 else []
        st, _ = decide(st, Samples([reads], ws), t)
        out.append((t, st.resources["vg"].delay_class, st.resources["vg"].quiet_ticks))
    return st, t, out


def test_writers_in_bursts_behind_a_long_delay_let_the_class_come_down():
    """A member whose long delay leaves a burst of writes every 2 s and nothing between
    (rhythm.py): the ticks between the bursts are writers' ticks, whose reads (9 ms
    against a 20 ms threshold) bring the class down; a tick at a time they were "no
    writers" and a convergence at a time "away", and only the bursts' slow ticks
    (40 ms) moved the class: up."""
    st = new_state(ControllerConfig(), [Resource("vg", 0.020)])
    st, _ = decide(st, Samples(writes=writes("vg", "A")), 0.0)
    st, t, _ = _bursts(st, 0.0, 6.0, 1, 0.060, 0.060, rate=20 * MIB)  # writes every tick
    top = st.resources["vg"].delay_class
    assert top > 40 and "A" in st.members("vg")
    st, t, sparse = _bursts(st, t, 60.0, 20, 0.040, 0.009)
    assert max(k for _, k, _ in sparse) <= top + 10
    late = [k for s, k, _ in sparse if s > 40.0]
    assert max(late) < top // 2, (top, late)
    assert max(q for s, _, q in sparse if s > 40.0) == 0  # no tick between them was quiet


def test_writers_that_stop_after_bursts_are_silent_after_their_rhythm():
    """The same member stops: once the silence is past the patience its rhythm gives
    (rhythm.py, here under 6 s), the ticks are without writers and the class holds, for
    a pause (AWAY_HOLD_S); a silence longer than that is writers gone (or silenced by
    their delay), and the class comes down on the reader's latency, never up."""
    from santhrottle.controller.state import AWAY_HOLD_S

    st = new_state(ControllerConfig(), [Resource("vg", 0.020)])
    st, _ = decide(st, Samples(writes=writes("vg", "A")), 0.0)
    st, t, _ = _bursts(st, 0.0, 6.0, 1, 0.060, 0.060, rate=20 * MIB)
    st, t, _ = _bursts(st, t, 30.0, 20, 0.040, 0.018)  # the rhythm learnt, near the setpoint
    patience = st.resources["vg"].rhythm.patience_s(0.1)
    assert 1.0 < patience < 6.0
    st, t, stopped = _bursts(st, t, 60.0, 10**6, 0.004, 0.004)  # no writes: reads are fast
    end = 30.0 + patience + AWAY_HOLD_S
    held = [k for s, k, _ in stopped if 30.0 + patience + 0.2 < s < end - 0.2]
    assert held and len(set(held)) == 1 and held[0] > 0
    after = [k for s, k, _ in stopped if s > end + 0.2]
    assert after[-1] < held[0] and all(b <= a for a, b in itertools.pairwise(after))
    # and a long silence with the reads over the threshold raises nothing
    st, t, slow = _bursts(st, t, 70.0, 10**6, 0.080, 0.080)
    assert max(k for _, k, _ in slow) <= after[-1]


def test_a_stalled_tick_still_counts_its_writes_in_the_rhythm():
    st = new_state(CFG, [Resource("vg", 0.010)])
    st, _ = decide(st, Samples(writes=writes("vg", "A")), 0.0)
    st, _ = decide(st, Samples([ReadSample("vg", 6, 0.030, write_bps=20 * MIB)]), 0.1)
    stalled = ReadSample("vg", 0, 0.0, write_bps=20 * MIB, reads_in_flight=1)
    st, _ = decide(st, Samples([stalled]), 0.2)
    assert st.resources["vg"].rhythm.last_s == pytest.approx(0.2)


def test_a_slowed_reader_counts_as_much_as_a_fast_one():
    """The read EWMA is a mean over time, one tick one sample: a QD1 reader that a burst
    slows completes fewer reads a tick (one at 60 ms against six at 9 ms), and its slow
    ticks must raise the latency, and the class, as fast as six slow reads would."""
    cfg = dataclasses.replace(CFG, read_ewma_tau_s=0.5)
    wr = 10 * MIB
    trace = [(6, 0.009)] * 10 + [(1, 0.060)] * 5
    slowed = new_state(cfg, [Resource("vg", 0.020)])
    counted = new_state(cfg, [Resource("vg", 0.020)])
    for st in (slowed, counted):
        decide(st, Samples(writes=writes("vg", "A")), 0.0)
    for k, (n, lat) in enumerate(trace, start=1):
        now = k / 10
        decide(slowed, Samples([ReadSample("vg", n, lat, wr)], writes("vg", "A")), now)
        decide(counted, Samples([ReadSample("vg", 6, lat, wr)], writes("vg", "A")), now)
        a, b = slowed.resources["vg"], counted.resources["vg"]
        assert a.ewma.value == pytest.approx(b.ewma.value)
        assert a.delay_class == b.delay_class
    # half a second of 60 ms: the EWMA is 1 - e^-1 of the way up, over the 20 ms threshold
    up = 0.009 + 0.051 * (1 - math.exp(-1))
    assert slowed.resources["vg"].ewma.value == pytest.approx(up)
    assert slowed.resources["vg"].delay_class > 0
