"""The human output of the initiator groups: `group list`, `group show`, status' section.

What it owns
    Turning the daemon's group answers (daemon/control/group_commands.py) and
    status' "groups" rows (daemon/status/build.py) into tables and lines.  Plain
    formatting: nothing here talks to the daemon (cli/groups.py does), so
    cli/daemon.py's status can use it too.

How to read it
    A group's targets are its latency target (the mean read latency its
    initiators see, the delay santhrottle adds included) and its throughput
    target (MB/s = 10^6 bytes/s, or IOPS); "*" marks a value set at run time
    (`santhrottle group set`).  Per grouped resource: the latency it saw
    over the last convergence (1 s), MB/s and IOPS, y = measured / target
    (1: met; "-": no target), PWFTE = priority x (1 - y) (above 0: short of
    its target, weighted by its priority; in overload the arbiter evens
    these out), its share of the resource's concurrency and its delay class.

Worked example
    targets({"priority": 4.0, "latency_target_s": 0.01, "throughput_target_bps": None,
             "throughput_target_iops": 5000.0, "override": {"priority": 4.0,
             "throughput_target_iops": 5000.0}, "configured": {"priority": 2.0, ...}})
    -> "priority 4 (file: 2), latency target 10.00ms, throughput target 5000iops
       (file: none)"
"""

from __future__ import annotations

from typing import Any

from santhrottle.appliance.units import fmt_mb, fmt_ms

# The fields of a group's targets, as the daemon answers them.
TARGET_FIELDS = ("latency_target_s", "throughput_target_bps", "throughput_target_iops")
OVERRIDE_NOTE = "* set at run time (group set); `group reset NAME` returns to the file's"
MEASURED_HEAD = (
    f"{'RESOURCE':<14} {'LATENCY':>9} {'MB/s':>8} {'IOPS':>8} {'Y':>6} {'PWFTE':>7} "
    f"{'SHARE':>6} {'CLASS':>5}"
)


