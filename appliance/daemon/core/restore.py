"""A start that picks up where the last run stopped, and never strands a delay.

What it owns
    restore(): at start, after the data path is applied, the saved state
    (daemon/core/state.py) and the kernel's members come together.  Pause, pins
    and threshold overrides come back as they were, and the groups'
    overrides of the groups the file still has.  Each resource's saved
    class seeds its controller (when the save is recent), so a writer the
    controller throttled is throttled again as soon as it is seen writing.
    Every member the kernel still holds is in `applied` (shown by status,
    removable by unpin or cleanup) and, unless a pin explains it, adopted:
    held at its class for ADOPT_HOLD_CONVERGES convergences, long enough for
    the controller to see the writers again, then lowered class by class
    (controller.class_decrease_max_per_tick per tick; glide leaves keep
    each descent in order) until the controller wants it or it is out.
    age_adopted() does that lowering, every tick.
    snapshot(): the Saved the daemon writes after a command and a convergence.

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
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from santhrottle.appliance.daemon.core.group_overrides import prune
from santhrottle.appliance.daemon.core.state import Saved, StateError, StateStore

if TYPE_CHECKING:
    from santhrottle.appliance.daemon.core.loop import Daemon

log = logging.getLogger("santhrottled")

# Convergences an adopted member keeps its class before it is lowered.
ADOPT_HOLD_CONVERGES = 3
# A saved resource class older than this is no guide to the array now.
SEED_MAX_AGE_S = 300.0


def restore(
    daemon: Daemon,
    store: StateStore | None,
    members: Mapping[str, Any],
    now: float,
    wall: float | None = None,
) -> Saved:
    """Saved state + the kernel's members (ip -> object with .klass, .mode)."""
    saved = Saved()
    if store is not None:
        try:
            saved = store.load(daemon.config.max_class)
        except StateError as e:
            try:
                where = store.set_aside()
                log.error("%s; set aside as %s, starting without it", e, where)
            except OSError as e2:
                log.error("%s; cannot set it aside (%s), starting without it", e, e2)
    st = daemon.state
    st.paused = saved.paused
    st.pins = dict(saved.pins)
    st.thresholds = dict(saved.thresholds)
    st.group_overrides = dict(saved.group_overrides)
    prune(st.group_overrides, daemon.config.groups, "start")  # the file changed since
    wall = time.time() if wall is None else wall
    if saved.saved_at is not None and 0 <= wall - saved.saved_at <= SEED_MAX_AGE_S:
        daemon.seed_classes = dict(saved.resource_classes)
    st.applied = {ip: (m.klass, m.mode) for ip, m in members.items() if m.klass > 0}
    st.adopted = {ip: km for ip, km in st.applied.items() if st.pins.get(ip) != km}
    if st.adopted:
        st.adopt_until = now + ADOPT_HOLD_CONVERGES * daemon.config.controller.converge_s
        log.info(
            "adopted %d member(s) a previous run left; held %.0f s, then lowered",
            len(st.adopted),
            st.adopt_until - now,
        )
    return saved


def age_adopted(daemon: Daemon, now: float) -> None:
    """After the hold: lower each adopted member a step, drop those the
    controller or a pin now explains (under the daemon's lock, each tick)."""
    st = daemon.state
    if not st.adopted or (st.adopt_until is not None and now < st.adopt_until):
        return
    dec = daemon.config.controller.class_decrease_max_per_tick
    for ip, (k, mode) in list(st.adopted.items()):
        wanted = daemon.ctl.effective.get(daemon.hosts.key(ip), 0)  # a host's: its key's
        k2 = k - dec if dec else 0
        if ip in st.pins or wanted >= k2 or k2 <= 0:
            del st.adopted[ip]
        else:
            st.adopted[ip] = (k2, mode)


def snapshot(daemon: Daemon) -> Saved:
    st = daemon.state
    return Saved(
        paused=st.paused,
        pins=dict(st.pins),
        thresholds=dict(st.thresholds),
        group_overrides=dict(st.group_overrides),
        resource_classes={
            n: rs.delay_class for n, rs in daemon.ctl.resources.items() if rs.delay_class
        },
    )
