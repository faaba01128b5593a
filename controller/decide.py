"""The controller state machine: one decide() for the 100 ms tick and the 1 s convergence.

Problem
    Per resource, keep the read latency under its threshold by choosing a
    delay class for the initiators that write heavily to it; per
    initiator, apply one class even when it loads several resources.

Measured signals (passed in as Samples; this module reads nothing)
    ReadSample: a resource's mean read latency over the last sensor
    interval and the number of reads behind it (diskstats, or the wire).
    WriteSample: an initiator's write rate on a resource.

Law, per call decide(state, samples, now_s)
    1. Fold every WriteSample into the write-heavy EWMAs (any time).
    2. If now_s >= next_tick_s ("tick"), per resource:
         with reads:    ewma <- EWMA(read latency)
                        want <- PID(ewma / threshold, setpoint, threshold)
                        (the error is relative, e = ewma/threshold - setpoint:
                        a threshold of 1 ms and one of 20 ms get the same
                        response to the same relative overshoot; the PID is
                        config.law's, controller/pid.py; the setpoint
                        is setpoint_fraction or more where the latency
                        scatters little, controller/setpoint.py)
                        class <- want if want >= class ("up"; law "log":
                        only while ewma > the setpoint, else the PID is
                        pulled to the class: the proportional term moves
                        up when the error grows, also far under the
                        setpoint, and with the holds below that ratchets),
                        else min(class, ceil(u + class_hysteresis)) ("down"),
                        or 0 once the PID has wanted no delay (its output
                        at its floor) RELEASE_FLOOR_TICKS ticks in a row
                        outside a hold ("release": the band holds a class
                        against noise, not against a PID that wants none),
                        but not under the class the resource had when a
                        hold began, while a member is away (where the
                        writers' rhythm is under a convergence), or for
                        WRITE_DROP_HOLD_CONVERGES convergences after the
                        resource's write rate fell under half its EWMA
                        WRITE_DROP_TICKS ticks in a row where most ticks
                        see writes (a writer stopped; the sets tell which
                        later), or for RESUME_HOLD_S
                        after RESUME_AFTER_TICKS ticks or more of "no
                        writers" (a burst begins: its first ticks show the
                        reader before the writers' IOs have queued): a
                        class gained during the hold may come back down
                        to it
         reads, but the resource has written less than no_writers_bps (a
         quarter of write_heavy_leave_bps with the relative rules, else all
         of it), or, with members, less than their away floor, in every
         tick for longer than its writers' rhythm explains (rhythm.py's
         patience: a tick for writers that write every tick, seconds for
         writers in bursts behind a long delay):
                        ewma updated, class held ("no writers": conditional
                        integration; the delay has nothing to act on, so the
                        error must not wind the class down or up) for a pause
                        (AWAY_HOLD_S); longer, the writers have gone (or their
                        delay silences them): the PID runs, down only (members
                        that write little because their delay is long are
                        writers: a 4 KiB QD1 writer at 250 ms writes 16 KiB/s,
                        and its class must be able to come down)
         without reads: hold the class ("idle"); after read_idle_release_s
                        without reads release it to 0 ("release"), unless
                        reads are in flight (a stalled reader is not gone)
       Every decrease, the release included, is at most
       class_decrease_max_per_tick classes per tick ("gradually"): a lower
       delay lets an initiator's new packets overtake its older ones still
       queued in the slower class, and the target's TCP fast-retransmits.
       Every increase is at most to rise(class), the highest class whose
       delay is within max(d x ratio, d + min) of the class's delay d, per
       tick ("ramp": class_increase_max_ratio_per_tick,
       delay_increase_min_s_per_tick); the PID's output is pulled down to the
       class it got (tracking anti-windup: it must not integrate what the
       ramp holds back). A delay that jumps past the target's tail-loss
       probe timer (2 x srtt + 2 jiffies) before srtt has followed makes a
       spurious probe, i.e. a retransmission.
       next_tick_s advances by whole ticks from the previous deadline (fixed
       rate, no drift); ticks that were missed are counted in late_ticks,
       never run back to back ("no bunching").
    3. If now_s >= next_converge_s ("converge"): the write-heavy sets are
       re-evaluated with their hysteresis (controller/writeheavy.py).
    4. The effective class of an initiator = max over the resources it is a
       member of ("max-over-resources"), recomputed only for initiators
       touched by a class or membership change (a member of one resource
       alone, without groups, takes that resource's class without the max:
       follow_resources); changes are returned. It
       rises by the same ramp: a writer that joins a set whose class is 60
       climbs 0, 2, 4, ... one tick at a time (`rising` holds those not yet
       there; every tick recomputes them).
    5. A grouped resource (restate.configure_groups) is decided by its
       groups (controller/groups.py): its PID does not act (its EWMA is
       kept), every convergence runs Maestro's interval on the IoSamples
       gathered since the last one, every tick moves the groups' classes,
       and those enter rule 4's max beside the resources' classes.
    6. A group with levels (controller/levels.py, wired by headroom.py) is
       decided at every convergence, on any resource: its level rises while
       it is at its cap and its resources have headroom, and the class that
       holds its cap enters rule 4's max as well (a ceiling). The tick's
       UtilizationSamples give each resource's busy share per convergence
       (utilization.py); one over its utilization_threshold counts as over
       its latency threshold until the next convergence.
    7. The groups and levels read the IoSamples of the sensors' convergences
       since the last one (Samples.io_batches: how many, each scaled to one
       convergence; their mean is the interval's). A convergence that got
       none (the daemon's sensor worker is slower than the controller) holds
       the groups and levels as they are: no IOs is not a rate of 0.
    8. A delay that does not lower the latency (controller/futile.py): every
       convergence looks at each resource not decided by groups; one whose
       latency stayed over its threshold, within 0.8 of its peak, while the
       delay took half of its writes or more, ten convergences in a row, is
       released (Decisions.futile): its PID reset, its class down to 0 a
       class a tick and the PID held at its floor until the backoff ends, or
       until its latency climbs past a quarter over its peak without the delay
       (Decisions.futile_refuted: the delay was working), whichever is first.

Bounds
    Classes are in [0, max_class] (PID clamp). A resource whose threshold
    is changed keeps its PID state: the new error acts from the next tick.

Threshold "auto" (Resource.auto)
    Every DeviceSample (the resource's devices over the sensor interval:
    IOs, their mean latency, the mean IOs in flight) feeds the resource's
    LQ fit (controller/lqfit.py); the threshold in force is C / (1 -
    auto_alpha) of its last confident fit, and the Resource's threshold_s
    (the fallback; math.inf observes) until there is one.

New parameters, a restart (controller/restate.py)
    reconfigure(state, config): new gains, EWMA time constants, write-heavy
    thresholds or cadences keep every resource's class (the PID continues
    from it: bumpless), its latency EWMA and the write-heavy sets, so a
    reload moves no initiator.  seed_class(state, name, k) starts a new
    resource at class k (a restarted daemon continues its last decision).

Idle behaviour
    Writers pause (paper: 5 s pauses between bursts): the resource's own
    write rate drops under write_heavy_leave_bps and the class is held, so
    the next burst meets the delay that held the threshold last time
    instead of a class the pause wound down to 0, and keeps it for
    RESUME_HOLD_S while their IOs queue at the array; if that delay is more
    than needed, the negative error then unwinds it.
    No reads: hold; after read_idle_release_s release to 0.
    No members in the set: the class may rise (nothing is throttled),
    bounded by the clamp and the ramp; members that join ramp up to it.

Performance
    O(resources) per tick, O(write pairs) per convergence, O(members of
    changed resources) for the effective classes. `make bench` measures a
    call with 1,000 resources and 10,000 initiators.

State ownership
    decide() updates `state` in place and returns it with the Decisions
    (the tables are too large to copy every 100 ms); the caller keeps no
    other reference to it.

Worked example
    One resource, threshold 10 ms, tick 100 ms, law "paper" with pid.py's
    example gains, the default ladder, initiator A already a member: decide()
    at t=0.1 with a 14 ms read sample (seeding the EWMA) -> resource class
    2 (1 ms), Decisions.initiator_classes {A: 2}; a second resource with A
    as member at class 5 (2.5 ms) -> A: 4 (the ramp from 1 ms: max(1 x
    1.25, 1 + 1) = 2 ms), and A: 5 at the next tick.
"""

