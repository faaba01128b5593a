"""The meter on disk: lifetime totals and the current period, and the closed periods' log.

What it owns
    In daemon.state_dir (/var/lib/santhrottle):
      meter.json          the lifetime totals per group (the counters the
                          metrics export) and the current period's usage,
                          written atomically after every convergence
                          (appliance/textfile.py write_atomically): a kill -9
                          loses at most one convergence's usage;
      meter/YYYY-MM.jsonl the closed periods, one JSON line per period and
                          group, appended as periods close (UTC month of the
                          period's start); a month whose every period ended
                          more than `[metering] retention` ago is deleted.
    `santhrottle meter` reads both (appliance/cli/meter.py); nothing else
    writes them.

Errors
    A meter.json that is not valid is set aside (meter.json.invalid) with one
    log line and the meter starts from zero: metering never stops the
    daemon. A log line that is not valid is skipped by readers (counted).
    A write that fails is logged and counted; the next convergence tries
    again.

Worked example
    store = MeterStore("/var/lib/santhrottle"); store.save(totals, current,
    closed) -> meter.json {"version": 1, "totals": {"gold": {...}},
    "current": {"start": 1764324000, "end": 1764327600, "groups": {...}}} and,
    for a closed period starting 2025-11-28 09:00 UTC, a line in
    meter/2025-11.jsonl: {"start": ..., "end": ..., "group": "gold",
    "level_seconds": {"iops": {"600": 2950.0, "1200": 650.0}}, "ios": ...}.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from santhrottle.appliance.daemon.core.meter import Period, Usage
from santhrottle.appliance.textfile import read_text_file, set_aside, write_atomically

log = logging.getLogger("santhrottled")

METER_FILE = "meter.json"
LOG_DIR = "meter"
METER_VERSION = 1
# 10,000 groups of a few levels each are a few MiB of JSON.
MAX_METER_BYTES = 64 * 1024 * 1024
# The longest period ([metering] period): a month.
MAX_PERIOD_S = 31 * 86400.0


class MeterError(ValueError):
    """A meter file that cannot be used: one line."""


@dataclass
class Kept:
    """What meter.json holds."""

    totals: dict[str, Usage]
    current: Period | None
    saved_at: float | None = None


def encode(totals: Mapping[str, Usage], current: Period | None, now: float) -> bytes:
    doc = {
        "version": METER_VERSION,
        "saved_at": now,
        "totals": {g: u.to_json() for g, u in sorted(totals.items())},
        "current": None if current is None else _period_json(current),
    }
    return json.dumps(doc, allow_nan=False).encode() + b"\n"


def _period_json(p: Period) -> dict[str, Any]:
    return {
        "start": p.start,
        "end": p.end,
        "groups": {g: u.to_json() for g, u in sorted(p.groups.items())},
    }


def decode(text: str, where: str = METER_FILE) -> Kept:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise MeterError(f"{where}: not valid JSON: {' '.join(str(e).split())}") from None
    if not isinstance(doc, dict) or doc.get("version") != METER_VERSION:
        raise MeterError(f"{where}: not a meter file of version {METER_VERSION}")
    try:
        totals = {str(g): Usage.from_json(u) for g, u in _obj(doc, "totals").items()}
        cur = doc.get("current")
        current = None
        if cur is not None:
            if not isinstance(cur, dict):
                raise ValueError("current: not an object")
            start, end = _time(cur.get("start")), _time(cur.get("end"))
            groups = {str(g): Usage.from_json(u) for g, u in _obj(cur, "groups").items()}
            current = Period(start, end, groups)
    except ValueError as e:
        raise MeterError(f"{where}: {e}") from None
    saved = doc.get("saved_at")
    return Kept(totals, current, saved if isinstance(saved, int | float) else None)


def _obj(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = doc.get(key, {})
    if not isinstance(v, dict):
        raise ValueError(f"{key}: not an object")
    return v


def _time(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
        raise ValueError(f"{v!r} is not a time")
    return float(v)


def month_of(t: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(t))


class MeterStore:
    """meter.json and meter/ in one directory."""

    def __init__(self, directory: str | Path, clock: Any = time.time) -> None:
        self.dir = Path(directory)
        self.path = self.dir / METER_FILE
        self.logs = self.dir / LOG_DIR
        self.clock = clock

    def load(self) -> Kept:
        """What meter.json holds; empty when there is none; MeterError when invalid."""
        if not self.path.exists() and not self.path.is_symlink():
            return Kept({}, None)
        return decode(read_text_file(self.path, MAX_METER_BYTES, MeterError), str(self.path))

    def save(
        self, totals: Mapping[str, Usage], current: Period | None, closed: Sequence[Period]
    ) -> None:
        """The closed periods appended to their months' logs, then meter.json replaced
        (OSError when the directory cannot be written)."""
        if closed:
            self.logs.mkdir(mode=0o700, parents=True, exist_ok=True)
            for p in closed:
                lines = "".join(
                    json.dumps({"start": p.start, "end": p.end, "group": g, **u.to_json()}) + "\n"
                    for g, u in sorted(p.groups.items())
                )
                with open(self.logs / f"{month_of(p.start)}.jsonl", "a", encoding="utf-8") as f:
                    f.write(lines)
                    f.flush()
                    os.fsync(f.fileno())
        write_atomically(self.path, encode(totals, current, self.clock()))

    def prune(self, retention_s: float, now: float) -> list[Path]:
        """Delete the months whose every period ended more than retention_s ago."""
        gone = []
        if not self.logs.is_dir():
            return gone
        keep_from = month_of(now - retention_s)
        for f in self.logs.glob("*.jsonl"):
            if f.stem < keep_from:
                f.unlink()
                gone.append(f)
        return gone

    def periods(self, since: float = 0.0) -> Iterator[tuple[float, float, str, Usage]]:
        """(start, end, group, usage) of every closed period ending after `since`, then
        the current one's; a line that cannot be read is skipped (counted in
        self.skipped)."""
        self.skipped = 0
        if self.logs.is_dir():
            first = month_of(max(0.0, since - MAX_PERIOD_S))  # a period's start month
            for f in sorted(self.logs.glob("*.jsonl")):
                if f.stem < first:
                    continue
                with open(f, encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        try:
                            doc = json.loads(line)
                            start, end = _time(doc.get("start")), _time(doc.get("end"))
                            usage = Usage.from_json(doc)
                            group = doc["group"]
                        except (ValueError, KeyError, TypeError, AttributeError):
                            self.skipped += 1
                            continue
                        if end > since:
                            yield start, end, str(group), usage
        kept = self.load()
        if kept.current is not None and kept.current.end > since:
            for g, u in sorted(kept.current.groups.items()):
                yield kept.current.start, kept.current.end, g, u


class MeterKeeper:
    """A running daemon's side of the store (as core/state.py's StateKeeper): load() at
    start, an invalid file set aside; save() after every convergence, never raising."""

    def __init__(self, store: MeterStore | None) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._pending: list[Period] = []  # closed periods a failed save did not log
        self._saved: tuple[Any, Any] | None = None  # (totals, current) last written

    def load(self) -> Kept:
        if self.store is None:
            return Kept({}, None)
        try:
            return self.store.load()
        except MeterError as e:
            set_aside(self.store.path, e, "metering from zero", log)
        return Kept({}, None)

    def save(self, snapshot: Any, retention_s: float | None = None) -> bool:
        """Write snapshot() = (totals, current, closed); False when it failed (logged).
        A snapshot equal to the last one written, with no period closed, is not written
        again: a daemon without metered groups would otherwise write and fsync the same
        file every second (two fsyncs a convergence, for nothing)."""
        if self.store is None:
            return True
        with self._lock:
            totals, current, closed = snapshot()
            closed = self._pending + list(closed)
            if not closed and self._saved == (totals, current):
                return True
            try:
                self.store.save(totals, current, closed)
                self._saved = (totals, current)
                self._pending = []
                if closed and retention_s is not None:
                    self.store.prune(retention_s, self.store.clock())
            except OSError as e:
                self._pending = closed
                log.error("cannot save the meter to %s: %s", self.store.path, e)
                return False
            return True
