"""Fleet simulator: several appliances on the paths of one array (issue 22), against one.

Problem
    Multipath initiators split their IOs over N paths, one per appliance.
    Does a fleet (merged samples, one leader per resource, the same class
    on every path) hold the threshold like one appliance that sees all the
    traffic, and does the same delay on every path throttle an unevenly
    split initiator's total? What goes wrong if each appliance controls
    alone on what it sees?

Model (the plant of sim/engine.py and sim/plant.py, per path)
    An initiator's fraction on path p is f_p (the case's split, rotated by
    the initiator's index unless rotate is off: initiator j's f_p is
    split[(p + j) mod N], so each appliance sees some hosts mostly and
    others barely, as dm-multipath path groups per host do). d_p is the
    class its appliance applies to it, on the ladder, plus the stream's
    overhead. A closed writer of depth q, per multipath policy:
      round-robin (a fixed split of the IOs): each IO waits d_p with
      probability f_p, its mean cycle is L + sum f_p d_p, so
          X = q / (L + sum_p f_p d_p),  X_p = f_p X
      service-time / queue-length (the path with the fewest outstanding IOs
      per unit of its weight f_p gets the next IO): the outstanding IOs
      settle at q f_p per path, so
          X_p = q f_p / (L + d_p),      X = sum_p X_p
      a path with less delay then carries more than f_p of the IOs.
    With one delay d on every path both give X = q / (L + d): one
    appliance's plant. Open-loop reads pick a path with probability f_p
    (their own seeded RNG; the arrivals are sim.py's, common random numbers).

Cases (mode)
    single:      one appliance on every path, step() on all samples (today).
    fleet:       each appliance's samples of a tick (controller/fleet.py
                 Report) merged; the leader's step() decides; its Decision
                 reaches every appliance lag_ticks ticks later through a
                 DecisionFence, and each applies it on its paths. failover_at_s:
                 the leader dies; none decides for ELECTION_S; the next (epoch 2)
                 starts from the last published classes (handover) or from 0, and
                 publishes after its first convergence (its write-heavy sets).
    independent: each appliance runs step() alone on its own paths' samples
                 and applies its own classes (the degraded mode).

Measured (per run, from the settle time on, as sim.summarize)
    reader p95 of the 1 s read latency / T (all reads: the array's truth),
    share of ticks above T, writers' throughput / the best constant class's
    (sim.best_constant_class: the same class on every path is one
    appliance's plant), resource class changes per minute (per appliance,
    averaged), per appliance the share of writer-ticks with a writer left
    unthrottled there, and each path's share of the written bytes.

Worked example (the plant law)
    C = 2 ms, m = 3 ms, q = 4, split 90/10, d = 10 ms on path 0, 0 on path 1:
    round-robin: one stream of d = 9 ms, L = 7.42 ms, X = 4 / 16.42 ms = 244 IOPS;
    service-time: streams (3.6, 10 ms) and (0.4, 0 ms), L = 8.0 ms, X_0 = 200
    and X_1 = 0.4 / L = 50 IOPS: the undelayed path carries 20 % of the IOs
    (10 % at equal delays), and the writer more in all (250 IOPS).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from santhrottle.controller.domain import ReadSample, Resource, Samples, WriteSample
from santhrottle.controller.fleet import (
    Decision,
    DecisionFence,
    Report,
    fresh,
    leader_decision,
    merge,
)
from santhrottle.controller.restate import seed_class
from santhrottle.controller.state import ControllerState, new_state
from santhrottle.controller.step import step

from .engine import (
    LATENCY_WINDOW_S,
    RunResult,
    Series,
    _lognormal_params,
    _mean_of_n,
    _on,
    best_constant_class,
    percentile,
    summarize,
)
from .plant import Closed, Device, closed_latency
from .scenario import Scenario

POLICIES = ("round-robin", "service-time")
MODES = ("single", "fleet", "independent")
# The leader's decision reaches the appliances one tick later (etcd's watch
# is milliseconds, but the appliances apply at their own next tick).
PUBLISH_LAG_TICKS = 1
# issue 22's splits: 2 and 4 appliances, even and uneven.
SPLITS: tuple[tuple[float, ...], ...] = (
    (0.5, 0.5),
    (0.7, 0.3),
    (0.9, 0.1),
    (0.25, 0.25, 0.25, 0.25),
    (0.4, 0.3, 0.2, 0.1),
    (0.85, 0.05, 0.05, 0.05),
)
SPLIT_SUM_TOLERANCE = 1e-6
# A dead leader's lease runs out and another is elected after this long (an etcd
# lease of 2 s and a campaign); the appliances keep the last classes meanwhile.
ELECTION_S = 3.0


@dataclass(frozen=True, slots=True)
class FleetCase:
    split: tuple[float, ...] = (1.0,)
    policy: str = "round-robin"
    mode: str = "single"
    rotate: bool = True
    lag_ticks: int = PUBLISH_LAG_TICKS
    failover_at_s: float | None = None  # fleet: the leader dies; another after ELECTION_S
    handover: bool = True  # the new leader starts at the last published classes

    def __post_init__(self) -> None:
        if self.policy not in POLICIES or self.mode not in MODES:
            raise ValueError(f"policy in {POLICIES}, mode in {MODES}")
        if not self.split or min(self.split) < 0.0:
            raise ValueError("split: fractions >= 0, at least one")
        if abs(sum(self.split) - 1.0) > SPLIT_SUM_TOLERANCE:
            raise ValueError(f"split {self.split}: fractions must sum to 1")

    @property
    def label(self) -> str:
        pct = "/".join(f"{round(f * 100)}" for f in self.split)
        return f"{self.mode} {pct} {self.policy}"


def path_fractions(split: Sequence[float], index: int, rotate: bool) -> tuple[float, ...]:
    """Initiator number index's fraction on each path."""
    n = len(split)
    k = index % n if rotate else 0
    return tuple(split[(p + k) % n] for p in range(n))


