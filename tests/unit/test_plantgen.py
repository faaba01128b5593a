"""sim/plantgen.py: reproducible plants within the issue's ranges, each a valid scenario."""

import math

import pytest

from santhrottle.sim import plantgen
from santhrottle.sim.plant import Device, solve_latency
from santhrottle.sim.scenario import parse_scenario

pytestmark = pytest.mark.unit

N = 150
MIB = 1024.0 * 1024.0


@pytest.fixture(scope="module")
def plants():
    return [plantgen.draw(7, i) for i in range(N)]


@pytest.fixture(scope="module")
def scenarios(plants):
    return [parse_scenario(p.toml()) for p in plants]


def test_reproducible_and_seeded():
    assert plantgen.generate(3, 5) == plantgen.generate(3, 5)
    assert plantgen.generate(3, 5) != plantgen.generate(3, 6)
    assert plantgen.generate(3, 5) != plantgen.generate(4, 5)
    assert plantgen.generate(3, 5) == plantgen.draw(3, 5).toml()


def test_the_worked_example():
    assert plantgen.draw(1, 0).describe() == (
        "few: 2 hosts (depth 1-22, 64-256 KiB), staggered_onoff on 27.3 s off 5.5 s gap 9 s; "
        "C 0.126 ms m 0.161 ms/IO noise 0.05; read 252 KiB/s; T 0.2198 ms (1.7x idle); "
        "2nd resource: 2 shared + 2 own hosts"
    )


def test_every_plant_parses_and_says_what_it_is(plants, scenarios):
    for p, sc in zip(plants, scenarios, strict=True):
        text = p.toml()
        assert text.startswith(f"# plantgen seed 7 index {p.index}")
        assert p.describe() in text
        assert sc.thresholds_s == (p.threshold_ms / 1000.0,)
        assert 60.0 <= sc.duration_s <= 90.0
        assert sc.settle_s is not None and sc.settle_s + 30.0 <= sc.duration_s


def test_device_and_reader_ranges(scenarios):
    for sc in scenarios:
        for r in sc.resources:
            assert 0.1e-3 <= r.intercept_s <= 10e-3
            assert 0.05e-3 <= r.slope_s_per_io <= 10e-3
            assert 0.0 <= r.noise <= 0.5
        readers = [s for s in sc.streams if s.kind == "read"]
        assert len(readers) == len(sc.resources)
        for s in readers:
            assert s.loop == "open" and s.size_bytes == 4096
            rate_kib = s.rate_iops * 4
            assert 64 * 0.999 <= rate_kib <= 1024 * 1.001
            m = next(r.slope_s_per_io for r in sc.resources if r.name == s.resource)
            assert m * s.rate_iops < 0.5  # the reader alone never saturates


def test_writer_ranges(plants, scenarios):
    for p, sc in zip(plants, scenarios, strict=True):
        n0 = len(p.hosts) - p.own_r1
        lo, hi = plantgen.HOSTS[p.family]
        assert lo <= n0 <= hi
        for h in p.hosts[:n0]:
            assert 1 <= h.threads <= 8 and 1 <= h.depth <= 32
        for s in sc.streams:
            if s.kind == "write":
                assert s.loop == "closed"
                kib = int(s.size_bytes / 1024)
                assert 4 <= kib <= 1024 and kib & (kib - 1) == 0  # a power of two
                assert 1 <= s.depth <= 8 * 32


def test_thresholds_within_1_5_and_10_times_idle(scenarios):
    for sc in scenarios:
        thr = sc.thresholds_s[0]
        for r in sc.resources:
            reader = next(s for s in sc.streams if s.kind == "read" and s.resource == r.name)
            idle = solve_latency(Device(r.intercept_s, r.slope_s_per_io), reader.rate_iops, [])
            assert math.isclose(idle, r.intercept_s / (1 - r.slope_s_per_io * reader.rate_iops))
            assert 1.5 <= thr / idle <= 10.0


def test_every_family_schedule_and_two_resources_occur(plants):
    assert {p.family for p in plants} == set(plantgen.FAMILIES)
    assert {p.schedule for p in plants} == set(plantgen.SCHEDULES)
    two = [p for p in plants if len(p.resources) == 2]
    assert len(two) >= N // 10
    for p in two:  # resource 1 shares writer hosts with resource 0
        assert any(h.depth_r1 for h in p.hosts[: len(p.hosts) - p.own_r1])


def test_schedules(scenarios, plants):
    for p, sc in zip(plants, scenarios, strict=True):
        writers = [s for s in sc.streams if s.kind == "write" and s.resource == "r0"]
        starts = [s.schedule.start_s for s in writers]
        if p.schedule.startswith("staggered") and len(starts) > 1:
            assert len(set(starts)) == len(starts)  # one by one
        elif p.schedule in ("simultaneous", "onoff"):
            assert len(set(starts)) == 1
        if p.schedule.endswith("onoff"):
            ws = next(s for s in sc.streams if s.kind == "write")
            assert 10.0 <= ws.schedule.on_s <= 30.0 and 3.0 <= ws.schedule.off_s <= 10.0


def _unthrottled(sc):
    """Resource 0 with every writer on and undelayed: latency, per-host write rates, IOPS."""
    r = sc.resources[0]
    reads = sum(s.rate_iops for s in sc.streams if s.kind == "read" and s.resource == r.name)
    writers = [s for s in sc.streams if s.kind == "write" and s.resource == r.name]
    lat = solve_latency(
        Device(r.intercept_s, r.slope_s_per_io), reads, [(s.depth, 0.0) for s in writers]
    )
    return lat, [s.depth / lat * s.size_bytes for s in writers], sum(s.depth for s in writers) / lat


def test_every_plant_needs_a_delay_and_the_ladder_can_hold_it(scenarios):
    for sc in scenarios:
        lat, _, _ = _unthrottled(sc)
        assert lat >= plantgen.NEEDS_THROTTLE_RATIO * sc.thresholds_s[0]


def test_light_hosts_each_under_1_mib_s_together_saturate(plants, scenarios):
    light = [sc for p, sc in zip(plants, scenarios, strict=True) if p.family == "light"]
    assert len(light) >= 10
    for sc in light:
        lat, rates, iops = _unthrottled(sc)
        assert len(rates) >= 20
        assert max(rates) < MIB  # under the default write-heavy enter threshold
        assert lat > sc.thresholds_s[0]  # together they push the reader past T
        assert sc.resources[0].slope_s_per_io * iops >= 0.5  # the array is busy
