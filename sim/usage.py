"""The tenants of one run: bursty streams and IO costs in the plant, and what each got.

What it owns (Tenancy, one per run, driven by sim/loop.py)
    In the plant, every dt: the bursty streams (sim/bursty.py) as closed
    flows capped at their arrival rate while nothing waits at the initiator,
    and draining at their depth while IOs wait; the plant solved with each
    stream's IO cost when a scenario has costs (plant.costed_latency, else
    closed_latency as before); the device's utilization (plant.utilization_of),
    each initiator's disk time (rate x cost x m: its share of the device's
    work) and each bursty stream's IO latencies (its queue at the initiator,
    its delay, its time at the device).
    To the sensors, every tick: each resource's mean utilization over the
    tick (a UtilizationSample, as the daemon's diskstats or wire sensor).
    From the controller, every convergence: each group's levels, level class
    and the classes its members have (Records).

Figures (summary()), per group after the settle time
    latency_p50/p95/p99_s   over its bursty streams' IOs, as they arrived
    iops                    served, mean
    level_seconds           per Levels and cap: convergences at that level x
                            converge_s (billing, docs/levels.md)
    level_cost              sum of cap x seconds (IOPS-seconds, or bytes)
    promotions, demotions   level changes
    busy_share_on           its disk time over the device's busy time, over
                            the seconds its streams were on
Every run of a scenario draws the same arrivals (common random numbers).

Worked example
    A bursty stream with depth 32 whose second asks 3,000 IOPS, L = 1 ms and
    a delay of 20 ms: 32 / 21 ms = 1,524 IOPS are served, 1,476 join its
    queue that second; an IO arriving at its end waits 1,476 / 1,524 = 0.97 s
    before it is sent, then 21 ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from santhrottle.controller.domain import UtilizationSample
from santhrottle.controller.state import ControllerState

from .bursty import Backlog, uniform_seconds
from .plant import Closed, Device, closed_latency, costed_latency, utilization_of
from .scenario import Scenario, Stream


@dataclass
class Records:
    """What the controller decided, at every convergence."""

    t_s: list[float] = field(default_factory=list)
    levels: dict[str, list[list[int]]] = field(default_factory=dict)  # group -> per Levels
    level_class: dict[str, list[int]] = field(default_factory=dict)  # group -> its class
    member_class: dict[str, list[int]] = field(default_factory=dict)  # initiator -> applied


@dataclass(slots=True)
class Work:
    """One dt of a resource's plant solution, for the tenants (Tenancy.work): the same
    every dt while the solution holds, so it is worked out once per solution."""

    resource: str
    busy_s: float  # the device's utilization x dt
    disk: list[tuple[list[float], float]]  # per flow: its initiator's disk seconds, a dt's
    on_s: list[list[bool]]  # the initiators with a flow: their on-seconds
    queues: list[tuple[int, float, float]]  # bursty: (stream, IOs/s served, L + delay)


class Tenancy:
    """The module's doc. One path only for bursty streams (a fleet's paths: ValueError)."""

    def __init__(self, sc: Scenario, n_paths: int = 1) -> None:
        self.sc = sc
        streams = sc.streams
        self.bursty = [i for i, s in enumerate(streams) if s.arrivals is not None]
        if self.bursty and n_paths != 1:
            raise ValueError("bursty streams run with one appliance only")
        self.costly = any(s.cost != 1.0 for s in streams)
        seconds = math.ceil(sc.duration_s) + 1
        u_of: dict[str, list[float]] = {}
        self.arrival: dict[int, list[float]] = {}
        self.backlog: dict[int, Backlog] = {}
        for i in self.bursty:
            a = streams[i].arrivals
            assert a is not None
            if a.process not in u_of:
                u_of[a.process] = uniform_seconds(a.bursts, seconds, f"{sc.seed}:{a.process}")
            self.arrival[i] = [a.quantile(u) for u in u_of[a.process]]
            self.backlog[i] = Backlog(streams[i].depth)
        self.of_resource = {
            r.name: [i for i in self.bursty if streams[i].resource == r.name] for r in sc.resources
        }
        self.util_sum = {r.name: 0.0 for r in sc.resources}  # U x dt over the tick
        self.disk: dict[str, list[float]] = {}  # initiator -> its disk seconds, per second
        self.busy: dict[str, list[float]] = {r.name: [0.0] * seconds for r in sc.resources}
        self.on_s: dict[str, list[bool]] = {}  # initiator -> had a stream on, per second
        self.seconds = seconds
        self.records = Records()
        self._index = {id(streams[i]): i for i in self.bursty}

    # ---------------------------------------------------------------- the plant
    def add_bursty(
        self,
        resource: str,
        t: float,
        on: Sequence[bool],
        closed: list[Any],
        fl: list[Closed],
        applied: Mapping[str, int],
        constant_class: int | None,
        delay_of: Sequence[float],
    ) -> None:
        """The resource's bursty streams as flows (one path), after its closed ones, each
        delayed by its initiator's class applied (or the constant class)."""
        sec = min(int(t), self.seconds - 1)
        for i in self.of_resource[resource]:
            s = self.sc.streams[i]
            lam = self.arrival[i][sec] if on[i] else 0.0
            cap = self.backlog[i].cap(lam)
            if cap is None:
                continue
            k = applied.get(s.initiator, 0) if constant_class is None else constant_class
            d = delay_of[k] + s.overhead_s
            closed.append((s, (1.0,), [d]))
            fl.append(Closed(s.depth, d, cap))

    def solve(
        self,
        dev: Device,
        open_iops: float,
        closed: Sequence[Any],
        fl: Sequence[Closed],
        owner: Sequence[tuple[int, int | None]],
    ) -> tuple[float, list[float] | None, list[float]]:
        """(the open load's latency, each flow's when IOs have costs, the flows' rates);
        owner: each flow's stream (its index in closed) and path."""
        if not self.costly:
            lat, rates = closed_latency(dev, open_iops, fl)
            return lat, None, rates
        return costed_latency(dev, open_iops, fl, [closed[j][0].cost for j, _ in owner])

    def work(
        self,
        resource: str,
        dev: Device,
        dt: float,
        open_iops: float,
        closed: Sequence[Any],
        owner: Sequence[tuple[int, int | None]],
        rates: Sequence[float],
        lats: Sequence[float],
    ) -> Work:
        """What one dt of the plant's solution adds (account()): the device's utilization,
        each flow's disk time, the bursty streams' service (rates: the flows', none while
        the device stalls; lats: theirs at the device)."""
        flows = [(closed[j], path) for j, path in owner[: len(rates)]]
        costs = [c[0].cost for c, _ in flows]
        u = utilization_of(dev, open_iops, rates, costs)
        m = dev.slope_s_per_io
        disk: list[tuple[list[float], float]] = []
        on_s: dict[str, list[bool]] = {}
        queues: list[tuple[int, float, float]] = []
        for q, ((s, _f, ds), path) in enumerate(flows):
            x, c = rates[q], costs[q]
            mine = self.disk.get(s.initiator)
            if mine is None:
                mine = self.disk[s.initiator] = [0.0] * self.seconds
                self.on_s[s.initiator] = [False] * self.seconds
            disk.append((mine, x * c * m * dt))
            on_s[s.initiator] = self.on_s[s.initiator]
            i = self._index.get(id(s))
            if i is not None:  # a bursty stream (one path): its queue at the initiator
                queues.append((i, x, lats[q] + ds[path or 0]))
        return Work(resource, u * dt, disk, list(on_s.values()), queues)

    def account(self, t: float, dt: float, work: Work, on: Sequence[bool]) -> None:
        """One dt of the plant at t: utilization, disk time, the bursty streams' queues."""
        self.util_sum[work.resource] += work.busy_s
        sec = min(int(t), self.seconds - 1)
        self.busy[work.resource][sec] += work.busy_s
        for disk, seconds in work.disk:
            disk[sec] += seconds
        for on_s in work.on_s:
            on_s[sec] = True
        for i, x, outside_s in work.queues:
            arrived = self.arrival[i][sec] if on[i] else 0.0
            self.backlog[i].step(arrived, x, outside_s, dt)

    def take_utilization(self, tick_s: float) -> list[UtilizationSample]:
        out = [UtilizationSample(name, v / tick_s) for name, v in self.util_sum.items()]
        for name in self.util_sum:
            self.util_sum[name] = 0.0
        return out

    # ----------------------------------------------------------- the controller
    def record(self, state: ControllerState, t: float, applied: Mapping[str, int]) -> None:
        """At a convergence: the groups' levels and level classes, the members' classes."""
        rec = self.records
        rec.t_s.append(round(t, 6))
        for g in state.levels.specs:
            ls = state.levels.groups.get(g)
            at = [0] * len(state.levels.specs[g]) if ls is None else [x.level for x in ls.ladders]
            rec.levels.setdefault(g, []).append(at)
            rec.level_class.setdefault(g, []).append(0 if ls is None else ls.delay_class)
        for ini in {s.initiator for s in self.sc.streams}:
            rec.member_class.setdefault(ini, []).append(applied.get(ini, 0))

    # ---------------------------------------------------------------- figures
    def summary(self, start_s: float, converge_s: float) -> dict[str, dict[str, Any]]:
        """Per group (the module's doc), after start_s."""
        out: dict[str, dict[str, Any]] = {}
        rec = self.records
        first = next((k for k, t in enumerate(rec.t_s) if t > start_s), len(rec.t_s))
        for gm in self.sc.groups:
            g = gm.group
            mine = [i for i in self.bursty if self.sc.streams[i].initiator in gm.members]
            merged = Backlog(0.0)
            for i in mine:
                for b, n in self.backlog[i].bins.items():
                    merged.bins[b] = merged.bins.get(b, 0.0) + n
                merged.ios += self.backlog[i].ios
                merged.served += self.backlog[i].served
            row: dict[str, Any] = {
                "latency_p50_s": merged.percentile_s(0.50),
                "latency_p95_s": merged.percentile_s(0.95),
                "latency_p99_s": merged.percentile_s(0.99),
                "iops": merged.served / self.sc.duration_s if mine else math.nan,
            }
            seconds: dict[str, dict[str, float]] = {}
            cost = 0.0
            levels = rec.levels.get(g.name, [])[first:]
            moves = [0, 0]
            for k, at in enumerate(levels):
                for spec, lv in zip(g.levels, at, strict=True):
                    cap = spec.caps[lv]
                    per = seconds.setdefault(spec.name, {})
                    key = f"{cap:g}"
                    per[key] = per.get(key, 0.0) + converge_s
                    cost += cap * converge_s
                if k:
                    for a, b in zip(levels[k - 1], at, strict=True):
                        moves[0 if b > a else 1] += b != a
            row.update(
                level_seconds=seconds,
                level_cost=cost,
                promotions=moves[0],
                demotions=moves[1],
                busy_share_on=self._busy_share(gm.members, start_s),
            )
            out[g.name] = row
        return out

    def contention_shares(self, start_s: float) -> dict[str, float]:
        """Per group, its share of its resources' busy time over the seconds after
        start_s in which every group had a stream on (when a reservation is a
        guarantee: every group wants its time)."""
        none = [False] * self.seconds
        groups = {gm.group.name: gm.members for gm in self.sc.groups}
        both = [
            sec
            for sec in range(math.ceil(start_s), self.seconds)
            if all(any(self.on_s.get(m, none)[sec] for m in mem) for mem in groups.values())
        ]
        return {g: self._share_over(mem, both) for g, mem in groups.items()}

    def _share_over(self, members: Sequence[str], seconds: Sequence[int]) -> float:
        res = {s.resource for s in self.sc.streams if s.initiator in members}
        none = [0.0] * self.seconds
        mine = sum(self.disk.get(m, none)[sec] for m in members for sec in seconds)
        busy = sum(self.busy[r][sec] for r in res for sec in seconds)
        return mine / busy if busy else math.nan

    def _busy_share(self, members: Sequence[str], start_s: float) -> float:
        """The members' disk time over their resources' busy time, over the seconds after
        start_s in which one of them had a stream on."""
        off = [False] * self.seconds
        on = [
            sec
            for sec in range(math.ceil(start_s), self.seconds)
            if any(self.on_s.get(m, off)[sec] for m in members)
        ]
        return self._share_over(members, on)


def streams_of(sc: Scenario, members: Sequence[str]) -> list[Stream]:
    return [s for s in sc.streams if s.initiator in members]
