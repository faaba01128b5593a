"""The paper's regime: a plant slope and thresholds at which throttling is needed. Pure.

Problem
    The paper's experiment means something only where the writers, left alone, drive
    the reader's latency well over the threshold: its uncontrolled latencies were 2-4
    times its thresholds.  The lab's writers are emulated: on a host whose emulated
    CPU is slow (or busy) each of their IOs costs the guest tens to hundreds of ms
    outside the array, they keep few IOs at it, and the paper's m = 5 ms/IO plant
    leaves the reader under its thresholds (a 0.5 ms static delay then holds them all).

Measured signal
    The uncontrolled phase at the plant's slope m0: the reader's p95 over 1 s windows
    (r95), and over the windows where the writers wrote, the array's mean queue q̄ and
    the writers' IOPS X̄ (N closed-loop writers, C the plant's intercept).

The rule
    regime      uncontrolled p95 >= REGIME_X x T at every threshold T it reports.
    thresholds  the wanted ones (the paper's 10, 15, 20 ms) that the regime admits:
                T <= r95 / REGIME_X.
    slope       when the largest wanted T is not admitted: the plant is a line
                L = C + m Q; the writers' time per IO outside it is
                o = N / X̄ - L0 (L0 = C + m0 q̄, Little's law per writer), and with o
                fixed the array's latency at slope m is the positive root of
                L^2 + (o - C - m N) L - C o = 0 (Q = N L / (L + o)).  The reader's
                p95 is taken to scale with L: r95(m) = r95 x L(m) / L(m0).  The
                slope is the smallest of SLOPE_STEP_MS steps above m0 whose r95(m)
                is AIM_X x T_max, at most MAX_SLOPE_MS.  o falls as the writers slow
                (the emulated CPU has less to do), so the rule errs high.
    light       the other end (`make lab-light`, work conservation): a plant where the
                uncontrolled p95 stays under T, so the controller has nothing to hold.
                T is the smallest wanted threshold; where r95 is outside
                LIGHT_LOW_X..LIGHT_X x T, the slope is the largest of LIGHT_STEP_MS
                steps within MIN_SLOPE_MS..MAX_SLOPE_MS whose r95(m) (the model above,
                down as well as up) is at most LIGHT_AIM_X x T, and the phase runs
                again (at most MAX_TRIES).  The threshold kept is the smallest wanted
                one the last phase's r95 stays under with room (r95 <= LIGHT_X x T).
                The controlled writers must then move at least CONSERVE_AT_LEAST of
                what the uncontrolled phase beside them moved (median over repetitions).
    bounds      once the run is done, each controlled threshold against the rest of
                what a run must show (docs/lab.md): p95 <= T, no target
                retransmission, a best static delay above class 1, the simulator
                within SIM_WITHIN, the writes >= VS_STATIC_AT_LEAST of the best
                static's.

Bounds
    m in [m0, MAX_SLOPE_MS]; at most MAX_TRIES uncontrolled phases (closed_loop.py).

Worked example
    N = 12 writers, C = 2 ms, m0 = 5 ms: q̄ = 3.0, X̄ = 180 IOPS, r95 = 17 ms.  L0 =
    17 ms, o = 12 / 180 - 0.017 = 49.7 ms; the model's L(5 ms) = 17.9 ms.  For T_max =
    20 ms: aim 2.5 x 20 = 50 ms; m = 8 ms gives L = 50.3 ms, r95 = 17 x 50.3 / 17.9 =
    47.8 ms (short); m = 9 ms gives L = 61.9 ms, r95 = 58.8 ms: slope 9 ms/IO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

REGIME_X = 2.0  # uncontrolled p95 >= 2 T (docs/lab.md, "What a run must show")
AIM_X = 2.5  # what the slope is chosen for: room for the run's own spread
SLOPE_STEP_MS = 1.0
MAX_SLOPE_MS = 50.0
MAX_TRIES = 3


@dataclass(frozen=True)
class Uncontrolled:
    """What the rule reads of an uncontrolled phase (labkit.analysis)."""

    m_ms: float  # the plant's slope it ran at
    c_ms: float
    writers: int  # closed-loop writers (hosts x jobs), QD1
    p95_s: float  # the reader's p95 over 1 s windows
    q: float  # the array's mean queue while the writers wrote
    iops: float  # the writers' IOPS while they wrote


def admitted(p95_s: float, wanted_s: list[float]) -> list[float]:
    """The wanted thresholds the regime admits (T <= p95 / REGIME_X)."""
    return [t for t in wanted_s if p95_s >= REGIME_X * t - 1e-12]


def overhead_s(u: Uncontrolled) -> float:
    """The writers' time per IO outside the array: N / X - (C + m0 q), at least 0."""
    if u.iops <= 0:
        return math.inf
    return max(0.0, u.writers / u.iops - (u.c_ms + u.m_ms * u.q) / 1e3)


def array_latency_s(c_s: float, m_s: float, writers: int, o_s: float) -> float:
    """The closed loop's fixed point: L = C + m Q with Q = N L / (L + o)."""
    b = o_s - c_s - m_s * writers
    return (-b + math.sqrt(b * b + 4 * c_s * o_s)) / 2


def predicted_p95_s(u: Uncontrolled, m_ms: float) -> float:
    o = overhead_s(u)
    if not math.isfinite(o):
        return 0.0
    l0 = array_latency_s(u.c_ms / 1e3, u.m_ms / 1e3, u.writers, o)
    lm = array_latency_s(u.c_ms / 1e3, m_ms / 1e3, u.writers, o)
    return u.p95_s * lm / l0 if l0 > 0 else 0.0


