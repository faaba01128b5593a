"""Plant model: a shared storage resource whose latency follows Pesto's LQ line.

Model (Pesto, section 4: latency is linear in outstanding IOs)
    L = C + m * Q
    L: latency of one IO at the device (s), C: intercept (s), m: LQ-slope
    (s per outstanding IO; peak device throughput ~ 1/m IOPS), Q: IOs
    outstanding at the device.

Streams
    closed loop, depth q, each IO d outside the device per round trip (its
    packets' delay, the class of its initiator, plus the stream's own
    overhead: the time outside, `outside_s`):
        each IO's life is L + d, of which L in the device, so by Little's law
        Q_i = q * L / (L + d)          throughput X_i = q / (L + d) IOPS
    (d also carries a stream's own time outside the device: the network and
    the protocol stacks, `overhead_ms` in a scenario)
    open loop at lambda IOPS (the small random reader):
        Q_j = lambda * L               throughput X_j = lambda
    closed with a rate cap r (fio's --rate at an iodepth; closed_latency):
        X = min(r, q / (L + d)); at its cap it loads the device as an open
        stream of r IOPS

Noise (lognormal_params, mean_of_n)
    A read's latency is L times a lognormal factor of mean 1 and relative
    standard deviation s (the resource's `noise`); the mean of n reads
    scatters by s / sqrt(n) (a fluid of closed-loop reads, a tick's device
    sample).

Fixed point
    g(L) = L - C - m * (Lambda * L + sum_i q_i * L / (L + d_i)) = 0,
    Lambda = sum of open-loop rates. L/(L+d) is concave, so g is convex,
    g(C) <= 0 and g grows without bound when m * Lambda < 1: exactly one
    root L* >= C. Newton's method started at the upper bound
        L_hi = (C + m * sum q_i) / (1 - m * Lambda)   (where g >= 0)
    descends monotonically onto it (convexity), in a handful of iterations.
    m * Lambda >= 1 means the open-loop load alone saturates the device:
    no steady state exists; that is an error of the scenario.

Worked example (hand-solved in the unit tests)
    C = 2 ms, m = 3 ms, one closed stream q = 4, d = 10 ms, no open load:
        L (L + d) = C (L + d) + m q L
        L^2 + (d - C - m q) L - C d = 0 -> L^2 - 0.004 L - 0.00002 = 0
        L = (0.004 + sqrt(0.004^2 + 4 * 0.00002)) / 2 = 6.899 ms
        X = 4 / (6.899 + 10) ms = 236.7 IOPS
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

NEWTON_TOL_S = 1e-12
NEWTON_MAX_ITER = 60


@dataclass(frozen=True, slots=True)
class Device:
    intercept_s: float  # C
    slope_s_per_io: float  # m


class SaturatedError(ValueError):
    """The open-loop load alone exceeds the device's peak throughput (m * Lambda >= 1)."""


def solve_latency(
    dev: Device,
    open_iops: float,
    closed: Sequence[tuple[float, float]],
) -> float:
    """Device latency L* for open-loop load (IOPS) and closed streams [(depth, outside_s)]."""
    c, m = dev.intercept_s, dev.slope_s_per_io
    mlam = m * open_iops
    if mlam >= 1.0:
        raise SaturatedError(
            f"open-loop load {open_iops:.1f} IOPS saturates the device (peak {1.0 / m:.1f} IOPS)"
        )
    lat = (c + m * sum(q for q, _ in closed)) / (1.0 - mlam)
    for _ in range(NEWTON_MAX_ITER):
        q_closed = 0.0
        dq = 0.0
        for q, d in closed:
            denom = lat + d
            q_closed += q * lat / denom
            dq += q * d / (denom * denom)
        g = lat * (1.0 - mlam) - c - m * q_closed
        gp = 1.0 - mlam - m * dq
        delta = g / gp
        lat -= delta
        if abs(delta) < NEWTON_TOL_S:
            break
    return lat


def closed_throughput_iops(depth: float, latency_s: float, outside_s: float) -> float:
    return depth / (latency_s + outside_s)


# Rounds of closed_latency: each caps at least one more stream, or ends.
CAP_ROUNDS_MAX = 8


@dataclass(frozen=True, slots=True)
class Closed:
    """A closed stream: depth IOs in flight, each outside_s outside the device (its delay
    and the stream's overhead); cap_iops > 0 caps its rate (fio's --rate at an iodepth)."""

    depth: float
    outside_s: float
    cap_iops: float = 0.0