from __future__ import annotations

import math
from typing import Final

from .domain import Decisions, Samples
from .effective import follow_resources, recompute_effective
from .groups import advance, run_intervals
from .headroom import converge as converge_levels
from .headroom import observe_utilization
from .headroom import tick as tick_levels
from .ramp import move_toward
from .state import AWAY_HOLD_S, ControllerState

# A member that stopped writing holds its resource's class for AWAY_HOLD_S
# (controller/state.py), from the convergence that names it. The same from the
# first tick on: a throttled resource whose write rate (its
# tick's, against its EWMA over state.py's WRITE_RATE_TAU_S) falls under WRITE_DROP_FRACTION
# has a writer that stopped, and the write-heavy sets tell which only at a later
# convergence; its class does not go down for WRITE_DROP_HOLD_CONVERGES periods.
# A drop counts after WRITE_DROP_TICKS ticks in a row: a tick's rate is a few IOs
# where the delay is long, and a single tick of one IO where three are the mean
# (Poisson: 1 in 5 ticks) must not renew the hold; three in a row are 1 in 125.
WRITE_DROP_FRACTION: Final = 0.5
WRITE_DROP_TICKS: Final = 3
WRITE_DROP_HOLD_CONVERGES: Final = 2
# Writers that come back after RESUME_AFTER_TICKS ticks or more in a row without
# writes ("no writers") hold the class for RESUME_HOLD_S: the first ticks of a burst
# show the reader before the writers' IOs have queued at the array (each writer's
# next IO waits for its delay), and their low latency is no sign that the delay that
# held the threshold at the end of the last burst is too long. One second is up to
# four IOs in a row of a QD1 writer even at 250 ms; two cost throughput on the robustness
# sweep (docs/controller.md, "Holding"). Ten ticks: a member at a long delay writes
# a few IOs a second, and a tick or two without one is not an off-period.
RESUME_AFTER_TICKS: Final = 10
RESUME_HOLD_S: Final = 1.0
# The hysteresis band holds a class against the noise of a PID that hovers near it,
# not against a PID that wants no delay at all: once the PID's output has sat at its
# floor (class 0) for RELEASE_FLOOR_TICKS ticks in a row, the class goes down to 0
# (a class a tick, the decrease limit). A short spike the loop cannot hold anyway (an
# array's stall, a guest's) buys a class through the ramp; without this, any class up
# to the band (4: 2 ms) would outlive it for as long as the reads go on (work
# conservation, docs/controller.md "Releasing"). One second: the floor is reached only
# after the latency has stayed well under the setpoint (the integral), and a second of
# that is no tick's noise.
RELEASE_FLOOR_TICKS: Final = 10