def next_slope(u: Uncontrolled, t_max_s: float) -> float | None:
    """The slope to try next for T_max (module header); None when even MAX_SLOPE_MS is
    not predicted to reach it, or nothing moved (m0 is already the maximum)."""
    aim = AIM_X * t_max_s
    m = u.m_ms
    while m < MAX_SLOPE_MS:
        m = min(MAX_SLOPE_MS, m + SLOPE_STEP_MS)
        if predicted_p95_s(u, m) >= aim:
            return m
    return MAX_SLOPE_MS if u.m_ms < MAX_SLOPE_MS else None


def verdict(p95_s: float, wanted_s: list[float]) -> tuple[str, list[float]]:
    """("reached" | "partly" | "not reached", the thresholds to run)."""
    ok = admitted(p95_s, wanted_s)
    if len(ok) == len(wanted_s):
        return "reached", ok
    return ("partly" if ok else "not reached"), ok


# Work conservation: the light plant, its threshold and what the writers must keep
LIGHT_X = 0.8  # the uncontrolled p95 at most 0.8 T: room for the next phases' spread
LIGHT_LOW_X = 0.4  # ... and at least 0.4 T, else the slope is raised toward the aim
LIGHT_AIM_X = 0.6  # the slope aimed at (the quiet host of the m = 5 plant: 0.64 T at 10 ms)
LIGHT_STEP_MS = 0.5
MIN_SLOPE_MS = 0.5
CONSERVE_AT_LEAST = 0.95


def light_slope(u: Uncontrolled, t_s: float) -> float | None:
    """The slope to run the uncontrolled phase at next for a light plant at T (module
    header); None when this phase's p95 is already within LIGHT_LOW_X..LIGHT_X x T, or
    when the model has nothing better (no writes measured, or the same slope)."""
    if LIGHT_LOW_X * t_s <= u.p95_s <= LIGHT_X * t_s or not math.isfinite(overhead_s(u)):
        return None
    steps = round((MAX_SLOPE_MS - MIN_SLOPE_MS) / LIGHT_STEP_MS)
    grid = [MIN_SLOPE_MS + k * LIGHT_STEP_MS for k in range(steps + 1)]
    fits = [m for m in grid if predicted_p95_s(u, m) <= LIGHT_AIM_X * t_s]
    m = max(fits) if fits else MIN_SLOPE_MS
    return None if m == u.m_ms else m


def light_threshold(p95_s: float, wanted_s: list[float]) -> float | None:
    """The smallest wanted threshold the uncontrolled p95 stays under (p95 <= LIGHT_X T);
    None when it stays under none of them."""
    ok = [t for t in sorted(wanted_s) if p95_s <= LIGHT_X * t + 1e-12]
    return ok[0] if ok else None


# The other bounds a run must show (docs/lab.md, "What a run must show")
SIM_WITHIN = 0.15
VS_STATIC_AT_LEAST = 0.90


def bounds(rows: list[dict]) -> dict:
    """Each controlled threshold against the bounds a run must show: p95 <= T, no target
    retransmission, a best static delay above class 1 (else a 0.5 ms pin would do), the
    simulator within 15 %, the controller's writes >= 90 % of the best static's.  None
    where the run has no figure for it."""
    out = {}
    for s in rows:
        best = (s.get("static") or {}).get("best")
        sim = s.get("sim_vs_lab_p95")
        vs = s.get("vs_static_writes")
        out[f"{s['threshold_s'] * 1e3:g}"] = {
            "p95_within_t": s["read_latency_p95_s"] <= s["threshold_s"],
            "no_target_retrans": s["target_retrans_segs"] == 0,
            "best_static_above_class_1": None if best is None else best["class"] > 1,
            "sim_within": None if sim is None else abs(sim) <= SIM_WITHIN,
            "writes_vs_static": None if vs is None else vs >= VS_STATIC_AT_LEAST,
        }
    return out


# CI's short loop picks its one threshold the same way from the other end: the plant
# fixed, T = half what this host's uncontrolled phase made, on a 0.25 ms grid, within
# LO-HI ("auto[:LO-HI]"; "auto" alone: 1-2 ms, the null_blk lab's).
AUTO_FRACTION = 1 / REGIME_X
AUTO_GRID_US = 250
AUTO_RANGE = "1ms-2ms"


def auto_threshold(uncontrolled_p95_s: float, spec: str = "auto") -> str:
    """'1.75ms' for an uncontrolled p95 of 3.9 ms and "auto"; '2ms' at 4 ms and above;
    '1ms' below 2.5 ms (then the contention is too small to tell).  "auto:10ms-20ms":
    '13.25ms' for 26.5 ms, '20ms' at 40 ms and above."""
    from santhrottle.appliance.units import parse_duration_s

    lo, _, hi = (spec.partition(":")[2] or AUTO_RANGE).partition("-")
    lo_us, hi_us = round(parse_duration_s(lo) * 1e6), round(parse_duration_s(hi) * 1e6)
    us = int(uncontrolled_p95_s * 1e6 * AUTO_FRACTION) // AUTO_GRID_US * AUTO_GRID_US
    us = max(lo_us, min(hi_us, us))
    return f"{us / 1000:g}ms"
