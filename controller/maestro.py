"""Maestro's application controllers and arbiter: priorities across initiator groups.

Problem
    Several groups of initiators share one resource. Each group has a
    target (a read latency it should see, a throughput it should get) and a
    priority p > 0. When the resource can serve every target, serve them;
    when it cannot, fall short of each target in inverse proportion to the
    priority (a group of priority 2 falls half as far short as one of
    priority 1).

Measured signal (per group, per interval; the caller measures it)
    y, the normalised performance: target latency / measured latency, or
    measured throughput / target throughput (the lower of the two for a
    group with both). y >= 1 is a target met; y = 0.9 is 10 % short.

Allocation
    u_i, group i's share of the resource's concurrency C (the IOs it may
    keep at the array), sum u_i = 1. What a share means in delay is the
    caller's business (controller/groups.py); here it is a number in
    [U_MIN_FRACTION, 1].

Model estimator (per group, every interval)
    Maestro's linear auto-regressive model
        y(t+1) ~= y(t) + beta * (u(t+1) - u(t))
    with beta re-fitted each interval by least squares through the origin
    on the last MODEL_WINDOW changes (du, dy). The default beta = 1 (a
    share point buys a point of normalised performance: conservative, and
    it keeps "more share, better performance") replaces a fit with fewer
    than MODEL_MIN_POINTS changes, too little movement to tell
    (sum du^2 < MODEL_MIN_EXCITATION), a poor fit (R^2 < MODEL_MIN_R2) or a
    slope outside [BETA_MIN, BETA_MAX] ("default model").

Requirement estimator
    r = c + (1 - y) / beta, the share that would bring y to 1 by the model,
    clamped to [c - l, c + l] (l = limit_max_fraction: the model holds near
    the operating point only) and to [U_MIN_FRACTION, 1].

Arbiter (box_i = [max(c_i - l, U_MIN_FRACTION), min(c_i + l, 1)])
    underload, sum r <= 1:  u_i = r_i + t * p_i, the excess spread in
                            proportion to priority (clipped to box_i, the
                            clipped ones' excess spread over the others)
    overload,  sum r > 1:   Maestro's linear program
                            minimise eps subject to
                              e_i(u_i) - e_j(u_j) <= eps   for all i != j
                              u_i in box_i,  sum u_i = 1
                            e_i(u) = p_i * (1 - y_i - beta_i * (u - c_i)),
                            the priority-weighted fractional tracking error
                            (PWFTE) the model predicts.

The linear program in closed form (water-filling), and why it is optimal
    e_i(u) = a_i - b_i * u with b_i = p_i * beta_i > 0. For a level L let
        u_i(L) = clip((a_i - L) / b_i, box_i),
    so every unclipped group has e_i = L, those clipped at the top of their
    box e_i >= L, at the bottom e_i <= L. S(L) = sum u_i(L) is continuous,
    non-increasing and piecewise linear, S(-inf) = sum hi >= 1 >=
    sum lo = S(+inf) (the previous allocation c is feasible), so some L* has
    S(L*) = 1; it is found by sorting the 2N breakpoints (O(N log N)).
    Optimality: let H be the groups clipped at hi, E_H = max e over H (each
    at its smallest possible e), A the unclipped ones. Any feasible u has
    max e >= E_H (H cannot do better) and, as sum over A of u_i equals
    1 - sum over H and lo of u_i >= 1 - sum over H of hi - sum over lo of lo
    = sum over A of u_i(L*), some group of A has u_i >= u_i(L*), i.e. e_i <= L*:
    min e <= L*. So eps >= E_H - L*, and symmetrically (groups clipped at lo,
    E_lo = min e over them) eps >= L* - E_lo; with both sets non-empty,
    eps >= E_H - E_lo. Water-filling attains max(E_H, L*) - min(E_lo, L*),
    which is each of these bounds in its case: its eps is the LP's optimum
    (tests/unit/test_maestro.py checks it against HiGHS on random instances).
    The underload rule is the same water-filling with a_i = r_i / p_i,
    b_i = 1 / p_i.

Bounds
    beta in [BETA_MIN, BETA_MAX]; u in [U_MIN_FRACTION, 1]; a change of at
    most l per interval (a priority change moves an allocation by at most l
    per interval: from 1/3 to 2/3 in 7 intervals at l = 0.05). l is the
    caller's, per claim or for all (Claim.limit, arbitrate's limit_max).

How to watch it
    Per group: y, the PWFTE p * (1 - y), the share u, and beta with
    whether it is the default model's (Model.default); groups.py keeps them
    per group and `santhrottle-simulate` shows them.

Worked example
    Two groups, p = 1 and 2, both at c = 0.5 with y = 0.8, beta = 1,
    l = 0.05. Requests 0.5 + 0.2 -> clamped 0.55 each: sum 1.1 > 1,
    overload. e_1 = 1 * (0.7 - u_1), e_2 = 2 * (0.7 - u_2): equal at
    u_1 = 0.433, u_2 = 0.567, but u_1 may fall to 0.45 only: u = (0.45,
    0.55), e = (0.25, 0.30), eps = 0.05. With l = 0.2 the equal point is
    within reach: u = (0.433, 0.567), e = 0.267 each, eps = 0, and the
    shortfalls 1 - y predicted, 0.267 and 0.133, are 2 : 1.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# Changes (du, dy) the slope is fitted on: Maestro re-fits on "the past
# several" intervals; 8 s of 1 s intervals follows a workload that changes
# over tens of seconds.
MODEL_WINDOW = 8
# Fewer changes than this: the default model.
MODEL_MIN_POINTS = 3
# sum du^2 under this: the allocation hardly moved, the slope is noise.
# (0.02)^2 * 3: three moves of 2 share points.
MODEL_MIN_EXCITATION = 0.0012
# A fit explaining less than this of dy's variance is poor.
MODEL_MIN_R2 = 0.3
# Slopes outside this are not believed: more share must help (> 0), and a
# slope of 20 predicts a 10 % change of y for half a share point.
BETA_MIN = 0.05
BETA_MAX = 20.0
DEFAULT_BETA = 1.0
# No group's share goes under this: its delay stays finite and its model
# keeps seeing the effect of its share.
U_MIN_FRACTION = 0.005
# The limit on a share's change per interval. Maestro's is 5 % of C; groups.py
# scales this one by the share in use at the array and adapts it per group.
LIMIT_MAX_FRACTION = 0.1


@dataclass(slots=True)
class Model:
    """One group's linear auto-regressive model of y against its share u."""

    window: int = MODEL_WINDOW
    changes: deque[tuple[float, float]] = field(default_factory=deque)
    last: tuple[float, float] | None = None  # (u, y) of the previous interval
    beta: float = DEFAULT_BETA
    default: bool = True  # beta is the default model's

    def observe(self, u: float, y: float) -> float:
        """Fold in this interval's (share in force, y measured under it); re-fit."""
        if self.last is not None:
            self.changes.append((u - self.last[0], y - self.last[1]))
            while len(self.changes) > self.window:
                self.changes.popleft()
        self.last = (u, y)
        self.beta, self.default = fit_beta(self.changes)
        return self.beta

    def reset(self) -> None:
        self.changes.clear()
        self.last = None
        self.beta, self.default = DEFAULT_BETA, True


