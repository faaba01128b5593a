"""The daemon's view for `santhrottle status`, the control socket and the metrics.

What it owns
    Plain data (JSON-ready): per resource its threshold, latency, class and
    members; per initiator its resources, write rates, class and pin; the
    daemon's counters.  Built under the daemon's lock from its state; reads
    nothing from the kernel.  Initiators are IPv4 or IPv6 addresses, IPv4
    first, each numerically; a [hosts.NAME] is one row (daemon/core/hosts.py).

Worked example
    [hosts.db1] addresses = ["10.0.1.5", "fd00:1::5"], both writing to vg0, and
    fd00::7: status()["initiators"] is
    [{"initiator": "10.0.1.5", "host": "db1", "addresses": ["10.0.1.5",
      "fd00:1::5"], "resources": ["vg0"], ...},
     {"initiator": "fd00::7", "host": null, "addresses": ["fd00::7"], ...}]
    and vg0's "members" name db1 once, as "10.0.1.5", when it is write-heavy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from santhrottle.appliance.daemon.core.group_overrides import to_json
from santhrottle.appliance.datapath.names import ip_key

if TYPE_CHECKING:
    from santhrottle.appliance.daemon.core.loop import Daemon


def threshold_view(daemon: Daemon, name: str) -> dict[str, Any]:
    """The threshold in force (None: observed), the setpoint's fraction of it and, for
    "auto", the LQ fit behind it."""
    rs = daemon.ctl.resources.get(name)
    if rs is None:
        return {"in_force_s": None, "setpoint_fraction": None, "fit": None}
    thr = rs.threshold_s(daemon.config.controller.auto_alpha)
    fit = rs.fit
    return {
        "in_force_s": thr if math.isfinite(thr) else None,
        # the fraction of it the PID regulates to (controller/setpoint.py)
        "setpoint_fraction": rs.setpoint(daemon.config.controller),
        "fit": None
        if fit is None
        else {
            "intercept_s": _finite(fit.intercept_s),
            "slope_s_per_io": _finite(fit.slope_s_per_io),
            "r_squared": _finite(fit.r_squared),
            "windows": fit.windows,
            "q_lo": _finite(fit.q_lo),
            "q_hi": _finite(fit.q_hi),
            "confident": fit.confident,
            "fitted": rs.lq is not None and rs.lq.last_confident is not None,
        },
    }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def status(daemon: Daemon) -> dict[str, Any]:
    d = daemon.state.discovery
    ladder = daemon.config.ladder
    resources = []
    totals = daemon.counters.resources
    for name in sorted(daemon.known_resources()):
        rs = daemon.ctl.resources.get(name)
        last = daemon.state.last_reads.get(name)
        tot = totals.get(name)
        resources.append(
            {
                "resource": name,
                "threshold_s": daemon.threshold_of(name),
                "configured_threshold_s": daemon.config.threshold_of(name),
                "threshold_override": name in daemon.state.thresholds,
                **{f"threshold_{k}": v for k, v in threshold_view(daemon, name).items()},
                "mode": "control" if rs is not None else "observe",
                "read_latency_ewma_s": rs.ewma.value if rs else None,
                "read_latency_s": last.read_latency_s if last and last.reads else None,
                "reads": last.reads if last else 0,
                "write_bytes_per_second": last.write_bps if last else None,
                "delay_class": rs.delay_class if rs else 0,
                "delay_s": ladder.delay_s(rs.delay_class if rs else 0),
                "members": sorted(daemon.ctl.members(name), key=ip_key),
                "devices": list(d.resources.get(name, ())) if d is not None else [],
                # raw totals since the daemon started (daemon/core/counters.py)
                "reads_completed": tot.reads_completed if tot else 0,
                "read_time_s": tot.read_time_s if tot else 0.0,
                "written_bytes": tot.written_bytes if tot else 0.0,
            }
        )
    initiators = initiator_rows(daemon)
    c = daemon.counters
    return {
        "mode": daemon.config.mode,
        "paused": daemon.state.paused,
        # keys the configuration file changed that take effect at the next restart
        "restart_needed": list(daemon.restart_pending),
        "tick_s": daemon.config.controller.tick_s,
        "step_s": ladder.step_s,
        "max_class": ladder.max_class,
        "ladder": {
            "step_us": ladder.step_us,
            "max_delay_us": ladder.max_delay_us,
            "ratio": ladder.ratio,
        },
        "write_mode": daemon.config.write_mode,
        "counters": {
            "ticks": c.ticks,
            "tick_overruns": c.tick_overruns,
            "converges": c.converges,
            "sensor_errors": c.sensor_errors,
            "actuator_errors": c.actuator_errors,
            "reloads": c.reloads,
            "reload_failures": c.reload_failures,
            "state_save_errors": c.state_save_errors,
            "tick_seconds_sum": c.tick_seconds_sum,
            "tick_duration_buckets": {  # cumulative, by upper bound (Prometheus' le)
                "+Inf" if math.isinf(le) else repr(le): n for le, n in c.tick_duration_buckets()
            },
            "glided_descents": daemon.actuator.glided,
            "unordered_descents": daemon.actuator.unordered_moves,
        },
        "resources": resources,
        "initiators": initiators,
        # bridge mode: the wire sensor's counts since the start (appliance/sensing/bridge.py)
        "wire": wire_counters(daemon),
        "groups": groups(daemon),
        # [fleet]: members, leaders, epochs, the engine's lag (daemon/core/fleetmode.py); None alone
        "fleet": None if daemon.fleet is None else daemon.fleet.status(),
    }


def initiator_rows(daemon: Daemon) -> list[dict[str, Any]]:
    """One row per initiator the daemon knows (discovered, in the kernel, pinned,
    adopted), a [hosts.NAME] once with every address it has (daemon/core/hosts.py):
    its write rates are its key's (the controller's, its addresses summed), its
    written bytes its addresses' sum, its class the highest of its addresses'
    (the same, but for a pin of one address).  IPv4 then IPv6, numerically."""
    d, st, ladder = daemon.state.discovery, daemon.state, daemon.config.ladder
    rates = daemon.ctl.write_sets.rates()
    member_of = daemon.ctl.write_sets.member_of
    written = daemon.written.snapshot()
    seen: dict[str, set[str]] = {}  # address -> the resources discovery sees it load
    if d is not None:
        for ip, v in d.initiators.items():
            seen[ip] = set(v.resources)
    for ip in set(st.applied) | set(st.pins) | set(st.adopted):
        seen.setdefault(ip, set())
    rows = []
    write_mode, pins, adopted = daemon.config.write_mode, st.pins, st.adopted
    hosts = daemon.hosts
    by_key = hosts.rows(seen)
    for key in sorted(by_key, key=ip_key):
        addrs = by_key[key]
        host = hosts.host_of(key) if hosts else None
        if host is None:  # one address: the common case, 10,000s of them
            res = sorted(seen[key])
            k, mode = st.applied.get(key, (0, write_mode))
            wrote = {r: written.get((key, r), 0.0) for r in res}
            pinned, adopt = key in pins, key in adopted
        else:
            res = sorted(set().union(*(seen.get(a, ()) for a in addrs)))
            applied = [st.applied[a] for a in addrs if a in st.applied]
            k, mode = max(applied) if applied else (0, write_mode)
            wrote = {r: sum(written.get((a, r), 0.0) for a in addrs) for r in res}
            pinned, adopt = any(a in pins for a in addrs), any(a in adopted for a in addrs)
        rows.append(
            {
                "initiator": key,  # a host's: its first address, the controller's key
                "host": None if host is None else host.name,
                "addresses": addrs,
                "resources": res,
                "write_bytes_per_second": {r: rates.get((r, key)) for r in res},
                "written_bytes": wrote,
                "write_heavy_on": sorted(member_of.get(key, ())),
                "class": k,
                "delay_s": ladder.delay_s(min(k, ladder.max_class)),
                "mode": mode,
                "pinned": pinned,
                # left by a previous run: held, then lowered (daemon/core/restore.py)
                "adopted": adopt,
            }
        )
    return rows


def groups(daemon: Daemon) -> list[dict[str, Any]]:
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
                {
                    "resource": res,
                    "group": name,
                    "priority": spec.priority,
                    "latency_target_s": spec.latency_target_s,
                    "throughput_target_bps": spec.throughput_target_bps,
                    "throughput_target_iops": spec.throughput_target_iops,
                    # what `santhrottle group set` changed ({}: the file's values)
                    "override": to_json(daemon.state.group_overrides.get(name)),
                    "latency_s": g.latency_s,  # its reads' mean, the delay included
                    "io_latency_s": g.io_latency_s,  # its IOs' mean at the array
                    "throughput_bps": g.throughput_bps,
                    "iops": g.iops,
                    "y": g.y,
                    "pwfte": g.pwfte,
                    "share": g.share,
                    "demand": g.demand,
                    "delay_class": g.delay_class,
                    "delay_s": ladder.delay_s(min(g.delay_class, ladder.max_class)),
                    "target_class": g.target_class,
                    "members": sorted(g.members),
                    "overloaded": gr.overloaded,
                    "resource_latency_s": gr.latency_s,
                }
            )
    return out


def wire_counters(daemon: Daemon) -> dict[str, Any] | None:
    """The wire sensor's counters and whether it captures (None: target mode)."""
    counters = getattr(daemon.sensors, "counters", None)
    if not daemon.config.bridge_mode or not callable(counters):
        return None
    kind = getattr(daemon.sensors, "kind", "capture")
    return {"capturing": bool(daemon.sensors.running), "sensor": kind, **counters()}


def volumes(daemon: Daemon) -> list[dict[str, Any]] | None:
    """Bridge mode: every volume the wire has shown (`santhrottle resources`);
    None in target mode."""
    rows = getattr(daemon.sensors, "volume_rows", None)
    if not daemon.config.bridge_mode or rows is None:
        return None
    tick_s = daemon.config.controller.tick_s
    names = getattr(daemon.sensors, "initiator_names", None)
    logged_in = names() if callable(names) else {}
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
        for r in rows()
    ]
