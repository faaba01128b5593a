"""The writers' rhythm: when a tick without writes means the writers stopped.

Problem
    decide() holds a resource's class while it has no writers (the delay acts on
    nothing, and the error must not wind the class down), and while a writer
    seems to have stopped (a drop of the write rate, a member away over a
    convergence). It sees the writes a tick at a time. A writer whose every IO
    waits for a long delay writes in bursts: an iSCSI write of 128 KiB behind a
    250 ms delay on the packets the target sends it (its R2T, its response, the
    ACKs its data waits for) is one burst every second or more, with ticks and
    whole convergences without a byte between them. Taken a tick at a time,
    those silences are "no writers" and "away": the class neither integrates
    nor comes down in them, while the ticks with a burst, whose reads the burst
    slows, raise it. The class climbs to the top of the ladder and stays there
    with the read latency under the setpoint between the bursts
    (docs/controller.md, "Writers in bursts").

Measured signal
    Per tick with a write rate: whether the resource was written (the tick's
    rate at or over the floor decide() uses: the away floor with members, else
    the no-writers floor), and the time.

Law (per resource)
    gap       the time between two written ticks, folded into an EWMA of gaps
              (weight GAP_WEIGHT per gap) at most GAP_FOLD_MAX_X times the EWMA
              before it: a pause of the writers teaches the rhythm little, a
              rhythm that thins out as the delay grows is learnt in a few bursts
    patience  GAP_X x gap - (GAP_X - 1) x tick in whole ticks, at least one:
              writers that write every tick are silent after one tick without
              writes (as decide() always counted), writers whose bursts come
              every 2 s after 5.8 s
    silent    no written tick yet, or none for at least the patience
    steady    the gap under STEADY_X ticks: most ticks see writes, and a tick's
              rate under half its EWMA is a drop, not the rhythm
    decide() counts a tick as without writers only when silent, counts write
    drops only when steady, and holds for a member away only where the
    patience is under a convergence (where a convergence without writes from a
    member is unusual).

Bounds
    A rhythm that never comes back is silent after the patience. One pause of
    writers that wrote every tick adds at most GAP_WEIGHT x (GAP_FOLD_MAX_X - 1)
    ticks to the gap (0.075 s: a patience of three ticks), and the next steady
    gaps take a quarter of the excess back each (a tick's patience again after
    six).

Idle behaviour
    Before the first written tick: silent, the gap a tick.

How to watch it
    ResourceState.rhythm (gap_s, last_s); tests/unit/test_rhythm.py.

Worked example
    tick 0.1 s. Writes every tick: gap 0.1 s, patience 0.1 s: the first tick
    without writes is silent. The delay grows and the bursts come every 2 s:
    folds of 0.4, 0.7, 1.225, 2 s move the gap to 0.175, 0.306, 0.536, 0.902 s
    (patience 0.3, 0.7, 1.4, 2.5 s): from the fourth burst on, the ticks
    between two bursts integrate the reader's latency. The writers stop: after
    2.5 s (5.8 s once the gap is 2 s) the ticks are without writers again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# The EWMA's weight of one gap.
GAP_WEIGHT: Final = 0.25
# A gap is folded in at most this many times the EWMA before it.
GAP_FOLD_MAX_X: Final = 4.0
# Silent after this many gaps (less the ticks that are not silence).
GAP_X: Final = 3.0
# Steady: the gap under this many ticks.
STEADY_X: Final = 2.0
# Time within this of the patience is the patience (float sums of ticks).
TIME_TOLERANCE_S: Final = 1e-6


@dataclass(slots=True)
class Rhythm:
    """One resource's writes: the last written tick and the EWMA of the gaps between."""

    last_s: float | None = None
    gap_s: float | None = None

    def observe(self, wrote: bool, now_s: float, tick_s: float) -> None:
        """A tick with a write rate: written or not."""
        if not wrote:
            return
        last = self.last_s
        if last is not None and now_s > last:
            gap = self.gap_s if self.gap_s is not None else tick_s
            seen = min(now_s - last, GAP_FOLD_MAX_X * gap)
            self.gap_s = gap + GAP_WEIGHT * (seen - gap)
        self.last_s = now_s

    def patience_s(self, tick_s: float) -> float:
        """The silence after which the writers have stopped, in whole ticks."""
        gap = self.gap_s if self.gap_s is not None else tick_s
        return tick_s * max(1, round(GAP_X * gap / tick_s - (GAP_X - 1.0)))

    def silent(self, now_s: float, tick_s: float) -> bool:
        """No writes for the patience (or never)."""
        last = self.last_s
        return last is None or now_s - last >= self.patience_s(tick_s) - TIME_TOLERANCE_S

    def steady(self, tick_s: float) -> bool:
        """Writes in most ticks: a tick's rate says something of the writers'."""
        return self.gap_s is None or self.gap_s < STEADY_X * tick_s