def closed_latency(
    dev: Device, open_iops: float, closed: Sequence[Closed]
) -> tuple[float, list[float]]:
    """The device latency L with the open load and the closed streams, and each closed
    stream's IOs per second: depth / (L + d), or its cap when that is more. A capped
    stream loads the device as an open one at its cap; capping one lowers L, so the
    others are checked again until no more is over its cap.

    E.g. C = 10 ms, m = 5 ms, a reader of depth 1 capped at 25/s and a writer of
    depth 2: uncapped the reader would do 1 / L > 25/s, so L = solve_latency(dev, 25,
    [(2, 0)]) and the rates are [25, 2 / L]."""
    if not any(c.cap_iops for c in closed):  # no caps: one round (the loop's first)
        by_outside: dict[float, float] = {}  # streams with one time outside act as one
        for c in closed:
            by_outside[c.outside_s] = by_outside.get(c.outside_s, 0.0) + c.depth
        lat = solve_latency(dev, open_iops, [(q, d) for d, q in by_outside.items()])
        return lat, [c.depth / (lat + c.outside_s) for c in closed]
    capped: set[int] = set()
    lat = 0.0
    for _ in range(CAP_ROUNDS_MAX):
        by_outside = {}
        for i, c in enumerate(closed):
            if i not in capped:
                by_outside[c.outside_s] = by_outside.get(c.outside_s, 0.0) + c.depth
        extra = sum(closed[i].cap_iops for i in capped)
        lat = solve_latency(dev, open_iops + extra, [(q, d) for d, q in by_outside.items()])
        over = {
            i
            for i, c in enumerate(closed)
            if c.cap_iops and i not in capped and c.depth / (lat + c.outside_s) > c.cap_iops
        }
        if not over:
            break
        capped |= over
    return lat, [
        c.cap_iops if i in capped else c.depth / (lat + c.outside_s) for i, c in enumerate(closed)
    ]


def lognormal_params(rel_sd: float) -> tuple[float, float]:
    s2 = math.log1p(rel_sd * rel_sd)
    return -s2 / 2.0, math.sqrt(s2)


def mean_of_n(rel_sd: float, n: float, g: float) -> float:
    """A mean-1 lognormal factor for the mean of n IOs of relative spread rel_sd
    (its spread rel_sd / sqrt(n)), from the standard normal draw g."""
    mu, sd = mean_of_n_params(rel_sd, n)
    return math.exp(mu + sd * g)


def mean_of_n_params(rel_sd: float, n: float) -> tuple[float, float]:
    """mean_of_n's lognormal parameters (mu, sd): its factor is exp(mu + sd * g)."""
    return lognormal_params(rel_sd / math.sqrt(max(n, 1.0)))


def costed_latency(
    dev: Device, open_iops: float, closed: Sequence[Closed], costs: Sequence[float]
) -> tuple[float, list[float], list[float]]:
    """The open load's latency at the device (its IOs cost 1), each closed stream's and
    its IOs per second, when its IOs cost the device `costs[i]` times an ordinary IO.

    Processor sharing on the LQ line: every IO in the device is served alike, so
    an IO that needs c times the work stays c times as long:
        L_i = C + c_i * m * Q,   Q = IOs in the device (every stream's, Little)
    A closed stream keeps q_i * L_i / (L_i + d_i) of them there, an open one (or a
    capped one, at its cap) lambda * L_i. h(Q) = Q - sum of those is convex with
    h(0) <= 0: one root, found by Newton's method from the upper bound
        Q_hi = (sum q_i + C * Lambda) / (1 - m * sum over the open of lambda * c)
    (as solve_latency; with every cost 1 both give the same L). Caps as
    closed_latency. The device's share of time at work is m * sum of rate x cost
    (utilization_of).

    E.g. C = 0, m = 8 ms, a random stream (c = 1) and a sequential one (c = 0.02),
    both q = 8 undelayed: Q = 16, L = 128 ms and 2.56 ms, 62.5 and 3,125 IOPS, each
    half of the device's time."""
    c0, m = dev.intercept_s, dev.slope_s_per_io
    capped: set[int] = set()
    lats: list[float] = [c0] * len(closed)
    q = 0.0
    for _ in range(CAP_ROUNDS_MAX):
        opens = [(open_iops, 1.0)] + [(closed[i].cap_iops, costs[i]) for i in capped]
        mlam = m * sum(lam * c for lam, c in opens)
        if mlam >= 1.0:
            raise SaturatedError(f"open-loop load saturates the device ({mlam:.2f} of it)")
        free = [i for i in range(len(closed)) if i not in capped]
        q = (sum(closed[i].depth for i in free) + c0 * sum(lam for lam, _ in opens)) / (1 - mlam)
        for _ in range(NEWTON_MAX_ITER):
            g = q - sum(lam * (c0 + c * m * q) for lam, c in opens)
            gp = 1.0 - mlam
            for i in free:
                cl = closed[i]
                lat = c0 + costs[i] * m * q
                g -= cl.depth * lat / (lat + cl.outside_s)
                gp -= cl.depth * costs[i] * m * cl.outside_s / (lat + cl.outside_s) ** 2
            step = g / gp
            q -= step
            if abs(step) < NEWTON_TOL_S * 1e3:  # IOs: a billionth of one
                break
        lats = [c0 + costs[i] * m * q for i in range(len(closed))]
        over = {
            i
            for i in free
            if closed[i].cap_iops
            and closed[i].depth / (lats[i] + closed[i].outside_s) > closed[i].cap_iops
        }
        if not over:
            break
        capped |= over
    rates = [
        c.cap_iops if i in capped else c.depth / (lats[i] + c.outside_s)
        for i, c in enumerate(closed)
    ]
    return c0 + m * q, lats, rates


def utilization_of(
    dev: Device, open_iops: float, rates: Sequence[float], costs: Sequence[float] | None = None
) -> float:
    """The device's share of time at work: m x (the open load + sum of rate x cost),
    at most 1. On the LQ line with cost 1 it is 1 - C / L (Little: m X = m Q / L)."""
    if costs is None:
        work = open_iops + sum(rates)
    else:
        work = open_iops + sum(r * c for r, c in zip(rates, costs, strict=True))
    return min(1.0, dev.slope_s_per_io * work)
