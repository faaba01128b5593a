"""Metrics: every series with its type and labels, the member counters read at scrape
time through an injected reader (and a failing one), the tick histogram and the raw
counters the daemon accumulates from its samples; against the fakes of
tests/unit/test_daemon.py in virtual time."""

from __future__ import annotations

import platform
import threading

import pytest
from prometheus_client import generate_latest

from santhrottle.appliance.daemon.core.counters import TICK_DURATION_BUCKETS_S, Counters
from santhrottle.appliance.daemon.status import member_counters
from santhrottle.appliance.daemon.status.build import StatusCache
from santhrottle.appliance.daemon.status.metrics import registry_for
from santhrottle.appliance.version import version
from santhrottle.controller.domain import ReadSample
from tests.unit.test_daemon import handle, status_of

from .test_daemon import MIB, make, run_for

KERNEL = {"10.0.0.3": ("all", 0x20, 1834, 2650112), "10.0.0.7": ("ack", 0x04, 12, 792)}

# family name -> (type, label names of its samples); counters and the histogram
# carry their suffixes in the samples (_total; _bucket/_sum/_count)
SERIES = {
    "santhrottle_resource_read_latency_seconds": ("gauge", {"resource"}),
    "santhrottle_resource_threshold_seconds": ("gauge", {"resource"}),
    "santhrottle_resource_setpoint_ratio": ("gauge", {"resource"}),
    "santhrottle_resource_lq_intercept_seconds": ("gauge", {"resource"}),
    "santhrottle_resource_lq_slope_seconds": ("gauge", {"resource"}),
    "santhrottle_resource_lq_r_squared": ("gauge", {"resource"}),
    "santhrottle_resource_lq_windows": ("gauge", {"resource"}),
    "santhrottle_resource_delay_class": ("gauge", {"resource"}),
    "santhrottle_resource_delay_seconds": ("gauge", {"resource"}),
    "santhrottle_resource_write_heavy_initiators": ("gauge", {"resource"}),
    "santhrottle_resource_reads_completed": ("counter", {"resource"}),
    "santhrottle_resource_read_time_seconds": ("counter", {"resource"}),
    "santhrottle_resource_written_bytes": ("counter", {"resource"}),
    "santhrottle_resource_futile_releases": ("counter", {"resource"}),
    "santhrottle_resource_futile_refutations": ("counter", {"resource"}),
    "santhrottle_initiator_write_bytes_per_second": ("gauge", {"initiator", "resource"}),
    "santhrottle_initiator_written_bytes": ("counter", {"initiator", "resource"}),
    "santhrottle_initiator_delay_seconds": ("gauge", {"initiator", "mode"}),
    "santhrottle_initiator_delay_class": ("gauge", {"initiator", "mode"}),
    "santhrottle_initiator_delayed_packets": ("counter", {"initiator", "mode"}),
    "santhrottle_initiator_delayed_bytes": ("counter", {"initiator", "mode"}),
    "santhrottle_scrape_errors": ("counter", {"source"}),
    "santhrottle_paused": ("gauge", set()),
    "santhrottle_quarantined": ("gauge", {"kind"}),
    "santhrottle_repairs": ("counter", set()),
    "santhrottle_quarantines": ("counter", {"kind"}),
    "santhrottle_ticks": ("counter", set()),
    "santhrottle_tick_overruns": ("counter", set()),
    "santhrottle_convergences": ("counter", set()),
    "santhrottle_sensor_errors": ("counter", set()),
    "santhrottle_actuator_errors": ("counter", set()),
    "santhrottle_reloads": ("counter", set()),
    "santhrottle_reload_failures": ("counter", set()),
    "santhrottle_state_save_errors": ("counter", set()),
    "santhrottle_initiators_adopted": ("gauge", set()),
    "santhrottle_initiators": ("gauge", set()),
    "santhrottle_initiators_omitted": ("gauge", set()),
    "santhrottle_glided_descents": ("counter", set()),
    "santhrottle_unordered_descents": ("counter", set()),
    "santhrottle_tick_duration_seconds": ("histogram", set()),
    "santhrottle_build_info": ("gauge", {"version", "python"}),
    "santhrottle_resource_utilization_ratio": ("gauge", {"resource"}),
    "santhrottle_resource_saturated": ("gauge", {"resource"}),
}
# prometheus_client's process collector, on the same registry (Linux: from /proc)
PROCESS = {
    "process_cpu_seconds": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_virtual_memory_bytes": "gauge",
    "process_start_time_seconds": "gauge",
    "process_open_fds": "gauge",
    "process_max_fds": "gauge",
}


