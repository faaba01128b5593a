"""Metering: what each group used, per period, kept across restarts (docs/levels.md).

What it owns
    Per group, over its lifetime (the counters the metrics export) and per
    period (`[metering] period`, an hour by default, aligned to the wall
    clock): the seconds at each level of each of its Levels (keyed by the
    Levels' name and the level's cap, so a price applies to what was in
    force even after the levels change), the IOs and bytes served on every
    resource, and the initiator-seconds its members were delayed at each
    class. A group's usage is a Usage; the Meter holds the lifetime totals,
    the current period's and the closed periods not yet written.

When (the daemon's convergence worker, core/metering.py; times injected)
    sample(ctl, ios, now, wall, paused): every convergence: the time since
        the last sample, at each group's levels and each member's class as
        the last sample found them (levels change only at the controller's
        convergences, a second apart: a level's seconds are off by at most
        the second in which it changed, and a class's by the ticks between
        its change and the next sample); a pause counts as class 0 (the data
        path applies no delay); the IOs and bytes of the convergence's
        IoSamples. A new period (the wall clock crossed its boundary) closes
        the old one.
    The store (core/meterstore.py) writes the Meter after every convergence,
    so a kill -9 loses at most one convergence's usage.

Worked example
    Group "gold" with iops_levels [600, 1200], samples at t = 0, 1, 2, 3, 4:
    at level 0 until the controller promotes it between the samples at 2 and
    3, its initiator at class 4 at the samples at 1 and 2: after the sample
    at t = 4, gold's usage has level seconds {"iops": {"600": 3.0, "1200":
    1.0}} and delay seconds {4: 2.0}.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from santhrottle.controller.domain import IoSample
from santhrottle.controller.state import ControllerState

# A period is at least a minute, at most a month.
MIN_PERIOD_S = 60.0


def cap_key(cap: float) -> str:
    """A level's cap as a key: "600", "20971520" (its value per second, %g)."""
    return f"{cap:.10g}"


@dataclass
class Usage:
    """What one group used."""

    level_s: dict[str, dict[str, float]] = field(default_factory=dict)  # levels -> cap -> s
    ios: float = 0.0
    bytes: float = 0.0
    delay_s: dict[int, float] = field(default_factory=dict)  # class -> initiator-seconds

    def add(self, other: Usage) -> None:
        for name, caps in other.level_s.items():
            mine = self.level_s.setdefault(name, {})
            for cap, s in caps.items():
                mine[cap] = mine.get(cap, 0.0) + s
        self.ios += other.ios
        self.bytes += other.bytes
        for k, s in other.delay_s.items():
            self.delay_s[k] = self.delay_s.get(k, 0.0) + s

    def to_json(self) -> dict[str, Any]:
        return {
            "level_seconds": {n: dict(sorted(c.items())) for n, c in sorted(self.level_s.items())},
            "ios": self.ios,
            "bytes": self.bytes,
            "delay_seconds": {str(k): s for k, s in sorted(self.delay_s.items())},
        }

    @classmethod
    def from_json(cls, doc: Any) -> Usage:
        """ValueError naming the field when doc is not a Usage's JSON."""
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        u = cls()
        levels = doc.get("level_seconds", {})
        if not isinstance(levels, dict):
            raise ValueError("level_seconds: not an object")
        for name, caps in levels.items():
            if not isinstance(caps, dict):
                raise ValueError(f"level_seconds.{name}: not an object")
            u.level_s[str(name)] = {str(c): _seconds(s, "level_seconds") for c, s in caps.items()}
        u.ios = _seconds(doc.get("ios", 0.0), "ios")
        u.bytes = _seconds(doc.get("bytes", 0.0), "bytes")
        delays = doc.get("delay_seconds", {})
        if not isinstance(delays, dict):
            raise ValueError("delay_seconds: not an object")
        for k, s in delays.items():
            if not str(k).isdigit():
                raise ValueError(f"delay_seconds: {k!r} is not a class")
            u.delay_s[int(k)] = _seconds(s, "delay_seconds")
        return u