def fit_beta(changes: Iterable[tuple[float, float]]) -> tuple[float, bool]:
    """(beta, is_default): least squares through the origin of dy on du, or the default."""
    sxx = sxy = syy = 0.0
    n = 0
    for du, dy in changes:
        n += 1
        sxx += du * du
        sxy += du * dy
        syy += dy * dy
    if n < MODEL_MIN_POINTS or sxx < MODEL_MIN_EXCITATION or syy <= 0.0:
        return DEFAULT_BETA, True
    beta = sxy / sxx
    r2 = sxy * sxy / (sxx * syy)
    if r2 < MODEL_MIN_R2 or not BETA_MIN <= beta <= BETA_MAX:
        return DEFAULT_BETA, True
    return beta, False


@dataclass(frozen=True, slots=True)
class Claim:
    """One group as the arbiter sees it this interval."""

    priority: float  # > 0
    y: float  # normalised performance measured under `share`
    share: float  # c, the share in force (sum over the claims = 1)
    beta: float  # the model's slope (> 0)
    limit: float | None = None  # this group's change limit l (None: the arbiter's)


def box(c: float, limit_max: float) -> tuple[float, float]:
    """The shares a group may get next interval, from its share c."""
    return max(c - limit_max, U_MIN_FRACTION), min(c + limit_max, 1.0)