def families(reg):
    return {m.name: m for m in reg.collect()}


def value(reg, sample_name, **labels):
    for m in reg.collect():
        for s in m.samples:
            if s.name == sample_name and s.labels == labels:
                return s.value
    return None


@pytest.fixture
def daemon():
    d, vt, sensors, _act = make()
    run_for(d, vt, 3.0)
    return d, vt, sensors


def test_every_series_has_its_type_and_labels(daemon):
    d, _vt, _s = daemon
    fams = families(registry_for(StatusCache(d), lambda: KERNEL))
    ours = {n for n in fams if n.startswith("santhrottle_")}
    assert ours == set(SERIES)
    assert {n: fams[n].type for n in PROCESS} == PROCESS
    assert all(n.startswith("process_") for n in set(fams) - ours)
    for name, (kind, labels) in SERIES.items():
        m = fams[name]
        assert m.type == kind, name
        assert m.samples or "_lq_" in name, name  # lq: "auto" resources only (below)
        for s in m.samples:
            want = labels | {"le"} if s.name.endswith("_bucket") else labels
            assert set(s.labels) == want, (name, s)
        if kind == "counter":
            assert {s.name for s in m.samples} <= {name + "_total", name + "_created"}
        assert m.documentation, name
    text = generate_latest(registry_for(StatusCache(d), lambda: KERNEL)).decode()
    for line in (
        'santhrottle_initiator_delayed_packets_total{initiator="10.0.0.3",mode="all"} 1834.0',
        'santhrottle_initiator_delayed_bytes_total{initiator="10.0.0.7",mode="ack"} 792.0',
        'santhrottle_scrape_errors_total{source="member_sets"} 0.0',
        f'santhrottle_build_info{{python="{platform.python_version()}",version="{version()}"}} 1.0',
    ):
        assert line in text, line
    assert "santhrottle_tick_seconds_total" not in text  # replaced by the histogram's _sum


def test_delay_seconds_beside_each_class(daemon):
    d, _vt, _s = daemon
    reg = registry_for(StatusCache(d))
    st = status_of(d)
    (vg0,) = [r for r in st["resources"] if r["resource"] == "vg0"]
    (ini,) = [i for i in st["initiators"] if i["initiator"] == "10.0.0.3"]
    assert vg0["delay_class"] > 0 and ini["class"] > 0
    lad = d.config.ladder
    assert value(reg, "santhrottle_resource_delay_class", resource="vg0") == vg0["delay_class"]
    assert value(reg, "santhrottle_resource_delay_seconds", resource="vg0") == pytest.approx(
        lad.delay_s(vg0["delay_class"])
    )
    labels = {"initiator": "10.0.0.3", "mode": "all"}
    assert value(reg, "santhrottle_initiator_delay_class", **labels) == ini["class"]
    assert value(reg, "santhrottle_initiator_delay_seconds", **labels) == pytest.approx(
        lad.delay_s(ini["class"])
    )


def test_counters_restart_note_in_the_help_text(daemon):
    d, _vt, _s = daemon
    fams = families(registry_for(StatusCache(d), lambda: KERNEL))
    for name in ("santhrottle_initiator_delayed_packets", "santhrottle_initiator_delayed_bytes"):
        assert "bulk swap" in fams[name].documentation


def test_without_a_reader_the_member_series_are_left_out(daemon):
    d, _vt, _s = daemon
    fams = families(registry_for(StatusCache(d)))
    assert "santhrottle_initiator_delayed_packets" not in fams
    assert "santhrottle_scrape_errors" not in fams
    assert "santhrottle_initiator_delay_class" in fams