@dataclass
class FleetRun:
    result: RunResult
    class_changes_per_appliance: list[int]
    unthrottled_ticks: list[dict[str, int]]  # per appliance: writer -> ticks at class 0
    writer_ticks: dict[str, int]  # writer -> ticks writing after the settle time
    path_write_bytes: list[float]  # per path, after the settle time
    writer_bytes: dict[str, float]  # per writer, after the settle time
    refused: int = 0  # decisions the fences refused
    membership: list[dict[str, int]] = field(default_factory=list)  # ticks a member


def _flows(
    closed: list[tuple[Any, tuple[float, ...], list[float]]], policy: str
) -> tuple[list[Closed], list[tuple[int, int | None]]]:
    """The plant's closed streams for (stream, fractions, path delays); owner of each:
    (index into closed, path or None for a stream spread by its fractions)."""
    out: list[Closed] = []
    owner: list[tuple[int, int | None]] = []
    for j, (s, f, ds) in enumerate(closed):
        if policy == "round-robin" or max(ds) == min(ds):
            out.append(
                Closed(s.depth, sum(fp * dp for fp, dp in zip(f, ds, strict=True)), s.rate_iops)
            )
            owner.append((j, None))
            continue
        for p, (fp, dp) in enumerate(zip(f, ds, strict=True)):
            if fp > 0.0:
                out.append(Closed(s.depth * fp, dp, s.rate_iops * fp))
                owner.append((j, p))
    return out, owner


