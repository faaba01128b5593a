"""Why an initiator's delay class is what it is: the reason behind each change the kernel took.

What it owns
    reason(): for one initiator whose class just changed in the kernel (now: the
    daemon's clock), the resource that decided it (None: none did) and why, in the
    words of the audit trail (core/audit.py):
        paused                      santhrottle pause: every delay off
        pinned (class K MODE)       a pin, whatever the controller says
        left by the previous run    an adopted member, held then lowered
        the fleet leader's decision another appliance leads the resource
        write-heavy on R (joined)   it joined R's write-heavy set
        group G's arbiter on R      R is grouped: its group's class
        R's controller              R's PID moved its class (up or down)
        R's delay released (futile) R's delay did not lower its latency
        no longer write-heavy       it left every write-heavy set
    released(): each resource whose delay decide() released as futile
    (controller/futile.py) this tick, and each whose release its latency
    ended (the delay was working), into the audit trail.
    record(): each change of a tick, into the audit trail.  The daemon calls it
    with what the data path took (Actuator.reconcile's changes), under its lock,
    in the tick: only initiators that changed cost anything.

Worked example
    10.0.0.3 joins vg0's write-heavy set (vg0 at class 4): reason() ->
    ("vg0", "write-heavy on vg0 (joined)"); it is then pinned at 10: (None,
    "pinned (class 10 all)"); unpinned with vg0 at 6: ("vg0", "vg0's controller (class
    down)"), the unpin itself being the command's audit line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from santhrottle.appliance.daemon.core.loop import Daemon


def reason(d: Daemon, ip: str, old: int, new: int, now: float) -> tuple[str | None, str]:
    rt, ctl = d.runtime, d.ctl
    if rt.paused and new == 0:
        return None, "paused"
    pin = rt.pins.get(ip)
    if pin is not None and pin[0] > 0 and pin[0] == new:
        return None, f"pinned (class {pin[0]} {pin[1]})"
    adopted = rt.adopted.get(ip)
    if adopted is not None and adopted[0] == new:
        return None, "left by the previous run (held, then lowered)"
    key = d.hosts.key(ip)
    resources = ctl.write_sets.member_of.get(key, ())
    grouped = ctl.groups.group_of.get(key)

    def class_of(r: str) -> int:
        rs = ctl.resources.get(r)
        if r in ctl.grouped and grouped is not None:
            g = ctl.groups.resources.get(r)
            gs = g.groups.get(grouped) if g is not None else None
            return gs.delay_class if gs is not None else 0
        return rs.delay_class if rs is not None else 0

    top = max(resources, key=class_of, default=None)
    led = d.fleet is not None and new > 0 and d.fleet.extra.get(key, 0) == new
    if led and (top is None or class_of(top) < new):
        return None, "the fleet leader's decision"
    if top is None:
        return None, "no longer write-heavy" if new < old else "the controller"
    if top in ctl.grouped and grouped is not None:
        return top, f"group {grouped}'s arbiter on {top}"
    if old == 0:
        return top, f"write-heavy on {top} (joined)"
    rs = ctl.resources.get(top)
    if new < old and rs is not None and rs.futile.released(now):
        return top, f"{top}'s delay released (futile: it did not lower the read latency)"
    return top, f"{top}'s controller (class {'up' if new > old else 'down'})"


def record(d: Daemon, changes: Mapping[str, tuple[int, int, str]], now: float) -> None:
    """Each change the kernel took this tick, into the audit trail (under the lock)."""
    for ip, (old, new, _mode) in changes.items():
        resource, why = reason(d, ip, old, new, now)
        d.audit.class_change(ip, resource, old, new, why, now)


def released(d: Daemon, names: list[str], refuted: list[str], now: float) -> None:
    """The resources whose futile delay decide() released this tick, and those whose
    release their latency ended (under the lock)."""
    alpha = d.config.controller.auto_alpha
    for name in names:
        rs = d.ctl.resources[name]
        d.audit.futile(name, rs.futile, rs.threshold_s(alpha), now)
    for name in refuted:
        rs = d.ctl.resources[name]
        d.audit.futile_refuted(name, rs.futile, rs.threshold_s(alpha))
