"""Prometheus metrics, read from the daemon's state and the kernel at scrape time.

What it owns
    DaemonCollector: a custom collector on an injected CollectorRegistry (no
    global registry, no values cached between scrapes) that turns one
    Daemon.status() and one read of the member sets' counters into metric
    families (the initiator groups': daemon/status/group_metrics.py).  Names are in
    base units with node_exporter's vocabulary (`_seconds`, `_bytes`,
    `_total`; read time and written bytes as node_disk_read_time_seconds_total
    / node_disk_written_bytes_total).  The HTTP side is status/exporter.py
    (127.0.0.1 by default).

    The daemon's state is read under its lock; the kernel's counters after
    the lock is released, through read_members (a callable: the real one is
    daemon/status/member_counters.py, tests pass a fake), so a slow netlink dump
    never holds up a tick.  A failing read does not fail the scrape: its
    series are left out, santhrottle_scrape_errors_total{source} counts it
    and the first failure after a success is logged.

    The per-initiator series (santhrottle_initiator_*: per initiator 2 per
    resource it writes to, 2 for its delay and class, and 2 per address while
    it is delayed, its member counters) are bounded by initiator_series (a
    callable read under the daemon's lock at each scrape: metrics.initiator_series
    of the configuration in force, None for all): the initiators with the
    largest delay, then the largest write rate, keep theirs;
    santhrottle_initiators_omitted counts the others, whose traffic the
    resources' series still hold.  The registry also carries
    prometheus_client's process collector (process_cpu_seconds_total,
    process_resident_memory_bytes, process_open_fds, ...: this process, from
    /proc at scrape time).

Worked example
    A daemon that delays 10.0.0.3 by class 20 (10 ms) for vg0, with
    read_members returning {"10.0.0.3": ("all", 0x20, 1834, 2650112)}:
        santhrottle_resource_delay_class{resource="vg0"} 20.0
        santhrottle_resource_delay_seconds{resource="vg0"} 0.01
        santhrottle_initiator_delay_class{initiator="10.0.0.3",mode="all"} 20.0
        santhrottle_initiator_delayed_packets_total{initiator="10.0.0.3",mode="all"} 1834.0
        santhrottle_initiator_delayed_bytes_total{initiator="10.0.0.3",mode="all"} 2650112.0
        santhrottle_scrape_errors_total{source="member_sets"} 0.0
    Label values are address text as the data path prints it, IPv4 or IPv6
    ("fd00::3"); nothing here parses them.  A [hosts.NAME] is one initiator:
    its per-initiator series carry its first address, it counts once in
    santhrottle_initiators and in a resource's write-heavy initiators, and
    santhrottle_host_address_info{host="db1",initiator="10.0.1.5",
    address="fd00:1::5"} 1.0 names each of its addresses (the member set
    counters stay per address).
"""

from __future__ import annotations

import logging
import platform
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from santhrottle.appliance.daemon.status.fleet_metrics import fleet_families
from santhrottle.appliance.daemon.status.group_metrics import group_families
from santhrottle.appliance.daemon.status.tenancy import tenancy_families
from santhrottle.appliance.daemon.status.views import (
    CountersView,
    FitView,
    InitiatorView,
    ResourceView,
    StatusView,
)
from santhrottle.appliance.daemon.status.wire_metrics import wire_families
from santhrottle.appliance.version import version

log = logging.getLogger("santhrottled")

# ip -> (mode, HTB minor, packets, bytes), as MemberSets.read() returns it
MemberCounters = Mapping[str, tuple[str, int, int, int]]
MEMBER_SETS_SOURCE = "member_sets"
# Kinds of quarantine (datapath/reconcile.py), a series each even at 0.
QUARANTINE_KINDS = ("member", "jumps", "gate", "leaf")
COUNTER_RESTART_NOTE = (
    "restarts from 0 when the initiator rejoins its set or the set is rebuilt by a bulk swap"
)

# (metric name without _total, its value in the status' counters, help)
EVENT_COUNTERS: tuple[tuple[str, Callable[[CountersView], int], str], ...] = (
    ("santhrottle_ticks", lambda c: c.ticks, "Controller ticks run"),
    ("santhrottle_tick_overruns", lambda c: c.tick_overruns, "Tick deadlines missed (late ticks)"),
    ("santhrottle_convergences", lambda c: c.converges, "Set convergences (discovery) finished"),
    ("santhrottle_sensor_errors", lambda c: c.sensor_errors, "Failed sensor reads"),
    ("santhrottle_actuator_errors", lambda c: c.actuator_errors, "Failed kernel updates"),
    ("santhrottle_reloads", lambda c: c.reloads, "Configuration reloads"),
    ("santhrottle_reload_failures", lambda c: c.reload_failures, "Refused reloads"),
    (
        "santhrottle_state_save_errors",
        lambda c: c.state_save_errors,
        "Failed writes of the runtime state file (pins, pause, overrides, classes)",
    ),
    (
        "santhrottle_repairs",
        lambda c: c.repairs,
        "Kernel objects of the data path found missing or changed under the daemon, and rebuilt",
    ),
    (
        "santhrottle_glided_descents",
        lambda c: c.glided_descents,
        "Initiators whose delay went down through a glide leaf (kept in order)",
    ),
    (
        "santhrottle_unordered_descents",
        lambda c: c.unordered_descents,
        "Initiators whose delay went down without a free glide leaf (may reorder)",
    ),
)