def run_fleet(
    sc: Scenario, case: FleetCase, threshold_s: float, constant_class: int | None = None
) -> FleetRun:
    """One run of a case at threshold_s (or a constant class on every path)."""
    cfg = sc.controller
    n = len(case.split)
    mode = case.mode
    res = [Resource(r.name, threshold_s) for r in sc.resources]
    states: list[ControllerState] = [
        new_state(cfg, res) for _ in range(n if mode == "independent" else 1)
    ]
    fences = [DecisionFence() for _ in range(n)]
    outbox: deque[list[Decision]] = deque()
    applied: list[dict[str, int]] = [{} for _ in range(n)]
    inis = list(dict.fromkeys(s.initiator for s in sc.streams))
    frac = {ini: path_fractions(case.split, j, case.rotate) for j, ini in enumerate(inis)}
    writers = sorted({s.initiator for s in sc.streams if s.kind == "write"})
    devices = {r.name: Device(r.intercept_s, r.slope_s_per_io) for r in sc.resources}
    ln_params = {r.name: _lognormal_params(r.noise) for r in sc.resources}
    windows = {id(s): s.schedule.windows(sc.duration_s) for s in sc.streams}
    settle_s = sc.default_settle_s()
    first = sc.resources[0].name
    open_rng = {id(s): random.Random(f"{sc.seed}:open:{i}") for i, s in enumerate(sc.streams)}
    path_rng = {id(s): random.Random(f"{sc.seed}:path:{i}") for i, s in enumerate(sc.streams)}
    next_arrival = {
        id(s): open_rng[id(s)].expovariate(s.rate_iops) for s in sc.streams if s.loop == "open"
    }
    closed_rng = {r.name: random.Random(f"{sc.seed}:closed:{r.name}") for r in sc.resources}
    paths = range(n)
    pending: list[tuple[float, str, float, int]] = []  # (done, resource, latency, path)
    tick_sum = [{r.name: 0.0 for r in sc.resources} for _ in paths]
    tick_n = [{r.name: 0.0 for r in sc.resources} for _ in paths]
    tick_wb = [{r.name: 0.0 for r in sc.resources} for _ in paths]
    write_bytes: list[dict[tuple[str, str], float]] = [{} for _ in paths]
    window: deque[tuple[float, float]] = deque()
    window_sum = tick_write_bytes = bytes_after_settle = writer_on_after_settle = 0.0
    path_bytes = [0.0 for _ in paths]
    writer_bytes = dict.fromkeys(writers, 0.0)
    changes = [0 for _ in paths]
    prev = [0 for _ in paths]
    unthrottled: list[dict[str, int]] = [dict.fromkeys(writers, 0) for _ in paths]
    member_ticks: list[dict[str, int]] = [dict.fromkeys(writers, 0) for _ in paths]
    writer_ticks = dict.fromkeys(writers, 0)
    series = Series()
    dt = sc.sim_step_s
    tick_every = max(1, round(cfg.tick_s / dt))
    converge_every = max(1, round(cfg.converge_s / dt))
    delay_of = [cfg.ladder.delay_s(k) for k in range(cfg.ladder.max_class + 1)]
    by_resource = {r.name: [s for s in sc.streams if s.resource == r.name] for r in sc.resources}
    writing: set[str] = set()
    epoch, elected_s, waiting, late = 1, -math.inf, False, list[Decision]()

    for k in range(round(sc.duration_s / dt)):
        t = k * dt
        on = {id(s): _on(windows[id(s)], t) for s in sc.streams}
        if t >= settle_s and any(on[id(s)] for s in sc.streams if s.kind == "write"):
            writer_on_after_settle += dt
        writing = {s.initiator for s in sc.streams if s.kind == "write" and on[id(s)]}
        for r in sc.resources:
            mine = by_resource[r.name]
            closed = []
            for s in mine:
                if s.loop != "closed" or not on[id(s)]:
                    continue
                cls = [
                    constant_class if constant_class is not None else applied[p].get(s.initiator, 0)
                    for p in paths
                ]
                closed.append((s, frac[s.initiator], [delay_of[c] + s.overhead_s for c in cls]))
            flows, owner = _flows(closed, case.policy)
            open_iops = sum(s.rate_iops for s in mine if s.loop == "open" and on[id(s)])
            lat, rates = closed_latency(devices[r.name], open_iops, flows)
            mu, sd = ln_params[r.name]
            for (j, path), iops in zip(owner, rates, strict=True):
                s, f, _ds = closed[j]
                per_path = (
                    [(p, iops * fp) for p, fp in enumerate(f)] if path is None else [(path, iops)]
                )
                for p, x in per_path:
                    if s.kind == "write":
                        b = x * s.size_bytes * dt
                        key = (s.resource, s.initiator)
                        write_bytes[p][key] = write_bytes[p].get(key, 0.0) + b
                        tick_wb[p][r.name] += b
                        tick_write_bytes += b
                        if t >= settle_s:
                            bytes_after_settle += b
                            path_bytes[p] += b
                            writer_bytes[s.initiator] += b
                    elif x > 0.0:  # closed-loop reads: a fluid, as in sim.py
                        m = x * dt
                        noise = _mean_of_n(r.noise, m, closed_rng[r.name].gauss())
                        tick_sum[p][r.name] += m * lat * noise
                        tick_n[p][r.name] += m
            for s in mine:
                if s.loop != "open":
                    continue
                rng, prng = open_rng[id(s)], path_rng[id(s)]
                f = frac[s.initiator]
                while next_arrival[id(s)] < t + dt:  # the same draws as sim.py, and a path
                    noise = math.exp(mu + sd * rng.gauss())
                    p = prng.choices(paths, weights=f)[0]
                    if on[id(s)] and s.kind == "read":
                        lat_i = lat * noise
                        heapq.heappush(pending, (next_arrival[id(s)] + lat_i, r.name, lat_i, p))
                    next_arrival[id(s)] += rng.expovariate(s.rate_iops)

        t_end = t + dt
        while pending and pending[0][0] <= t_end:
            done_t, name, lat_i, p = heapq.heappop(pending)
            tick_sum[p][name] += lat_i
            tick_n[p][name] += 1.0
            if name == first:
                window.append((done_t, lat_i))
                window_sum += lat_i
        if (k + 1) % tick_every:
            continue
        # --- tick: each appliance's sensor, then the controllers ---
        while window and window[0][0] <= t_end - LATENCY_WINDOW_S:
            window_sum -= window.popleft()[1]
        converging = (k + 1) % converge_every == 0
        parts = [_part(tick_sum[p], tick_n[p], tick_wb[p], write_bytes[p], cfg.tick_s,
                       converge_every * dt if converging else 0.0) for p in paths]  # fmt: skip
        if mode == "independent":
            for p in paths:
                states[p], _ = step(states[p], parts[p], t_end)
                applied[p] = states[p].effective
        else:
            if mode == "single":  # one appliance: the sums of the paths, unsplit
                samples = _part(
                    _sum(tick_sum), _sum(tick_n), _sum(tick_wb), _sum(write_bytes), cfg.tick_s,
                    converge_every * dt if converging else 0.0,
                )  # fmt: skip
            else:  # fleet: the reports, fresh, merged
                reports = [Report(f"a{p}", k, t_end, parts[p]) for p in paths]
                samples = merge([rep.samples for rep in fresh(reports, t_end)])
                if epoch == 1 and case.failover_at_s is not None and t_end >= case.failover_at_s:
                    epoch, elected_s, waiting = 2, t_end + ELECTION_S, True
                    late, states[0] = list(outbox[-1]) if outbox else [], new_state(cfg, res)
                    outbox.clear()
                    if case.handover:  # the new leader starts where the old one published
                        for name, per in fences[0].classes.items():
                            seed_class(states[0], name, max(per.values(), default=0))
                        states[0].effective.update(fences[0].initiator_classes())
            if mode == "single" or t_end >= elected_s:
                states[0], out = step(states[0], samples, t_end)
                waiting = waiting and not out.converged  # a new leader: its sets, once
            if mode == "single":
                applied = [states[0].effective for _ in paths]
            elif t_end >= elected_s:
                lead = states[0]
                if not waiting:
                    outbox.append(
                        [leader_decision(n_, epoch, k, lead.members(n_), lead.effective)
                         for n_ in lead.resources]
                    )  # fmt: skip
                while len(outbox) > case.lag_ticks:
                    batch = outbox.popleft() + late  # the old leader's last, late: refused
                    late = []
                    for p in paths:
                        for dec in batch:
                            fences[p].offer(dec)
                        applied[p] = fences[p].initiator_classes()
        for p in paths:
            for d in (tick_sum[p], tick_n[p], tick_wb[p]):
                for name in d:
                    d[name] = 0.0
            if converging:
                write_bytes[p].clear()
        st = states[0]
        cls0 = st.resources[first].delay_class if constant_class is None else constant_class
        if t_end >= settle_s:
            for w in writing:
                writer_ticks[w] += 1
            for p in paths:
                own = states[p if mode == "independent" else 0]
                cls_p = own.resources[first].delay_class if constant_class is None else cls0
                if cls_p != prev[p]:
                    changes[p] += 1
                for w in writing:
                    if applied[p].get(w, 0) == 0 and constant_class is None:
                        unthrottled[p][w] += 1
                    if w in own.members(first):
                        member_ticks[p][w] += 1
        for p in paths:
            own = states[p if mode == "independent" else 0]
            prev[p] = own.resources[first].delay_class if constant_class is None else cls0
        series.t_s.append(round(t_end, 6))
        series.read_latency_s.append(window_sum / len(window) if window else None)
        series.ewma_s.append(st.resources[first].ewma.value)
        series.threshold_s.append(threshold_s)
        series.delay_class.append(cls0)
        series.write_bps.append(tick_write_bytes / cfg.tick_s)
        tick_write_bytes = 0.0

    result = RunResult(
        case.label,
        threshold_s,
        constant_class,
        series,
        bytes_after_settle,
        writer_on_after_settle,
        round(sum(changes) / n),
    )
    return FleetRun(
        result,
        changes,
        unthrottled,
        writer_ticks,
        path_bytes,
        writer_bytes,
        sum(f.refused for f in fences),
        member_ticks,
    )


