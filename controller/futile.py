"""Futile delay: a class comes back down when the delay does not lower the latency it is for.

Problem
    The law raises a resource's class while its read latency is over the threshold,
    on the premise that the latency is the writers' doing.  Where it is not (a slow
    path between the initiators and the target that the wire sensor measures, a load
    santhrottle does not see, an array that is slow on its own), the delay takes the
    members' throughput and buys nothing: the class climbs to the clamp and stays
    there for as long as the latency stays over the threshold (work conservation,
    docs/controller.md "Futile delay").

Signals (the resource's read-latency EWMA and its write-rate EWMA: its writes as the
sensor sees them)
    Both are smoothed again over FUTILE_TAU_S, a convergence at a time: a second's
    noise must neither make a peak nor break a run of futile convergences.  An
    episode begins when the class leaves 0: its peak latency and peak write rate
    start at the smoothed values of the last convergence at class 0 (the plant
    undelayed), and follow their maxima while the class is above 0.

Law (per resource not decided by groups, at every convergence)
    futile convergence: latency > threshold (still not held; the smoothed latency),
                        write rate <= FUTILE_WRITE_FRACTION x peak write rate (the
                        delay has taken at least that share of the writes),
                        latency >= FUTILE_LATENCY_FRACTION x peak latency (and the
                        latency has not come down by more than the rest)
    FUTILE_CONVERGES futile convergences in a row release the resource: its PID is
    reset, and for backoff_s its class is 0 (decide.py pulls it down, a class a tick
    as every decrease, and holds the PID at its floor).  Then the law acts again from
    class 0: a delay that has become useful is found as before.  The backoff starts
    at FUTILE_BACKOFF_S and doubles with each release up to FUTILE_BACKOFF_MAX_S; a
    convergence with the latency at or under the threshold sets it back.
    refuted:            during a release, the smoothed latency climbs over
                        FUTILE_REFUTE_X x the episode's peak latency: without the
                        delay the latency is higher than it ever was with it, so the
                        delay was holding it.  The release ends at that convergence
                        (the law acts again at once), the backoff is set back, and
                        the next episode starts from the latency of the moment.

Bounds
    A plant where the delay works sees none of it: there the latency comes down when
    the writes do (by more than 1 - FUTILE_LATENCY_FRACTION of its peak), or the
    threshold is held.  Where it does not work, the members are delayed for the
    FUTILE_CONVERGES convergences of an episode and the ramp before them, then once
    per backoff at most.  A resource without a write rate (a sensor that gives none)
    is never futile.  A release the latency refutes (a delay that was working, taken
    for futile: a stall of the guest or the array, a burst's start) lasts the few
    convergences the smoothed latency takes to climb past 1.25 times its peak, not
    the backoff; where the delay is futile the latency without it stays near its
    peak (the plant undelayed is where the episode began), and nothing is refuted.

Worked example
    T = 20 ms; the class leaves 0 with the latency at 21 ms and 40 MB/s of writes;
    at the clamp the writes are 3 MB/s and the latency 24.6 ms (its peak 26 ms):
    24.6 > 20, 3 <= 0.5 x 40 and 24.6 >= 0.8 x 26, ten convergences in a row ->
    released for 60 s; the latency at class 0 is 25 ms, over T: the next episode, if
    futile too, is released for 120 s, then 240 s, 480 s at most.  Had the latency
    climbed to 33 ms (over 1.25 x 26 ms) without the delay, the release would have
    ended at that convergence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from .ewma import Ewma

# The delay took at least half of the writes...
FUTILE_WRITE_FRACTION: Final = 0.5
# ...and the latency came down by a fifth of its peak or less
FUTILE_LATENCY_FRACTION: Final = 0.8
# for ten convergences in a row (10 s at the default 1 s): an array's queue drains in
# a second or two once the writes that filled it are gone; a stall of its own (no
# writes, no reads) is over in a few seconds (sim/scenarios/stalls.toml: 0.4 and 4 s)
FUTILE_CONVERGES: Final = 10
# the smoothing of both signals, against the noise of a second's reads
FUTILE_TAU_S: Final = 5.0
# a release ends when the smoothed latency climbs over this times the episode's peak:
# the latency without the delay is higher than with it (a quarter over the peak: the
# latency may come down by a fifth under the delay and still count as futile)
FUTILE_REFUTE_X: Final = 1.25
FUTILE_BACKOFF_S: Final = 60.0
FUTILE_BACKOFF_MAX_S: Final = 480.0


@dataclass(slots=True)
class Futility:
    """One resource's episode and backoff."""

    tau_s: float = FUTILE_TAU_S  # the smoothing's time constant
    latency: Ewma = field(init=False)
    writes: Ewma = field(init=False)
    peak_latency_s: float = 0.0
    peak_write_bps: float = 0.0
    convergences: int = 0  # futile ones in a row
    until_s: float = -math.inf  # released (class 0) until then
    backoff_s: float = FUTILE_BACKOFF_S  # the next release's
    releases: int = 0  # since the daemon started
    release_peak_s: float = 0.0  # the peak latency of the episode the last release ended
    refutations: int = 0  # releases ended by the latency (since the daemon started)

    def __post_init__(self) -> None:
        self.latency = Ewma(self.tau_s)
        self.writes = Ewma(self.tau_s)

    def released(self, now_s: float) -> bool:
        return now_s < self.until_s

    def converge(
        self,
        latency_s: float,
        write_bps: float,
        threshold_s: float,
        delay_class: int,
        now_s: float,
    ) -> bool:
        """One convergence's look at the episode; True when it releases the resource."""
        lat = self.latency.update(latency_s, now_s)
        wr = self.writes.update(write_bps, now_s)
        if lat <= threshold_s:
            self.backoff_s = FUTILE_BACKOFF_S
        if self.released(now_s) and lat > FUTILE_REFUTE_X * self.release_peak_s:
            self.until_s = now_s  # refuted: the delay was holding the latency
            self.backoff_s = FUTILE_BACKOFF_S
            self.refutations += 1
        if not delay_class or self.released(now_s):  # no episode: the plant undelayed
            self.peak_latency_s, self.peak_write_bps = lat, wr
            self.convergences = 0
            return False
        self.peak_latency_s = max(self.peak_latency_s, lat)
        self.peak_write_bps = max(self.peak_write_bps, wr)
        if (
            lat > threshold_s
            and wr <= FUTILE_WRITE_FRACTION * self.peak_write_bps
            and lat >= FUTILE_LATENCY_FRACTION * self.peak_latency_s
        ):
            self.convergences += 1
        else:
            self.convergences = 0
        if self.convergences < FUTILE_CONVERGES:
            return False
        self.until_s = now_s + self.backoff_s
        self.release_peak_s = self.peak_latency_s
        self.backoff_s = min(2 * self.backoff_s, FUTILE_BACKOFF_MAX_S)
        self.convergences = 0
        self.releases += 1
        return True