class StatusSource(Protocol):
    """Where the view comes from: status/build.py's StatusCache (its lock is the daemon's)."""

    @property
    def lock(self) -> Any: ...

    def status(self) -> StatusView: ...


class DaemonCollector(Collector):
    def __init__(
        self,
        source: StatusSource,
        read_members: Callable[[], MemberCounters] | None = None,
        initiator_series: Callable[[], int | None] | None = None,
    ) -> None:
        self.source = source
        self.read_members = read_members
        self.initiator_series = initiator_series
        self._errors_lock = threading.Lock()
        self._scrape_errors = 0
        self._failing = False
        self._build = (version(), platform.python_version())

    def collect(self) -> Iterator[Metric]:
        with self.source.lock:
            st = self.source.status()
            limit = None if self.initiator_series is None else self.initiator_series()
        shown = top_initiators(st.initiators, limit)
        yield from resource_families(st.resources)
        yield from initiator_families(st.initiators, shown)
        if self.read_members is not None:
            keep = None
            if len(shown) < len(st.initiators):  # only the shown initiators' addresses
                keep = {a for i in shown for a in (i.initiator, *i.addresses)}
            yield from self._member_families(keep)
        yield from daemon_families(st)
        if st.wire is not None:
            yield from wire_families(st.wire)
        if st.groups:  # [groups.NAME] configured and on a resource
            yield from group_families(st.groups)
        yield from tenancy_families(st)  # utilization, levels (status/tenancy.py)
        if st.fleet is not None:  # [fleet] configured (status/fleet_metrics.py)
            yield from fleet_families(st.fleet)
        info = GaugeMetricFamily(
            "santhrottle_build_info",
            "santhrottle's version and the Python running it (always 1)",
            labels=["version", "python"],
        )
        info.add_metric(list(self._build), 1.0)
        yield info

    def _member_families(self, keep: set[str] | None) -> Iterator[Metric]:
        """The member sets' counters, of the addresses in keep (None: all)."""
        assert self.read_members is not None
        try:
            members = self.read_members()
        except Exception as e:  # the scrape goes on without these series
            with self._errors_lock:
                self._scrape_errors += 1
                first, self._failing = not self._failing, True
            if first:
                log.warning("metrics: cannot read the member counters: %s", e)
            else:
                log.debug("metrics: cannot read the member counters: %s", e)
            members = None
        else:
            with self._errors_lock:
                self._failing = False
        errors = CounterMetricFamily(
            "santhrottle_scrape_errors",
            "Scrapes whose read of a source failed (that source's series were left out)",
            labels=["source"],
        )
        errors.add_metric([MEMBER_SETS_SOURCE], self._scrape_errors)
        yield errors
        if members is None:
            return
        packets = CounterMetricFamily(
            "santhrottle_initiator_delayed_packets",
            "Packets to the initiator that went through its delay class (its member set "
            f"entry's counter; {COUNTER_RESTART_NOTE})",
            labels=["initiator", "mode"],
        )
        nbytes = CounterMetricFamily(
            "santhrottle_initiator_delayed_bytes",
            "Bytes to the initiator that went through its delay class (its member set "
            f"entry's counter; {COUNTER_RESTART_NOTE})",
            labels=["initiator", "mode"],
        )
        for ip, (mode, _minor, n_packets, n_bytes) in sorted(members.items()):
            if keep is not None and ip not in keep:
                continue
            packets.add_metric([ip, mode], n_packets)
            nbytes.add_metric([ip, mode], n_bytes)
        yield packets
        yield nbytes