def _sum(ds: Sequence[dict[Any, float]]) -> dict[Any, float]:
    out: dict[Any, float] = {}
    for d in ds:
        for key, v in d.items():
            out[key] = out.get(key, 0.0) + v
    return out


def _part(
    rsum: dict[str, float],
    rn: dict[str, float],
    wb: dict[str, float],
    write_bytes: dict[tuple[str, str], float],
    tick_s: float,
    span_s: float,
) -> Samples:
    """One appliance's Samples of a tick (writes only at a convergence: span_s > 0)."""
    reads = [
        ReadSample(name, math.ceil(rn[name]), rsum[name] / rn[name], wb[name] / tick_s)
        if rn[name] > 0.0
        else ReadSample(name, 0, 0.0, wb[name] / tick_s)
        for name in rn
    ]
    writes = [WriteSample(r, i, b / span_s) for (r, i), b in write_bytes.items()] if span_s else []
    return Samples(reads, writes)


def fleet_summary(sc: Scenario, fr: FleetRun, best_bps: float | None) -> dict[str, Any]:
    """A run's figures: sim.summarize's, relative to T and the best constant class."""
    s = summarize(sc, fr.result)
    thr = fr.result.threshold_s or math.nan
    minutes = max((sc.duration_s - sc.default_settle_s()) / 60.0, 1e-9)
    total = sum(fr.path_write_bytes)
    return {
        "p95_over_T": s["read_latency_p95_s"] / thr,
        "above_T_pct": s["time_above_threshold_pct"],
        "writes_vs_best": s["write_throughput_bps"] / best_bps if best_bps else math.nan,
        "write_throughput_bps": s["write_throughput_bps"],
        "class_changes_per_min": sum(fr.class_changes_per_appliance)
        / len(fr.class_changes_per_appliance)
        / minutes,
        "unthrottled_pct": [
            {w: 100.0 * u[w] / fr.writer_ticks[w] if fr.writer_ticks[w] else 0.0 for w in u}
            for u in fr.unthrottled_ticks
        ],
        "member_pct": [
            {w: 100.0 * m[w] / fr.writer_ticks[w] if fr.writer_ticks[w] else 0.0 for w in m}
            for m in fr.membership
        ],
        "path_write_share": [b / total if total else 0.0 for b in fr.path_write_bytes],
        "refused": fr.refused,
        # the most against the least written (1: the writers are treated alike)
        "writer_spread": max(fr.writer_bytes.values()) / min(fr.writer_bytes.values())
        if fr.writer_bytes and min(fr.writer_bytes.values()) > 0.0
        else math.nan,
    }


