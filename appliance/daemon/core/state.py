"""The daemon's runtime state on disk: what the admin said and what the controller decided.

What it owns
    state.json in daemon.state_dir (/var/lib/santhrottle): pause, pins,
    threshold overrides and the groups' overrides (`santhrottle group set`,
    daemon/core/group_overrides.py): the admin's words, kept however old; and each
    resource's delay class with the wall-clock time it was saved (the
    controller's last decision, a starting point only while it is recent).
    The kernel's members are not kept here: the kernel is their record,
    and a start reads them back (daemon/core/runtime.py).

Writes are atomic: a temporary file in the same directory, fsync, rename
over state.json, fsync of the directory.  A kill -9 at any moment leaves
either the old or the new file, never half of one.  A file is validated on
load like a configuration (types, addresses, finite positive thresholds,
classes within 0..max_class, modes, group targets and priorities within the
file's bounds); one that is not valid raises
StateError with one line, and the caller sets it aside.

Worked example
    store = StateStore("/var/lib/santhrottle")
    store.save(Saved(paused=True, pins={"10.0.0.3": (10, "all")},
                     thresholds={"vg0": 0.01}, resource_classes={"vg0": 12}))
    store.load(max_class=100) -> the same Saved (saved_at set);
    a file with "pins": {"bogus": [5, "all"]} -> StateError
    "state.json: pins: 'bogus' is not an IPv4 or IPv6 address"; a pin of an
    address no initiator has ("0.0.0.0", appliance/addresses.py, the check every
    entry uses) is dropped with a warning, the rest of the file kept; a pin of
    "FD00:0::2" loads as "fd00::2" (the data path's canonical form); more
    than MAX_PINS pins, or a class above any ladder's, is refused; a class
    above this daemon's maximum (a smaller max_delay since) is clamped to it
    with a warning; one with
    "group_overrides": {"db": {"priority": 0}} -> StateError "state.json:
    group_overrides: db: priority: 0 must be above 0".
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from santhrottle.appliance.addresses import AddressError, RefusedAddress, initiator_address
from santhrottle.appliance.config.kinds import AUTO, MAX_THRESHOLD_S, NAME_RE, KindError, quote
from santhrottle.appliance.config.schema import MAX_CLASSES, PIN_MODES
from santhrottle.appliance.daemon.core.group_overrides import GroupOverride, from_json, to_json
from santhrottle.appliance.textfile import read_text_file, set_aside, write_atomically

log = logging.getLogger("santhrottled")

STATE_FILE = "state.json"
STATE_VERSION = 1
# Pins share the mode sets with the controller's members (datapath MAXELEM
# 65,536 per set): a bound far below it, so pins can never fill a set.
MAX_PINS = 4096
# 10,000 pins are ~400 KiB of JSON.
MAX_STATE_BYTES = 8 * 1024 * 1024


class StateError(ValueError):
    """A state file that cannot be used: one line."""


@dataclass
class Saved:
    paused: bool = False
    pins: dict[str, tuple[int, str]] = field(default_factory=dict)  # ip -> (class, mode)
    thresholds: dict[str, float | str] = field(default_factory=dict)  # s or "auto" (overrides)
    resource_classes: dict[str, int] = field(default_factory=dict)
    saved_at: float | None = None  # wall clock (time.time()) of the save
    group_overrides: dict[str, GroupOverride] = field(default_factory=dict)  # `group set`


def encode(s: Saved, now: float) -> bytes:
    doc = {
        "version": STATE_VERSION,
        "saved_at": now,
        "paused": s.paused,
        "pins": {ip: [k, mode] for ip, (k, mode) in sorted(s.pins.items())},
        "thresholds": dict(sorted(s.thresholds.items())),
        "group_overrides": {n: to_json(o) for n, o in sorted(s.group_overrides.items())},
        "resource_classes": dict(sorted(s.resource_classes.items())),
    }
    return json.dumps(doc, indent=1, allow_nan=False).encode() + b"\n"


def _reject(_: str) -> Any:
    raise ValueError("NaN and Infinity are not numbers")


def decode(text: str, max_class: int, where: str = STATE_FILE) -> Saved:
    """A Saved from the file's text; StateError naming the field otherwise."""
    try:
        doc = json.loads(text, parse_constant=_reject)
    except (ValueError, RecursionError) as e:
        raise StateError(f"{where}: not valid JSON: {' '.join(str(e).split())}") from None
    if not isinstance(doc, dict):
        raise StateError(f"{where}: not a JSON object")
    if doc.get("version") != STATE_VERSION:
        raise StateError(f"{where}: version {doc.get('version')!r}, expected {STATE_VERSION}")

    def bad(key: str, what: str) -> StateError:
        return StateError(f"{where}: {key}: {what}")

    out = Saved()
    saved_at = doc.get("saved_at")
    if saved_at is not None:
        if not _number(saved_at):
            raise bad("saved_at", f"{saved_at!r} is not a time")
        out.saved_at = float(saved_at)
    if not isinstance(doc.get("paused", False), bool):
        raise bad("paused", "must be true or false")
    out.paused = bool(doc.get("paused", False))
    pins = _table(doc, "pins", bad)
    if len(pins) > MAX_PINS:
        raise bad("pins", f"{len(pins)} pins, at most {MAX_PINS}")
    for ip, pin in pins.items():
        try:  # an initiator's address, as the data path's sets print it
            norm = initiator_address(ip)
        except RefusedAddress as e:  # an address, but none an initiator has: this pin only
            log.warning("state file: pins: %s; the pin is dropped", e)
            continue
        except AddressError as e:
            raise bad("pins", str(e)) from None
        if not (isinstance(pin, list) and len(pin) == 2 and pin[1] in PIN_MODES):
            raise bad("pins", f"{norm}: expected [class, mode] with a mode of {PIN_MODES}")
        out.pins[norm] = (_class(pin[0], max_class, f"pins: {norm}", bad), pin[1])
    for name, thr in _table(doc, "thresholds", bad).items():
        if not NAME_RE.match(name):
            raise bad("thresholds", f"{quote(name)} is not a resource name")
        if thr == AUTO:
            out.thresholds[name] = AUTO
            continue
        if not _number(thr) or not 0 < thr <= MAX_THRESHOLD_S:
            raise bad("thresholds", f"{name}: {thr!r} is not a threshold (0 < s <= 60, or auto)")
        out.thresholds[name] = float(thr)
    for name, ov in _table(doc, "group_overrides", bad).items():
        if not NAME_RE.match(name):
            raise bad("group_overrides", f"{quote(name)} is not a group name")
        try:
            out.group_overrides[name] = from_json(ov)
        except KindError as e:
            raise bad("group_overrides", f"{name}: {e}") from None
    for name, k in _table(doc, "resource_classes", bad).items():
        if not NAME_RE.match(name):
            raise bad("resource_classes", f"{quote(name)} is not a resource name")
        out.resource_classes[name] = _class(k, max_class, f"resource_classes: {name}", bad)
    return out


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _table(doc: dict[str, Any], key: str, bad: Any) -> dict[str, Any]:
    t = doc.get(key, {})
    if not isinstance(t, dict):
        raise bad(key, "must be an object")
    return t


