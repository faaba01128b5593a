"""The PID on ln(delay) (controller/pid.py, law "log") and the relative write-heavy share."""

import itertools
import math

import pytest

from santhrottle.controller.decide import decide
from santhrottle.controller.domain import (
    ControllerConfig,
    ReadSample,
    Resource,
    Samples,
    WriteSample,
)
from santhrottle.controller.ladder import Ladder
from santhrottle.controller.pid import LogPid, SingleSidedPid, new_pid
from santhrottle.controller.state import new_state
from santhrottle.controller.writeheavy import WriteHeavySets

pytestmark = pytest.mark.unit
MIB = 1024.0 * 1024.0


def test_the_docstrings_worked_example():
    p = LogPid(1.0, 0.5, 0.0, 0.1, Ladder())
    p.follow(40)
    assert p.u == pytest.approx(math.log(0.025))
    got = [(p.update(m, 0.9), round(math.exp(p.u) * 1000, 1)) for m in (1.5, 1.2, 1.0)]
    assert got == [(55, 51.4), (50, 40.4), (47, 33.7)]


def test_the_offset_moves_a_short_delay_by_a_share_of_the_threshold():
    # the docstring's example with offset 0.5 and a threshold of 10 ms
    lad = Ladder()
    got = []
    for start in (40, 2):  # 25 ms, 1 ms
        p = LogPid(1.0, 0.5, 0.0, 0.1, lad, offset_x_threshold=0.5)
        p.follow(start)
        got.append(p.update(1.5, 0.9, 0.010))
    assert got == [57, 15]
    plain = LogPid(1.0, 0.5, 0.0, 0.1, lad, offset_x_threshold=0.5)
    plain.follow(2)
    assert plain.update(1.5, 0.9) == 5  # no scale given: ln(delay), 2.05 ms
    down = LogPid(1.0, 0.5, 0.0, 0.1, lad, offset_x_threshold=0.5)
    down.follow(4)  # 2 ms; far under the setpoint: (2 + 5) e^-0.72 - 5 < 0 -> off
    assert down.update(0.3, 0.9, 0.010) == 0
    with pytest.raises(ValueError, match="offset must be within 0-10"):
        LogPid(1.0, 0.5, 0.0, 0.1, lad, offset_x_threshold=-1.0)


def test_the_same_relative_errors_move_any_delay_by_the_same_factors():
    def run(start_class):
        p = LogPid(1.0, 0.5, 0.0, 0.1, Ladder(500, 1_000_000))
        p.follow(start_class)
        u0 = p.u
        for m in (1.3, 1.1, 0.95):
            p.update(m, 0.9)
        return p.u - u0

    lad = Ladder(500, 1_000_000)
    lo, hi = lad.class_of_us(20_000), lad.class_of_us(202_500)
    assert run(lo) == pytest.approx(run(hi))


def test_single_sided_off_at_the_floor_and_clamped_at_the_top():
    lad = Ladder()
    p = LogPid(1.0, 0.5, 0.0, 0.1, lad)
    assert p.delay_class == 0
    assert p.update(0.5, 0.9) == 0  # under the setpoint from off: stays off
    assert p.update(1.0, 0.9) == 1  # any rise above the floor is at least class 1
    for _ in range(200):
        p.update(10.0, 0.9)
    assert p.delay_class == lad.max_class and p.u == pytest.approx(math.log(0.25))
    for _ in range(20):  # anti-windup: it unwinds at once, not after 200 ticks
        p.update(0.1, 0.9)
    assert p.delay_class == 0
    p.follow(30)
    p.track(10)
    assert p.delay_class == 10
    assert p.class_with_margin(4) == 14 == p.class_with_margin(4, p.delay_class)
    p.reset()
    assert p.delay_class == 0


def test_new_pid_follows_the_law():
    assert isinstance(new_pid(ControllerConfig()), LogPid)
    assert isinstance(new_pid(ControllerConfig(law="paper")), SingleSidedPid)
    with pytest.raises(ValueError, match="control law must be one of log, paper"):
        ControllerConfig(law="fast")


def test_the_ramp_bounds_a_rise_by_the_delay_not_the_class_number():
    cfg = ControllerConfig(read_ewma_tau_s=0.0)
    st = new_state(cfg, [Resource("vg", 0.010)])
    st, _ = decide(st, Samples(writes=[WriteSample("vg", "A", 20 * MIB)]), 0.0)
    delays = []
    for k in range(1, 30):  # 5 x the threshold: the ramp alone sets the pace
        st, _ = decide(st, Samples([ReadSample("vg", 6, 0.050)]), k / 10)
        delays.append(cfg.ladder.delay_s(st.resources["vg"].delay_class))
    for a, b in itertools.pairwise(delays):
        assert b <= max(a * 1.25, a + 0.001) + 1e-9
    assert delays[-1] > 0.1  # and it gets far (no plant needs fewer than 29 ticks)


def test_the_class_rises_only_while_the_latency_is_over_the_setpoint():
    """The proportional term moves up when the error grows, also far under the
    setpoint: law "log" does not apply that (nor integrate it)."""
    cfg = ControllerConfig(read_ewma_tau_s=0.0, setpoint_quiet_fraction=0.0)
    st = new_state(cfg, [Resource("vg", 0.010)])

    def at(k, lat):  # A writes on; its samples come once per convergence
        ws = [WriteSample("vg", "A", 20 * MIB)] if k % 10 == 0 else []
        return decide(st, Samples([ReadSample("vg", 6, lat, 20 * MIB)], ws), k / 10)[0]

    st = at(0, 0.002)
    k = 1
    while st.resources["vg"].delay_class < 30:  # too slow: up to 30 (17 ms)
        st = at(k, 0.020)
        k += 1
    classes = []
    for lat in (0.002, 0.008, 0.003, 0.0085, 0.002):  # jumps, all under 9 ms
        st = at(k, lat)
        k += 1
        classes.append(st.resources["vg"].delay_class)
    assert all(b <= a for a, b in itertools.pairwise(classes))  # never up
    st = at(k, 0.012)
    assert st.resources["vg"].delay_class > classes[-1]  # over the setpoint: up at once


