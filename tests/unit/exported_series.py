"""Every series the exporter exports, scraped from real registries (status/metrics.py's
registry_for: the daemon's collector and the process collector), not listed by hand.

Daemons on the unit tests' fakes, each with a part of the configuration switched on,
so every family shows: target mode with the member counters, a threshold "auto" (its
LQ fit's families) and a [hosts.NAME]; [groups.NAME]; [fleet] (two appliances on a
fake engine); a group with levels and its meter (docs/levels.md); bridge mode's wire
families on a daemon's own view with a WireView in it (the unit tier has no wire
sensor: the collector is the real one).  A family without samples counts by its
`# TYPE` line; a histogram by its _bucket, _sum and _count.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading

from prometheus_client import generate_latest

from santhrottle.appliance.daemon.status.build import StatusCache
from santhrottle.appliance.daemon.status.metrics import registry_for
from santhrottle.appliance.daemon.status.views import StatusView, SyncView, WireView
from santhrottle.appliance.daemon.status.wire_metrics import SYNC_STATES, WIRE_COUNTERS

KERNEL = {"10.0.0.3": ("all", 0x20, 1834, 2650112)}  # the member counters, faked
HOSTS = """
[hosts.db1]
addresses = ["10.0.0.3", "fd00::3"]
"""
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )", re.M)
TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


class ViewSource:
    """A StatusSource holding one view (the collector reading it is the real one)."""

    def __init__(self, view: StatusView) -> None:
        self.lock = threading.Lock()
        self.view = view

    def status(self) -> StatusView:
        return self.view


def names_in(text: str) -> set[str]:
    """The series names of an exposition: its samples' and its families'."""
    out = set(SAMPLE.findall(text))
    for name, kind in TYPE.findall(text):
        out |= {name + s for s in SUFFIXES.get(kind, ("",))}
    return out


def _registries():
    from tests.unit.test_daemon import CONF, handle, make, run_for
    from tests.unit.test_daemon_fleet import Fleet
    from tests.unit.test_group_commands import grouped
    from tests.unit.test_levels_daemon import levels_registry

    d, vt, _s, _a = make(CONF + HOSTS)
    run_for(d, vt, 3.0)
    handle(d, "threshold_set", {"resource": "vg0", "threshold_s": "auto"})
    run_for(d, vt, 2.0)
    yield registry_for(StatusCache(d), lambda: KERNEL)
    g, _vt, _s, _a = grouped()
    yield registry_for(StatusCache(g))
    f = Fleet()
    f.run(2.0)
    yield registry_for(StatusCache(f.daemons["a"]))
    yield levels_registry()
    sync = [
        SyncView("10.0.0.3", 40000 + i, "10.0.0.9:3260", "iqn.x:t", "to_target", s, 0, 0.0, 0, "")
        for i, s in enumerate(SYNC_STATES)
    ]
    counters = {key: 1 for _name, key, _doc in WIRE_COUNTERS}
    wire = WireView(
        capturing=True,
        sensor="kernel",
        held=["vg0"],
        sync=sync,
        directions=dict.fromkeys(SYNC_STATES, 1),
        counters=counters,
    )
    view = dataclasses.replace(StatusCache(d).status(), mode="bridge", wire=wire)
    yield registry_for(ViewSource(view))


@functools.cache
def exported_series() -> frozenset[str]:
    """Every series name the exporter exports (santhrottle_* and process_*)."""
    out: set[str] = set()
    for reg in _registries():
        out |= names_in(generate_latest(reg).decode())
    return frozenset(out)