def requirement(cl: Claim, limit_max: float = LIMIT_MAX_FRACTION) -> float:
    """The share that would bring y to 1 by the model, within the change limit."""
    lo, hi = box(cl.share, limit_max if cl.limit is None else cl.limit)
    want = cl.share + (1.0 - cl.y) / cl.beta
    return min(max(want, lo), hi)


def pwfte(cl: Claim, u: float | None = None) -> float:
    """p * (1 - f(u)): the priority-weighted fractional tracking error the model
    predicts at share u (None: as measured, at the share in force)."""
    f = cl.y if u is None else cl.y + cl.beta * (u - cl.share)
    return cl.priority * (1.0 - f)


def arbitrate(
    claims: Sequence[Claim], limit_max: float = LIMIT_MAX_FRACTION
) -> tuple[list[float], bool]:
    """(next shares, overloaded): Maestro's arbiter over the groups' claims."""
    if not claims:
        return [], False
    boxes = [box(cl.share, limit_max if cl.limit is None else cl.limit) for cl in claims]
    req = [requirement(cl, limit_max) for cl in claims]
    if sum(req) <= 1.0:  # underload: grant, spread the excess by priority
        a = [r / cl.priority for r, cl in zip(req, claims, strict=True)]
        b = [1.0 / cl.priority for cl in claims]
        boxes = [(r, hi) for r, (_, hi) in zip(req, boxes, strict=True)]
        return water_fill(a, b, boxes), False
    a = [cl.priority * (1.0 - cl.y + cl.beta * cl.share) for cl in claims]  # overload: the LP
    b = [cl.priority * cl.beta for cl in claims]
    return water_fill(a, b, boxes), True


def water_fill(
    a: Sequence[float], b: Sequence[float], boxes: Sequence[tuple[float, float]]
) -> list[float]:
    """u_i = clip((a_i - L) / b_i, box_i) with sum u_i = 1 (b_i > 0).

    The boxes must admit a sum of 1 (sum lo <= 1 <= sum hi); where they do
    not, every u is at the bound that comes nearest."""
    n = len(a)
    lo_sum = sum(lo for lo, _ in boxes)
    hi_sum = sum(hi for _, hi in boxes)
    if hi_sum <= 1.0:
        return [hi for _, hi in boxes]
    if lo_sum >= 1.0:
        return [lo for lo, _ in boxes]
    # events: at L = a - b*hi group i leaves its top (becomes active), at
    # L = a - b*lo it reaches its bottom. S(L) = const + A - L * B.
    events: list[tuple[float, int, int]] = []
    for i in range(n):
        lo, hi = boxes[i]
        events.append((a[i] - b[i] * hi, 0, i))
        events.append((a[i] - b[i] * lo, 1, i))
    events.sort()
    const, big_a, big_b = hi_sum, 0.0, 0.0
    level = prev = events[-1][0]
    for lev, kind, i in events:
        s = const + big_a - lev * big_b
        if s <= 1.0:  # S crossed 1 in the segment [prev, lev] (flat: anywhere in it)
            level = (const + big_a - 1.0) / big_b if big_b > 0.0 else lev
            level = min(max(level, prev), lev)  # rounding: a flat segment's B is ~0
            break
        prev = lev
        lo, hi = boxes[i]
        if kind == 0:
            const -= hi
            big_a += a[i] / b[i]
            big_b += 1.0 / b[i]
        else:
            big_a -= a[i] / b[i]
            big_b -= 1.0 / b[i]
            const += lo
    out = []
    for i in range(n):
        lo, hi = boxes[i]
        out.append(min(max((a[i] - level) / b[i], lo), hi))
    return out


def spread(claims: Sequence[Claim], shares: Sequence[float]) -> float:
    """eps: the largest difference of the predicted PWFTEs at the given shares."""
    e = [pwfte(cl, u) for cl, u in zip(claims, shares, strict=True)]
    return max(e) - min(e) if e else 0.0


def normalised(
    latency_target_s: float | None,
    latency_s: float | None,
    throughput_target: float | None,
    throughput: float | None,
) -> float | None:
    """y for a group: the lower of its targets' ratios; None without a target or a measure."""
    ys = []
    if latency_target_s is not None and latency_s is not None and latency_s > 0.0:
        ys.append(latency_target_s / latency_s)
    if throughput_target is not None and throughput is not None:
        ys.append(throughput / throughput_target)
    ys = [y for y in ys if math.isfinite(y)]
    return min(ys) if ys else None