def _seconds(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{what}: {v!r} is not a count")
    return float(v)


@dataclass
class Period:
    """One period's usage per group: [start, end) in wall-clock seconds."""

    start: float
    end: float
    groups: dict[str, Usage] = field(default_factory=dict)

    def usage(self, group: str) -> Usage:
        u = self.groups.get(group)
        if u is None:
            u = self.groups[group] = Usage()
        return u


class Meter:
    """The daemon's meter (the module's doc). Not thread-safe: the loop's lock."""

    def __init__(self, period_s: float = 3600.0) -> None:
        self.period_s = max(period_s, MIN_PERIOD_S)
        self.totals: dict[str, Usage] = {}
        self.current: Period | None = None
        self.closed: list[Period] = []  # closed, not yet written to the log
        self._last: float | None = None  # the last sample's time (monotonic)
        self._levels: dict[str, dict[str, float]] = {}  # group -> levels -> cap in force
        self._classes: dict[str, tuple[str, int]] = {}  # initiator -> (group, class > 0)

    def sample(
        self,
        ctl: ControllerState,
        ios: Iterable[IoSample],
        now: float,
        wall: float,
        paused: bool,
    ) -> None:
        """One convergence's usage (the module's doc)."""
        period = self._period(wall)
        span = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        for g, caps in self._levels.items():  # at what the last sample found
            for name, cap in caps.items():
                for u in (period.usage(g), self._total(g)):
                    at = u.level_s.setdefault(name, {})
                    at[cap_key(cap)] = at.get(cap_key(cap), 0.0) + span
        for g, k in self._classes.values():
            for u in (period.usage(g), self._total(g)):
                u.delay_s[k] = u.delay_s.get(k, 0.0) + span
        group_of = ctl.groups.group_of
        for s in ios:
            g = group_of.get(s.initiator)
            if g is not None:
                for u in (period.usage(g), self._total(g)):
                    u.ios += s.ios
                    u.bytes += s.bytes
        self._levels = {}
        for g, specs in ctl.levels.specs.items():  # a group not seen yet is at level 0
            ls = ctl.levels.groups.get(g)
            at = [0] * len(specs) if ls is None else [lad.level for lad in ls.ladders]
            self._levels[g] = {spec.name: spec.caps[k] for spec, k in zip(specs, at, strict=True)}
        self._classes = (
            {}
            if paused
            else {i: (group_of[i], k) for i, k in ctl.effective.items() if i in group_of}
        )

    def peek(self) -> tuple[dict[str, Usage], Period | None, list[Period]]:
        """The totals, the current period and the closed ones, as they are (not copies:
        read them under the daemon's lock)."""
        return self.totals, self.current, self.closed

    def snapshot(self) -> tuple[dict[str, Usage], Period | None, list[Period]]:
        """Copies for the store: totals, the current period, the closed ones (taken)."""
        closed, self.closed = self.closed, []
        cur = None
        if self.current is not None:
            cur = Period(self.current.start, self.current.end, _copy(self.current.groups))
        return _copy(self.totals), cur, closed

    def restore(self, totals: Mapping[str, Usage], current: Period | None) -> None:
        """At start: what the store kept (a current period that is over is closed at the
        first sample)."""
        self.totals = dict(totals)
        self.current = current

    def _period(self, wall: float) -> Period:
        start = math.floor(wall / self.period_s) * self.period_s
        cur = self.current
        if cur is None or not cur.start <= wall < cur.end:
            if cur is not None:
                self.closed.append(cur)
            cur = self.current = Period(start, start + self.period_s)
        return cur

    def _total(self, group: str) -> Usage:
        u = self.totals.get(group)
        if u is None:
            u = self.totals[group] = Usage()
        return u


def _copy(groups: Mapping[str, Usage]) -> dict[str, Usage]:
    out = {}
    for g, u in groups.items():
        c = Usage()
        c.add(u)
        out[g] = c
    return out