def test_a_failing_reader_leaves_its_series_out_and_is_counted(daemon):
    d, _vt, _s = daemon
    state = {"fail": True, "calls": 0}

    def reader():
        state["calls"] += 1
        if state["fail"]:
            raise OSError("netlink: Operation not permitted")
        return KERNEL

    reg = registry_for(StatusCache(d), reader)
    for n in (1, 2):
        text = generate_latest(reg).decode()  # the scrape itself does not fail
        assert "santhrottle_initiator_delayed_packets_total" not in text
        assert "santhrottle_initiator_delayed_bytes_total" not in text
        assert f'santhrottle_scrape_errors_total{{source="member_sets"}} {n}.0' in text
        assert 'santhrottle_resource_threshold_seconds{resource="vg0"}' in text  # the rest
    state["fail"] = False
    text = generate_latest(reg).decode()
    assert 'santhrottle_initiator_delayed_packets_total{initiator="10.0.0.3",mode="all"}' in text
    assert 'santhrottle_scrape_errors_total{source="member_sets"} 2.0' in text  # a counter
    assert state["calls"] == 3


def test_the_kernel_is_read_outside_the_daemon_lock(daemon):
    """A slow netlink dump must not hold up the tick, which takes the daemon's lock."""
    d, _vt, _s = daemon
    got = []

    def reader():
        t = threading.Thread(target=lambda: got.append(d.lock.acquire(timeout=1.0)))
        t.start()
        t.join()
        if got[-1]:
            d.lock.release()
        return KERNEL

    generate_latest(registry_for(StatusCache(d), reader))
    assert got == [True]


def test_the_reader_opens_and_closes_its_own_host_per_scrape(monkeypatch):
    opened, closed = [], []

    class FakeHost:
        def __init__(self, netns, tools):
            opened.append(netns)

        def close(self):
            closed.append(True)

    class FakeSets:
        fail = False

        def __init__(self, host):
            self.host = host

        def read(self):
            if FakeSets.fail:
                raise OSError("ipset: gone")
            return dict(KERNEL)

    monkeypatch.setattr(member_counters, "Host", FakeHost)
    monkeypatch.setattr(member_counters, "MemberSets", FakeSets)
    read = member_counters.MemberCounterReader("tgt")
    assert read() == KERNEL and read() == KERNEL
    FakeSets.fail = True
    with pytest.raises(OSError):
        read()
    assert opened == ["tgt"] * 3 and len(closed) == 3  # closed after a failure too


def test_tick_duration_histogram_counts_ticks():
    d, vt, sensors, _act = make()
    durations = [0.0004, 0.004, 0.005, 0.06, 2.0]  # 0.005: on a bound, counted in it (le)
    todo = iter(durations)
    read = sensors.read_samples

    def slow_read():
        vt.now += next(todo)  # the tick's work takes this long, in virtual time
        return read()

    sensors.read_samples = slow_read
    for _ in durations:
        d.tick(vt.now)
    c = status_of(d)["counters"]
    assert c["ticks"] == 5 and c["tick_seconds_sum"] == pytest.approx(sum(durations))
    buckets = c["tick_duration_buckets"]
    assert list(buckets)[-1] == "+Inf" and len(buckets) == len(TICK_DURATION_BUCKETS_S) + 1
    assert buckets["0.001"] == 1 and buckets["0.003"] == 1
    assert buckets["0.005"] == 3 and buckets["0.05"] == 3
    assert buckets["0.075"] == 4 and buckets["1.0"] == 4 and buckets["+Inf"] == 5
    reg = registry_for(StatusCache(d))
    name = "santhrottle_tick_duration_seconds"
    assert value(reg, name + "_bucket", le="0.005") == 3
    assert value(reg, name + "_bucket", le="+Inf") == 5
    assert value(reg, name + "_count") == 5
    assert value(reg, name + "_sum") == pytest.approx(sum(durations))


