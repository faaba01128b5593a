"""What a simulated run measured, and the figures `santhrottle-simulate` prints from it.

Measured (every tick, by the loop, sim/loop.py)
    The "1 s read latency" of the first resource: the mean of the reads
    completed in the trailing LATENCY_WINDOW_S, sampled at every tick, like
    the method paper's plots of the average wait time (LatencyWindow); the
    latency EWMA and the threshold in force the controller saw; the
    resource's delay class; the writers' aggregate rate over the tick.
    After the settle time: the bytes written, the time writers were on and
    the class changes.

Figures (summarize)
    Statistics start at the settle time (Scenario.default_settle_s): the
    end of the writers' first on-period unless the scenario says otherwise,
    because during the first burst the write-heavy sets still have to learn
    who the writers are. On the 1 s latency from then on:
        p50 / p95 / p99            percentiles (linear interpolation)
        p99 outside transients     without the TRANSIENT_S after each
                                   switch-on of the writers
        peak                       the worst within PEAK_WINDOW_S of a
                                   switch-on
        recovered after            from a switch-on until the latency is
                                   back under the threshold (an excursion
                                   that starts within TRANSIENT_S of it;
                                   later ones are noise)
        time above threshold       share of the ticks over it
        write throughput           bytes after the settle time / the time
                                   writers were on after it
        class changes per minute   of the resource's class
    and the learning burst (the first switch-on, before the settle time):
    its peak and when it was back under the threshold.

Worked example
    Reads completing at 0.2 s (8 ms) and 0.9 s (12 ms): the window at
    t = 1.0 s holds both, mean 10 ms; at t = 1.3 s only the second, 12 ms;
    at 2.0 s none (None: no reads in the last second).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .groups import GroupSeries
from .scenario import Scenario

# After a switch-on the p99 and the "back under threshold" clock exclude or
# measure this long a transient (issue acceptance: 2 s).
TRANSIENT_S = 2.0
# Peak after a switch-on is looked for in this window.
PEAK_WINDOW_S = 5.0
# Window of the reported read latency (paper's plots: average wait time).
LATENCY_WINDOW_S = 1.0


class LatencyWindow:
    """The reads of one resource completed in the trailing LATENCY_WINDOW_S."""

    __slots__ = ("_done", "_sum")

    def __init__(self) -> None:
        self._done: deque[tuple[float, float]] = deque()  # (completion, latency)
        self._sum = 0.0

    def add(self, done_s: float, latency_s: float) -> None:
        self._done.append((done_s, latency_s))
        self._sum += latency_s

    def mean(self, now_s: float) -> float | None:
        """The mean latency of the reads completed in (now - window, now]; None if none."""
        done = self._done
        while done and done[0][0] <= now_s - LATENCY_WINDOW_S:
            self._sum -= done.popleft()[1]
        return self._sum / len(done) if done else None


@dataclass
class Series:
    t_s: list[float] = field(default_factory=list)
    read_latency_s: list[float | None] = field(default_factory=list)  # 1 s window, resource 0
    ewma_s: list[float | None] = field(default_factory=list)
    threshold_s: list[float | None] = field(default_factory=list)  # in force, resource 0
    delay_class: list[int] = field(default_factory=list)
    write_bps: list[float] = field(default_factory=list)  # aggregate, over the tick


@dataclass
class RunResult:
    label: str
    threshold_s: float | None
    constant_class: int | None
    series: Series
    write_bytes_after_settle: float
    writer_on_s_after_settle: float
    class_changes_after_settle: int
    groups: dict[str, GroupSeries] = field(default_factory=dict)  # scenarios with [[group]]
    futile_releases: int = 0  # the controllers' releases of a futile delay (futile.py)


def percentile(xs: list[float], q: float) -> float:
    """Percentile with linear interpolation (numpy's default)."""
    if not xs:
        return math.nan
    ys = sorted(xs)
    pos = (len(ys) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


def summarize(sc: Scenario, r: RunResult, threshold_s: float | None = None) -> dict[str, Any]:
    """The figures `santhrottle-simulate` prints, for one run, against a threshold."""
    thr = threshold_s if threshold_s is not None else r.threshold_s
    settle = sc.default_settle_s()
    s = r.series
    after = [
        (t, v)
        for t, v in zip(s.t_s, s.read_latency_s, strict=True)
        if t >= settle and v is not None
    ]
    lat = [v for _, v in after]
    ons = [t for t in sc.switch_ons() if t >= settle]
    calm = [v for t, v in after if not any(on <= t < on + TRANSIENT_S for on in ons)]
    minutes = max((sc.duration_s - settle) / 60.0, 1e-9)
    out: dict[str, Any] = {
        "label": r.label,
        "threshold_s": thr,
        "settle_s": settle,
        "read_latency_p50_s": percentile(lat, 50),
        "read_latency_p95_s": percentile(lat, 95),
        "read_latency_p99_s": percentile(lat, 99),
        "read_latency_p99_outside_transients_s": percentile(calm, 99),
        "write_throughput_bps": r.write_bytes_after_settle / r.writer_on_s_after_settle
        if r.writer_on_s_after_settle
        else 0.0,
        "class_changes_per_min": r.class_changes_after_settle / minutes,
        "futile_releases": r.futile_releases,
    }
    if thr is not None:
        out["time_above_threshold_pct"] = (
            100.0 * sum(1 for v in lat if v > thr) / len(lat) if lat else math.nan
        )
        peaks = []
        for on in ons:
            seg = [(t, v) for t, v in after if on <= t < on + PEAK_WINDOW_S]
            if not seg:
                continue
            peak = max(v for _, v in seg)
            # the switch-on's own excursion: the first one that starts within
            # TRANSIENT_S; later ones are noise and show in p99 / time above
            start = next((t for t, v in seg if v > thr), None)
            recovered = 0.0
            if start is not None and start < on + TRANSIENT_S:
                end = next((t for t, v in seg if t > start and v <= thr), on + PEAK_WINDOW_S)
                recovered = end - on
            peaks.append({"switch_on_s": on, "peak_s": peak, "recovered_after_s": recovered})
        out["switch_ons"] = peaks
        # the learning burst, before the settle time: writers not yet in the sets
        first_on = next(iter(sc.switch_ons()), None)
        if first_on is not None and first_on < settle:
            seg = [
                (t, v)
                for t, v in zip(s.t_s, s.read_latency_s, strict=True)
                if first_on <= t < settle and v is not None
            ]
            if seg:
                t_peak, peak = max(seg, key=lambda x: x[1])
                back = next((t for t, v in seg if t > t_peak and v <= thr), None)
                out["learning"] = {
                    "switch_on_s": first_on,
                    "peak_s": peak,
                    "recovered_after_s": None if back is None else back - first_on,
                }
        out["peak_overshoot_s"] = max((p["peak_s"] for p in peaks), default=math.nan)
        out["overshoot_duration_s"] = max((p["recovered_after_s"] for p in peaks), default=math.nan)
    return out
