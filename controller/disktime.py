"""Disk-time reservations (Fahrrad): a share of the device's busy time, guaranteed when wanted.

Problem
    A throughput reservation must assume worst-case IOs: a random 4 KiB IO
    may take a hundred times a sequential one, so the IOPS an array can
    promise is a small part of what it does, and a sequential tenant's
    reservation says little about the time it takes. Disk time is what a
    device has to give, whatever the IOs: a group that reserves 30 % of it
    gets 30 % of the time, sequential or random, and reservations are
    feasible exactly when they sum to at most 100 % (Fahrrad's test).

Measured signal (per grouped resource, per interval: groups.py)
    Each group's disk time, attributed from its IOs and the time each spent
    at the device: its weight is the sum over its IOs of their latency at
    the array (its mean IOs in flight, Little), its share of the busy time
    its weight over every group's. Under processor sharing (every IO in the
    device served alike) that is each group's exact share of the device's
    time: an IO that needs ten times the service stays ten times as long.
    On a target host where a group's initiators each have a LUN of their
    own, that LUN's io_ticks (IoSample.busy_s) is the time the group had an
    IO in flight at all: no more device time than that can be its. Weights
    count IOs in flight, not time: a group that bursts at depth 4 while the
    other is idle weighs 4 per busy second against the other's 1. Then
    (attribute()) the device's busy time B (utilization x interval) is
    shared by weight, no group above its own busy time, the rest to the
    others by weight (water-filling): exact when the groups take turns
    (each gets its own io_ticks), processor sharing's split when they
    overlap (the caps do not bind), and never more than B.
    The resource's utilization U (utilization.py): whether the device is
    saturated (U >= SATURATED_UTILIZATION).

Law: the reservation as a target of the arbiter (maestro.py)
    target share r (utilization_target), busy share s:
    wants     the group is held back (its delay class > 0 over the interval)
              or the device is saturated (or its utilization is unknown):
              y = s / r
    otherwise it has what it asks and the device has time to spare:
              y = max(1, s / r, u / w)
              (u: its share of the concurrency, w: its demand share)
    y is the normalised performance the arbiter equalises under overload
    and meets in underload, the lower of it and the group's other targets'.
    A share above the demand of a group that does not want its time is
    share it does not use (u / w > 1): the arbiter gives it back to the
    others (work conservation), at most its change limit per interval.

Feasibility (checked when a configuration or scenario is loaded)
    On every resource the reservations of the groups that reach it sum to at
    most 100 %; a group that names no resources reaches every one.
    over_reserved() gives the one line that refuses a load.

Bounds
    0 < r <= 1; y >= 0.

Idle behaviour
    A group without IOs takes no part in the interval (groups.py); its time
    goes to the others.

How to watch it
    GroupState.busy_share per group and resource beside its y and share;
    `santhrottle group show`.

Worked example
    seq reserves 0.7, rand 0.3; both keep 8 IOs in the device (shares of
    busy time 0.5 / 0.5, the device saturated): y_seq = 0.5 / 0.7 = 0.71,
    y_rand = 0.5 / 0.3 = 1.67. The arbiter moves share from rand to seq;
    with rand delayed so that it keeps 3.4 IOs at the device against seq's
    8, s = 0.70 / 0.30 and y = 1 for both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# At or above this utilization the device has no time to spare: every group
# competes for it, and one under its reservation wants more.
SATURATED_UTILIZATION = 0.9
# Reservations on one resource may sum to this, and no more.
RESERVABLE_FRACTION = 1.0


def reservation_y(
    target: float,
    busy_share: float,
    held_back: bool,
    utilization: float | None,
    share: float,
    demand: float,
) -> float:
    """A group's normalised performance against its disk-time reservation."""
    y = busy_share / target
    saturated = utilization is None or utilization >= SATURATED_UTILIZATION
    if held_back or saturated:  # it wants its time
        return y
    unused = share / demand if demand > 0.0 else 1.0
    return max(1.0, y, unused)


def attribute(
    weights: Mapping[str, float], caps: Mapping[str, float | None], total_s: float
) -> dict[str, float]:
    """Each group's disk time (s): total_s (the device's busy time) shared in
    proportion to weights (its IOs' time at the device), none above its cap (its own
    LUN's busy time; None: no cap), what a cap leaves to the others by their weights.
    Time no weight takes (every group capped below total_s: IOs of no group) stays
    unattributed. Without a cap, or without a busy time (0: not measured), the
    weights as they are.

    >>> attribute({"a": 1.5, "b": 0.5}, {"a": 0.25, "b": 0.5}, 0.75)
    {'a': 0.25, 'b': 0.5}
    """
    if not total_s > 0.0 or all(caps.get(g) is None for g in weights):
        return dict(weights)
    out: dict[str, float] = {}
    free = [g for g, w in weights.items() if w > 0.0]
    left = total_s
    while free:
        total_w = sum(weights[g] for g in free)
        capped = [
            g for g in free if (c := caps.get(g)) is not None and left * weights[g] / total_w > c
        ]
        if not capped:
            for g in free:
                out[g] = left * weights[g] / total_w
            break
        for g in capped:
            c = caps[g]
            assert c is not None
            out[g] = c
            left -= c
        free = [g for g in free if g not in out]
    return out


def over_reserved(groups: Iterable[tuple[str, float, tuple[str, ...]]]) -> str | None:
    """One line when the reservations on some resource sum to more than 100 %, else
    None. groups: (name, utilization_target, the resources it names; () = every)."""
    rows = list(groups)
    everywhere = [(n, r) for n, r, res in rows if not res]
    named: dict[str, list[tuple[str, float]]] = {}
    for n, r, res in rows:
        for name in res:
            named.setdefault(name, []).append((n, r))
    cases = [(f"on resource {name}", everywhere + own) for name, own in sorted(named.items())]
    if everywhere:
        cases.append(("on every resource (groups without resources reach them all)", everywhere))
    for where, who in cases:
        total = sum(r for _, r in who)
        if total > RESERVABLE_FRACTION + 1e-9:
            parts = ", ".join(f"{n} ({r * 100:g} %)" for n, r in who)
            return (
                f"utilization_target: {where} the reservations of {parts} sum to "
                f"{total * 100:g} %, more than {RESERVABLE_FRACTION * 100:g} %"
            )
    return None