def _schedule(next_s: float | None, period_s: float, now_s: float) -> tuple[bool, float, int]:
    """Fixed-rate cadence: (due, next deadline, deadlines skipped)."""
    if next_s is None:  # first call starts the cadence
        return True, now_s + period_s, 0
    if now_s + 1e-9 < next_s:
        return False, next_s, 0
    missed = math.floor((now_s - next_s) / period_s + 1e-9)
    return True, next_s + (missed + 1) * period_s, missed


def _wrote(
    write_bps: float,
    no_writers_bps: float,
    away_bps: float,
    name: str,
    members: dict[str, set[str]],
) -> bool:
    """A tick's writes count (rhythm.py): at the no-writers floor, or with members at
    their away floor (a member writes little where its delay is long)."""
    return write_bps >= no_writers_bps or (write_bps >= away_bps and bool(members.get(name)))


def _one_interval_of_ios(state: ControllerState) -> bool:
    """state.ios as one convergence's: the mean of the sensor convergences it holds.
    False when none arrived since the last convergence (the sensor's worker is late):
    the groups and levels hold, rather than read a rate of 0."""
    n, state.io_batches = state.io_batches, None if state.io_batches is None else 0
    if n is None or n == 1:
        return True
    if n == 0:
        return False
    state.ios[:] = [
        s._replace(
            ios=s.ios / n,
            bytes=s.bytes / n,
            reads=s.reads / n,
            busy_s=None if s.busy_s is None else s.busy_s / n,
        )
        for s in state.ios
    ]
    return True


