"""The audit trail: who changed what, and why an initiator's delay changed.

What it owns
    Audit, the daemon's one writer of audit records, to its log:
      command()       every state-changing command (pin, unpin, pause, resume,
                      threshold set/reset, group set/reset, reload), done or
                      refused: who (the caller: the control socket's peer
                      credentials, uid and pid from SO_PEERCRED; a SIGHUP), what
                      (the command and its arguments), before -> after;
      class_change()  every change of an initiator's delay class that reached
                      the kernel: the initiator, the resource, from -> to and why
                      (the controller's write-heavy entry or exit, its PID, a
                      group's arbiter, a pin, a pause, a fleet leader's decision,
                      a previous run's member lowered), at most one line per
                      initiator per CLASS_LOG_MIN_INTERVAL_S (the next one says
                      how many it stands for);
      futile()        a resource's delay released because it did not lower the
                      read latency (controller/futile.py): the latency and its
                      peak, the writes against their peak, for how long;
      futile_refuted() such a release ended early: without the delay the latency
                      climbed past a quarter over its peak (the delay was working);
    and the recent history behind `santhrottle why INITIATOR`: the last
    HISTORY_PER_INITIATOR events of each of the last HISTORY_INITIATORS
    initiators, rate limit or not.

Where the records go
    Each record is one log line of key=value pairs ('audit: event=command
    command=pin via=socket uid=0 pid=4242 initiator=10.0.0.3 class=10 mode=all
    before="not pinned" after="class 10 all" result=done') and carries the same as structured fields
    (SANTHROTTLE_EVENT, SANTHROTTLE_COMMAND, SANTHROTTLE_UID, ...), which
    journald keeps when the daemon logs to it through python-systemd
    (daemon/main.py): `journalctl -u santhrottled SANTHROTTLE_INITIATOR=10.0.0.3`.

Worked example
    At 14:02:07 10.0.0.3 joins vg0's write-heavy set while vg0 is at class 4:
    'audit: event=class initiator=10.0.0.3 resource=vg0 from=0 to=4
    why="write-heavy on vg0 (joined)"'; `santhrottle why 10.0.0.3` lists it,
    with the pin an admin made at 14:05 ("pin by uid 0 pid 4242").
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from santhrottle.controller.futile import Futility

log = logging.getLogger("santhrottled.audit")

# One class-change line per initiator per this long at most; the history keeps all.
CLASS_LOG_MIN_INTERVAL_S = 10.0
# Refused commands: at most one line per (uid, command) per this long.
REFUSED_LOG_MIN_INTERVAL_S = 1.0
# `santhrottle why`: the last events of each of the last initiators that had one.
HISTORY_PER_INITIATOR = 64
HISTORY_INITIATORS = 4096


@dataclass(frozen=True)
class Caller:
    """Who asked: the control socket's peer ("socket", its uid and pid), "SIGHUP"."""

    via: str
    uid: int | None = None
    pid: int | None = None

    def describe(self) -> str:
        if self.uid is None:
            return self.via
        return f"uid {self.uid} pid {self.pid}"


@dataclass(frozen=True)
class Event:
    at: float  # wall clock
    initiator: str
    resource: str | None
    old: int  # class before (0: not delayed)
    new: int
    why: str


def kv(fields: Mapping[str, Any]) -> str:
    """key=value pairs (None: left out), a value with a space, a quote or an = in
    double quotes as JSON writes a string."""
    out = []
    for k, v in fields.items():
        if v is None:
            continue
        text = str(v)
        if not text or any(c in text for c in " '\"=\\"):
            text = json.dumps(text)
        out.append(f"{k}={text}")
    return " ".join(out)


def journal_fields(fields: Mapping[str, Any]) -> dict[str, str]:
    """The same as journald fields: SANTHROTTLE_KEY (uppercase, as journald wants)."""
    return {f"SANTHROTTLE_{k.upper()}": str(v) for k, v in fields.items() if v is not None}


