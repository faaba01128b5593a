"""The human output of the daemon's status: `santhrottle status`, `top`, `threshold show`.

What it owns
    Turning the daemon's typed view (daemon/status/views.py: StatusView,
    ThresholdView, read back from the answer's JSON with from_json) into tables
    and lines: the resources, the initiators (a [hosts.NAME] once), the
    quarantine, the wire, the LQ fit of a threshold "auto".  Plain formatting:
    nothing here talks to the daemon (cli/daemon.py does).  An answer that is
    not the view is Failed, one line.

Worked example
    describe_threshold(ThresholdView(0.015, 0.03, True, 0.015, 0.9, None)) ->
    "15.00ms (override; file: 30.00ms)".
"""

from __future__ import annotations

import time
from typing import Any

from santhrottle.appliance.cli.common import Failed, column_width, ip_key
from santhrottle.appliance.cli.groupview import print_status_groups
from santhrottle.appliance.cli.tenantsview import fmt_util, print_levels
from santhrottle.appliance.daemon.status.views import (
    FitView,
    InitiatorView,
    QuarantineView,
    StatusView,
    ThresholdView,
    ViewError,
    WireView,
    from_json,
    to_json,
)
from santhrottle.appliance.units import fmt_duration, fmt_mb, fmt_ms


def read_status(data: Any) -> StatusView:
    """The daemon's status answer as its typed view; Failed when it is not one."""
    try:
        return from_json(StatusView, data, "status")
    except ViewError as e:
        raise Failed(f"santhrottled's status answer does not read: {e}") from None


def print_status(data: Any) -> None:
    st = read_status(data)
    c = st.counters
    print(
        f"{'PAUSED' if st.paused else 'running'}; tick {fmt_duration(st.tick_s)}, "
        f"step {fmt_duration(st.step_s)}, write mode {st.write_mode}; "
        f"ticks {c.ticks}, late {c.tick_overruns}, sensor errors {c.sensor_errors}, "
        f"actuator errors {c.actuator_errors}"
    )
    if st.restart_needed:
        print(f"restart needed for: {', '.join(st.restart_needed)} (the file changed them)")
    if st.wire is not None:
        print(describe_wire(st.wire))
    names = {i.initiator: i.host for i in st.initiators if i.host}
    print(
        f"{'RESOURCE':<16} {'MODE':<8} {'THRESHOLD':>13} {'SETPT':>5} {'LAT_EWMA':>9} {'LAST':>9} "
        f"{'UTIL':>5} {'CLASS':>5} {'DELAY':>8}  MEMBERS"
    )
    for r in st.resources:
        th = r.threshold
        thr = fmt_threshold(th.threshold_s, th.in_force_s) + ("*" if th.override else "")
        sp = th.setpoint_fraction
        members = ",".join(names.get(m, m) for m in r.members) or "-"  # a host by its name
        print(
            f"{r.resource:<16} {r.mode:<8} {thr:>13} {'-' if sp is None else f'{sp:.2f}':>5} "
            f"{fmt_ms(r.read_latency_ewma_s):>9} {fmt_ms(r.read_latency_s):>9} "
            f"{fmt_util(r.utilization, r.saturated):>5} "
            f"{r.delay_class:>5} {fmt_ms(r.delay_s):>8}  {members}"
        )
    print_initiators(st.initiators)
    for q in st.quarantine:  # what the kernel refused (docs/troubleshoot.md)
        print(describe_quarantine(q))
    for r in st.resources:
        if r.futile_released_s is not None:  # controller/futile.py
            print(
                f"{r.resource}: delay released for {r.futile_released_s:.0f} s more: it did "
                f"not lower the read latency (futile; {r.futile_releases} release(s))"
            )
    if any(r.threshold.override for r in st.resources):
        print("* a threshold set at run time (threshold reset returns to the file's)")
    for r in st.resources:
        if r.threshold.threshold_s == "auto":
            print(f"{r.resource}: {describe_fit(r.threshold.fit, r.threshold.in_force_s)}")
    if st.groups:  # [groups.NAME]: per grouped resource and group (cli/groupview.py)
        print_status_groups([to_json(g) for g in st.groups])
    if st.levels:  # groups with elastic levels (cli/tenantsview.py)
        print_levels(st.levels)


def print_initiators(initiators: list[InitiatorView]) -> None:
    """The daemon's initiators, one row each (a [hosts.NAME] once: its addresses, and
    its name under HOST, a column shown with [hosts] only), IPv4 then IPv6; the
    address and resource columns as wide as their content (an IPv6 address is up to
    39 characters)."""
    rows = sorted(initiators, key=lambda i: ip_key(i.initiator))
    addrs = [",".join(i.addresses or [i.initiator]) for i in rows]
    res = [",".join(i.resources) or "-" for i in rows]
    hosts = [i.host or "-" for i in rows]
    wa, wr = column_width(addrs, "INITIATOR", 18), column_width(res, "RESOURCES", 20)
    wh = column_width(hosts, "HOST") if any(i.host for i in rows) else None
    head = f"{'INITIATOR':<{wa}} " + ("" if wh is None else f"{'HOST':<{wh}} ")
    print(f"{head}{'RESOURCES':<{wr}} {'WR_MB/s':>8} {'CLASS':>5} {'DELAY':>8} MODE")
    for i, a, r, h in zip(rows, addrs, res, hosts, strict=True):
        rate = sum(v for v in i.write_bytes_per_second.values() if v is not None)
        pinned = " (pinned)" if i.pinned else " (adopted)" if i.adopted else ""
        lead = f"{a:<{wa}} " + ("" if wh is None else f"{h:<{wh}} ")
        print(
            f"{lead}{r:<{wr}} {fmt_mb(rate):>8} {i.klass:>5} "
            f"{fmt_ms(i.delay_s):>8} {i.mode}{pinned}"
        )