def decide(
    state: ControllerState, samples: Samples, now_s: float
) -> tuple[ControllerState, Decisions]:
    c = state.config
    out = Decisions(now_s)
    sets = state.write_sets
    if samples.writes:
        sets.observe_many(samples.writes, now_s)
    if samples.ios and (state.grouped or state.levels.specs):  # the groups' next interval
        state.ios.extend(samples.ios)
    if samples.io_batches is not None:
        state.io_batches = (state.io_batches or 0) + samples.io_batches
    if samples.utilization:  # the resources' busy share (utilization.py)
        observe_utilization(state, samples.utilization)
    for dev in samples.devices:  # threshold "auto": the LQ fits
        rs0 = state.resources.get(dev.resource)
        if rs0 is not None and rs0.lq is not None:
            rs0.lq.observe(dev, now_s)

    touched: set[str] = set()  # resources whose class or membership changed

    due, state.next_tick_s, missed = _schedule(state.next_tick_s, c.tick_s, now_s)
    if due:
        out.ticked = True
        out.late_ticks = missed
        state.late_ticks_total += missed
        reads = {s.resource: s for s in samples.reads if s.reads > 0}
        stalled = {s.resource: s for s in samples.reads if not s.reads and s.reads_in_flight}
        # the loop's invariants, once per tick (1,000 resources: attribute lookups count)
        log_law = c.law == "log"
        hyst = c.class_hysteresis
        hyst_classes = math.ceil(hyst)
        decrease_max = c.class_decrease_max_per_tick
        tick_s, converge_s = c.tick_s, c.converge_s
        sp_floor, sp_ceiling, sp_z = (
            c.setpoint_fraction,
            c.setpoint_quiet_fraction,
            c.setpoint_noise_z,
        )
        no_writers_bps, away_bps = state.no_writers_bps, sets.away_bps
        members, away, rise_to = sets.members, state.away, state.rise_to
        grouped = state.grouped
        saturated = state.utilization.saturated  # counts as over the threshold
        resource_classes = out.resource_classes
        for name, rs in state.resources.items():
            sample = reads.get(name)
            if sample is None:
                stall = stalled.get(name)
                if stall is not None:  # reads pending: not idle, hold
                    rs.last_read_s = now_s
                    if stall.write_bps is not None:  # the writes' rhythm goes on
                        rs.rhythm.observe(
                            _wrote(stall.write_bps, no_writers_bps, away_bps, name, members),
                            now_s,
                            tick_s,
                        )
                    continue
                if (
                    rs.last_read_s is not None
                    and now_s - rs.last_read_s >= c.read_idle_release_s
                    and rs.delay_class
                ):  # release
                    rs.pid.reset()
                    rs.ewma.reset()
                    new_class = 0
                else:  # idle: hold
                    continue
            else:
                rs.last_read_s = now_s
                if name in grouped:  # the groups' arbiter decides (groups.py)
                    rs.ewma.update(sample.read_latency_s, now_s)
                    continue
                write_bps = sample.write_bps
                rhythm = rs.rhythm
                gone = False  # silent past the writers' rhythm; past a pause too: down only
                if write_bps is not None:
                    rhythm.observe(
                        _wrote(write_bps, no_writers_bps, away_bps, name, members), now_s, tick_s
                    )
                    gone = rhythm.silent(now_s, tick_s)
                if gone:
                    # no writers: the class acts on nothing, do not integrate (a tick
                    # between the bursts of writers in a long delay is not one: rhythm.py)
                    rs.quiet_ticks += 1
                    if rs.quiet_ticks * tick_s <= AWAY_HOLD_S:  # a pause: hold
                        rs.ewma.update(sample.read_latency_s, now_s)
                        continue
                    # silent for longer than a pause (AWAY_HOLD_S): the writers have gone,
                    # or their delay silences them; the class may come down, not go up
                else:
                    if rs.quiet_ticks >= RESUME_AFTER_TICKS and rs.delay_class:  # a burst begins
                        rs.drop_hold_until_s = max(rs.drop_hold_until_s, now_s + RESUME_HOLD_S)
                    rs.quiet_ticks = 0
                # tick
                rs.noise.observe(sample.reads, sample.read_latency_s, now_s)
                ewma = rs.ewma.update(sample.read_latency_s, now_s)
                # relative error: one set of gains for any threshold
                thr = rs.resource.threshold_s if rs.lq is None else rs.threshold_s(c.auto_alpha)
                if saturated and name in saturated and ewma < thr:  # utilization.py
                    ewma = thr
                sp = rs.noise.setpoint(sp_floor, sp_ceiling, sp_z)
                pid = rs.pid
                want = pid.update(ewma / thr, sp, thr)
                if not want:  # at the floor ("release")
                    rs.floor_ticks += 1
                elif rs.floor_ticks:
                    rs.floor_ticks = 0
                if write_bps is not None and not gone:  # a writer stopped?
                    before = rs.write_rate.value
                    rs.write_rate.update(write_bps, now_s)
                    if (
                        rs.delay_class
                        and before
                        and write_bps < WRITE_DROP_FRACTION * before
                        and rhythm.steady(tick_s)  # else a tick's rate is the bursts' rhythm
                    ):
                        rs.drop_ticks += 1
                        if rs.drop_ticks >= WRITE_DROP_TICKS:
                            hold_s = WRITE_DROP_HOLD_CONVERGES * c.converge_s
                            rs.drop_hold_until_s = now_s + hold_s
                    else:
                        rs.drop_ticks = 0
                if (  # held: a member away (where a convergence without writes is
                    # unusual: rhythm.py), or the writes dropped
                    name in away and rhythm.patience_s(tick_s) < converge_s
                ) or now_s < rs.drop_hold_until_s:
                    if rs.hold_base is None:
                        rs.hold_base = rs.delay_class
                else:
                    rs.hold_base = None
                if want > rs.delay_class and (gone or (log_law and ewma <= sp * thr)):
                    # up only over the setpoint ("single-sided up"), and never for no writers
                    new_class = rs.delay_class
                    pid.track(new_class)
                elif want >= rs.delay_class:  # up: at once
                    new_class = want
                elif rs.floor_ticks >= RELEASE_FLOOR_TICKS and rs.hold_base is None:
                    new_class = 0  # down: the PID wants no delay ("release"); not in a hold
                else:  # down: past the hysteresis band only
                    new_class = min(rs.delay_class, pid.class_with_margin(hyst, want))
                    if rs.hold_base is not None:  # but a member is away: not under the class
                        # the hold began with (the others alone need less; it comes back);
                        # what it gained since, on their latency alone, may come back down
                        new_class = max(new_class, rs.hold_base)
                        if new_class == rs.delay_class:
                            pid.track_up(rs.delay_class - hyst_classes)
            if rs.futile.until_s > now_s:  # released: the delay did nothing (futile.py)
                new_class = 0
                rs.pid.track(0)
            cur = rs.delay_class
            if new_class == cur:
                continue
            # the ramp up, gradually down (ramp.py)
            moved = move_toward(cur, new_class, rise_to, decrease_max)
            if moved > cur:  # the PID tracks what the ramp allowed
                rs.pid.track(moved)
            elif moved != new_class and sample is not None:  # tracking, down
                rs.pid.track_up(moved - hyst_classes)
            rs.delay_class = moved
            resource_classes[name] = moved
            touched.add(name)

    due, state.next_converge_s, _ = _schedule(state.next_converge_s, c.converge_s, now_s)
    if due:  # converge
        out.converged = True
        contended = {  # over the setpoint, or throttling: the relative write-heavy rule
            name
            for name, rs in state.resources.items()
            if rs.delay_class
            or (rs.ewma.value or 0.0) > rs.setpoint(c) * rs.threshold_s(c.auto_alpha)
        }
        change = sets.converge(now_s, contended)
        state.away = change.away
        out.joined, out.left = change.joined, change.left
        touched.update(change.joined)
        touched.update(change.left)
        for name, rs in state.resources.items():  # a delay that does not work (futile.py)
            lat_s, wr_bps = rs.ewma.value, rs.write_rate.value
            if lat_s is None or wr_bps is None or name in state.grouped:
                continue
            thr = rs.threshold_s(c.auto_alpha)
            refuted = rs.futile.refutations
            if rs.futile.converge(lat_s, wr_bps, thr, rs.delay_class, now_s):
                rs.pid.reset()
                out.futile.append(name)
            elif rs.futile.refutations != refuted:  # the latency rose without the delay
                out.futile_refuted.append(name)
        fresh = _one_interval_of_ios(state)
        converge_levels(state, fresh)  # utilization, then the groups' levels (headroom.py)
        if state.grouped and fresh:  # Maestro's interval on each grouped resource
            res = state.resources  # the grouped ones' latency only, not every resource's
            lat = {n: res[n].ewma.value for n in state.grouped if n in res}
            util = state.utilization.last
            run_intervals(state.groups, state.grouped, state.ios, c.converge_s, c.ladder, lat, util)
        state.ios.clear()

    group_changed: set[str] = set()
    if out.ticked and state.groups.resources:  # group classes move a tick toward their target
        for inis in advance(
            state.groups, state.rise_to, c.class_decrease_max_per_tick, c.ladder
        ).values():
            group_changed.update(inis)
    if out.ticked and state.levels.groups:  # and the levels' classes (levels.py)
        group_changed.update(tick_levels(state))

    if touched or group_changed or (out.ticked and state.rising):
        affected: set[str] = set(state.rising) if out.ticked else set()
        affected.update(group_changed)
        for name in touched:
            affected.update(out.left.get(name, ()))
        if state.groups.resources or state.levels.groups:  # a group's class may apply to any
            for name in touched:
                affected.update(sets.members.get(name, ()))
            out.initiator_classes = recompute_effective(state, affected)
        else:  # members of one resource follow it; the others are recomputed
            out.initiator_classes = follow_resources(state, touched, affected)
            out.initiator_classes.update(recompute_effective(state, affected))
    return state, out
