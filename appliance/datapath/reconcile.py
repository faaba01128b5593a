"""Reconciling the kernel's members with the classes wanted, one refusal never blocking the rest.

Problem
    Every tick the daemon hands the data path the classes it wants for every
    initiator (ip -> (class, mode)).  The kernel can refuse a member (an
    address a hash:ip set does not take, an IPv6 initiator where the gate has
    no IPv6 rules, a full set) or an object the members need (the jump rules,
    the gate's list:set, a glide leaf's delay).  Sent as one batch, one bad
    member failed the whole batch every tick and nobody else was ever moved.

What it owns
    Reconciler: the classes last applied per initiator (`targets`, the data
    path's record of what the kernel holds: the daemon keeps no copy), the
    diff from them to what is wanted, and the quarantine.
      reconcile(want) sends only what changed, per mode, as one batch; a batch
                      the kernel refuses falls back to one member at a time,
                      and each member it refuses is quarantined: left out, shown
                      in `status`, counted in the metrics, retried on its own
                      after QUARANTINE_FIRST_S, the wait doubling up to
                      QUARANTINE_MAX_S, never every tick.  A refusal of an
                      object the members share (ObjectError: the jumps, the
                      gate) quarantines that object instead: nothing of that
                      mode is sent until its retry.  An address no initiator
                      has (appliance/addresses.py) is quarantined without
                      being sent at all, and never retried.
      forget(ip) / lost()  a member whose membership is no longer known
                      (the kernel changed under us: drift, core/loop.py)
                      is sent again at the next reconcile().
    What is sent is Datapath.set_classes' job (datapath/actuator.py); this
    module is pure but for the callable it is given and the clock.

Worked example
    want {10.0.0.3: (10, all), 0.0.0.0: (10, all), 10.0.0.4: (12, all)}:
    0.0.0.0 is quarantined at once ("'0.0.0.0' is unspecified: ..."), the
    others go in one batch.  Had the kernel refused 10.0.0.4 alone, the batch
    would fail, 10.0.0.3 would go in on its own, 10.0.0.4 wait 1 s, then 2,
    4, ... 60 s between tries; once it is no longer wanted its entry goes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from santhrottle.appliance.addresses import AddressError, initiator_address
from santhrottle.appliance.datapath.names import ObjectError

log = logging.getLogger("santhrottled")

Target = tuple[int, str]  # (class, mode)
Change = tuple[int, int, str]  # (class before, class after, mode)
# The first retry of a quarantined member or object, and the longest wait between two.
QUARANTINE_FIRST_S = 1.0
QUARANTINE_MAX_S = 60.0
MEMBER = "member"


@dataclass
class Quarantined:
    """An initiator (kind "member") or a shared object ("jumps", "gate", "leaf")
    the kernel refused, and when it is tried again (math.inf: never)."""

    kind: str
    error: str
    since: float
    retries: int
    retry_at: float

    def failed_again(self, error: str, now: float) -> None:
        self.error = error
        self.retries += 1
        wait = min(QUARANTINE_FIRST_S * 2.0**self.retries, QUARANTINE_MAX_S)
        self.retry_at = now + wait


class Reconciler:
    def __init__(
        self,
        send: Callable[[Mapping[str, int], str, bool], int],
        clock: Callable[[], float],
    ) -> None:
        self.send = send  # (ip -> class, mode, ordered) -> ops; DatapathError
        self.clock = clock
        self.targets: dict[str, Target] = {}  # ip -> (class, mode) applied, class > 0
        self.quarantine: dict[str, Quarantined] = {}  # ip or object name -> entry
        self.quarantined_total: dict[str, int] = {}  # kind -> entries ever made
        self.errors = 0  # refusals (a batch's, a member's, an object's)
        self._changed: dict[str, Change] = {}  # what the reconcile() under way changed

    # ----------------------------------------------------------- the record
    def members(self) -> Mapping[str, Target]:
        return self.targets

    def adopt(self, members: Mapping[str, Target]) -> None:
        """The kernel's members as read back (a start, a repair): the record."""
        self.targets = {ip: km for ip, km in members.items() if km[0] > 0}

    def forget(self, ip: str) -> None:
        self.targets.pop(ip, None)

    def guard(self, key: str, kind: str, fn: Callable[[], int]) -> int:
        """fn() (an operation on a shared object: advancing the glide leaves), quarantined
        with the same backoff when it fails; 0 while it waits for its retry."""
        now = self.clock()
        q = self.quarantine.get(key)
        if q is not None and now < q.retry_at:
            return 0
        try:
            out = fn()
        except Exception as e:
            if q is None:
                self._quarantine(key, kind, str(e), now)
            else:
                self.errors += 1
                q.failed_again(str(e), now)
                log.warning("actuator: %s still refused (try %d): %s", key, q.retries, e)
            return 0
        if self.quarantine.pop(key, None) is not None:
            log.info("actuator: %s works again", key)
        return out

    # ---------------------------------------------------------- reconcile
    def reconcile(self, want: Mapping[str, Target], ordered: bool = True) -> dict[str, Change]:
        """Move the kernel's members to `want` (ip -> (class, mode); an ip not in it
        leaves every set); returns what changed in the kernel: ip -> (class before,
        class after, mode), each initiator whose class the kernel took."""
        now = self.clock()
        self._unquarantine_unwanted(want)
        by_mode = self._changes(want, now)
        for mode, classes in by_mode.items():
            blocked = self.quarantine.get(mode_object(mode))
            if blocked is not None and now < blocked.retry_at:
                continue
            self._send_batch(classes, mode, ordered, now)
        changed, self._changed = self._changed, {}
        return changed

    def _unquarantine_unwanted(self, want: Mapping[str, Target]) -> None:
        for key in [k for k, q in self.quarantine.items() if q.kind == MEMBER]:
            if key not in want and key not in self.targets:
                del self.quarantine[key]

    def _changes(self, want: Mapping[str, Target], now: float) -> dict[str, dict[str, int]]:
        have, quarantine = self.targets, self.quarantine
        by_mode: dict[str, dict[str, int]] = {}
        for ip, (k, mode) in want.items():
            if have.get(ip) == (k, mode):
                continue
            q = quarantine.get(ip)
            if q is not None:
                if now < q.retry_at:
                    continue
            elif ip not in have and not self._valid(ip, now):
                continue
            by_mode.setdefault(mode, {})[ip] = k
        for ip, (_k, mode) in have.items():
            if ip not in want:
                by_mode.setdefault(mode, {})[ip] = 0
        return by_mode

    def _valid(self, ip: str, now: float) -> bool:
        """A new member's address is one an initiator can have; else quarantined for good."""
        try:
            initiator_address(ip)
        except AddressError as e:
            self._quarantine(ip, MEMBER, str(e), now, retry=False)
            return False
        return True

    def _send_batch(self, classes: dict[str, int], mode: str, ordered: bool, now: float) -> int:
        retrying = [ip for ip in classes if ip in self.quarantine]
        batch = {ip: k for ip, k in classes.items() if ip not in self.quarantine}
        sent = 0
        if batch:
            try:
                sent += self.send(batch, mode, ordered)
            except ObjectError as e:
                self._object_failed(mode, e, now)
                return 0
            except Exception as e:  # one member, or the batch: find out member by member
                self.errors += 1
                if len(batch) == 1:
                    (ip,) = batch
                    self._quarantine(ip, MEMBER, str(e), now)
                    return 0
                n = len(batch)
                log.warning("actuator: %d change(s) in %s refused (%s): one by one", n, mode, e)
                retrying = list(batch) + retrying
            else:
                self._applied(batch, mode)
                self.quarantine.pop(mode_object(mode), None)
        for ip in retrying:  # on its own: a refusal is its own
            try:
                sent += self.send({ip: classes[ip]}, mode, ordered)
            except ObjectError as e:
                self._object_failed(mode, e, now)
                break
            except Exception as e:
                q = self.quarantine.get(ip)
                if q is None:
                    self._quarantine(ip, MEMBER, str(e), now)
                else:
                    self.errors += 1
                    q.failed_again(str(e), now)
                    wait = q.retry_at - now
                    log.warning(
                        "actuator: %s still refused (try %d, next in %.0f s): %s",
                        ip,
                        q.retries,
                        wait,
                        e,
                    )
            else:
                self._applied({ip: classes[ip]}, mode)
                if self.quarantine.pop(ip, None) is not None:
                    log.info("actuator: %s applied after its quarantine", ip)
        return sent

    def _applied(self, classes: Mapping[str, int], mode: str) -> None:
        have = self.targets
        changed = self._changed
        for ip, k in classes.items():
            old = have.get(ip, (0, mode))[0]
            if old != k:
                changed[ip] = (old, k, mode)
            if k:
                have[ip] = (k, mode)
            elif have.get(ip, (0, mode))[1] == mode:
                have.pop(ip, None)

    def _object_failed(self, mode: str, e: ObjectError, now: float) -> None:
        key = mode_object(mode)
        q = self.quarantine.get(key)
        if q is None:
            self._quarantine(key, e.kind, str(e), now)
        else:
            self.errors += 1
            q.failed_again(str(e), now)
            log.warning("actuator: %s still refused (try %d): %s", key, q.retries, e)

    def _quarantine(self, key: str, kind: str, error: str, now: float, retry: bool = True) -> None:
        self.errors += retry  # an address refused before it is sent is no kernel error
        self.quarantine[key] = Quarantined(
            kind, error, now, 0, now + QUARANTINE_FIRST_S if retry else math.inf
        )
        self.quarantined_total[kind] = self.quarantined_total.get(kind, 0) + 1
        then = f"retried in {QUARANTINE_FIRST_S:g} s" if retry else "not sent"
        log.error("actuator: %s quarantined (%s): %s", key, then, error)


def mode_object(mode: str) -> str:
    """The quarantine key of what a mode's members share (its set's gate, the jumps)."""
    return f"{mode} members' gate and jumps"
