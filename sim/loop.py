"""The simulation loop: the controller against the plant, one loop for one path or N.

Problem
    Tune and judge the controller without a kernel: the same decide() the
    daemon runs (controller/decide.py), against a plant from Pesto's model
    (sim/plant.py). One appliance sees every IO of the array; a fleet of N
    appliances (sim/fleet.py) each sees the IOs of its path. Both are this
    one loop: a run has N paths (sim/paths.py; one for one appliance) and a
    control that turns what each path's sensor saw (sim/sensors.py) into
    the classes each path applies.

What one run does (every dt, the scenario's run.dt_s, 10 ms by default)
    1. Streams switch on/off by their schedules.
    2. Per resource, the device latency L is the fixed point of
       sim/plant.py with the closed streams' flows (each stream's delay on
       each path: the class that path applies to its initiator, or the
       constant class); closed streams move their IOs per second, split
       over the paths. Solved again only when a stream switched on or off,
       a class applied moved or the array stalls (sim/solution.py).
    3. Open-loop reads arrive as a Poisson process (their own seeded RNG,
       identical in every run of a scenario: common random numbers), each
       on a path drawn by its initiator's fractions (another RNG, drawn
       only with more than one path); each read's latency is L times a
       mean-1 lognormal with the resource's relative noise; it completes at
       arrival + latency. Closed-loop reads are a fluid, their mean noise
       drawn per dt (the resource's RNG).
    4. Every tick (100 ms) the sensors (per path, and the array's devices)
       and the control: OneAppliance here (the daemon: one controller on
       every path), sim/fleet.py's FleetControl for a fleet; none:
       uncontrolled or a constant class.
    5. The measurement of the first resource (sim/measure.py) every tick,
       and with stats the figures per path (PathStats).

Bounds
    A run is deterministic: the same scenario, paths and control give the
    same series. One path is the single appliance: each stream is one flow
    and no path is drawn.

Worked example
    The paper scenario (sim/scenarios/paper.toml) at T = 10 ms: 13,000 dt
    of 10 ms, 1,300 ticks; `run(sc, 0.010)` gives the series whose 1 s
    latency has a p95 of 9.31 ms after the settle time of 30 s
    (docs/simulator.md).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from santhrottle.controller.decide import decide
from santhrottle.controller.domain import (
    DeviceSample,
    Resource,
)
from santhrottle.controller.restate import set_class
from santhrottle.controller.state import ControllerState, new_state

from .groups import GroupMeter
from .measure import LatencyWindow, RunResult, Series
from .paths import ONE_PATH, Paths
from .plant import lognormal_params, mean_of_n
from .scenario import Scenario
from .sensors import Sensed
from .solution import Solver
from .usage import Tenancy


class Control(Protocol):
    """The appliances of a run: what each path applies, from what the sensors saw."""

    def decide(self, sensed: Sensed, now_s: float, seq: int) -> Sequence[Mapping[str, int]]:
        """The classes (initiator -> class) each path applies from now on; seq is the
        run's dt number (a tick's, for reports)."""
        ...

    def own(self, path: int) -> ControllerState:
        """The controller whose classes path applies (its resource class is counted)."""
        ...


class OneAppliance:
    """One controller on every path (the daemon): decide() on everything sensed.

    oracle_class: every resource's class is set to it after each decide() (the
    controller's PID runs, the class it decided is replaced): a writer gets
    it once the write-heavy sets name it and through the ramp, the best a
    controller limited by the sets' cadence and the ramp could do knowing
    the class in advance (sim/sweep.py). meter: a grouped scenario's
    (sim/groups.py), told after each decide() (the groups' live changes).
    """

    def __init__(
        self,
        state: ControllerState,
        n_paths: int = 1,
        meter: GroupMeter | None = None,
        oracle_class: int | None = None,
    ) -> None:
        self.state = state
        self.n_paths = n_paths
        self.meter = meter
        self.oracle_class = oracle_class

    def decide(self, sensed: Sensed, now_s: float, seq: int) -> Sequence[Mapping[str, int]]:
        self.state, _ = decide(self.state, sensed.whole(), now_s)
        if self.meter is not None:
            self.meter.after_decide(self.state, now_s, sensed.converging)
        if self.oracle_class is not None:  # the class that holds T, every tick
            for name in self.state.resources:
                set_class(self.state, name, self.oracle_class)
        return [self.state.effective] * self.n_paths

    def own(self, path: int) -> ControllerState:
        return self.state


@dataclass
class PathStats:
    """Per path (appliance), after the settle time: its resource-0 class changes, per
    writer the ticks it wrote at class 0 there and the ticks it was a member of the
    path's controller's set; the bytes written through each path and by each writer."""

    class_changes: list[int]
    unthrottled_ticks: list[dict[str, int]]
    member_ticks: list[dict[str, int]]
    writer_ticks: dict[str, int]  # writer -> ticks writing after the settle time
    path_write_bytes: list[float]
    writer_bytes: dict[str, float]


def run_paths(
    sc: Scenario,
    paths: Paths = ONE_PATH,
    control: Control | None = None,
    constant_class: int | None = None,
    meter: GroupMeter | None = None,
    label: str = "",
    threshold_s: float | None = None,
    stats: bool = False,
    tenancy: Tenancy | None = None,
) -> tuple[RunResult, PathStats]:
    """One run (the module's doc): with a control, or at a constant class on every
    path (which wins over the control's classes), or uncontrolled. stats: gather
    PathStats (a fleet's figures)."""
    cfg = sc.controller
    n = len(paths.split)
    idx = range(n)
    names = [r.name for r in sc.resources]
    first = names[0]
    streams = sc.streams
    ln_params = {r.name: lognormal_params(r.noise) for r in sc.resources}
    noise_of = {r.name: r.noise for r in sc.resources}
    settle_s = sc.default_settle_s()
    writers = sorted({s.initiator for s in streams if s.kind == "write"})
    # per stream, by its index: its on-windows and the one it has reached
    wins = [s.schedule.windows(sc.duration_s) for s in streams]
    reached = [0] * len(streams)
    on = [False] * len(streams)
    writes_of = [i for i, s in enumerate(streams) if s.kind == "write"]

    # open-loop streams: pre-seeded arrival/noise generators, one per stream
    open_rng = [random.Random(f"{sc.seed}:open:{i}") for i in range(len(streams))]
    path_rng = [random.Random(f"{sc.seed}:path:{i}") for i in range(len(streams))]
    next_arrival = [
        open_rng[i].expovariate(s.rate_iops) if s.loop == "open" else math.inf
        for i, s in enumerate(streams)
    ]
    closed_rng = {r.name: random.Random(f"{sc.seed}:closed:{r.name}") for r in sc.resources}
    dev_rng = random.Random(f"{sc.seed}:device")
    dev_tick = {name: [0.0, 0.0, 0.0] for name in names}  # IOs, sum of L, sum of Q dt

    # (completion time, resource, latency, path, initiator, bytes)
    pending: list[tuple[float, str, float, int, str, float]] = []
    sensed = Sensed(names, n, cfg.tick_s)
    window = LatencyWindow()
    tick_write_bytes = bytes_after_settle = writer_on_after_settle = 0.0
    st = PathStats(
        [0] * n,
        [dict.fromkeys(writers, 0) for _ in idx],
        [dict.fromkeys(writers, 0) for _ in idx],
        dict.fromkeys(writers, 0),
        [0.0] * n,
        dict.fromkeys(writers, 0.0),
    )
    prev = [0] * n
    series = Series()
    applied: Sequence[Mapping[str, int]] = [{} for _ in idx]

    dt = sc.dt_s
    tick_every = max(1, round(cfg.tick_s / dt))
    converge_every = max(1, round(cfg.converge_s / dt))
    ten = tenancy if tenancy is not None else Tenancy(sc, n)  # bursty streams, costs (usage.py)
    solver = Solver(sc, paths, constant_class, ten, sensed)
    frac, open_of = solver.frac, solver.open_of

    stalls, stall_i = sc.stalls, 0  # the array's stalls (sorted), the next one
    last_lat = dict.fromkeys(names, 0.0)  # each resource's latency before a stall
    version = 0  # moves when a stream switches on or off or a class applied moves
    next_change_s = -math.inf  # the first time a stream may switch on or off
    writer_on = False  # a writer is on
    was_applied = [dict(a) for a in applied]
    for k in range(round(sc.duration_s / dt)):
        t = k * dt
        while stall_i < len(stalls) and stalls[stall_i][1] <= t:
            stall_i += 1
        stall_end = (
            stalls[stall_i][1] if stall_i < len(stalls) and stalls[stall_i][0] <= t else None
        )
        if t >= next_change_s:  # on: in the last window that started by t
            next_change_s = math.inf
            for i, win in enumerate(wins):
                j = reached[i]
                while j < len(win) and win[j][0] <= t:
                    j += 1
                reached[i] = j
                on[i] = j > 0 and t < win[j - 1][1]
                if on[i]:
                    next_change_s = min(next_change_s, win[j - 1][1])
                if j < len(win):
                    next_change_s = min(next_change_s, win[j][0])
            writer_on = any(on[i] for i in writes_of)
            version += 1
        after_settle = t >= settle_s
        if after_settle and writer_on:
            writer_on_after_settle += dt
        for r in sc.resources:
            name = r.name
            stalled = stall_end is not None
            # the plant (sim/solution.py): solved again only when it no longer holds
            sol = solver.solution(name, t, on, applied, stalled, last_lat[name], version)
            lat = sol.lat
            if not stalled:
                last_lat[name] = lat
            ten.account(t, dt, sol.work, on)
            # the device as diskstats sees it: IOs, their latency, IOs in flight (Little)
            dev_acc = dev_tick[name]
            dev_acc[0] += sol.device[0]
            dev_acc[1] += sol.device[1]
            dev_acc[2] += sol.device[2]
            if meter is not None:
                for ini, read, iops, size, lat_q in sol.metered:
                    meter.closed(name, ini, read, iops, size, lat_q, dt)
            for pairs, key, per_res, b, p, ini in sol.writes:
                pairs[key] = pairs.get(key, 0.0) + b
                per_res[name] += b
                tick_write_bytes += b
                if after_settle:
                    bytes_after_settle += b
                    if stats:
                        st.path_write_bytes[p] += b
                        st.writer_bytes[ini] += b
            if sol.reads:  # closed-loop reads: counted as a fluid in the sensor
                rng_c = closed_rng[name]
                for p, m, m_lat, mu_n, sd_n in sol.reads:
                    noise = math.exp(mu_n + sd_n * rng_c.gauss())  # mean_of_n's
                    sensed.read_sum[p][name] += m_lat * noise
                    sensed.read_n[p][name] += m
            mu, sd = ln_params[name]
            t_next = t + dt
            for i in open_of[name]:
                # the arrival clock and noise draws run while off, too: every
                # run of a scenario sees the same reads (common random numbers)
                if next_arrival[i] >= t_next:
                    continue
                s = streams[i]
                rng = open_rng[i]
                reading = on[i] and s.kind == "read"
                while next_arrival[i] < t_next:
                    noise = math.exp(mu + sd * rng.gauss())
                    p = 0 if n == 1 else path_rng[i].choices(idx, weights=frac[s.initiator])[0]
                    if reading:
                        lat_i = lat * noise
                        done = next_arrival[i] + lat_i
                        if stall_end is not None:  # served once the stall is over
                            done = stall_end + lat_i
                            lat_i = done - next_arrival[i]
                        heapq.heappush(pending, (done, name, lat_i, p, s.initiator, s.size_bytes))
                    next_arrival[i] += rng.expovariate(s.rate_iops)

        t_end = t + dt
        while pending and pending[0][0] <= t_end:
            done_t, name, lat_i, p, ini, size = heapq.heappop(pending)
            if meter is not None:
                meter.read_done(name, ini, size, lat_i)
            sensed.read_sum[p][name] += lat_i
            sensed.read_n[p][name] += 1.0
            if name == first:
                window.add(done_t, lat_i)

        if (k + 1) % tick_every:
            continue
        # --- tick: the sensors, then the appliances ---
        for name, acc in dev_tick.items():
            n_io, lat_sum, q_sum = acc
            if n_io > 0.0:
                g = mean_of_n(noise_of[name], n_io, dev_rng.gauss())
                sensed.devices.append(
                    DeviceSample(name, math.ceil(n_io), lat_sum / n_io * g, q_sum / cfg.tick_s)
                )
            dev_tick[name] = [0.0, 0.0, 0.0]
        sensed.utilization = ten.take_utilization(cfg.tick_s)
        if (k + 1) % converge_every == 0:
            sensed.span_s = converge_every * dt
            if meter is not None:
                sensed.ios = meter.take()
        if control is not None:
            applied = control.decide(sensed, t_end, k)
            now_applied = [dict(a) for a in applied]
            if now_applied != was_applied:  # the plant is solved again for them
                was_applied = now_applied
                version += 1
            if sensed.converging:
                ten.record(control.own(0), t_end, applied[0])
        sensed.clear()
        # --- measure ---
        own0 = control.own(0) if control is not None else None
        rs0 = own0.resources[first] if own0 is not None else None
        for p in idx:
            if constant_class is not None:
                cls_p = constant_class
            elif control is not None:
                cls_p = control.own(p).resources[first].delay_class
            else:
                cls_p = 0
            if cls_p != prev[p] and t_end >= settle_s:
                st.class_changes[p] += 1
            prev[p] = cls_p
        if stats and t_end >= settle_s:
            writing = {streams[i].initiator for i in writes_of if on[i]}
            for w in writing:
                st.writer_ticks[w] += 1
            for p in idx:
                members = control.own(p).members(first) if control is not None else set()
                for w in writing:
                    if applied[p].get(w, 0) == 0 and constant_class is None:
                        st.unthrottled_ticks[p][w] += 1
                    if w in members:
                        st.member_ticks[p][w] += 1
        series.t_s.append(round(t_end, 6))
        series.read_latency_s.append(window.mean(t_end))
        series.ewma_s.append(rs0.ewma.value if rs0 is not None else None)
        series.threshold_s.append(
            rs0.threshold_s(cfg.auto_alpha) if rs0 is not None else threshold_s
        )
        series.delay_class.append(prev[0])
        series.write_bps.append(tick_write_bytes / cfg.tick_s)
        tick_write_bytes = 0.0

    result = RunResult(
        label,
        threshold_s,
        constant_class,
        series,
        bytes_after_settle,
        writer_on_after_settle,
        round(sum(st.class_changes) / n),
        meter.series if meter is not None else {},
        _futile_releases(control, n),
    )
    return result, st


def _futile_releases(control: Control | None, n_paths: int) -> int:
    """The releases of a futile delay (controller/futile.py) by the run's controllers."""
    if control is None:
        return 0
    states = {id(s): s for s in (control.own(p) for p in range(n_paths))}
    return sum(rs.futile.releases for s in states.values() for rs in s.resources.values())


def run(
    sc: Scenario,
    threshold_s: float | None = None,
    constant_class: int | None = None,
    label: str | None = None,
    auto: bool = False,
    oracle_class: int | None = None,
    tenancy: Tenancy | None = None,
) -> RunResult:
    """One appliance: controlled at threshold_s, or a constant class, or neither
    (uncontrolled).

    auto: threshold "auto" (Pesto's, from the LQ fit of the device samples),
    threshold_s the fallback until the fit is confident. oracle_class (with
    threshold_s): every resource's class is held at it (OneAppliance). tenancy:
    the run's tenants (sim/usage.py), for the caller's figures."""
    if oracle_class is not None and threshold_s is None:
        raise ValueError("oracle_class needs threshold_s (a controlled run)")
    cfg = sc.controller
    if oracle_class is not None and not 0 <= oracle_class <= cfg.max_class:
        raise ValueError(f"oracle_class {oracle_class}: not a class of the ladder")
    control: OneAppliance | None = None
    meter: GroupMeter | None = None
    if threshold_s is not None:
        res = [Resource(r.name, threshold_s, auto, r.utilization_threshold) for r in sc.resources]
        state = new_state(cfg, res)
        if sc.groups:
            meter = GroupMeter(sc)
            meter.configure(state)
        control = OneAppliance(state, 1, meter, oracle_class)
    if label is None:
        if threshold_s is not None:
            label = f"T={threshold_s * 1000:g}ms"
        elif constant_class is not None:
            label = f"class {constant_class}"
        else:
            label = "uncontrolled"
    result, _ = run_paths(
        sc,
        control=control,
        constant_class=constant_class,
        meter=meter,
        label=label,
        threshold_s=threshold_s,
        tenancy=tenancy,
    )
    return result
