"""Bursty open-loop arrivals: ON/OFF with heavy-tailed bursts, from a percentile table.

Problem
    Production volumes are bursty: IOTune's six volumes (its Table 2) spend
    most seconds at a few hundred IOPS and a few at several thousand (volume
    1: mean 906, p90 1,877, p95 3,255, p99 4,026, p99.9 5,592 IOPS). A
    static cap at a percentile of that distribution, an elastic level
    (controller/levels.py) and no cap at all are judged on such a stream,
    whose IOs arrive at their own pace whatever the array does.

The rate, second by second (RateTable, ArrivalProcess)
    A per-second rate whose distribution is the table's: r(t) = Q(u(t)),
    Q the table's quantile function and u(t) uniform on [0, 1) at every
    second, so every percentile of r is the table's (up to the run's
    sampling). Q is linear between the given percentiles, flat above the
    last, and below the first (q1, v1) a power law v1 * (u / q1)^k whose
    exponent k >= 0 makes the mean the table's:
        mean = q1 * v1 / (k + 1) + the integral of Q above q1.
    The bursts: u(t) lies in [1 - f, 1) during ON periods and in
    [0, 1 - f) during OFF ones (f = the burst fraction), drawn anew every
    second within the band; ON and OFF periods last a Pareto number of
    seconds (shape a, heavy-tailed: a < 2 has an infinite variance), their
    means in the ratio f : 1 - f. The seconds are then ranked by u and each
    given (rank + 0.5) / n: the run's own marginal is exactly uniform, so
    its percentiles are the table's (a heavy tail's share of ON seconds
    varies from run to run), and its top seconds are still the bursts.
    Streams that name the same process share u(t): a tenant's reads and
    writes burst together.

The stream at the initiator (Backlog)
    Arrivals join the initiator's queue; at most `depth` IOs are outstanding
    (the initiator's queue depth). With nothing queued the stream is open
    at its arrival rate (a closed stream capped at it, sim/plant.py); once
    IOs queue it is a closed stream of `depth` draining them. An IO that
    arrives with B IOs queued before it waits B / x (x: the rate the stream
    is served at, FIFO) before it is sent, then its delay d and its time at
    the device L: its latency is B / x + d + L. Latencies are kept in a
    histogram of LATENCY_BIN_RATIO-wide bins, weighted by the IOs.

Worked example
    Volume 1's table: above p90 the integral is (1877 + 3255) / 2 x 0.05 +
    (3255 + 4026) / 2 x 0.04 + (4026 + 5592) / 2 x 0.009 + 5592 x 0.001 =
    322.8, so 0.9 x 1877 / (k + 1) = 906 - 322.8 and k = 1.90: the median
    is 1877 x (0.5 / 0.9)^1.90 = 615 IOPS.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

# The quantile names a table may give: p50, p90, p99, p99_9 (the 99.9th) ...
PERCENTILE_KEY_PREFIX = "p"
# Histogram bins of IO latency: 1 % wide, from LATENCY_MIN_S.
LATENCY_BIN_RATIO = 1.01
LATENCY_MIN_S = 1e-6


class TableError(ValueError):
    """A percentile table that describes no distribution; the message says why."""


def percentile_of_key(key: str) -> float:
    """ "p90" -> 0.90, "p99_9" -> 0.999; TableError for another key."""
    body = key[1:].replace("_", ".") if key.startswith(PERCENTILE_KEY_PREFIX) else ""
    try:
        q = float(body) / 100.0
    except ValueError:
        raise TableError(f"{key}: not a percentile (p90, p99_9, ...)") from None
    if not 0.0 < q < 1.0 or not body[:1].isdigit():
        raise TableError(f"{key}: not a percentile between p0 and p100")
    return q


@dataclass(frozen=True, slots=True)
class RateTable:
    """A distribution of per-second rates from its mean and some percentiles."""

    mean: float
    knots: tuple[tuple[float, float], ...]  # (quantile, value), ascending
    exponent: float = field(init=False)  # the body's power law below the first knot

    def __post_init__(self) -> None:
        if not self.knots:
            raise TableError("needs at least one percentile beside the mean")
        if not self.mean > 0.0:
            raise TableError("mean: must be > 0")
        prev = (0.0, 0.0)
        for q, v in self.knots:
            if not 0.0 < q < 1.0 or q <= prev[0]:
                raise TableError("percentiles must be distinct and between p0 and p100")
            if not v >= prev[1] or not math.isfinite(v):
                raise TableError("percentiles must not fall as they rise")
            prev = (q, v)
        q1, v1 = self.knots[0]
        body = self.mean - self._above_first()
        if body <= 0.0 or body > q1 * v1 + 1e-9:
            lo = self._above_first() / 1.0
            hi = lo + q1 * v1
            raise TableError(
                f"a mean of {self.mean:g} does not fit these percentiles "
                f"(it must be above {lo:g} and at most {hi:g})"
            )
        object.__setattr__(self, "exponent", max(0.0, q1 * v1 / body - 1.0))

    @classmethod
    def of(cls, table: Mapping[str, float]) -> RateTable:
        """From {"mean": 906, "p90": 1877, "p99_9": 5592, ...}."""
        if "mean" not in table:
            raise TableError("mean: missing")
        knots = sorted((percentile_of_key(k), float(v)) for k, v in table.items() if k != "mean")
        return cls(float(table["mean"]), tuple(knots))

    def _above_first(self) -> float:
        total = 0.0
        for (qa, va), (qb, vb) in zip(self.knots, self.knots[1:], strict=False):
            total += (qb - qa) * (va + vb) / 2.0
        q_last, v_last = self.knots[-1]
        return total + (1.0 - q_last) * v_last

    def quantile(self, u: float) -> float:
        """The rate at quantile u in [0, 1]."""
        q1, v1 = self.knots[0]
        if u <= q1:
            return v1 * (u / q1) ** self.exponent if u > 0.0 else 0.0 if self.exponent else v1
        i = bisect.bisect_right([q for q, _ in self.knots], u) - 1
        if i >= len(self.knots) - 1:
            return self.knots[-1][1]
        (qa, va), (qb, vb) = self.knots[i], self.knots[i + 1]
        return va + (vb - va) * (u - qa) / (qb - qa)


@dataclass(frozen=True, slots=True)
class Bursts:
    """The ON/OFF structure: the share of seconds in bursts, their mean length, and
    the Pareto shape of the ON and OFF lengths."""

    fraction: float = 0.2
    mean_s: float = 10.0
    shape: float = 1.5


def uniform_seconds(bursts: Bursts, seconds: int, seed: str) -> list[float]:
    """u(t) for t = 0 .. seconds - 1: uniform marginal, its top `fraction` in bursts."""
    rng = random.Random(seed)
    f, a = bursts.fraction, bursts.shape

    def pareto(mean_s: float) -> int:
        xm = mean_s * (a - 1.0) / a
        return max(1, round(xm * rng.paretovariate(a)))

    on = rng.random() < f
    out: list[float] = []
    while len(out) < seconds:
        n = pareto(bursts.mean_s if on else bursts.mean_s * (1.0 - f) / f)
        lo, width = (1.0 - f, f) if on else (0.0, 1.0 - f)
        out.extend(lo + width * rng.random() for _ in range(n))
        on = not on
    latent = out[:seconds]
    # ranked: the run's own marginal exactly uniform (a heavy tail's ON share varies
    # from run to run), the bursts still its top seconds
    order = sorted(range(seconds), key=latent.__getitem__)
    ranked = [0.0] * seconds
    for rank, i in enumerate(order):
        ranked[i] = (rank + 0.5) / seconds
    return ranked


class Backlog:
    """One bursty stream at its initiator: the IOs queued, and its IOs' latencies."""

    def __init__(self, depth: float) -> None:
        self.depth = depth
        self.queued = 0.0
        self.bins: dict[int, float] = {}  # latency bin -> IOs
        self.ios = 0.0
        self.served = 0.0

    def cap(self, arrival_iops: float) -> float | None:
        """The cap of its closed-stream stand-in this step: its arrival rate with
        nothing queued, 0 (none: draining at its depth) otherwise; None: not active."""
        if self.queued > 1e-9:
            return 0.0
        return arrival_iops if arrival_iops > 0.0 else None

    def step(self, arrival_iops: float, served_iops: float, latency_s: float, dt: float) -> None:
        """Account one step: arrivals, service, and the arrivals' latency."""
        wait = self.queued / served_iops if served_iops > 0.0 else 0.0
        n = arrival_iops * dt
        if n > 0.0:
            b = int(math.log(max(wait + latency_s, LATENCY_MIN_S) / LATENCY_MIN_S) / _LOG_BIN)
            self.bins[b] = self.bins.get(b, 0.0) + n
            self.ios += n
        self.served += served_iops * dt
        self.queued = max(0.0, self.queued + (arrival_iops - served_iops) * dt)

    def percentile_s(self, q: float) -> float:
        """The latency under which a share q of the IOs arrived (bin's upper edge)."""
        if not self.ios:
            return math.nan
        want, seen = q * self.ios, 0.0
        for b in sorted(self.bins):
            seen += self.bins[b]
            if seen >= want - 1e-9:
                return LATENCY_MIN_S * LATENCY_BIN_RATIO ** (b + 1)
        return LATENCY_MIN_S * LATENCY_BIN_RATIO ** (max(self.bins) + 1)


_LOG_BIN = math.log(LATENCY_BIN_RATIO)


@dataclass(frozen=True, slots=True)
class Arrivals:
    """A bursty stream's arrivals: `share` of the rates of `table`, second by second,
    on the process named `process` (streams naming one process burst together)."""

    table: RateTable
    process: str
    share: float = 1.0
    bursts: Bursts = field(default_factory=Bursts)

    def quantile(self, q: float) -> float:
        """This stream's IOPS at the q-th quantile of its seconds."""
        return self.share * self.table.quantile(q)