class Audit:
    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.wall = wall
        self._history: OrderedDict[str, deque[Event]] = OrderedDict()
        self._last_line: dict[str, tuple[float, int]] = {}  # initiator -> (at, suppressed)
        self._last_refusal: dict[tuple[Any, str], float] = {}

    def _write(self, level: int, fields: Mapping[str, Any]) -> None:
        log.log(level, "audit: %s", kv(fields), extra=journal_fields(fields))

    # ------------------------------------------------------------ commands
    def command(
        self,
        caller: Caller,
        command: str,
        args: Mapping[str, Any],
        before: str | None,
        after: str | None,
        refused: str | None = None,
    ) -> None:
        now = self.wall()
        if refused is not None:
            key = (caller.uid if caller.uid is not None else caller.via, command)
            if now - self._last_refusal.get(key, -1e18) < REFUSED_LOG_MIN_INTERVAL_S:
                return
            self._last_refusal[key] = now
        fields = {
            "event": "command",
            "command": command,
            "via": caller.via,
            "uid": caller.uid,
            "pid": caller.pid,
            **{k: v for k, v in args.items() if v is not None},
            "before": before,
            "after": after,
            "result": "done" if refused is None else "refused",
            "error": refused,
        }
        self._write(logging.INFO if refused is None else logging.WARNING, fields)
        ip = args.get("initiator")
        if refused is None and isinstance(ip, str):
            self._remember(Event(now, ip, None, -1, -1, f"{command} by {caller.describe()}"))

    # ------------------------------------------------------------ classes
    def class_change(
        self, initiator: str, resource: str | None, old: int, new: int, why: str, now: float
    ) -> None:
        """One initiator's class changed in the kernel (now: the daemon's clock)."""
        self._remember(Event(self.wall(), initiator, resource, old, new, why))
        last = self._last_line.get(initiator)
        if last is not None and now - last[0] < CLASS_LOG_MIN_INTERVAL_S:
            self._last_line[initiator] = (last[0], last[1] + 1)
            return
        suppressed = last[1] if last is not None else 0
        self._last_line[initiator] = (now, 0)
        fields = {
            "event": "class",
            "initiator": initiator,
            "resource": resource,
            "from": old,
            "to": new,
            "why": why,
            "changes_not_logged": suppressed or None,
        }
        self._write(logging.INFO, fields)
        if len(self._last_line) > HISTORY_INITIATORS * 2:  # never grows without a bound
            cut = now - CLASS_LOG_MIN_INTERVAL_S
            self._last_line = {k: v for k, v in self._last_line.items() if v[0] >= cut}

    def futile(self, resource: str, f: Futility, threshold_s: float, now: float) -> None:
        """A resource's delay released at `now` (the daemon's clock): it did not lower the
        latency (controller/futile.py)."""
        writes = f.writes.value or 0.0
        fields = _futile_fields("futile", resource, f, f.peak_latency_s, threshold_s)
        fields["writes_of_peak"] = round(writes / f.peak_write_bps, 3) if f.peak_write_bps else 0.0
        fields["released_s"] = round(f.until_s - now)
        fields["why"] = "the delay took the writes but not the read latency over the threshold"
        self._write(logging.WARNING, fields)

    def futile_refuted(self, resource: str, f: Futility, threshold_s: float) -> None:
        """A futile release ended by its latency: it climbed without the delay past
        FUTILE_REFUTE_X times the episode's peak (controller/futile.py)."""
        fields = _futile_fields("futile_refuted", resource, f, f.release_peak_s, threshold_s)
        fields["why"] = "the read latency rose without the delay: the delay was working"
        self._write(logging.WARNING, fields)

    # ------------------------------------------------------------ history
    def _remember(self, e: Event) -> None:
        h = self._history.get(e.initiator)
        if h is None:
            h = self._history[e.initiator] = deque(maxlen=HISTORY_PER_INITIATOR)
            if len(self._history) > HISTORY_INITIATORS:
                self._history.popitem(last=False)
        else:
            self._history.move_to_end(e.initiator)
        h.append(e)

    def history(self, initiator: str) -> list[Event]:
        return list(self._history.get(initiator, ()))


def _futile_fields(
    event: str, resource: str, f: Futility, peak_s: float, threshold_s: float
) -> dict[str, object]:
    """A futile delay's record: the resource, its smoothed latency, the peak it is
    measured against and the threshold, in ms."""
    latency = f.latency.value if f.latency.value is not None else math.nan
    return {
        "event": event,
        "resource": resource,
        "latency_ms": round(latency * 1e3, 2),
        "peak_latency_ms": round(peak_s * 1e3, 2),
        "threshold_ms": round(threshold_s * 1e3, 2),
    }