def describe_quarantine(q: QuarantineView) -> str:
    """One line per initiator or shared object the kernel refused."""
    what = q.object if q.kind == "member" else f"{q.object} ({q.kind})"
    if q.retry_in_s is None:
        when = "never sent"
    else:
        when = f"next try in {q.retry_in_s:.0f} s, {q.retries} tries so far"
    return f"QUARANTINED {what}: {q.error} ({when})"


def _evicted(n: int) -> str:
    """The in-kernel sensor's flow map full: said only when it dropped a direction."""
    return f", {n} connection directions dropped by its full flow map" if n else ""


def describe_wire(w: WireView) -> str:
    """Bridge mode: the wire sensor in one line (counts since the daemon's start)."""
    state = "capturing" if w.capturing else "NOT capturing (see the log)"
    where = " in the kernel" if w.sensor == "kernel" else ""
    n = w.counters
    lost = (
        f"{n.get('kernel_desyncs', 0)} desyncs, {n.get('kernel_gaps', 0)} gaps"
        + _evicted(n.get("kernel_flows_evicted", 0))
        if where
        else f"{n.get('capture_kernel_drops', 0)} dropped by a full ring"
    )
    return (
        f"bridge mode, wire {state}{where}: {n.get('commands', 0)} commands, "
        f"{n.get('completions', 0)} completed, {n.get('unmatched', 0)} unmatched, "
        f"{n.get('aged', 0)} aged out; {n.get('capture_frames', 0)} frames, {lost}"
    )


def fmt_threshold(thr: Any, in_force: float | None) -> str:
    """A threshold as asked for; "auto" with the one in force ("-": observed)."""
    if thr == "auto":
        return f"auto {fmt_ms(in_force) if in_force is not None else '-'}"
    return fmt_ms(thr)


def describe_fit(fit: FitView | None, in_force: float | None) -> str:
    """threshold "auto": the LQ fit (C, m, R^2, windows, Q seen) and what is in force."""
    force = f"in force {fmt_ms(in_force)}" if in_force is not None else "observed (no fallback)"
    if fit is None or not fit.windows:
        return f"LQ fit: no samples yet; {force} (the fallback)"
    line = (
        f"LQ fit L = {fmt_ms(fit.intercept_s)} + {fmt_ms(fit.slope_s_per_io)} x Q, "
        f"R^2 {_num(fit.r_squared)}, {fit.windows:.0f} windows, "
        f"Q {_num(fit.q_lo)}..{_num(fit.q_hi)} IOs"
    )
    if fit.fitted:
        return f"{line}; threshold C/(1-alpha) {force}"
    return f"{line}; not confident yet: {force} (the fallback)"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def read_threshold(data: Any, where: str = "threshold") -> ThresholdView:
    """One resource's threshold in an answer (status/views.py ThresholdView)."""
    try:
        return from_json(ThresholdView, data, where)
    except ViewError as e:
        raise Failed(f"santhrottled's answer does not read: {e}") from None


def describe_threshold(th: ThresholdView) -> str:
    """The threshold in force, "auto" with its fit, an override with the file's."""
    thr = th.threshold_s
    text = fmt_threshold(thr, th.in_force_s) if thr is not None else "none (observe only)"
    if thr == "auto":
        text += f"; {describe_fit(th.fit, th.in_force_s)}"
    if th.override:
        conf = th.configured_s
        text += f" (override; file: {fmt_ms(conf) if conf is not None else 'none'})"
    return text


def print_why(d: Any) -> None:
    """`santhrottle why`: the initiator's delay now, then its history, oldest first."""
    if not isinstance(d, dict) or not isinstance(d.get("events"), list):
        raise Failed("santhrottled's why answer is not an object with events")
    now = f"class {d['class']} ({fmt_ms(d['delay_s'])}, {d['mode']})"
    notes = [
        "pinned" if d.get("pinned") else "",
        "PAUSED" if d.get("paused") else "",
        f"write-heavy on {', '.join(d['write_heavy_on'])}" if d.get("write_heavy_on") else "",
        f"group {d['group']}" if d.get("group") else "",
    ]
    print(f"{d['initiator']}: {now}" + "".join(f"; {n}" for n in notes if n))
    if not d["events"]:
        print("no change of its class since the daemon started (or since it was forgotten)")
    for e in d["events"]:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"]))
        move = "" if e["from"] is None else f"class {e['from']} -> {e['to']}  "
        res = f"{e['resource']}: " if e.get("resource") else ""
        print(f"{at}  {move}{res}{e['why']}")
