"""The runtime state: what the admin said at run time, and what a previous run left in the kernel.

What it owns
    Runtime: pause, pins, threshold overrides and the groups' overrides (the
    admin's words: kept in the state file, core/state.py, however old), and
    the adopted members (what a previous run left in the kernel that no pin
    explains), with
      snapshot()     the Saved the daemon writes after a change and after a
                     convergence (with the controller's resource classes);
      restore()      at start, after the data path is applied: the saved state
                     and the kernel's members come together;
      age_adopted()  every tick: the adopted members lowered.
    Everything here is changed under the daemon's lock, through the daemon's
    public methods (core/loop.py), never by another module directly.

Restart
    Pause, pins and threshold overrides come back as they were, and the groups'
    overrides of the groups the file still has.  Each resource's saved class
    seeds its controller when the save is recent (SEED_MAX_AGE_S), so a writer
    the controller throttled is throttled again as soon as it is seen writing.
    Every member the kernel still holds that no pin explains is adopted: held at
    its class for ADOPT_HOLD_CONVERGES convergences, long enough for the
    controller to see the writers again, then lowered class by class
    (controller.class_decrease_max_per_tick per tick; glide leaves keep each
    descent in order) until the controller wants it or it is out.

Worked example
    The last run pinned 10.0.0.9 at class 10 and the controller held
    10.0.0.3 at class 40 for vg0; kill -9; the kernel still has both.  At
    start: pins {10.0.0.9: (10, all)}, vg0's PID seeded at 40, adopted
    {10.0.0.3: (40, all)}.  At the first convergence 10.0.0.3 writes
    again: vg0 is at 40, so the controller wants 40 and the adoption ends.
    Had it stopped writing, from 3 s on its class goes 39, 38, ... 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from santhrottle.appliance.config.parse import GroupConfig
from santhrottle.appliance.daemon.core.errors import CommandError
from santhrottle.appliance.daemon.core.group_overrides import GroupOverride, merge, prune
from santhrottle.appliance.daemon.core.state import MAX_PINS, Saved

log = logging.getLogger("santhrottled")

Pin = tuple[int, str]  # (class, mode)
# Convergences an adopted member keeps its class before it is lowered.
ADOPT_HOLD_CONVERGES = 3
# A saved resource class older than this is no guide to the array now.
SEED_MAX_AGE_S = 300.0


@dataclass
class Runtime:
    paused: bool = False
    pins: dict[str, Pin] = field(default_factory=dict)  # ip -> (class, mode)
    thresholds: dict[str, float | str] = field(default_factory=dict)  # `threshold set`
    group_overrides: dict[str, GroupOverride] = field(default_factory=dict)  # `group set`
    # members a previous run left that no pin explains: held, then lowered
    adopted: dict[str, Pin] = field(default_factory=dict)
    adopt_until: float | None = None

    def pin(self, ip: str, klass: int, mode: str) -> None:
        """Pin ip (a checked address) at klass in mode; CommandError past MAX_PINS."""
        if ip not in self.pins and len(self.pins) >= MAX_PINS:
            raise CommandError(
                f"pin: {len(self.pins)} initiators pinned already (at most {MAX_PINS}): "
                "unpin some first"
            )
        self.pins[ip] = (klass, mode)

    def unpin(self, ip: str) -> Pin:
        """The pin removed; CommandError when ip is not pinned."""
        pin = self.pins.pop(ip, None)
        if pin is None:
            raise CommandError(f"{ip!r} is not pinned")
        return pin

    def set_group(self, group: str, override: GroupOverride) -> None:
        """`group set`: merged over the group's earlier override."""
        self.group_overrides[group] = merge(self.group_overrides.get(group), override)

    def desired(self, classes: Mapping[str, int], write_mode: str) -> dict[str, Pin]:
        """ip -> (class, mode) for the kernel: nothing while paused; else the
        controller's classes (per address) in the write mode, an adopted member at
        least at its adopted class, a pin above 0 whatever the rest says."""
        if self.paused:
            return {}
        out = {ip: (k, write_mode) for ip, k in classes.items()}
        for ip, (k, mode) in self.adopted.items():
            if out.get(ip, (0, mode))[0] < k:
                out[ip] = (k, mode)
        out.update({ip: pin for ip, pin in self.pins.items() if pin[0] > 0})
        return out

    def snapshot(self, resource_classes: Mapping[str, int]) -> Saved:
        return Saved(
            paused=self.paused,
            pins=dict(self.pins),
            thresholds=dict(self.thresholds),
            group_overrides=dict(self.group_overrides),
            resource_classes={n: k for n, k in resource_classes.items() if k},
        )

    def restore(
        self,
        saved: Saved,
        members: Mapping[str, Pin],
        groups: Mapping[str, GroupConfig],
        now: float,
        hold_s: float,
    ) -> None:
        """The saved state, and the kernel's members (ip -> (class, mode)) that no pin
        explains adopted until now + hold_s (see the module's header)."""
        self.paused = saved.paused
        self.pins = dict(saved.pins)
        self.thresholds = dict(saved.thresholds)
        self.group_overrides = dict(saved.group_overrides)
        prune(self.group_overrides, groups, "start")  # the file changed since
        self.adopted = {
            ip: km for ip, km in members.items() if km[0] > 0 and self.pins.get(ip) != km
        }
        if self.adopted:
            self.adopt_until = now + hold_s
            log.info(
                "adopted %d member(s) a previous run left; held %.0f s, then lowered",
                len(self.adopted),
                hold_s,
            )

    def age_adopted(self, now: float, decrease: int, wanted: Callable[[str], int]) -> None:
        """After the hold: lower each adopted member by `decrease` classes (0: out at
        once), drop those a pin or the controller (wanted(ip): its class) now explains."""
        if not self.adopted or (self.adopt_until is not None and now < self.adopt_until):
            return
        for ip, (k, mode) in list(self.adopted.items()):
            k2 = k - decrease if decrease else 0
            if ip in self.pins or wanted(ip) >= k2 or k2 <= 0:
                del self.adopted[ip]
            else:
                self.adopted[ip] = (k2, mode)


def recent_classes(saved: Saved, wall: float) -> dict[str, int]:
    """The saved resource classes when they were saved within SEED_MAX_AGE_S."""
    if saved.saved_at is not None and 0 <= wall - saved.saved_at <= SEED_MAX_AGE_S:
        return dict(saved.resource_classes)
    return {}