def _class(k: Any, max_class: int, key: str, bad: Any) -> int:
    """A class of the file: 0..MAX_CLASSES (no ladder has more); above this
    daemon's max_class (a smaller max_delay since) it is clamped, with a warning."""
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_CLASSES:
        raise bad(key, f"{quote(k)} is not a delay class (0..{MAX_CLASSES})")
    if k > max_class:
        log.warning(
            "state file: %s: class %d is above the maximum class now, %d", key, k, max_class
        )
        return max_class
    return k


class StateStore:
    """state.json in one directory (created 0700 when missing)."""

    def __init__(self, directory: str | Path, clock: Any = time.time) -> None:
        self.dir = Path(directory)
        self.path = self.dir / STATE_FILE
        self.clock = clock

    def load(self, max_class: int) -> Saved:
        """The saved state; Saved() when there is none; StateError when invalid."""
        if not self.path.exists() and not self.path.is_symlink():
            return Saved()
        text = read_text_file(self.path, MAX_STATE_BYTES, StateError)
        return decode(text, max_class, str(self.path))

    def save(self, s: Saved) -> None:
        """Write atomically; OSError when the directory cannot be written."""
        write_atomically(self.path, encode(s, self.clock()))


class StateKeeper:
    """A running daemon's side of the store: load() at start (an invalid file set
    aside with one log line: the daemon starts without it), save() after every
    change and convergence, written only when it differs from what the store
    holds.  save() takes the snapshot under the file's own lock, so two saves
    never write out of order, and the caller's lock is taken inside it (never the
    other way round: the tick never waits for an fsync).  Without a store (tests)
    nothing is kept."""

    def __init__(self, store: StateStore | None) -> None:
        self.store = store
        self._saved: Saved | None = None  # what the store holds
        self._lock = threading.Lock()

    def load(self, max_class: int) -> Saved:
        if self.store is None:
            return Saved()
        try:
            return self.store.load(max_class)
        except StateError as e:
            set_aside(self.store.path, e, "starting without it", log)
        return Saved()

    def save(self, snapshot: Callable[[], Saved]) -> bool:
        """Write snapshot() when it changed; False when the write failed (logged)."""
        if self.store is None:
            return True
        with self._lock:
            snap = snapshot()
            if snap == self._saved:
                return True
            try:
                self.store.save(snap)
            except OSError as e:
                log.error("cannot save the runtime state to %s: %s", self.store.path, e)
                return False
            self._saved = snap
            return True