def resource_families(resources: list[ResourceView]) -> Iterator[Metric]:
    lat = GaugeMetricFamily(
        "santhrottle_resource_read_latency_seconds",
        "Read latency of the resource (EWMA the controller uses; the last interval's mean "
        "for resources only observed)",
        labels=["resource"],
    )
    thr = GaugeMetricFamily(
        "santhrottle_resource_threshold_seconds",
        "Read-latency threshold of the resource",
        labels=["resource"],
    )
    cls = GaugeMetricFamily(
        "santhrottle_resource_delay_class",
        "Delay class the resource's PID asks for its write-heavy initiators",
        labels=["resource"],
    )
    delay = GaugeMetricFamily(
        "santhrottle_resource_delay_seconds",
        "Packet delay the resource's PID asks for its write-heavy initiators "
        "(the delay of its class on the ladder)",
        labels=["resource"],
    )
    members = GaugeMetricFamily(
        "santhrottle_resource_write_heavy_initiators",
        "Initiators in the resource's write-heavy set",
        labels=["resource"],
    )
    reads = CounterMetricFamily(
        "santhrottle_resource_reads_completed",
        "Reads completed on the resource's devices (the sum of the ticks' samples)",
        labels=["resource"],
    )
    read_time = CounterMetricFamily(
        "santhrottle_resource_read_time_seconds",
        "Time the resource's reads took: per tick, reads x their mean latency "
        "(as node_disk_read_time_seconds_total)",
        labels=["resource"],
    )
    written = CounterMetricFamily(
        "santhrottle_resource_written_bytes",
        "Bytes written to the resource: per tick, the sampled write rate x the tick periods "
        "the sample covers",
        labels=["resource"],
    )
    futile = CounterMetricFamily(
        "santhrottle_resource_futile_releases",
        "Times the resource's delay was released because it did not lower the read "
        "latency over the threshold (a futile delay)",
        labels=["resource"],
    )
    refuted = CounterMetricFamily(
        "santhrottle_resource_futile_refutations",
        "Futile releases the read latency ended early: it rose without the delay, so the "
        "delay was working",
        labels=["resource"],
    )
    setpoint = GaugeMetricFamily(
        "santhrottle_resource_setpoint_ratio",
        "The fraction of the threshold the PID regulates to (setpoint_fraction, more where "
        "the latency scatters little)",
        labels=["resource"],
    )
    lq: tuple[tuple[GaugeMetricFamily, Callable[[FitView], float | int | None]], ...] = (
        (
            _lq_gauge("intercept_seconds", 'threshold "auto": the fitted LQ line\'s C'),
            lambda f: f.intercept_s,
        ),
        (
            _lq_gauge("slope_seconds", 'threshold "auto": its slope m per IO in flight'),
            lambda f: f.slope_s_per_io,
        ),
        (_lq_gauge("r_squared", 'threshold "auto": R^2 of the fit'), lambda f: f.r_squared),
        (
            _lq_gauge("windows", 'threshold "auto": the 1 s windows the fit holds'),
            lambda f: f.windows,
        ),
    )
    for r in resources:
        name = [r.resource]
        th = r.threshold
        if th.fit is not None:
            for fam, value in lq:
                v = value(th.fit)
                if v is not None:
                    fam.add_metric(name, v)
        latency = r.read_latency_ewma_s if r.read_latency_ewma_s is not None else r.read_latency_s
        if latency is not None:
            lat.add_metric(name, latency)
        if th.in_force_s is not None:  # "auto": the fitted one
            thr.add_metric(name, th.in_force_s)
        if th.setpoint_fraction is not None:
            setpoint.add_metric(name, th.setpoint_fraction)
        cls.add_metric(name, r.delay_class)
        delay.add_metric(name, r.delay_s)
        members.add_metric(name, len(r.members))
        reads.add_metric(name, r.reads_completed)
        read_time.add_metric(name, r.read_time_s)
        written.add_metric(name, r.written_bytes)
        futile.add_metric(name, r.futile_releases)
        refuted.add_metric(name, r.futile_refutations)
    lq_fams = [fam for fam, _ in lq]
    yield from (lat, thr, setpoint, cls, delay, members, reads, read_time, written, futile)
    yield refuted
    yield from lq_fams


def _lq_gauge(metric: str, doc: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"santhrottle_resource_lq_{metric}", doc, labels=["resource"])


def top_initiators(initiators: list[InitiatorView], limit: int | None) -> list[InitiatorView]:
    """The initiators whose series are exported: all when limit is None or not
    below their number, else the `limit` with the largest delay, then the largest
    write rate (over their resources), then by address."""
    if limit is None or len(initiators) <= limit:
        return initiators

    def rank(i: InitiatorView) -> tuple[float, float, str]:
        rate = sum(v for v in i.write_bytes_per_second.values() if v is not None)
        return (-i.delay_s, -rate, i.initiator)

    return sorted(initiators, key=rank)[: max(limit, 0)]


