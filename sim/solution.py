"""One resource's plant for one dt of the loop, solved once for as long as it holds.

Problem
    Every dt (10 ms) the loop (sim/loop.py, its item 2) needs each resource's
    device latency L, the closed flows' rates, and what that dt adds to the
    sensors (write bytes, closed-loop reads), the group meter and the tenants
    (sim/usage.py). The fixed point and those increments depend only on the
    streams on, the classes each path applies (or the constant class) and
    the array's stall: between a tick's decide() and the next, and between
    two on/off edges of the schedules, they are the same every dt. Solved
    every dt, they would be most of the simulator's time.

What it does
    Solver.solve() builds the closed flows (one per stream on one path;
    sim/paths.py's flows() on N paths), solves the plant with the open load
    (Tenancy.solve: sim/plant.py's closed_latency, or costed_latency with IO
    costs), and returns a Solution: L, a dt's device increments (IOs, their
    latency sum, IOs in flight x dt, as diskstats sees them), per closed
    write flow and path its bytes a dt, per closed read flow and path its IOs
    a dt with the lognormal parameters of their mean's noise, the meter's
    flows, and the tenants' Work. Solver.solution() holds each resource's
    Solution and solves again only when it no longer holds.

Bounds
    It solves again when a stream switches on or off, when a class
    applied moves, at every dt of a stall (nothing moves; the reads take the
    latency before it) and at every dt of a resource with bursty streams
    (their caps follow their queues). In between it adds the same increments
    in the same order: every series, figure and decision is the one solving
    every dt gives, bit for bit (only the noise of closed-loop reads is drawn
    each dt, in the same order, from the same generator).

Worked example
    The paper scenario (12 writers and a reader on one resource): of its
    13,000 dt the plant is solved 10 times uncontrolled (the schedules'
    edges) and 216 times at T = 10 ms (the edges, and the ticks whose
    decide() moved a writer's class); every other dt adds the Solution's 12
    write flows' bytes to the sensor as they were.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .paths import ONE, ClosedOnPaths, Paths, flows
from .plant import Closed, Device, mean_of_n_params
from .scenario import Scenario
from .sensors import Sensed
from .usage import Tenancy, Work

# a closed write flow on a path, as Sensed counts it every dt: (that path's pair writes,
# the pair, that path's resource writes, bytes a dt, the path, the initiator)
WriteFlow = tuple[dict[tuple[str, str], float], tuple[str, str], dict[str, float], float, int, str]


@dataclass(slots=True)
class Solution:
    """One resource's plant solved for the streams on and the classes applied, and what
    one dt of it adds to the sensors, the meter and the tenants: the same every dt until
    a stream switches on or off or a class applied moves (the module's doc)."""

    lat: float  # the open load's latency at the device (L)
    device: tuple[float, float, float]  # a dt's IOs, their latency sum, IOs in flight x dt
    writes: list[WriteFlow]
    # per closed read flow and path moving IOs: (path, IOs a dt, IOs x latency, the
    # lognormal parameters of their mean's noise)
    reads: list[tuple[int, float, float, float, float]]
    metered: list[tuple[str, bool, float, float, float]]  # the group meter's flows
    work: Work  # the tenants' (usage.py)


class Solver:
    """Solves a resource's plant (the module's doc) for the streams on and the
    classes each path applies (or the constant class): one Solution, held while
    it holds (solution())."""

    def __init__(
        self,
        sc: Scenario,
        paths: Paths,
        constant_class: int | None,
        ten: Tenancy,
        sensed: Sensed,
    ) -> None:
        streams = self.streams = sc.streams
        self.n = len(paths.split)
        self.policy = paths.policy
        self.constant_class = constant_class
        self.ten = ten
        self.sensed = sensed
        self.dt = sc.dt_s
        cfg = sc.controller
        self.delay_of = [cfg.ladder.delay_s(k) for k in range(cfg.ladder.max_class + 1)]
        self.resources = {r.name: r for r in sc.resources}
        self.devices = {r.name: Device(r.intercept_s, r.slope_s_per_io) for r in sc.resources}
        inis = list(dict.fromkeys(s.initiator for s in streams))
        self.frac = {ini: paths.fractions(j) for j, ini in enumerate(inis)}
        of = {
            r.name: [i for i, s in enumerate(streams) if s.resource == r.name] for r in sc.resources
        }
        self.closed_of = {
            name: [i for i in mine if streams[i].loop == "closed"] for name, mine in of.items()
        }
        self.open_of = {
            name: [i for i in mine if streams[i].loop == "open"] for name, mine in of.items()
        }
        # per resource, its Solution and the loop's version it was solved at
        self.held: dict[str, tuple[int, Solution]] = {}

    def solution(
        self,
        name: str,
        t: float,
        on: Sequence[bool],
        applied: Sequence[Mapping[str, int]],
        stalled: bool,
        last_lat: float,
        version: int,
    ) -> Solution:
        """Resource name's Solution at t (solve()'s arguments): the one held when it was
        solved at this version (the loop moves it when a stream switches on or off or a
        class applied moves), else solved now, and held unless stalled or bursty."""
        held = self.held.get(name)
        if held is not None and held[0] == version and not stalled:
            return held[1]
        sol = self.solve(name, t, on, applied, stalled, last_lat)
        if stalled or self.ten.of_resource[name]:  # this dt's only
            self.held.pop(name, None)
        else:
            self.held[name] = (version, sol)
        return sol

    def solve(
        self,
        name: str,
        t: float,
        on: Sequence[bool],
        applied: Sequence[Mapping[str, int]],
        stalled: bool,
        last_lat: float,
    ) -> Solution:
        """The plant of resource name at t; stalled: the array serves nothing (no closed
        stream moves, the reads take last_lat, the latency before the stall)."""
        streams, n, dt, ten = self.streams, self.n, self.dt, self.ten
        constant_class, delay_of = self.constant_class, self.delay_of
        dev = self.devices[name]
        # mode "all": every packet to a throttled initiator is delayed
        closed: list[ClosedOnPaths] = []
        owner: list[tuple[int, int | None]]
        fl: list[Closed] = []
        if stalled:
            owner = []
        elif n == 1:  # one path: a flow per stream, as flows() makes it
            app0 = applied[0]
            for i in self.closed_of[name]:
                if not on[i]:
                    continue
                s = streams[i]
                cls = app0.get(s.initiator, 0) if constant_class is None else constant_class
                d = delay_of[cls] + s.overhead_s
                closed.append((s, ONE, [d]))
                fl.append(Closed(s.depth, d, s.rate_iops))
            ten.add_bursty(name, t, on, closed, fl, app0, constant_class, delay_of)
            owner = [(j, 0) for j in range(len(closed))]
        else:
            for i in self.closed_of[name]:
                if not on[i]:
                    continue
                s = streams[i]
                ini = s.initiator
                ds = [
                    delay_of[applied[p].get(ini, 0) if constant_class is None else constant_class]
                    + s.overhead_s
                    for p in range(n)
                ]
                closed.append((s, self.frac[ini], ds))
            fl, owner = flows(closed, self.policy)
        lats: list[float] | None
        if not stalled:
            open_iops = sum(streams[i].rate_iops for i in self.open_of[name] if on[i])
            lat, lats, rates = ten.solve(dev, open_iops, closed, fl, owner)
        else:
            open_iops, lat, lats, rates = 0.0, last_lat, None, []
        lat_of = lats or [lat] * len(rates)
        work = ten.work(name, dev, dt, open_iops, closed, owner, rates, lat_of)
        dev_iops = open_iops + sum(rates)
        device = (dev_iops * dt, dev_iops * dt * lat, dev_iops * lat * dt)
        sensed = self.sensed
        rel_sd = self.resources[name].noise
        writes: list[WriteFlow] = []
        reads: list[tuple[int, float, float, float, float]] = []
        metered: list[tuple[str, bool, float, float, float]] = []
        for q, ((j, path), iops) in enumerate(zip(owner, rates, strict=True)):
            s, f, _ds = closed[j]
            read = s.kind != "write"
            lat_q = lat_of[q]  # its IOs' cost (usage.py)
            metered.append((s.initiator, read, iops, s.size_bytes, lat_q))
            per_path = (
                ((path, iops),)
                if path is not None
                else tuple((p, iops * fp) for p, fp in enumerate(f))
            )
            for p, x in per_path:
                if not read:
                    b = x * s.size_bytes * dt
                    key = (s.resource, s.initiator)
                    writes.append(
                        (sensed.write_pair[p], key, sensed.write_res[p], b, p, s.initiator)
                    )
                elif x > 0.0:
                    m = x * dt
                    mu_n, sd_n = mean_of_n_params(rel_sd, m)
                    reads.append((p, m, m * lat_q, mu_n, sd_n))
        return Solution(lat, device, writes, reads, metered, work)