def test_raw_resource_counters_accumulate_from_the_samples():
    d, vt, sensors, _act = make()
    tick_s = d.config.controller.tick_s
    sample = sensors.read_samples()[0]  # 6 reads of 30 ms, 20 MiB/s
    d.converge_once()  # discovers vg1 too (no threshold: observed)
    for _ in range(10):
        d.run_once()
    (vg0,) = [r for r in status_of(d)["resources"] if r["resource"] == "vg0"]
    assert vg0["reads_completed"] == 10 * sample.reads
    assert vg0["read_time_s"] == pytest.approx(10 * sample.reads * sample.read_latency_s)
    assert vg0["written_bytes"] == pytest.approx(10 * sample.write_bps * tick_s)
    # a tick late by two periods: its sample covers three
    vt.now += 0.35
    d.run_once()
    assert d.counters.tick_overruns == 2
    assert d.counters.resources["vg0"].written_bytes == pytest.approx(
        13 * sample.write_bps * tick_s
    )
    # a failed read: the next sample covers both ticks
    sensors.fail_reads = True
    d.run_once()
    sensors.fail_reads = False
    d.run_once()
    totals = d.counters.resources["vg0"]
    assert totals.written_bytes == pytest.approx(15 * sample.write_bps * tick_s)
    assert totals.reads_completed == 12 * sample.reads  # reads are counts: no scaling
    reg = registry_for(StatusCache(d))
    assert value(reg, "santhrottle_resource_reads_completed_total", resource="vg0") == 72
    assert value(reg, "santhrottle_resource_read_time_seconds_total", resource="vg0") == (
        pytest.approx(72 * 0.030)
    )
    assert value(reg, "santhrottle_resource_written_bytes_total", resource="vg0") == (
        pytest.approx(15 * 20 * MIB * tick_s)
    )
    # a known resource without samples yet: its counters are there, at 0
    assert value(reg, "santhrottle_resource_reads_completed_total", resource="vg1") == 0


def test_written_bytes_per_initiator_from_the_convergences():
    d, _vt, sensors, _act = make()
    converge_s = d.config.controller.converge_s
    for _ in range(4):
        d.converge_once()
    (ini,) = [i for i in status_of(d)["initiators"] if i["initiator"] == "10.0.0.3"]
    assert ini["written_bytes"] == {"vg0": pytest.approx(4 * 20 * MIB * converge_s)}
    reg = registry_for(StatusCache(d))
    labels = {"initiator": "10.0.0.3", "resource": "vg0"}
    assert value(reg, "santhrottle_initiator_written_bytes_total", **labels) == (
        pytest.approx(4 * 20 * MIB * converge_s)
    )
    # the initiator leaves the discovery: its pairs go with it
    sensors.writers = {"10.0.0.4": "vg0"}
    d.converge_once()
    assert ("10.0.0.3", "vg0") not in d.written.snapshot()
    assert (
        value(registry_for(StatusCache(d)), "santhrottle_initiator_written_bytes_total", **labels)
        is None
    )


def test_counters_never_read_a_clock():
    c = Counters()
    c.add_reads([ReadSample("vg0", 6, 0.030, 1e6)], 0.1)
    c.tick_overruns = 3  # three deadlines missed before the next tick
    c.add_reads([ReadSample("vg0", 2, 0.010, 1e6)], 0.1)
    t = c.resources["vg0"]
    assert t.reads_completed == 8
    assert t.read_time_s == pytest.approx(0.2)
    assert t.written_bytes == pytest.approx(1e6 * 0.1 + 1e6 * 0.4)
    c.add_reads([ReadSample("vg0", 1, 0.01, None)], 0.1)  # no write rate: no bytes
    assert t.written_bytes == pytest.approx(5e5)


