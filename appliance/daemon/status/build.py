"""The daemon's view for `santhrottle status`, the control socket and the metrics, built.

What it owns
    status(): a StatusView (status/views.py) of the daemon: per resource its
    threshold (a ThresholdView, the same as `threshold show` answers), latency,
    class and members; per initiator its resources, write rates, class and
    pin; the groups; the counters; the wire; the fleet.  Built under the
    daemon's lock from its public attributes (core/loop.py); reads nothing
    from the kernel.  Initiators are IPv4 or IPv6 addresses, IPv4 first, each
    numerically; a [hosts.NAME] is one row (core/hosts.py).
    StatusCache: one view per revision of the daemon (a tick, a convergence, a
    change), shared by the control socket and the metrics: a burst of
    `santhrottle status` calls holds the tick up once, not once per call.
    volumes(): bridge mode's `santhrottle resources` rows.

Worked example
    [hosts.db1] addresses = ["10.0.1.5", "fd00:1::5"], both writing to vg0, and
    fd00::7: status(d).initiators is
    [InitiatorView(initiator="10.0.1.5", host="db1", addresses=["10.0.1.5",
      "fd00:1::5"], resources=["vg0"], ...),
     InitiatorView(initiator="fd00::7", host=None, addresses=["fd00::7"], ...)]
    and vg0's members name db1 once, as "10.0.1.5", when it is write-heavy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from santhrottle.appliance.daemon.core.group_overrides import to_json
from santhrottle.appliance.daemon.status.tenancy import level_rows
from santhrottle.appliance.daemon.status.views import (
    CountersView,
    FitView,
    GroupView,
    InitiatorView,
    LadderView,
    QuarantineView,
    ResourceView,
    StatusView,
    SyncView,
    ThresholdView,
    WireView,
)
from santhrottle.appliance.datapath.names import ip_key
from santhrottle.bridge.conns import LISTED

if TYPE_CHECKING:
    from santhrottle.appliance.daemon.core.loop import Daemon
    from santhrottle.controller.state import ResourceState

# The connection directions a status lists (those not in sync first, the longest out of
# sync first): the wire may hold 65,536 of them; WireView.directions counts them all.
SYNC_ROWS = LISTED


def threshold_view(daemon: Daemon, name: str) -> ThresholdView:
    """The threshold asked for, the file's, whether overridden, the one in force (None:
    observed), the setpoint's fraction of it and, for "auto", the LQ fit behind it."""
    rs = daemon.ctl.resources.get(name)
    asked = daemon.threshold_of(name)
    configured = daemon.config.threshold_of(name)
    override = name in daemon.runtime.thresholds
    if rs is None:
        return ThresholdView(asked, configured, override, None, None, None)
    thr = rs.threshold_s(daemon.config.controller.auto_alpha)
    fit = rs.fit
    return ThresholdView(
        threshold_s=asked,
        configured_s=configured,
        override=override,
        in_force_s=thr if math.isfinite(thr) else None,
        # the fraction of it the PID regulates to (controller/setpoint.py)
        setpoint_fraction=rs.setpoint(daemon.config.controller),
        fit=None
        if fit is None
        else FitView(
            intercept_s=_finite(fit.intercept_s),
            slope_s_per_io=_finite(fit.slope_s_per_io),
            r_squared=_finite(fit.r_squared),
            windows=fit.windows,
            q_lo=_finite(fit.q_lo),
            q_hi=_finite(fit.q_hi),
            confident=fit.confident,
            fitted=rs.lq is not None and rs.lq.last_confident is not None,
        ),
    )


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def status(daemon: Daemon) -> StatusView:
    """The whole view (the caller holds the daemon's lock)."""
    ladder = daemon.config.ladder
    c = daemon.counters
    return StatusView(
        mode=daemon.config.mode,
        paused=daemon.runtime.paused,
        restart_needed=list(daemon.restart_pending),
        tick_s=daemon.config.controller.tick_s,
        step_s=ladder.step_s,
        max_class=ladder.max_class,
        ladder=LadderView(ladder.step_us, ladder.max_delay_us, ladder.ratio),
        write_mode=daemon.config.write_mode,
        counters=CountersView(
            ticks=c.ticks,
            tick_overruns=c.tick_overruns,
            converges=c.converges,
            sensor_errors=c.sensor_errors,
            actuator_errors=c.actuator_errors,
            reloads=c.reloads,
            reload_failures=c.reload_failures,
            state_save_errors=c.state_save_errors,
            repairs=c.repairs,
            tick_seconds_sum=c.tick_seconds_sum,
            tick_duration_buckets={
                "+Inf" if math.isinf(le) else repr(le): n for le, n in c.tick_duration_buckets()
            },
            glided_descents=daemon.actuator.glided,
            unordered_descents=daemon.actuator.unordered_moves,
            quarantines=dict(daemon.actuator.quarantines),
        ),
        resources=resource_rows(daemon),
        initiators=initiator_rows(daemon),
        wire=wire(daemon),
        groups=groups(daemon),
        quarantine=quarantine(daemon),
        levels=level_rows(daemon.ctl),
        fleet=None if daemon.fleet is None else daemon.fleet.status(),
    )


