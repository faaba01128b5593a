"""The delay ladder: which delay each class stands for, one definition for everything.

Problem
    The actuator has a fixed set of netem classes; the controller picks
    one per initiator. Fine steps matter near 0 (a 1 ms threshold needs
    0.5 ms resolution), coarse ones far out (between 200 and 210 ms the
    difference is 5 %), and a plant may need anything from 0.5 ms to a
    quarter of a second. A linear ladder of 0.5 ms steps would need 500
    classes for 250 ms; each is an HTB class with a netem qdisc.

Law
    Class 0 is no delay. Class 1 delays by `step`. Each next class adds
    `step`, or multiplies by `ratio` rounded to a whole step, whichever
    is larger; the last class is `max_delay`:
        d_1 = step
        d_{k+1} = min(max_delay, max(d_k + step, step * round(d_k * ratio / step)))
    So the ladder is linear (step) up to step / (ratio - 1) and geometric
    (ratio) above. ratio = 1 is the linear ladder of the method paper
    (class k = k * step).

Bounds
    Delays are whole microseconds (tc's unit). max_delay is bounded by
    the caller (the configuration: far under the initiators' timeouts,
    docs/controller.md "The ladder").

Worked example (the defaults: step 0.5 ms, ratio 1.05, max 250 ms)
    classes 1..20 = 0.5, 1.0, ..., 10.0 ms (0.5 ms steps: 5 % of 10 ms is
    0.5 ms, where the two rules meet); 21 = 10.5 ms, ..., 30 = 15.0,
    31 = 16.0 (15 * 1.05 = 15.75 -> 16.0), ..., 202.5 -> 212.5 ms, and the
    last, class 88 = 250 ms. The same reach linear: 500 classes.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

# Paper appendix: 0.5 ms steps are a suitable granularity near 0.
DEFAULT_STEP_US = 500
# Past 10 ms a class is 5 % more delay than the one below it.
DEFAULT_RATIO = 1.05
# Far enough for a writer that needs five times the paper's 51 ms, far
# under the initiators' 5 s keep-alive timeouts (docs/controller.md).
DEFAULT_MAX_DELAY_US = 250_000
# Hard bound on the number of classes (HTB minors, netem qdiscs).
MAX_CLASSES = 5000


class LadderError(ValueError):
    """A ladder that cannot be built; the message names the parameter."""


@dataclass(frozen=True, slots=True)
class Ladder:
    step_us: int = DEFAULT_STEP_US
    max_delay_us: int = DEFAULT_MAX_DELAY_US
    ratio: float = DEFAULT_RATIO
    delays_us: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if type(self.step_us) is not int or self.step_us < 1:
            raise LadderError(
                f"ladder step must be a whole number of us >= 1, got {self.step_us!r}"
            )
        if type(self.max_delay_us) is not int or self.max_delay_us < self.step_us:
            raise LadderError(
                f"ladder maximum must be a whole number of us >= the step, "
                f"got {self.max_delay_us!r}"
            )
        if not 1.0 <= self.ratio <= 2.0:
            raise LadderError(f"ladder ratio must be within 1.0-2.0, got {self.ratio!r}")
        if self.ratio == 1.0 and self.max_delay_us % self.step_us:
            raise LadderError("a linear ladder's maximum must be a whole multiple of its step")
        out = [0]
        d = self.step_us
        while True:
            out.append(d)
            if d >= self.max_delay_us:
                break
            if len(out) > MAX_CLASSES:
                raise LadderError(
                    f"ladder has more than {MAX_CLASSES} classes: raise the step or the ratio"
                )
            geo = self.step_us * round(d * self.ratio / self.step_us)
            d = min(self.max_delay_us, max(d + self.step_us, geo))
        object.__setattr__(self, "delays_us", tuple(out))

    @classmethod
    def linear(cls, step_us: int, max_class: int) -> Ladder:
        """The method paper's ladder: class k delays by k * step."""
        return cls(step_us, step_us * max_class, 1.0)

    @property
    def max_class(self) -> int:
        return len(self.delays_us) - 1

    @property
    def step_s(self) -> float:
        return self.step_us / 1e6

    @property
    def max_delay_s(self) -> float:
        return self.max_delay_us / 1e6

    def delay_us(self, k: int) -> int:
        return self.delays_us[k]

    def delay_s(self, k: int) -> float:
        return self.delays_us[k] / 1e6

    def class_at_least(self, delay_s: float) -> int:
        """Smallest class delaying by >= delay_s (max_class past the top, 0 for <= 0)."""
        if delay_s <= 0.0:
            return 0
        k = bisect.bisect_left(self.delays_us, delay_s * 1e6 - 1e-6)
        return min(k, self.max_class)

    def class_at_most(self, delay_s: float) -> int:
        """Largest class delaying by <= delay_s (0 below the first step)."""
        return max(0, bisect.bisect_right(self.delays_us, delay_s * 1e6 + 1e-6) - 1)

    def class_of_us(self, delay_us: int) -> int | None:
        """The class whose delay is exactly delay_us, or None."""
        k = bisect.bisect_left(self.delays_us, delay_us)
        return k if k < len(self.delays_us) and self.delays_us[k] == delay_us else None

    @classmethod
    def matching(cls, delays_us: Sequence[int]) -> Ladder | None:
        """The ladder whose delays are exactly delays_us ([0] = 0), or None.

        For a tree read back from the kernel: step and maximum are its first
        and last delays; the ratio is searched in steps of 0.001."""
        if len(delays_us) < 2 or delays_us[0] != 0:
            return None
        step, top = delays_us[1], delays_us[-1]
        want = tuple(delays_us)
        for milli in range(1000, 2001):
            try:
                lad = cls(step, top, milli / 1000.0)
            except LadderError:
                return None
            if lad.delays_us == want:
                return lad
            if lad.max_class < len(want) - 1:  # fewer classes as the ratio grows
                return None
        return None

    def describe(self) -> str:
        lin = "linear" if self.ratio == 1.0 else f"x{self.ratio:g} past {self._knee_ms():g} ms"
        return (
            f"{self.max_class} classes, {self.step_us / 1000:g} ms steps, {lin}, "
            f"max {self.max_delay_us / 1000:g} ms"
        )

    def _knee_ms(self) -> float:
        return round(self.step_us / (self.ratio - 1.0) / 1000.0, 3)