def initiator_families(
    initiators: list[InitiatorView], shown: list[InitiatorView] | None = None
) -> Iterator[Metric]:
    """The counts over every initiator; the per-initiator series of `shown` (default:
    all; top_initiators() picks them)."""
    shown = initiators if shown is None else shown
    rate = GaugeMetricFamily(
        "santhrottle_initiator_write_bytes_per_second",
        "Smoothed write rate of the initiator on the resource",
        labels=["initiator", "resource"],
    )
    written = CounterMetricFamily(
        "santhrottle_initiator_written_bytes",
        "Bytes the initiator wrote to the resource: per convergence, its write rate x the "
        "convergence period (restarts when the initiator leaves the discovery)",
        labels=["initiator", "resource"],
    )
    delay = GaugeMetricFamily(
        "santhrottle_initiator_delay_seconds",
        "Packet delay applied to the initiator",
        labels=["initiator", "mode"],
    )
    cls = GaugeMetricFamily(
        "santhrottle_initiator_delay_class",
        "Delay class applied to the initiator (0: not delayed)",
        labels=["initiator", "mode"],
    )
    adopted = GaugeMetricFamily(
        "santhrottle_initiators_adopted",
        "Members a previous run left that no pin explains, held and then lowered",
    )
    adopted.add_metric([], sum(1 for i in initiators if i.adopted))
    yield adopted
    count = GaugeMetricFamily(
        "santhrottle_initiators",
        "Initiators the daemon knows (discovered, delayed, pinned or adopted); a "
        "[hosts.NAME] counts once",
    )
    count.add_metric([], len(initiators))
    yield count
    host = GaugeMetricFamily(
        "santhrottle_host_address_info",
        "An address of a [hosts.NAME] (always 1); `initiator` is the host's first "
        "address, the one its per-initiator series are labelled with",
        labels=["host", "initiator", "address"],
    )
    for i in initiators:
        if i.host:
            for a in i.addresses:
                host.add_metric([i.host, i.initiator, a], 1.0)
    if host.samples:  # [hosts.NAME] configured and seen
        yield host
    omitted = GaugeMetricFamily(
        "santhrottle_initiators_omitted",
        "Initiators whose per-initiator series are left out (metrics.initiator_series): "
        "those with the smallest delay and write rate",
    )
    omitted.add_metric([], len(initiators) - len(shown))
    yield omitted
    for i in shown:
        ip = i.initiator
        for res, bps in i.write_bytes_per_second.items():
            if bps is not None:
                rate.add_metric([ip, res], bps)
        for res, n in i.written_bytes.items():
            written.add_metric([ip, res], n)
        delay.add_metric([ip, i.mode], i.delay_s)
        cls.add_metric([ip, i.mode], i.klass)
    yield from (rate, written, delay, cls)


def daemon_families(st: StatusView) -> Iterator[Metric]:
    paused = GaugeMetricFamily("santhrottle_paused", "1 while throttling is paused")
    paused.add_metric([], 1.0 if st.paused else 0.0)
    yield paused
    yield from quarantine_families(st)
    c = st.counters
    for name, value, doc in EVENT_COUNTERS:
        m = CounterMetricFamily(name, doc)
        m.add_metric([], value(c))
        yield m
    yield HistogramMetricFamily(
        "santhrottle_tick_duration_seconds",
        "Time each controller tick took (read the samples, step, update the kernel)",
        buckets=[(floatToGoString(float(le)), n) for le, n in c.tick_duration_buckets.items()],
        sum_value=c.tick_seconds_sum,
    )


def quarantine_families(st: StatusView) -> Iterator[Metric]:
    """What the kernel refused (datapath/reconcile.py), per kind: member, or an object
    the members share (jumps, gate, leaf)."""
    now = GaugeMetricFamily(
        "santhrottle_quarantined",
        "Initiators (kind member) or shared objects the kernel refused, left out and "
        "retried with backoff",
        labels=["kind"],
    )
    total = CounterMetricFamily(
        "santhrottle_quarantines",
        "Initiators or shared objects put into quarantine since the start",
        labels=["kind"],
    )
    kinds = {*QUARANTINE_KINDS, *st.counters.quarantines, *(q.kind for q in st.quarantine)}
    for kind in sorted(kinds):
        now.add_metric([kind], sum(1 for q in st.quarantine if q.kind == kind))
        total.add_metric([kind], st.counters.quarantines.get(kind, 0))
    yield now
    yield total


def registry_for(
    source: StatusSource,
    read_members: Callable[[], MemberCounters] | None = None,
    initiator_series: Callable[[], int | None] | None = None,
    meter: Collector | None = None,
) -> CollectorRegistry:
    """A registry with the daemon's collector (source: status/build.py's StatusCache)
    and the process collector (process_*); read_members: the member sets' counters
    (status/member_counters.py), None to leave those series out; initiator_series:
    how many initiators keep their own series (read at each scrape; None: all);
    meter: the meter's counters (status/tenancy.py)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DaemonCollector(source, read_members, initiator_series))
    ProcessCollector(registry=reg)
    if meter is not None:
        reg.register(meter)
    return reg
