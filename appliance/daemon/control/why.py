"""`santhrottle why INITIATOR`: the answer from the daemon's recent history.

What it owns
    why_answer(): one initiator's delay now (its class, mode, pin, the
    resources it is write-heavy on, its group) and what the audit trail
    remembers of it (core/audit.py: each class change the kernel took, with its
    resource and reason, and each command that named it, with who), oldest
    first; a [hosts.NAME] address answers for its host's row too.  Read under
    the daemon's lock; JSON-ready.

Answer
    {"initiator": "10.0.0.3", "class": 4, "delay_s": 0.002, "mode": "all",
     "pinned": false, "write_heavy_on": ["vg0"], "group": null,
     "events": [{"at": 1764337327.1, "resource": "vg0", "from": 0, "to": 4,
                 "why": "write-heavy on vg0 (joined)"},
                {"at": 1764337500.0, "resource": null, "from": null, "to": null,
                 "why": "pin by uid 0 pid 4242"}, ...]}
    "at" is the wall clock (seconds since the epoch); "from"/"to" are null for a
    command.  An initiator the daemon never changed has no events.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from santhrottle.appliance.daemon.core.loop import Daemon


def why_answer(d: Daemon, ip: str) -> dict[str, Any]:
    klass, mode = d.actuator.members().get(ip, (0, d.config.write_mode))
    key = d.hosts.key(ip)
    pin = d.runtime.pins.get(ip)
    events = [
        {
            "at": e.at,
            "resource": e.resource,
            "from": None if e.old < 0 else e.old,
            "to": None if e.new < 0 else e.new,
            "why": e.why,
        }
        for e in d.audit.history(ip)
    ]
    ladder = d.config.ladder
    return {
        "initiator": ip,
        "class": klass,
        "delay_s": ladder.delay_s(min(klass, ladder.max_class)),
        "mode": mode,
        "pinned": pin is not None,
        "paused": d.runtime.paused,
        "write_heavy_on": sorted(d.ctl.write_sets.member_of.get(key, ())),
        "group": d.ctl.groups.group_of.get(key),
        "events": events,
    }