def resource_rows(daemon: Daemon) -> list[ResourceView]:
    d = daemon.discovery
    ladder = daemon.config.ladder
    totals = daemon.counters.resources
    rows = []
    now = daemon.clock()
    for name in sorted(daemon.known_resources()):
        rs = daemon.ctl.resources.get(name)
        last = daemon.last_reads.get(name)
        tot = totals.get(name)
        k = rs.delay_class if rs else 0
        rows.append(
            ResourceView(
                resource=name,
                threshold=threshold_view(daemon, name),
                mode="control" if rs is not None else "observe",
                read_latency_ewma_s=rs.ewma.value if rs else None,
                read_latency_s=last.read_latency_s if last and last.reads else None,
                reads=last.reads if last else 0,
                write_bytes_per_second=last.write_bps if last else None,
                delay_class=k,
                delay_s=ladder.delay_s(k),
                members=sorted(daemon.ctl.members(name), key=ip_key),
                devices=list(d.resources.get(name, ())) if d is not None else [],
                reads_completed=tot.reads_completed if tot else 0,
                read_time_s=tot.read_time_s if tot else 0.0,
                written_bytes=tot.written_bytes if tot else 0.0,
                utilization=daemon.ctl.utilization.last.get(name),
                saturated=name in daemon.ctl.utilization.saturated,
                futile_released_s=_released_s(rs, now),
                futile_releases=rs.futile.releases if rs else 0,
                futile_refutations=rs.futile.refutations if rs else 0,
            )
        )
    return rows


def _released_s(rs: ResourceState | None, now: float) -> float | None:
    """The seconds a futile delay's release has still to run (controller/futile.py)."""
    if rs is None or not rs.futile.released(now):
        return None
    return round(rs.futile.until_s - now, 1)


def initiator_rows(daemon: Daemon) -> list[InitiatorView]:
    """One row per initiator the daemon knows (discovered, in the kernel, pinned,
    adopted), a [hosts.NAME] once with every address it has (core/hosts.py):
    its write rates are its key's (the controller's, its addresses summed), its
    written bytes its addresses' sum, its class the highest of its addresses'
    (the same, but for a pin of one address).  IPv4 then IPv6, numerically."""
    d, rt, ladder = daemon.discovery, daemon.runtime, daemon.config.ladder
    applied = daemon.actuator.members()
    rates = daemon.ctl.write_sets.rates()
    member_of = daemon.ctl.write_sets.member_of
    written = daemon.written.snapshot()
    seen: dict[str, set[str]] = {}  # address -> the resources discovery sees it load
    if d is not None:
        for ip, v in d.initiators.items():
            seen[ip] = set(v.resources)
    quarantined = {ip for ip, q in daemon.actuator.quarantined().items() if q.kind == "member"}
    for ip in set(applied) | set(rt.pins) | set(rt.adopted) | quarantined:
        seen.setdefault(ip, set())
    rows = []
    write_mode, pins, adopted = daemon.config.write_mode, rt.pins, rt.adopted
    hosts = daemon.hosts
    by_key = hosts.rows(seen)
    for key in sorted(by_key, key=ip_key):
        addrs = by_key[key]
        host = hosts.host_of(key) if hosts else None
        if host is None:  # one address: the common case, 10,000s of them
            res = sorted(seen[key])
            k, mode = applied.get(key, (0, write_mode))
            wrote = {r: written.get((key, r), 0.0) for r in res}
            pinned, adopt = key in pins, key in adopted
        else:
            res = sorted(set().union(*(seen.get(a, ()) for a in addrs)))
            kms = [applied[a] for a in addrs if a in applied]
            k, mode = max(kms) if kms else (0, write_mode)
            wrote = {r: sum(written.get((a, r), 0.0) for a in addrs) for r in res}
            pinned, adopt = any(a in pins for a in addrs), any(a in adopted for a in addrs)
        rows.append(
            InitiatorView(
                initiator=key,
                host=None if host is None else host.name,
                addresses=addrs,
                resources=res,
                write_bytes_per_second={r: rates.get((r, key)) for r in res},
                written_bytes=wrote,
                write_heavy_on=sorted(member_of.get(key, ())),
                klass=k,
                delay_s=ladder.delay_s(min(k, ladder.max_class)),
                mode=mode,
                pinned=pinned,
                adopted=adopt,
            )
        )
    return rows