def test_many_light_writers_join_one_small_writer_beside_a_heavy_one_does_not():
    w = WriteHeavySets(8.0, MIB, MIB / 4, share=0.5)
    light = [("vg", f"10.0.1.{i}", 0.5 * MIB) for i in range(40)]  # 20 MiB/s together
    mixed = [("vg2", "10.0.2.1", 20 * MIB), ("vg2", "10.0.2.2", 0.3 * MIB)]
    w.observe_many(light + mixed + [("vg", "10.0.9.9", 0.01 * MIB)], 0.0)
    ch = w.converge(0.0)
    assert ch.joined["vg"] == {f"10.0.1.{i}" for i in range(40)}  # not the 10 kB/s one
    assert ch.joined["vg2"] == {"10.0.2.1"}
    off = WriteHeavySets(8.0, MIB, MIB / 4, share=0.0)
    off.observe_many(light, 0.0)
    assert off.converge(0.0).joined == {}  # the per-host threshold alone misses them
    with pytest.raises(ValueError, match="share must be within 0-1"):
        WriteHeavySets(8.0, MIB, MIB / 4, share=2.0)


def test_a_contended_resource_throttles_every_writer_above_the_floor_and_holds_them():
    w = WriteHeavySets(8.0, MIB, MIB / 4, share=0.5)
    small = [("vg", "10.0.1.1", 0.2 * MIB), ("vg", "10.0.1.2", 0.01 * MIB)]  # 10 kB/s: logs
    w.observe_many(small, 0.0)
    assert w.converge(0.0).joined == {}  # 0.21 MiB/s in all: not busy, not contended
    assert w.converge(1.0, {"vg"}).joined == {"vg": {"10.0.1.1"}}  # over the 64 KiB/s floor
    w.observe_many([("vg", "10.0.1.1", 0.02 * MIB)], 2.0)  # throttled: writes little now
    for t in range(3, 20):
        assert w.converge(float(t), {"vg"}).left == {}  # held while contended
    assert w.converge(20.0).left == {"vg": {"10.0.1.1"}}  # under leave once it is not
    off = WriteHeavySets(8.0, MIB, MIB / 4, share=0.0)  # share 0: the fixed thresholds only
    off.observe_many(small, 0.0)
    assert off.converge(0.0, {"vg"}).joined == {}


class _TwoWriters:
    """Writers A and B on "vg" (T 10 ms), a tick per call; write samples once per
    convergence, as the sensors give them."""

    def __init__(self):
        self.st = new_state(ControllerConfig(read_ewma_tau_s=0.0), [Resource("vg", 0.010)])
        self.k = 0

    @property
    def t(self):
        return self.k / 10

    @property
    def delay_class(self):
        return self.st.resources["vg"].delay_class

    def tick(self, lat, writers):
        t = self.t
        ws = [WriteSample("vg", w, 20 * MIB) for w in writers] if self.k % 10 == 0 else []
        self.st = decide(self.st, Samples([ReadSample("vg", 6, lat, 20 * MIB)], ws), t)[0]
        self.k += 1
        return self.delay_class

    def throttled(self):
        """Both write and the reader is slow, up to class 40, at a whole second."""
        while self.delay_class < 40 or self.k % 10:
            self.tick(0.030, "AB")
        return self


def test_a_member_that_pauses_while_others_write_holds_the_class_for_a_while():
    """B pauses while A goes on: the latency falls (A alone needs less), but B comes
    back; once a convergence has seen B write nothing the class holds, until
    AWAY_HOLD_S after that; then it unwinds."""
    from santhrottle.controller.state import AWAY_HOLD_S

    w = _TwoWriters().throttled()
    t0 = w.t
    classes = []
    while w.t < t0 + AWAY_HOLD_S + 4.0:  # B away; A alone is fast
        t = round(w.t - t0, 1)
        classes.append((t, w.tick(0.002, "A")))
    held = dict(classes)[1.1]  # seen away at the convergence 1 s after its last write
    assert all(c == held for t, c in classes if 1.1 <= t < AWAY_HOLD_S)
    assert classes[-1][1] < held  # B stayed away: it has gone, the class unwinds


def test_a_hold_keeps_the_class_it_began_with_not_what_it_gained_since():
    """B pauses, the class holds; a burst of slow reads during the pause lifts it,
    and once they pass it comes back down to the held class, not below, while the
    hold lasts (a few noisy ticks must not ratchet a held class up)."""
    from santhrottle.controller.state import AWAY_HOLD_S

    w = _TwoWriters().throttled()
    t0 = w.t
    while w.t < t0 + 1.5:  # B away: held from the convergence that sees it
        w.tick(0.002, "A")
    held = w.delay_class
    assert w.st.resources["vg"].hold_base == held
    for _ in range(3):  # three slow ticks
        w.tick(0.030, "A")
    assert w.delay_class > held
    classes = []
    while w.t < t0 + AWAY_HOLD_S - 0.5:  # fast again, still within the hold
        classes.append(w.tick(0.002, "A"))
    assert classes[-1] == held and min(classes) == held
