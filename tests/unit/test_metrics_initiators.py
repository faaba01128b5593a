"""The per-initiator series: how many an initiator has (the count docs/monitor.md
gives), and metrics.initiator_series bounding them to the initiators with the
largest delay, then write rate; the process collector's process_* beside them."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from santhrottle.appliance.daemon.status.build import StatusCache
from santhrottle.appliance.daemon.status.metrics import registry_for, top_initiators
from santhrottle.appliance.daemon.status.views import InitiatorView, StatusView

from .exported_series import ViewSource as Source
from .test_daemon import make, run_for


@pytest.fixture(scope="module")
def view() -> StatusView:
    d, vt, _sensors, _act = make()
    run_for(d, vt, 3.0)
    return StatusCache(d).status()


def initiator(ip: str, delay_s: float, rates: dict[str, float | None], **kw) -> InitiatorView:
    return InitiatorView(
        initiator=ip,
        host=kw.get("host"),
        addresses=kw.get("addresses", [ip]),
        resources=list(rates),
        write_bytes_per_second=rates,
        written_bytes={r: 1e6 for r in rates},
        write_heavy_on=[],
        klass=int(delay_s / 0.0005),
        delay_s=delay_s,
        mode="all",
        pinned=False,
        adopted=False,
    )


# delayed 10.0.0.1 > 10.0.0.2; then by write rate 10.0.0.4 > 10.0.0.3; 10.0.0.5 writes nothing
FLEET = [
    initiator("10.0.0.3", 0.0, {"vg0": 1e6}),
    initiator("10.0.0.1", 0.010, {"vg0": 1e5, "vg1": 1e5}),
    initiator("10.0.0.5", 0.0, {"vg0": None}),
    initiator("10.0.0.2", 0.005, {"vg0": 5e7}),
    initiator("10.0.0.4", 0.0, {"vg1": 2e6}),
    initiator("10.0.0.8", 0.0005, {"vg0": 1e3}, host="db1", addresses=["10.0.0.8", "fd00::8"]),
]
KERNEL = {
    "10.0.0.1": ("all", 20, 100, 1000),
    "10.0.0.2": ("all", 10, 50, 500),
    "10.0.0.9": ("all", 4, 5, 50),  # a member no initiator view has
    "10.0.0.8": ("all", 1, 5, 50),
    "fd00::8": ("all", 1, 5, 50),  # the host's second address
}


def per_initiator(reg) -> Counter[str]:
    """Samples per initiator label (every santhrottle_initiator_* series)."""
    n: Counter[str] = Counter()
    for m in reg.collect():
        if m.name.startswith("santhrottle_initiator_"):
            for s in m.samples:
                if not s.name.endswith("_created"):
                    n[s.labels["initiator"]] += 1
    return n


def gauge(reg, name: str) -> float:
    (m,) = [m for m in reg.collect() if m.name == name]
    (s,) = m.samples
    return s.value


def test_the_series_count_per_initiator_is_the_documented_one(view):
    """2 per resource it writes to (write rate, written bytes), 2 for its delay
    (seconds, class), 2 per address while it is in a delay class (packets, bytes)."""
    st = dataclasses.replace(view, initiators=FLEET)
    reg = registry_for(Source(st), lambda: KERNEL)
    got = per_initiator(reg)
    for i in FLEET:
        rated = sum(v is not None for v in i.write_bytes_per_second.values())
        members = sum(a in KERNEL for a in i.addresses)
        own = sum(got[a] for a in i.addresses)
        assert own == rated + len(i.written_bytes) + 2 + 2 * members, i.initiator
    # docs/monitor.md, "Series per initiator": 4 undelayed on one resource, 6 delayed,
    # 8 for a delayed host with two addresses (its member counters per address)
    assert got["10.0.0.3"] == 4 and got["10.0.0.2"] == 6
    assert got["10.0.0.8"] + got["fd00::8"] == 8 and got["fd00::8"] == 2
    assert got["10.0.0.1"] == 8  # delayed, on two resources
    assert got["10.0.0.9"] == 2  # a member of the sets only: its counters
    assert gauge(reg, "santhrottle_initiators_omitted") == 0


def test_the_live_daemons_delayed_initiator_has_six(view):
    reg = registry_for(Source(view), lambda: {"10.0.0.3": ("all", 88, 1, 1)})
    assert per_initiator(reg) == {"10.0.0.3": 6}


def test_top_initiators_by_delay_then_write_rate():
    order = [i.initiator for i in top_initiators(FLEET, len(FLEET) - 1)]
    assert order == ["10.0.0.1", "10.0.0.2", "10.0.0.8", "10.0.0.4", "10.0.0.3"]
    assert top_initiators(FLEET, None) is FLEET and top_initiators(FLEET, 99) is FLEET
    assert top_initiators(FLEET, 0) == []


@pytest.mark.parametrize("limit", [0, 1, 2, 3])
def test_a_limit_keeps_the_top_initiators_series_and_counts_the_rest(view, limit):
    st = dataclasses.replace(view, initiators=FLEET)
    asked = []

    def initiator_series():
        asked.append(1)
        return limit

    reg = registry_for(Source(st), lambda: KERNEL, initiator_series)
    top = ["10.0.0.1", "10.0.0.2", "10.0.0.8"][:limit]
    assert set(per_initiator(reg)) - {"fd00::8"} == set(top)
    assert gauge(reg, "santhrottle_initiators_omitted") == len(FLEET) - limit
    assert gauge(reg, "santhrottle_initiators") == len(FLEET)  # every initiator counts
    assert asked  # read at scrape time (a reload changes the next scrape)
    resources = {m.name for m in reg.collect() if m.name.startswith("santhrottle_resource_")}
    assert "santhrottle_resource_written_bytes" in resources  # the aggregates stay


def test_process_series_are_this_processs(view):
    reg = registry_for(Source(view))
    assert gauge(reg, "process_open_fds") >= 3
    assert gauge(reg, "process_resident_memory_bytes") > 1 << 20
    (cpu,) = [m for m in reg.collect() if m.name == "process_cpu_seconds"]
    assert cpu.type == "counter" and cpu.samples[0].value > 0
