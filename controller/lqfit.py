"""Pesto's LQ line L = C + m * Q, fitted online from diskstats, and the threshold it implies.

Problem
    threshold = "auto": a resource's read-latency threshold should be the
    latency at which its device delivers a fraction alpha of its peak
    throughput. With Pesto's line (section 4) L = C + m * Q and Little's
    law X = Q / L, X -> 1/m as Q grows, and X = alpha / m where
        L_alpha = C / (1 - alpha)                  (Pesto, eq. 9)
    alpha = 0.9 by default (SIOC's convention). Only the intercept C sets
    the threshold; the slope m says where the peak is. Pesto measures the
    line with an injector at 2..32 outstanding IOs; here it is fitted
    passively, from the load the resource has anyway: noisy per tick, often
    idle, and varying only sometimes (writers come and go).

Measured signal
    One DeviceSample per sensor interval (100 ms): ios completed, their mean
    latency L, the time-weighted mean IOs outstanding Q. Ticks are folded
    into windows of WINDOW_S, IO-weighted:
        n_w = sum(n),  Q_w = sum(n Q) / n_w,  L_w = sum(n L) / n_w
    Q counts every IO in the device, each IO's own included (Pesto's
    convention: an IO alone takes C + m); a plant whose IOs see C + m * n,
    n the *other* IOs, has the line (C - m) + m * Q under a closed stream
    without think time (arrivals see Q - 1), C + m * Q under Poisson arrivals.
    IO-weighting both keeps a window whose load changed mid-way on the line
    (a weighted mean of points of a line is on it; a time-mean Q against an
    IO-mean L is not: the busier ticks count more in L).

Law (once per window)
    A window with n_w >= MIN_WINDOW_IOS goes into its bin of Q (log-spaced,
    BIN_RATIO wide), which keeps the weighted sums of 1, Q, L, Q^2, Q L,
    L^2 and k, its count of windows. The weight of a window is n_w / Lb^2:
    the mean of n IOs whose latencies spread by a fraction of L has a
    variance ~ L^2 / n; Lb is the bin's mean latency so far (the window's
    own L_w for a new bin): weighting by the window's own noisy L_w would
    favour the windows that came out low, and bias C down by ~0.2 of its
    standard error on the generated plants. Then
        every bin *= exp(-dt / FORGET_TAU_S)       forgetting: a changed array is re-learnt
        a bin over BIN_CAP_WINDOWS is scaled down to it: a steady load
        replaces its own bin's past, and does not drown the Qs seen before
        weighted least squares over the bins:
            m = Sxy / Sxx,  C = Lbar - m Qbar,  R^2 = m Sxy / Syy
            se(C)^2 = s^2 (1/S + Qbar^2 / Sxx),  s^2 = (Syy - m Sxy) / (K - 2)
    confident when K (windows) >= MIN_WINDOWS, q_hi >= MIN_Q_SPREAD_RATIO * q_lo
    (the means of the bins holding >= one window), R^2 >= MIN_R_SQUARED,
    C > 0, m > 0 and se(C) <= MAX_INTERCEPT_REL_SE * C. se(C) is what
    judges the spread: C is an extrapolation to Q = 0, as good as the
    lowest loads seen are low and many (the spread ratio only keeps a
    line that is straight over a narrow range from being extrapolated far).
    LqFit.threshold_s(alpha) = C / (1 - alpha) when that fit is confident,
    else None. LqEstimator.threshold_s(alpha) is the threshold in force: the
    last confident fit's, None before the first (the caller holds its
    configured fallback until then).

Bounds
    Per tick: three multiply-adds, no allocation. Per window: one pass over
    the bins, at most log(Q_MAX / Q_MIN) / log(BIN_RATIO) of them (a bin
    decayed under DROP_WINDOWS is dropped). Inputs that are not finite,
    negative, or intervals without IOs are ignored, never raised on.

Idle behaviour
    Intervals without IOs add nothing; a window with fewer than
    MIN_WINDOW_IOS is skipped (its mean is mostly noise), but the
    forgetting still runs for the time it took. A load that stops varying
    keeps the spread it had for a while (its own bin is capped; the others
    only decay, e^-1 per FORGET_TAU_S), then the fit loses its confidence
    and the last confident line stays in force (`last_confident`) until the
    load varies again. A changed array: the windows off the old line drop
    R^2 and raise se(C), the old line stays in force, and the new one takes
    over once the old windows have decayed: the Qs seen often are replaced
    within ~3 BIN_CAP_WINDOWS, the rarer ones only decay; 15-20 min in the
    unit test (C and m doubled, loads of 2-6 s at four Qs).

Worked example
    C = 2 ms, m = 1 ms/IO (peak 1000 IOPS), 50 IOs per tick. 15 s at Q = 2
    (L = 4 ms): 15 windows in one bin; no line (one Q), threshold None.
    Then 15 s at Q = 8 (L = 10 ms): 30 windows in two bins, each window of
    weight 500/0.004^2 or 500/0.010^2. The fit is exact: C = 2 ms,
    m = 1 ms/IO, R^2 = 1, q_lo = 2, q_hi = 8, K = sum(e^(-j/600), j < 30)
    = 29.29 (forgetting), se(C) = 0: confident, and
        threshold_s(0.9) = 0.002 / (1 - 0.9) = 20 ms
    where Q = (L - C) / m = 18 and X = Q / L = 900 IOPS = 0.9 of the peak.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .domain import DeviceSample

# SIOC's operating point: the threshold is the latency at 90 % of the peak.
DEFAULT_ALPHA = 0.9
# Ten ticks: a window's mean has tens of IOs at least, and a writer that
# comes or goes (seconds) leaves most windows at one load.
WINDOW_S = 1.0
# A window's mean latency over fewer IOs is mostly noise (per-IO spread 50 %
# -> 16 % at 10 IOs); it also counts as one window towards MIN_WINDOWS.
MIN_WINDOW_IOS = 10
# Bins of Q: two per octave. The in-bin spread still counts in the fit; the
# bins only bound each level of load's share.
BIN_RATIO = math.sqrt(2.0)
Q_MIN = 1e-3  # IOs; below it (an all but idle device) Q goes into the lowest bin
Q_MAX = 1e5  # IOs; above it into the highest
# A bin fed continuously holds its last ~30 windows; the other bins keep
# theirs (forgetting aside), so 30 s of another load still weighs as much
# as an hour of the same one.
BIN_CAP_WINDOWS = 30.0
# Everything decays e^-1 per 10 min: a changed array (rebuild, new disks,
# another workload mix) is re-learnt in ~20 min even at Qs not seen again,
# and 10 windows at another Q keep the spread through ~20 min of one load.
FORGET_TAU_S = 600.0
# A bin under this many windows' weight is dropped (memory bound).
DROP_WINDOWS = 0.01
# Confidence: 20 windows (20 s of IO); the Q seen spanning a factor of 1.5
# (bins holding >= 1 window: q_lo at most two spreads from Q = 0); R^2 of
# Pesto's injector less a little for passive data (Pesto discards fits under
# 0.93); C known to 6 %, so that the acceptance's 15 % is 2.5 standard errors
# (se(C) is calibrated on the generated plants: (C^ - C) / se has sd 1.0; at
# 5 % a noisy plant of the sweep's generator, C known to 5.1 % and 4.6 % off,
# still held its fallback at 73 s).
MIN_WINDOWS = 20.0
MIN_Q_SPREAD_RATIO = 1.5
MIN_R_SQUARED = 0.9
MAX_INTERCEPT_REL_SE = 0.06

_INF = math.inf
# 100 ms ticks summed in floating point: ten of them make 0.9999999999999999 s.
_CLOCK_SLACK_S = 1e-6
_LOG_BIN_RATIO = math.log(BIN_RATIO)
_BIN_LO = math.floor(math.log(Q_MIN) / _LOG_BIN_RATIO)
_BIN_HI = math.floor(math.log(Q_MAX) / _LOG_BIN_RATIO)
# A bin: [k windows, sum w, sum w Q, sum w L, sum w Q^2, sum w Q L, sum w L^2]
_K, _W, _WQ, _WL, _WQQ, _WQL, _WLL = range(7)


class LqFit(NamedTuple):
    """The line as fitted at the end of a window (NaN where not defined yet)."""

    intercept_s: float  # C
    slope_s_per_io: float  # m; peak throughput ~ 1/m IOPS
    r_squared: float
    windows: float  # K: windows in the fit, forgetting and caps applied
    q_lo: float  # IOs: lowest bin mean among the bins holding >= 1 window
    q_hi: float  # IOs: highest
    intercept_se_s: float  # standard error of C
    confident: bool

    def threshold_s(self, alpha: float = DEFAULT_ALPHA) -> float | None:
        """C / (1 - alpha) when confident, else None (the caller's fallback holds)."""
        if not self.confident or not 0.0 <= alpha < 1.0:
            return None
        return self.intercept_s / (1.0 - alpha)

    @property
    def peak_iops(self) -> float:
        m = self.slope_s_per_io
        return 1.0 / m if m > 0.0 else math.nan


NO_FIT = LqFit(math.nan, math.nan, math.nan, 0.0, math.nan, math.nan, math.nan, False)


class LqEstimator:
    """One resource's online LQ fit; time is passed in, never read."""

    __slots__ = (
        "_bins",
        "_n",
        "_nl",
        "_nq",
        "_window_start_s",
        "fit",
        "forget_tau_s",
        "last_confident",
        "window_s",
    )

    def __init__(self, window_s: float = WINDOW_S, forget_tau_s: float = FORGET_TAU_S) -> None:
        if not 0.0 < window_s < _INF:
            raise ValueError(f"LQ fit window must be > 0 s, got {window_s}")
        if not 0.0 < forget_tau_s <= _INF:
            raise ValueError(f"LQ fit forgetting time constant must be > 0 s, got {forget_tau_s}")
        self.window_s = window_s
        self.forget_tau_s = forget_tau_s
        self._bins: dict[int, list[float]] = {}
        self._n = 0.0
        self._nq = 0.0
        self._nl = 0.0
        self._window_start_s: float | None = None
        self.fit = NO_FIT
        self.last_confident: LqFit | None = None

    def observe(self, sample: DeviceSample, now_s: float) -> LqFit | None:
        """Fold in one sensor interval ending at now_s; the new fit when a window closed."""
        start = self._window_start_s
        if start is None:  # the first sample starts the clock; its interval came before
            if -_INF < now_s < _INF:
                self._window_start_s = now_s
            return None
        _, ios, lat, q = sample
        # Chained comparisons are False for NaN: NaN, inf, <= 0 IOs and
        # negative values all fall out here.
        if 0 < ios < _INF and 0.0 < lat < _INF and 0.0 <= q < _INF:
            self._n += ios
            self._nq += ios * q
            self._nl += ios * lat
        elapsed = now_s - start
        if elapsed >= self.window_s - _CLOCK_SLACK_S:
            if elapsed == _INF:  # a clock gone to infinity: ignore the time
                return None
            return self._close(now_s, elapsed)
        if elapsed < 0.0:  # the clock went back (a replay): restart the window there
            self._window_start_s = now_s
        return None

    def threshold_s(self, alpha: float = DEFAULT_ALPHA) -> float | None:
        """The threshold in force: the last confident fit's; None before the first."""
        last = self.last_confident
        return None if last is None else last.threshold_s(alpha)

    def _close(self, now_s: float, elapsed_s: float) -> LqFit:
        n, nq, nl = self._n, self._nq, self._nl
        self._n = self._nq = self._nl = 0.0
        self._window_start_s = now_s
        bins = self._bins
        # A gap of days would make decay 0 and 1/decay below infinite: 50 tau forgets all the same.
        decay = math.exp(-min(elapsed_s / self.forget_tau_s, 50.0))
        if n >= MIN_WINDOW_IOS:
            qw, lw = nq / n, nl / n
            i = math.floor(math.log(qw) / _LOG_BIN_RATIO) if qw > Q_MIN else _BIN_LO
            i = min(i, _BIN_HI)
            b = bins.get(i)
            if b is None:
                b = bins[i] = [0.0] * 7
                lref = lw
            else:
                lref = b[_WL] / b[_W]
            # 1/decay: the forgetting of this close (in _refit) brings the window to 1.
            w = n / (lref * lref * decay)
            b[_K] += 1.0 / decay
            b[_W] += w
            b[_WQ] += w * qw
            b[_WL] += w * lw
            b[_WQQ] += w * qw * qw
            b[_WQL] += w * qw * lw
            b[_WLL] += w * lw * lw
        self.fit = self._refit(decay)
        if self.fit.confident:
            self.last_confident = self.fit
        return self.fit

    def _refit(self, decay: float) -> LqFit:
        k_sum = s = sq = sl = sqq = sql = sll = 0.0
        q_lo, q_hi = _INF, -_INF
        dead: list[int] = []
        for i, b in self._bins.items():
            k = b[_K] * decay
            f = decay * BIN_CAP_WINDOWS / k if k > BIN_CAP_WINDOWS else decay
            if f != 1.0:
                for j in range(7):
                    b[j] *= f
            k = b[_K]
            if k < DROP_WINDOWS:
                dead.append(i)
                continue
            k_sum += k
            s += b[_W]
            sq += b[_WQ]
            sl += b[_WL]
            sqq += b[_WQQ]
            sql += b[_WQL]
            sll += b[_WLL]
            if k >= 1.0:
                qm = b[_WQ] / b[_W]
                q_lo = min(q_lo, qm)
                q_hi = max(q_hi, qm)
        for i in dead:
            del self._bins[i]
        if k_sum <= 2.0 or s <= 0.0:
            return NO_FIT._replace(windows=k_sum)
        qbar, lbar = sq / s, sl / s
        sxx = sqq - sq * qbar
        sxy = sql - sq * lbar
        syy = sll - sl * lbar
        if not sxx > 1e-12 * sqq or not syy > 0.0:  # one Q, or one L: no line
            return NO_FIT._replace(windows=k_sum)
        m = sxy / sxx
        c = lbar - m * qbar
        ss_res = max(syy - m * sxy, 0.0)
        r2 = 1.0 - ss_res / syy
        se_c = math.sqrt(ss_res / (k_sum - 2.0) * (1.0 / s + qbar * qbar / sxx))
        if q_lo > q_hi:
            q_lo = q_hi = math.nan
        confident = (
            k_sum >= MIN_WINDOWS
            and q_hi >= MIN_Q_SPREAD_RATIO * q_lo  # False for NaN
            and r2 >= MIN_R_SQUARED
            and c > 0.0
            and m > 0.0
            and se_c <= MAX_INTERCEPT_REL_SE * c
        )
        return LqFit(c, m, r2, k_sum, q_lo, q_hi, se_c, confident)