def groups(daemon: Daemon) -> list[GroupView]:
    """Per (grouped resource, group): its target, what it gets, its PWFTE, share and
    class (controller/groups.py); empty without [groups]."""
    ladder = daemon.config.ladder
    out = []
    gst = daemon.ctl.groups
    for res in sorted(gst.resources):
        gr = gst.resources[res]
        for name in sorted(gr.groups):
            g, spec = gr.groups[name], gst.spec(name)
            out.append(
                GroupView(
                    resource=res,
                    group=name,
                    priority=spec.priority,
                    latency_target_s=spec.latency_target_s,
                    throughput_target_bps=spec.throughput_target_bps,
                    throughput_target_iops=spec.throughput_target_iops,
                    override=to_json(daemon.runtime.group_overrides.get(name)),
                    latency_s=g.latency_s,
                    io_latency_s=g.io_latency_s,
                    throughput_bps=g.throughput_bps,
                    iops=g.iops,
                    y=g.y,
                    pwfte=g.pwfte,
                    share=g.share,
                    demand=g.demand,
                    delay_class=g.delay_class,
                    delay_s=ladder.delay_s(min(g.delay_class, ladder.max_class)),
                    target_class=g.target_class,
                    members=sorted(g.members),
                    overloaded=gr.overloaded,
                    resource_latency_s=gr.latency_s,
                )
            )
    return out


def quarantine(daemon: Daemon) -> list[QuarantineView]:
    """What the kernel refused, initiators in address order, then the shared objects."""
    now = daemon.clock()
    rows = [
        QuarantineView(
            object=key,
            kind=q.kind,
            error=q.error,
            for_s=max(0.0, now - q.since),
            retries=q.retries,
            retry_in_s=None if math.isinf(q.retry_at) else max(0.0, q.retry_at - now),
        )
        for key, q in daemon.actuator.quarantined().items()
    ]
    return sorted(rows, key=lambda r: (r.kind != "member", ip_key(r.object)))


def wire(daemon: Daemon) -> WireView | None:
    """The wire sensor's counters and whether it captures (None: target mode)."""
    b = daemon.bridge
    if b is None:
        return None
    summary = b.sync_summary()
    sync = [
        SyncView(
            initiator=r.initiator,
            initiator_port=r.initiator_port,
            portal=r.portal,
            target=r.target,
            direction=r.direction,
            state=r.state,
            out_of_sync_bytes=r.out_of_sync_bytes,
            out_of_sync_s=r.out_of_sync_s,
            desyncs=r.desyncs,
            reason=r.reason,
        )
        for r in summary.rows
    ]
    return WireView(
        capturing=bool(b.running),
        sensor=b.kind,
        held=sorted(b.held),
        sync=sync,
        directions=summary.directions,
        out_of_sync_s=summary.out_of_sync_s,
        counters=b.counters(),
    )


def volumes(daemon: Daemon) -> list[dict[str, Any]] | None:
    """Bridge mode: every volume the wire has shown (`santhrottle resources`);
    None in target mode."""
    b = daemon.bridge
    if b is None:
        return None
    tick_s = daemon.config.controller.tick_s
    logged_in = b.initiator_names()
    return [
        {
            "volume": r.name,
            "resources": list(r.resources),
            "initiators": list(r.initiators),
            # the names its initiators logged in with (IQN, host NQN), where seen
            "initiator_names": {i: list(logged_in[i]) for i in r.initiators if i in logged_in},
            "reads_per_s": r.reads / tick_s,
            "read_latency_s": r.read_latency_s,
        }
        for r in b.volume_rows()
    ]


class StatusCache:
    """The daemon's view, built once per revision (callers hold the daemon's lock
    and only read it): shared by the control socket's commands and the metrics."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self._view: tuple[tuple[int, ...], StatusView] | None = None

    @property
    def lock(self) -> Any:
        return self.daemon.lock

    def status(self) -> StatusView:
        rev = self.daemon.revision
        if self._view is None or self._view[0] != rev:
            self._view = (rev, status(self.daemon))
        return self._view[1]
