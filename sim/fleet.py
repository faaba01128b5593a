"""Fleet simulator: several appliances on the paths of one array (issue 22), against one.

Problem
    Multipath initiators split their IOs over N paths, one per appliance.
    Does a fleet (merged samples, one leader per resource, the same class
    on every path) hold the threshold like one appliance that sees all the
    traffic, and does the same delay on every path throttle an unevenly
    split initiator's total? What goes wrong if each appliance controls
    alone on what it sees?

Model
    The simulation loop's paths (sim/loop.py, sim/paths.py): an
    initiator's IOs split over the N paths by the case's split and
    multipath policy, each path's delay the class its appliance applies.
    This module is the appliances' side of it: FleetControl, per mode.

Cases (mode)
    single:      one appliance on every path, decide() on all samples (today).
    fleet:       each appliance's samples of a tick (controller/fleet.py
                 Report) merged; the leader's decide() decides; its Decision
                 reaches every appliance lag_ticks ticks later through a
                 DecisionFence, and each applies it on its paths. failover_at_s:
                 the leader dies; none decides for ELECTION_S; the next (epoch 2)
                 starts from the last published classes (handover) or from 0, and
                 publishes after its first convergence (its write-heavy sets).
    independent: each appliance runs decide() alone on its own paths' samples
                 and applies its own classes (the degraded mode).

Measured (per run, from the settle time on, as measure.summarize)
    reader p95 of the 1 s read latency / T (all reads: the array's truth),
    share of ticks above T, writers' throughput / the best constant class's
    (experiment.best_constant_class: the same class on every path is one
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

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from santhrottle.controller.decide import decide
from santhrottle.controller.domain import Resource
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

from .experiment import best_constant_class
from .loop import run_paths
from .measure import RunResult, percentile, summarize
from .paths import POLICIES, Paths
from .scenario import Scenario
from .sensors import Sensed

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
        if self.mode not in MODES:
            raise ValueError(f"policy in {POLICIES}, mode in {MODES}")
        Paths(self.split, self.policy, self.rotate)  # validates the split and the policy

    @property
    def paths(self) -> Paths:
        return Paths(self.split, self.policy, self.rotate)

    @property
    def label(self) -> str:
        pct = "/".join(f"{round(f * 100)}" for f in self.split)
        return f"{self.mode} {pct} {self.policy}"


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


class FleetControl:
    """The appliances of a case (the Cases above), one per path."""

    def __init__(self, sc: Scenario, case: FleetCase, threshold_s: float) -> None:
        self.cfg = sc.controller
        self.case = case
        self.n = len(case.split)
        self.res = [Resource(r.name, threshold_s) for r in sc.resources]
        deciding = self.n if case.mode == "independent" else 1
        self.states: list[ControllerState] = [
            new_state(self.cfg, self.res) for _ in range(deciding)
        ]
        self.fences = [DecisionFence() for _ in range(self.n)]
        self.outbox: deque[list[Decision]] = deque()
        self.applied: list[Mapping[str, int]] = [{} for _ in range(self.n)]
        self.epoch, self.elected_s, self.waiting = 1, -math.inf, False
        self.late: list[Decision] = []

    @property
    def refused(self) -> int:
        return sum(f.refused for f in self.fences)

    def own(self, path: int) -> ControllerState:
        return self.states[path if self.case.mode == "independent" else 0]

    def decide(self, sensed: Sensed, now_s: float, seq: int) -> Sequence[Mapping[str, int]]:
        case, states, paths = self.case, self.states, range(self.n)
        if case.mode == "independent":  # each appliance alone on its own paths
            for p in paths:
                states[p], _ = decide(states[p], sensed.part(p), now_s)
                self.applied[p] = states[p].effective
            return self.applied
        if case.mode == "single":  # one appliance: the sums of the paths
            samples = sensed.whole()
        else:  # fleet: the reports, fresh, merged
            reports = [Report(f"a{p}", seq, now_s, sensed.part(p)) for p in paths]
            samples = merge([rep.samples for rep in fresh(reports, now_s)])
            if self.epoch == 1 and case.failover_at_s is not None and now_s >= case.failover_at_s:
                self._failover(now_s)
        if case.mode == "single" or now_s >= self.elected_s:
            states[0], out = decide(states[0], samples, now_s)
            self.waiting = self.waiting and not out.converged  # a new leader: its sets, once
        if case.mode == "single":
            self.applied = [states[0].effective for _ in paths]
        elif now_s >= self.elected_s:
            lead = states[0]
            if not self.waiting:
                self.outbox.append(
                    [
                        leader_decision(name, self.epoch, seq, lead.members(name), lead.effective)
                        for name in lead.resources
                    ]
                )
            while len(self.outbox) > case.lag_ticks:
                batch = self.outbox.popleft() + self.late  # the old leader's last, late: refused
                self.late = []
                for p in paths:
                    for dec in batch:
                        self.fences[p].offer(dec)
                    self.applied[p] = self.fences[p].initiator_classes()
        return self.applied

    def _failover(self, now_s: float) -> None:
        """The leader dies: none decides for ELECTION_S, then epoch 2 starts from the last
        published classes (a restart of the leader's controller: handover) or from 0."""
        self.epoch, self.elected_s, self.waiting = 2, now_s + ELECTION_S, True
        self.late = list(self.outbox[-1]) if self.outbox else []
        self.states[0] = new_state(self.cfg, self.res)
        self.outbox.clear()
        if self.case.handover:  # the new leader starts where the old one published
            for name, per in self.fences[0].classes.items():
                seed_class(self.states[0], name, max(per.values(), default=0))
            self.states[0].effective.update(self.fences[0].initiator_classes())


def run_fleet(
    sc: Scenario, case: FleetCase, threshold_s: float, constant_class: int | None = None
) -> FleetRun:
    """One run of a case at threshold_s (or a constant class on every path)."""
    control = FleetControl(sc, case, threshold_s)
    result, st = run_paths(
        sc,
        case.paths,
        control,
        constant_class,
        label=case.label,
        threshold_s=threshold_s,
        stats=True,
    )
    return FleetRun(
        result,
        st.class_changes,
        st.unthrottled_ticks,
        st.writer_ticks,
        st.path_write_bytes,
        st.writer_bytes,
        control.refused,
        st.member_ticks,
    )


def fleet_summary(sc: Scenario, fr: FleetRun, best_bps: float | None) -> dict[str, Any]:
    """A run's figures: measure.summarize's, relative to T and the best constant class."""
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