def fleet_compare(
    sc: Scenario,
    threshold_s: float,
    seeds: Sequence[int] = (1, 2, 3),
    splits: Sequence[tuple[float, ...]] = SPLITS,
    policies: Sequence[str] = POLICIES,
    modes: Sequence[str] = ("fleet", "independent"),
    rotate: bool = True,
) -> dict[str, Any]:
    """Every (split, policy, mode) against the single appliance, per seed and as medians.

    Seeded: the scenario's seed is replaced by each of seeds (its arrivals,
    noise and path choices); the same seeds give the same figures."""
    cases = [FleetCase((1.0,), "round-robin", "single", rotate)] + [
        FleetCase(tuple(sp), pol, mode, rotate)
        for sp in splits
        for pol in policies
        for mode in modes
    ]
    per_seed: dict[str, list[dict[str, Any]]] = {c.label: [] for c in cases}
    best: list[dict[str, Any]] = []
    for seed in seeds:
        sc_s = replace(sc, seed=seed)
        found = best_constant_class(sc_s, threshold_s)
        best_bps = None
        if found is not None:
            c, cres = found
            best_bps = summarize(sc_s, cres, threshold_s)["write_throughput_bps"]
            best.append({"seed": seed, "delay_class": c, "write_throughput_bps": best_bps})
        for case in cases:
            fr = run_fleet(sc_s, case, threshold_s)
            per_seed[case.label].append({"seed": seed, **fleet_summary(sc_s, fr, best_bps)})
    keys = ("p95_over_T", "above_T_pct", "writes_vs_best", "class_changes_per_min")
    rows = [
        {
            "case": c.label,
            "mode": c.mode,
            "split": list(c.split),
            "policy": c.policy,
            **{
                f"{key}_median": percentile([r[key] for r in per_seed[c.label]], 50) for key in keys
            },
            "runs": per_seed[c.label],
        }
        for c in cases
    ]
    return {"threshold_s": threshold_s, "seeds": list(seeds), "best_constant": best, "rows": rows}