def _num(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def fmt_priority(p: float) -> str:
    return f"{p:g}"


def fmt_throughput(bps: float | None, iops: float | None, none: str = "-") -> str:
    """A throughput target: "200.00MB/s", "5000iops", `none` for none."""
    parts = []
    if bps is not None:
        parts.append(f"{fmt_mb(bps)}MB/s")
    if iops is not None:
        parts.append(f"{iops:g}iops")
    return ",".join(parts) or none


def fmt_latency(s: float | None, none: str = "-") -> str:
    return none if s is None else fmt_ms(s)


def fmt_targets(r: dict[str, Any]) -> str:
    """Latency and throughput targets in one cell ("-": best effort)."""
    parts = []
    if r.get("latency_target_s") is not None:
        parts.append(fmt_ms(r["latency_target_s"]))
    tp = fmt_throughput(r.get("throughput_target_bps"), r.get("throughput_target_iops"))
    if tp != "-":
        parts.append(tp)
    return ",".join(parts) or "-"


def _overridden(g: dict[str, Any], *fields: str) -> bool:
    return any(f in (g.get("override") or {}) for f in fields)


def _mark(g: dict[str, Any], *fields: str) -> str:
    """ "*" after a value set at run time."""
    return "*" if _overridden(g, *fields) else ""


def measured(r: dict[str, Any]) -> str:
    """A resource row's cells under MEASURED_HEAD."""
    return (
        f"{r['resource']:<14} {fmt_ms(r.get('latency_s')):>9} {fmt_mb(r.get('throughput_bps')):>8} "
        f"{_num(r.get('iops'), '.0f'):>8} {_num(r.get('y'), '.2f'):>6} "
        f"{_num(r.get('pwfte'), '.2f'):>7} {_num(r.get('share'), '.3f'):>6} "
        f"{r.get('delay_class', 0):>5}"
    )


def print_list(groups: list[dict[str, Any]]) -> None:
    """`group list`: a line per group and grouped resource it is on."""
    if not groups:
        print("no groups: [groups.NAME] in the configuration (docs/groups.md)")
        return
    print(
        f"{'GROUP':<14} {'PRIO':>6} {'LAT_TARGET':>10} {'TPUT_TARGET':>14} {'INIS':>4}  "
        + MEASURED_HEAD
    )
    for g in groups:
        prio = fmt_priority(g["priority"]) + _mark(g, "priority")
        lat = fmt_latency(g.get("latency_target_s")) + _mark(g, "latency_target_s")
        tp = fmt_throughput(g.get("throughput_target_bps"), g.get("throughput_target_iops"))
        tp += _mark(g, "throughput_target_bps", "throughput_target_iops")
        head = f"{g['group']:<14} {prio:>6} {lat:>10} {tp:>14} {len(g['initiators']):>4}  "
        rows = g.get("resources") or []
        if not rows:
            print(head + f"{'-':<14} (no IOs on a grouped resource yet)")
        for i, r in enumerate(rows):
            print((head if i == 0 else " " * len(head)) + measured(r))
    if any(g.get("override") for g in groups):
        print(OVERRIDE_NOTE)


def targets(g: dict[str, Any]) -> str:
    """Priority and targets in force, each set at run time followed by the file's."""
    conf = g.get("configured") or {}

    def file_note(*fields: str) -> str:
        if not _overridden(g, *fields) or not conf:
            return ""
        if fields[0] == "priority":
            was = fmt_priority(conf["priority"])
        elif fields[0] == "latency_target_s":
            was = fmt_latency(conf.get("latency_target_s"), "none")
        else:
            bps, iops = conf.get("throughput_target_bps"), conf.get("throughput_target_iops")
            was = fmt_throughput(bps, iops, "none")
        return f" (file: {was})"

    tp = fmt_throughput(g.get("throughput_target_bps"), g.get("throughput_target_iops"), "none")
    return (
        f"priority {fmt_priority(g['priority'])}{file_note('priority')}, "
        f"latency target {fmt_latency(g.get('latency_target_s'), 'none')}"
        f"{file_note('latency_target_s')}, "
        f"throughput target {tp}{file_note('throughput_target_bps', 'throughput_target_iops')}"
    )


def print_show(g: dict[str, Any]) -> None:
    """`group show NAME`: the whole of one group."""
    print(f"group {g['group']}: {targets(g)}")
    if g.get("configured") is None:
        print("  the initiators of a grouped resource in no group: no target, best effort")
    else:
        print(f"  {'members (file)':<18}{', '.join(g['configured_members'])}")
        res = ", ".join(g.get("configured_resources") or []) or "every resource its members load"
        print(f"  {'resources (file)':<18}{res}")
    print(f"  {'initiators now':<18}{', '.join(g['initiators']) or '-'}")
    rows = g.get("resources") or []
    if not rows:
        print("  on no grouped resource yet (no IOs seen)")
    for r in rows:
        over = " (overloaded: not every group's target can be met)" if r.get("overloaded") else ""
        print(f"  on {r['resource']}{over}")
        at = fmt_ms(r.get("io_latency_s"))
        res_lat = fmt_ms(r.get("resource_latency_s"))
        print(
            f"    {'latency':<16}{fmt_ms(r.get('latency_s'))} mean, its delay included "
            f"(its IOs at the array {at}; the resource's reads {res_lat})"
        )
        print(
            f"    {'throughput':<16}{fmt_mb(r.get('throughput_bps'))} MB/s, "
            f"{_num(r.get('iops'), '.0f')} IOPS"
        )
        print(f"    {'y':<16}{_num(r.get('y'), '.2f')} (measured / target: 1 = met; - = no target)")
        print(f"    {'PWFTE':<16}{_num(r.get('pwfte'), '.2f')} (priority x (1 - y))")
        print(
            f"    {'share':<16}{_num(r.get('share'), '.3f')} of the resource's concurrency "
            f"(its demand {_num(r.get('demand'), '.3f')})"
        )
        print(
            f"    {'class':<16}{r.get('delay_class', 0)}, delay {fmt_ms(r.get('delay_s'))} "
            f"(moving to class {r.get('target_class', r.get('delay_class', 0))})"
        )
        print(f"    {'initiators':<16}{', '.join(r.get('members') or []) or '-'}")
    if g.get("override"):
        print(f"  set at run time; `santhrottle group reset {g['group']}` returns to the file's")


def print_status_groups(rows: list[dict[str, Any]]) -> None:
    """status' groups section: per grouped resource and group, target, measured,
    PWFTE and priority."""
    print(f"{'GROUP':<14} {'PRIO':>6} {'TARGET':>18}  " + MEASURED_HEAD)
    for r in rows:
        prio = fmt_priority(r["priority"]) + _mark(r, "priority")
        target = fmt_targets(r) + _mark(r, *TARGET_FIELDS)
        print(f"{r['group']:<14} {prio:>6} {target:>18}  " + measured(r))
    if any(r.get("override") for r in rows):
        print(OVERRIDE_NOTE)