def test_an_auto_threshold_exports_its_lq_fit_and_the_threshold_in_force():
    """The fake devices follow L = 2 ms + 3 ms x Q: once the load has varied, the fit
    is confident and the threshold in force is C / (1 - 0.9) = 20 ms."""
    d, vt, sensors, _act = make()
    handle(d, "threshold_set", {"resource": "vg0", "threshold_s": "auto"})
    for lat in (0.005, 0.011, 0.020, 0.035, 0.050) * 3:
        sensors.latency_s = lat
        run_for(d, vt, 3.0)
    fams = families(registry_for(StatusCache(d), lambda: KERNEL))

    def one(name):
        (s,) = [s for s in fams[name].samples if s.labels == {"resource": "vg0"}]
        return s.value

    assert one("santhrottle_resource_lq_intercept_seconds") == pytest.approx(0.002, rel=0.05)
    assert one("santhrottle_resource_lq_slope_seconds") == pytest.approx(0.003, rel=0.05)
    assert one("santhrottle_resource_lq_r_squared") > 0.95
    assert one("santhrottle_resource_threshold_seconds") == pytest.approx(0.020, rel=0.05)


def test_bridge_mode_exports_the_wire_sensors_counters():
    from santhrottle.appliance.daemon.status.views import SyncView, WireView
    from santhrottle.appliance.daemon.status.wire_metrics import WIRE_COUNTERS, wire_families

    counts = {"commands": 10, "completions": 9, "capture_kernel_drops": 2, "walk_desyncs": 3}
    sync = [
        SyncView("10.0.0.2", 40000, "10.0.0.9:3260", "iqn.x:t", d, s, b, t, 0, "")
        for d, s, b, t in (("to_target", "in sync", 0, 0.0),
                           ("to_initiator", "out of sync", 900, 1.5))
    ]  # fmt: skip
    wire = WireView(capturing=True, sensor="capture", held=["array1"], sync=sync,
                    directions={"in sync": 1, "out of sync": 1}, out_of_sync_s=1.5,
                    counters=counts)  # fmt: skip
    families = list(wire_families(wire))
    got = {m.name: m.samples[0].value for m in families if len(m.samples) == 1}
    assert got["santhrottle_wire_capturing"] == 1.0
    assert got["santhrottle_wire_commands"] == 10 and got["santhrottle_wire_completions"] == 9
    assert got["santhrottle_wire_dropped_frames"] == 2
    assert got["santhrottle_wire_aged_commands"] == 0
    assert got["santhrottle_wire_desyncs"] == 3
    assert got["santhrottle_wire_out_of_sync_seconds"] == 1.5
    assert got["santhrottle_wire_resource_held"] == 1.0
    ways = {s.labels["state"]: s.value for m in families if m.name == "santhrottle_wire_directions"
            for s in m.samples}  # fmt: skip
    assert ways == {"in sync": 1, "provisional": 0, "out of sync": 1, "not measurable": 0}
    assert len(families) == len(WIRE_COUNTERS) + 4


def test_a_status_lists_the_directions_out_of_sync_first_and_counts_them_all():
    """65,536 connection directions on the wire: the status lists SYNC_ROWS of them,
    those not in sync first (the longest first), and counts them all by state."""
    from types import SimpleNamespace

    from santhrottle.appliance.daemon.status.build import SYNC_ROWS, wire
    from santhrottle.bridge.conns import SyncRow, summary

    rows = [
        SyncRow("10.0.0.2", i, "10.0.0.9:3260", "", "to_target", "in sync", 0, 0.0, 0, "")
        for i in range(60_000)
    ] + [
        SyncRow("10.0.0.3", i, "10.0.0.9:3260", "", "to_target", "out of sync", 9, i / 10, 1, "")
        for i in range(300)
    ]
    bridge = SimpleNamespace(
        running=True,
        kind="kernel",
        held=frozenset(),
        sync_summary=lambda: summary(rows),
        counters=dict,
    )
    w = wire(SimpleNamespace(bridge=bridge))  # type: ignore[arg-type]
    assert len(w.sync) == SYNC_ROWS
    assert all(r.state == "out of sync" for r in w.sync)
    assert [r.out_of_sync_s for r in w.sync[:2]] == [29.9, 29.8]
    assert w.directions == {"in sync": 60_000, "out of sync": 300}
    assert w.out_of_sync_s == pytest.approx(sum(i / 10 for i in range(300)))
