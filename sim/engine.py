"""Plant simulator: the real controller against an LQ-line storage resource.

Problem
    Tune and judge the controller without a kernel: same step(), same
    EWMA/PID/write-heavy code as the daemon, a plant from Pesto's model.

What one run does (every sim_step_s, 10 ms by default)
    1. Streams switch on/off by their schedules.
    2. Each closed stream's per-IO delay d = effective class of its
       initiator's delay on the ladder (0 when uncontrolled; fixed for a constant run).
    3. Per resource, the device latency L is the fixed point of
       sim/plant.py; closed streams move q/(L+d) IOs per second.
    4. Open-loop reads arrive as a Poisson process (their own seeded RNG,
       identical in every run of a scenario: common random numbers); each
       read's latency is L times a mean-1 lognormal with the resource's
       relative noise; it completes at arrival + latency.
    5. Every tick (100 ms) a diskstats-like sensor reports, per resource,
       the mean latency of the reads completed in the interval and their
       count; every convergence (1 s) the write rate of every
       (resource, initiator) pair over that second. Both go to step().

Measurements (what `santhrottle simulate` prints)
    The "1 s read latency" is the mean of the reads completed in the
    trailing second, sampled at every tick, like the paper's plots of the
    average wait time. Statistics start at the settle time: the end of the
    writers' first on-period unless the scenario says otherwise, because
    during the first burst the write-heavy sets still have to learn who the
    writers are (they join at the first 1 s convergence after their rate
    has been measured).
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from santhrottle.controller.domain import DeviceSample, ReadSample, Resource, Samples, WriteSample
from santhrottle.controller.restate import set_class
from santhrottle.controller.state import new_state
from santhrottle.controller.step import step

from .groups import GroupMeter, GroupSeries, group_summary
from .plant import Closed, Device, closed_latency
from .scenario import Scenario

# After a switch-on the p99 and the "back under threshold" clock exclude or
# measure this long a transient (issue acceptance: 2 s).
TRANSIENT_S = 2.0
# Peak after a switch-on is looked for in this window.
PEAK_WINDOW_S = 5.0
# Window of the reported read latency (paper's plots: average wait time).
LATENCY_WINDOW_S = 1.0


@dataclass
class Series:
    t_s: list[float] = field(default_factory=list)
    read_latency_s: list[float | None] = field(default_factory=list)  # 1 s window, per resource 0
    ewma_s: list[float | None] = field(default_factory=list)
    threshold_s: list[float | None] = field(default_factory=list)  # in force, resource 0
    delay_class: list[int] = field(default_factory=list)
    write_bps: list[float] = field(default_factory=list)  # aggregate, over the tick


@dataclass
class RunResult:
    label: str
    threshold_s: float | None
    constant_class: int | None
    series: Series
    write_bytes_after_settle: float
    writer_on_s_after_settle: float
    class_changes_after_settle: int
    groups: dict[str, GroupSeries] = field(default_factory=dict)  # scenarios with [[group]]


def _mean_of_n(rel_sd: float, n: float, g: float) -> float:
    """A mean-1 lognormal factor for the mean of n IOs of relative spread rel_sd
    (its spread rel_sd / sqrt(n)), from the standard normal draw g."""
    mu, sd = _lognormal_params(rel_sd / math.sqrt(max(n, 1.0)))
    return math.exp(mu + sd * g)


def _lognormal_params(rel_sd: float) -> tuple[float, float]:
    s2 = math.log1p(rel_sd * rel_sd)
    return -s2 / 2.0, math.sqrt(s2)


def _on(windows: list[tuple[float, float]], t: float) -> bool:
    i = bisect.bisect_right(windows, (t, math.inf)) - 1
    return i >= 0 and t < windows[i][1]


def run(
    sc: Scenario,
    threshold_s: float | None = None,
    constant_class: int | None = None,
    label: str | None = None,
    auto: bool = False,
    oracle_class: int | None = None,
) -> RunResult:
    """One run: controlled at threshold_s, or a constant class, or neither (uncontrolled).

    auto: threshold "auto" (Pesto's, from the LQ fit of the device samples),
    threshold_s the fallback until the fit is confident.
    oracle_class (with threshold_s): every resource's class is held at it after
    each step, so a writer gets it once the write-heavy sets have it and
    through the ramp: the best a controller limited by the sets' cadence and
    the ramp could do, knowing the class in advance (sim/sweep.py)."""
    if oracle_class is not None and threshold_s is None:
        raise ValueError("oracle_class needs threshold_s (a controlled run)")
    cfg = sc.controller
    if oracle_class is not None and not 0 <= oracle_class <= cfg.max_class:
        raise ValueError(f"oracle_class {oracle_class}: not a class of the ladder")
    state = (
        new_state(cfg, [Resource(r.name, threshold_s, auto) for r in sc.resources])
        if threshold_s is not None
        else None
    )
    meter = GroupMeter(sc) if sc.groups and state is not None else None
    if meter is not None and state is not None:
        meter.configure(state)
    devices = {r.name: Device(r.intercept_s, r.slope_s_per_io) for r in sc.resources}
    ln_params = {r.name: _lognormal_params(r.noise) for r in sc.resources}
    noise_of = {r.name: r.noise for r in sc.resources}
    windows = {id(s): s.schedule.windows(sc.duration_s) for s in sc.streams}
    settle_s = sc.default_settle_s()
    first = sc.resources[0].name

    # open-loop streams: pre-seeded arrival/noise generators, one per stream
    open_rng = {id(s): random.Random(f"{sc.seed}:open:{i}") for i, s in enumerate(sc.streams)}
    next_arrival = {
        id(s): open_rng[id(s)].expovariate(s.rate_iops) for s in sc.streams if s.loop == "open"
    }
    closed_rng = {r.name: random.Random(f"{sc.seed}:closed:{r.name}") for r in sc.resources}
    dev_rng = random.Random(f"{sc.seed}:device")
    dev_tick = {r.name: [0.0, 0.0, 0.0] for r in sc.resources}  # IOs, sum of L, sum of Q dt

    # (completion time, resource, latency, initiator, bytes)
    pending: list[tuple[float, str, float, str, float]] = []
    tick_sum: dict[str, float] = {r.name: 0.0 for r in sc.resources}
    tick_n: dict[str, float] = {r.name: 0.0 for r in sc.resources}
    tick_res_write_bytes: dict[str, float] = {r.name: 0.0 for r in sc.resources}
    window: deque[tuple[float, float]] = deque()  # completions of resource 0
    window_sum = 0.0
    write_bytes: dict[tuple[str, str], float] = {}
    tick_write_bytes = 0.0
    bytes_after_settle = 0.0
    writer_on_after_settle = 0.0
    class_changes = 0
    series = Series()

    dt = sc.sim_step_s
    tick_every = max(1, round(cfg.tick_s / dt))
    converge_every = max(1, round(cfg.converge_s / dt))
    n_steps = round(sc.duration_s / dt)
    effective: dict[str, int] = {}
    delay_of = [cfg.ladder.delay_s(k) for k in range(cfg.ladder.max_class + 1)]
    prev_class = 0

    by_resource = {r.name: [s for s in sc.streams if s.resource == r.name] for r in sc.resources}
    for k in range(n_steps):
        t = k * dt
        on = {id(s): _on(windows[id(s)], t) for s in sc.streams}
        if t >= settle_s and any(on[id(s)] for s in sc.streams if s.kind == "write"):
            writer_on_after_settle += dt
        for r in sc.resources:
            mine = by_resource[r.name]
            # mode "all": every packet to a throttled initiator is delayed
            closed = [
                (
                    s,
                    delay_of[
                        effective.get(s.initiator, 0) if constant_class is None else constant_class
                    ]
                    + s.overhead_s,
                )
                for s in mine
                if s.loop == "closed" and on[id(s)]
            ]
            open_iops = sum(s.rate_iops for s in mine if s.loop == "open" and on[id(s)])
            lat, rates = closed_latency(
                devices[r.name], open_iops, [Closed(s.depth, d, s.rate_iops) for s, d in closed]
            )
            # the device as diskstats sees it: IOs, their latency, IOs in flight (Little)
            dev_iops = open_iops + sum(rates)
            dev_acc = dev_tick[r.name]
            dev_acc[0] += dev_iops * dt
            dev_acc[1] += dev_iops * dt * lat
            dev_acc[2] += dev_iops * lat * dt
            mu, sd = ln_params[r.name]
            for (s, _d), iops in zip(closed, rates, strict=True):
                if meter is not None:
                    meter.closed(r.name, s.initiator, s.kind == "read", iops, s.size_bytes, lat, dt)
                if s.kind == "write":
                    b = iops * s.size_bytes * dt
                    key = (s.resource, s.initiator)
                    write_bytes[key] = write_bytes.get(key, 0.0) + b
                    tick_write_bytes += b
                    tick_res_write_bytes[r.name] += b
                    if t >= settle_s:
                        bytes_after_settle += b
                else:  # closed-loop reads: counted as a fluid in the sensor
                    n = iops * dt
                    noise = _mean_of_n(r.noise, n, closed_rng[r.name].gauss())
                    tick_sum[r.name] += n * lat * noise
                    tick_n[r.name] += n
            for s in mine:
                if s.loop != "open":
                    continue
                # the arrival clock and noise draws run while off, too: every
                # run of a scenario sees the same reads (common random numbers)
                rng = open_rng[id(s)]
                while next_arrival[id(s)] < t + dt:
                    noise = math.exp(mu + sd * rng.gauss())
                    if on[id(s)] and s.kind == "read":
                        lat_i = lat * noise
                        done = next_arrival[id(s)] + lat_i
                        heapq.heappush(pending, (done, r.name, lat_i, s.initiator, s.size_bytes))
                    next_arrival[id(s)] += rng.expovariate(s.rate_iops)

        t_end = t + dt
        while pending and pending[0][0] <= t_end:
            done_t, name, lat_i, ini, size = heapq.heappop(pending)
            if meter is not None:
                meter.read_done(name, ini, size, lat_i)
            tick_sum[name] += lat_i
            tick_n[name] += 1.0
            if name == first:
                window.append((done_t, lat_i))
                window_sum += lat_i

        if (k + 1) % tick_every:
            continue
        # --- tick: sensor + controller ---
        while window and window[0][0] <= t_end - LATENCY_WINDOW_S:
            window_sum -= window.popleft()[1]
        reads = [
            ReadSample(
                name,
                math.ceil(tick_n[name]),
                tick_sum[name] / tick_n[name],
                tick_res_write_bytes[name] / cfg.tick_s,
            )
            for name in tick_n
            if tick_n[name] > 0.0
        ]
        for name in tick_n:
            tick_sum[name] = tick_n[name] = tick_res_write_bytes[name] = 0.0
        devs = []
        for name, (n_io, lat_sum, q_sum) in dev_tick.items():
            if n_io > 0.0:
                g = _mean_of_n(noise_of[name], n_io, dev_rng.gauss())
                devs.append(
                    DeviceSample(name, math.ceil(n_io), lat_sum / n_io * g, q_sum / cfg.tick_s)
                )
            dev_tick[name] = [0.0, 0.0, 0.0]
        writes: list[WriteSample] = []
        converging = (k + 1) % converge_every == 0
        ios = meter.take() if meter is not None and converging else []
        if converging:
            span = converge_every * dt
            writes = [WriteSample(r, i, b / span) for (r, i), b in write_bytes.items()]
            write_bytes.clear()
        ewma: float | None = None
        cls0 = 0
        if state is not None:
            state, _ = step(state, Samples(reads, writes, devs, ios), t_end)
            if meter is not None:
                meter.after_step(state, t_end, converging)
            if oracle_class is not None:  # the class that holds T, every tick
                for name in state.resources:
                    set_class(state, name, oracle_class)
            effective = state.effective
            rs = state.resources[first]
            ewma = rs.ewma.value
            cls0 = rs.delay_class
        elif constant_class is not None:
            cls0 = constant_class
        if cls0 != prev_class and t_end >= settle_s:
            class_changes += 1
        prev_class = cls0
        series.t_s.append(round(t_end, 6))
        series.read_latency_s.append(window_sum / len(window) if window else None)
        series.ewma_s.append(ewma)
        series.threshold_s.append(
            state.resources[first].threshold_s(cfg.auto_alpha) if state is not None else None
        )
        series.delay_class.append(cls0)
        series.write_bps.append(tick_write_bytes / cfg.tick_s)
        tick_write_bytes = 0.0

    if label is None:
        if threshold_s is not None:
            label = f"T={threshold_s * 1000:g}ms"
        elif constant_class is not None:
            label = f"class {constant_class}"
        else:
            label = "uncontrolled"
    return RunResult(
        label,
        threshold_s,
        constant_class,
        series,
        bytes_after_settle,
        writer_on_after_settle,
        class_changes,
        meter.series if meter is not None else {},
    )


def percentile(xs: list[float], q: float) -> float:
    """Percentile with linear interpolation (numpy's default)."""
    if not xs:
        return math.nan
    ys = sorted(xs)
    pos = (len(ys) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


def summarize(sc: Scenario, r: RunResult, threshold_s: float | None = None) -> dict[str, Any]:
    """The figures `santhrottle simulate` prints, for one run, against a threshold."""
    thr = threshold_s if threshold_s is not None else r.threshold_s
    settle = sc.default_settle_s()
    s = r.series
    after = [
        (t, v)
        for t, v in zip(s.t_s, s.read_latency_s, strict=True)
        if t >= settle and v is not None
    ]
    lat = [v for _, v in after]
    ons = [t for t in sc.switch_ons() if t >= settle]
    calm = [v for t, v in after if not any(on <= t < on + TRANSIENT_S for on in ons)]
    minutes = max((sc.duration_s - settle) / 60.0, 1e-9)
    out: dict[str, Any] = {
        "label": r.label,
        "threshold_s": thr,
        "settle_s": settle,
        "read_latency_p50_s": percentile(lat, 50),
        "read_latency_p95_s": percentile(lat, 95),
        "read_latency_p99_s": percentile(lat, 99),
        "read_latency_p99_outside_transients_s": percentile(calm, 99),
        "write_throughput_bps": r.write_bytes_after_settle / r.writer_on_s_after_settle
        if r.writer_on_s_after_settle
        else 0.0,
        "class_changes_per_min": r.class_changes_after_settle / minutes,
    }
    if thr is not None:
        out["time_above_threshold_pct"] = (
            100.0 * sum(1 for v in lat if v > thr) / len(lat) if lat else math.nan
        )
        peaks = []
        for on in ons:
            seg = [(t, v) for t, v in after if on <= t < on + PEAK_WINDOW_S]
            if not seg:
                continue
            peak = max(v for _, v in seg)
            # the switch-on's own excursion: the first one that starts within
            # TRANSIENT_S; later ones are noise and show in p99 / time above
            start = next((t for t, v in seg if v > thr), None)
            recovered = 0.0
            if start is not None and start < on + TRANSIENT_S:
                end = next((t for t, v in seg if t > start and v <= thr), on + PEAK_WINDOW_S)
                recovered = end - on
            peaks.append({"switch_on_s": on, "peak_s": peak, "recovered_after_s": recovered})
        out["switch_ons"] = peaks
        # the learning burst, before the settle time: writers not yet in the sets
        first_on = next(iter(sc.switch_ons()), None)
        if first_on is not None and first_on < settle:
            seg = [
                (t, v)
                for t, v in zip(s.t_s, s.read_latency_s, strict=True)
                if first_on <= t < settle and v is not None
            ]
            if seg:
                t_peak, peak = max(seg, key=lambda x: x[1])
                back = next((t for t, v in seg if t > t_peak and v <= thr), None)
                out["learning"] = {
                    "switch_on_s": first_on,
                    "peak_s": peak,
                    "recovered_after_s": None if back is None else back - first_on,
                }
        out["peak_overshoot_s"] = max((p["peak_s"] for p in peaks), default=math.nan)
        out["overshoot_duration_s"] = max((p["recovered_after_s"] for p in peaks), default=math.nan)
    return out


def best_constant_class(sc: Scenario, threshold_s: float) -> tuple[int, RunResult] | None:
    """Smallest constant class (most writer throughput) whose p95 holds the threshold.

    Binary search: with common random numbers the latency falls monotonically
    with the delay. None if even max_class does not hold it.
    """

    def holds(c: int) -> tuple[bool, RunResult]:
        res = run(sc, constant_class=c)
        return summarize(sc, res, threshold_s)["read_latency_p95_s"] <= threshold_s, res

    lo, hi = 0, sc.controller.max_class
    ok, best = holds(hi)
    if not ok:
        return None
    ok0, res0 = holds(lo)
    if ok0:
        return lo, res0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, res = holds(mid)
        if ok:
            hi, best = mid, res
        else:
            lo = mid
    return hi, best


def simulate(sc: Scenario, baseline: bool = True) -> dict[str, Any]:
    """Uncontrolled run plus one controlled run per threshold, summarized."""
    unc = run(sc)
    runs: list[dict[str, Any]] = []
    all_runs = [unc]
    for thr in sc.thresholds_s:
        res = run(sc, threshold_s=thr)
        all_runs.append(res)
        summary = summarize(sc, res)
        summary["uncontrolled_p95_s"] = summarize(sc, unc, thr)["read_latency_p95_s"]
        if baseline:
            found = best_constant_class(sc, thr)
            if found is None:
                summary["best_constant"] = None
            else:
                c, cres = found
                cw = summarize(sc, cres, thr)["write_throughput_bps"]
                summary["best_constant"] = {
                    "delay_class": c,
                    "delay_s": sc.controller.ladder.delay_s(c),
                    "write_throughput_bps": cw,
                    "controlled_vs_constant": summary["write_throughput_bps"] / cw if cw else None,
                }
        runs.append(summary)
    out_groups = {r.label: _groups_view(sc, r) for r in all_runs if r.groups}
    return {
        **({"groups": out_groups} if out_groups else {}),
        "uncontrolled": summarize(sc, unc),
        "controlled": runs,
        "series": {
            r.label: {
                "t_s": r.series.t_s,
                "read_latency_s": r.series.read_latency_s,
                "ewma_s": r.series.ewma_s,
                "delay_class": r.series.delay_class,
                "delay_s": [sc.controller.ladder.delay_s(c) for c in r.series.delay_class],
                "write_bps": r.series.write_bps,
            }
            for r in all_runs
        },
    }


def _groups_view(sc: Scenario, r: RunResult) -> dict[str, Any]:
    """Per group of a controlled run: its figures after the settle time, and its series."""
    specs = {g.group.name: g.group for g in sc.groups}
    settle = sc.default_settle_s()
    return {
        name: {
            "summary": group_summary(rec, specs[name], settle),
            "latency_target_s": specs[name].latency_target_s,
            "throughput_target_bps": specs[name].throughput_target_bps,
            "throughput_target_iops": specs[name].throughput_target_iops,
            "series": {
                "t_s": rec.t_s,
                "latency_s": rec.latency_s,
                "throughput_bps": rec.throughput_bps,
                "iops": rec.iops,
                "y": rec.y,
                "pwfte": rec.pwfte,
                "share": rec.share,
                "demand": rec.demand,
                "delay_class": rec.delay_class,
                "priority": rec.priority,
            },
        }
        for name, rec in r.groups.items()
    }
