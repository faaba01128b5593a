"""The paths between the initiators and the array: one per appliance, and how a multipath
initiator spreads its IOs over them.

Model
    An initiator's fraction on path p is f_p (the split, rotated by the
    initiator's index unless rotate is off: initiator j's f_p is
    split[(p + j) mod N], so each appliance sees some hosts mostly and
    others barely, as dm-multipath path groups per host do). d_p is the
    class applied to it on path p, on the ladder, plus the stream's
    overhead. A closed stream of depth q, per multipath policy (flows()):
      round-robin (a fixed split of the IOs): each IO waits d_p with
      probability f_p, its mean cycle is L + sum f_p d_p, so
          X = q / (L + sum_p f_p d_p),  X_p = f_p X
      service-time / queue-length (the path with the fewest outstanding IOs
      per unit of its weight f_p gets the next IO): the outstanding IOs
      settle at q f_p per path, so
          X_p = q f_p / (L + d_p),      X = sum_p X_p
      a path with less delay then carries more than f_p of the IOs.
    With one delay d on every path both give X = q / (L + d): one path.
    Open-loop reads pick a path with probability f_p (sim/loop.py).

Worked example (the plant law, hand-solved in tests/sim/test_fleetsim.py)
    C = 2 ms, m = 3 ms, q = 4, split 90/10, d = 10 ms on path 0, 0 on path 1:
    round-robin: one stream of d = 9 ms, L = 7.42 ms, X = 4 / 16.42 ms = 244 IOPS;
    service-time: streams (3.6, 10 ms) and (0.4, 0 ms), L = 8.0 ms, X_0 = 200
    and X_1 = 0.4 / L = 50 IOPS: the undelayed path carries 20 % of the IOs
    (10 % at equal delays), and the writer more in all (250 IOPS).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .plant import Closed
from .scenario import Stream

POLICIES = ("round-robin", "service-time")
SPLIT_SUM_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class Paths:
    """How the initiators reach the array: one path per appliance (the module's doc)."""

    split: tuple[float, ...] = (1.0,)
    policy: str = "round-robin"
    rotate: bool = True

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy in {POLICIES}")
        if not self.split or min(self.split) < 0.0:
            raise ValueError("split: fractions >= 0, at least one")
        if abs(sum(self.split) - 1.0) > SPLIT_SUM_TOLERANCE:
            raise ValueError(f"split {self.split}: fractions must sum to 1")

    def fractions(self, index: int) -> tuple[float, ...]:
        """Initiator number index's fraction on each path."""
        n = len(self.split)
        k = index % n if self.rotate else 0
        return tuple(self.split[(p + k) % n] for p in range(n))


ONE_PATH = Paths()
ONE = (1.0,)  # the fractions of an initiator on a single path
# (stream, its fractions, its delay on each path)
ClosedOnPaths = tuple[Stream, tuple[float, ...], list[float]]


def flows(
    closed: Sequence[ClosedOnPaths], policy: str
) -> tuple[list[Closed], list[tuple[int, int | None]]]:
    """The plant's closed flows for the streams and their path delays; the owner of
    each: (index into closed, path or None for a flow spread by its fractions)."""
    out: list[Closed] = []
    owner: list[tuple[int, int | None]] = []
    for j, (s, f, ds) in enumerate(closed):
        if policy == "round-robin" or max(ds) == min(ds):
            out.append(
                Closed(s.depth, sum(fp * dp for fp, dp in zip(f, ds, strict=True)), s.rate_iops)
            )
            owner.append((j, None))
            continue
        for p, (fp, dp) in enumerate(zip(f, ds, strict=True)):
            if fp > 0.0:
                out.append(Closed(s.depth * fp, dp, s.rate_iops * fp))
                owner.append((j, p))
    return out, owner
