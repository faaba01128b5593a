"""The simulator's side of initiator groups (controller/groups.py).

What it measures
    Per (resource, initiator), over each convergence: IOs, bytes, reads and
    the reads' latency at the device, fed to decide() as IoSamples: closed
    streams as a fluid (q / (L + d) IOs per second), open-loop reads as
    they complete.
What it records (GroupSeries, per group, at every convergence)
    What the controller saw and decided: the latency the group sees (its
    reads' device latency plus its delay), its throughput, y, the PWFTE,
    its share and demand share, its delay class.
Live changes
    A scenario's group changes (`changes = [{ at_s, priority, ... }]`) are
    applied with configure_groups at their time, as `santhrottle group set`
    does in the daemon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from santhrottle.controller.domain import IoSample
from santhrottle.controller.groups import Group
from santhrottle.controller.restate import configure_groups
from santhrottle.controller.state import ControllerState

from .scenario import Scenario


@dataclass
class GroupSeries:
    t_s: list[float] = field(default_factory=list)
    latency_s: list[float | None] = field(default_factory=list)  # as the group sees it
    throughput_bps: list[float] = field(default_factory=list)
    iops: list[float] = field(default_factory=list)
    y: list[float | None] = field(default_factory=list)
    pwfte: list[float] = field(default_factory=list)
    share: list[float] = field(default_factory=list)
    demand: list[float] = field(default_factory=list)
    delay_class: list[int] = field(default_factory=list)
    priority: list[float] = field(default_factory=list)


class GroupMeter:
    """Per-initiator IO accounting for one run, and the groups' series."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        # ios, bytes, reads, read latency sum, latency sum
        self.acc: dict[tuple[str, str], list[float]] = {}
        self.series: dict[str, GroupSeries] = {g.group.name: GroupSeries() for g in sc.groups}
        self.changes = sorted(
            (at_s, i, spec) for i, g in enumerate(sc.groups) for at_s, spec in g.changes
        )
        self.specs = [g.group for g in sc.groups]

    def configure(self, state: ControllerState) -> None:
        group_of = {m: g.group.name for g in self.sc.groups for m in g.members}
        # every resource is arbitrated when a group has a target (levels alone cap)
        targeted = any(g.targeted for g in self.specs)
        grouped = [r.name for r in self.sc.resources] if targeted else []
        configure_groups(state, self.specs, group_of, grouped)

    def closed(
        self,
        resource: str,
        initiator: str,
        read: bool,
        iops: float,
        size: float,
        lat: float,
        dt: float,
    ) -> None:
        a = self.acc.setdefault((resource, initiator), [0.0] * 5)
        n = iops * dt
        a[0] += n
        a[1] += n * size
        a[4] += n * lat
        if read:
            a[2] += n
            a[3] += n * lat

    def read_done(self, resource: str, initiator: str, size: float, lat: float) -> None:
        a = self.acc.setdefault((resource, initiator), [0.0] * 5)
        a[0] += 1.0
        a[1] += size
        a[2] += 1.0
        a[3] += lat
        a[4] += lat

    def take(self) -> list[IoSample]:
        out = [
            IoSample(r, i, a[0], a[1], a[2], a[3] / a[2] if a[2] else None, a[4] / a[0])
            for (r, i), a in self.acc.items()
        ]
        self.acc.clear()
        return out

    def after_decide(self, state: ControllerState, t_s: float, converged: bool) -> None:
        """Apply the changes due; at a convergence, record every group."""
        changed = False
        while self.changes and self.changes[0][0] <= t_s + 1e-9:
            _, i, spec = self.changes.pop(0)
            self.specs[i] = spec
            changed = True
        if changed:
            self.configure(state)
        if not converged:
            return
        for name, rec in self.series.items():
            gs = None
            for gr in state.groups.resources.values():
                gs = gr.groups.get(name) or gs
            rec.t_s.append(round(t_s, 6))
            rec.priority.append(state.groups.spec(name).priority)
            if gs is None or gs.idle_intervals:  # not there, or no IOs this interval
                idle = gs is not None
                rec.throughput_bps.append(0.0 if idle else math.nan)
                rec.iops.append(0.0 if idle else math.nan)
                rec.pwfte.append(math.nan)
                rec.share.append(gs.share if gs is not None else math.nan)
                rec.demand.append(math.nan)
                rec.latency_s.append(None)
                rec.y.append(None)
                rec.delay_class.append(gs.delay_class if gs is not None else 0)
                continue
            rec.latency_s.append(gs.latency_s)
            rec.throughput_bps.append(gs.throughput_bps)
            rec.iops.append(gs.iops)
            rec.y.append(gs.y)
            rec.pwfte.append(gs.pwfte)
            rec.share.append(gs.share)
            rec.demand.append(gs.demand)
            rec.delay_class.append(gs.delay_class)


def group_summary(
    series: GroupSeries, spec: Group, start_s: float, end_s: float = math.inf
) -> dict[str, float]:
    """A group's figures over [start_s, end_s): p95 of the latency it sees, mean
    throughput, shortfall 1 - mean y (0 where met), mean share and PWFTE."""
    idx = [i for i, t in enumerate(series.t_s) if start_s <= t < end_s]

    def mean(xs: list[float]) -> float:
        xs = [x for x in xs if x is not None and math.isfinite(x)]
        return sum(xs) / len(xs) if xs else math.nan

    lat = sorted(v for i in idx if (v := series.latency_s[i]) is not None)
    ys = [series.y[i] for i in idx]
    out = {
        "latency_p95_s": lat[min(len(lat) - 1, math.ceil(0.95 * len(lat)) - 1)]
        if lat
        else math.nan,
        "latency_mean_s": mean(lat),
        "throughput_bps": mean([series.throughput_bps[i] for i in idx]),
        "iops": mean([series.iops[i] for i in idx]),
        "y_mean": mean([y for y in ys if y is not None]),
        "shortfall": max(0.0, 1.0 - mean([y for y in ys if y is not None])),
        "share": mean([series.share[i] for i in idx]),
        "pwfte": mean([series.pwfte[i] for i in idx]),
        "delay_class": mean([float(series.delay_class[i]) for i in idx]),
        "priority": spec.priority,
    }
    return out
