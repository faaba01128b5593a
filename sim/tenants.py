"""What a scenario says about tenants: bursty streams, IO costs, levels, reservations, policies.

The scenario's tables (docs/simulator.md, "Tenants") read here, each field
checked with the scenario's one-line errors (sim/scenario.py):

    [[stream]] loop = "bursty"   arrivals from a percentile table (sim/bursty.py):
        iops = { mean = 906, p90 = 1877, p99 = 4026 }, share = 0.7,
        process = "vol1", bursts = { fraction = 0.2, mean_s = 10, shape = 1.5 },
        depth = 32 (the initiator's queue depth)
    [[stream]] cost = 0.02       an IO's work at the device, in ordinary IOs
                                 (sim/plant.py costed_latency)
    [[resource]] utilization_threshold (or [controller]'s for every one), nominal_iops
    [[group]] iops_levels, bandwidth_levels and their read_ and write_ forms,
        utilization_target: [groups.NAME]'s keys, read by the schema's kinds
    [run] compare = ["no-caps", "static-p90", "static-p99", "rate-reservations"]

The policies `compare` names are the same scenario with each group's levels
or reservations replaced (policy()):
    no-caps            no levels
    static-pNN         one level per group: the NNth percentile of its
                       members' bursty streams' IOPS (the sum over them: the
                       streams of one process burst together; 0 without)
    rate-reservations  each utilization_target r replaced by an IOPS target of
                       r x the resource's nominal_iops (by default the IOPS of
                       its costliest stream's IOs: 1 / (m x cost)), a
                       throughput reservation sized as Fahrrad's comparison is
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from santhrottle.controller.disktime import over_reserved
from santhrottle.controller.groups import Group
from santhrottle.controller.levels import Levels

from .bursty import Arrivals, Bursts, RateTable, TableError

if TYPE_CHECKING:
    from .scenario import Scenario

POLICIES = ("no-caps", "rate-reservations")
STATIC_RE = re.compile(r"^static-p(\d{1,2}(?:_\d+)?)$")


def arrivals(t: Any, name: str, error: type[ValueError]) -> Arrivals:
    """A bursty stream's arrivals from its table `t`."""
    raw = t.get("iops", required=True)
    if not isinstance(raw, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in raw.values()
    ):
        raise error(f"{t.path}.iops: must be a table of numbers (mean, p90, p99_9, ...)")
    try:
        table = RateTable.of(raw)
    except TableError as e:
        raise error(f"{t.path}.iops: {e}") from None
    b = t.table("bursts")
    d = Bursts()
    bursts = Bursts(
        fraction=b.number("fraction", d.fraction, lo=0.0, lo_open=True, hi=0.9),
        mean_s=b.number("mean_s", d.mean_s, lo=1.0),
        shape=b.number("shape", d.shape, lo=1.0, lo_open=True, hi=10.0),
    )
    b.done()
    return Arrivals(
        table,
        t.string("process", name),
        t.number("share", 1.0, lo=0.0, lo_open=True),
        bursts,
    )


# parse(where, the schema's dotted key, the value): the value as the daemon's
# configuration takes it, or the scenario's error naming `where` (sim/scenario.py).
Parse = Callable[[str, str, Any], Any]


def group_extras(
    t: Any, base: Group, level_keys: Sequence[tuple[str, str, str]], parse: Parse
) -> dict[str, Any]:
    """A [[group]]'s levels and utilization_target, as [groups.NAME] takes them
    (level_keys: (key, measure, direction); iops_levels = [600, 1200],
    bandwidth_levels = ["20MB/s"], ...); what t does not name stays base's."""
    levels = {lv.name: lv for lv in base.levels}
    order = []
    for key, measure, direction in level_keys:
        t.used.add(key)
        order.append(Levels((1.0,), measure, direction).name)
        if key in t.data:
            caps = parse(f"{t.path}.{key}", f"groups.NAME.{key}", t.data[key])
            levels[order[-1]] = Levels(caps, measure, direction)
    target = base.utilization_target
    t.used.add("utilization_target")
    if "utilization_target" in t.data:
        target = parse(
            f"{t.path}.utilization_target",
            "groups.NAME.utilization_target",
            t.data["utilization_target"],
        )
    return {"levels": tuple(levels[n] for n in order if n in levels), "utilization_target": target}


def resource_extras(t: Any, controller: Mapping[str, Any], parse: Parse) -> dict[str, Any]:
    """A [[resource]]'s utilization_threshold (else [controller]'s, as the daemon's
    [resources.NAME] and [controller] take it) and nominal_iops."""
    out: dict[str, Any] = {"utilization_threshold": None, "nominal_iops": None}
    key = "utilization_threshold"
    if key in controller:
        out[key] = parse(f"controller.{key}", f"controller.{key}", controller[key])
    if key in t.data:
        out[key] = parse(f"{t.path}.{key}", f"resources.NAME.{key}", t.data[key])
    t.used.add(key)
    if "nominal_iops" in t.data:
        out["nominal_iops"] = t.number("nominal_iops", lo=0.0, lo_open=True)
    t.used.add("nominal_iops")
    return out


def check_reservations(groups: Sequence[Group], error: type[ValueError]) -> None:
    """Every resource of a scenario is each group's: their reservations sum to <= 100 %."""
    line = over_reserved(
        (g.name, g.utilization_target, ()) for g in groups if g.utilization_target is not None
    )
    if line is not None:
        raise error(f"group: {line}")


def check_policy(name: str, error: type[ValueError]) -> str:
    if name in POLICIES or STATIC_RE.match(name):
        return name
    raise error(
        f"run.compare: {name!r} is not a policy (no-caps, static-p90 or another "
        "percentile, rate-reservations)"
    )


def policy(sc: Scenario, name: str) -> Scenario:
    """The scenario under another policy (the module's header)."""
    gms = []
    for gm in sc.groups:
        g = gm.group
        if name == "no-caps":
            g = dataclasses.replace(g, levels=())
        elif name == "rate-reservations":
            if g.utilization_target is not None:
                iops = g.utilization_target * _nominal_iops(sc, gm.members)
                g = dataclasses.replace(g, utilization_target=None, throughput_target_iops=iops)
        else:
            q = float(STATIC_RE.match(name).group(1).replace("_", ".")) / 100.0  # type: ignore[union-attr]
            cap = sum(
                s.arrivals.quantile(q)
                for s in sc.streams
                if s.arrivals is not None and s.initiator in gm.members
            )
            g = dataclasses.replace(g, levels=(Levels((cap,)),) if cap > 0.0 else ())
        gms.append(dataclasses.replace(gm, group=g, changes=()))
    return dataclasses.replace(sc, groups=tuple(gms), compare=())


def _nominal_iops(sc: Scenario, members: Sequence[str]) -> float:
    """The nominal IOPS of the resource the members' streams use: its own, or the IOPS
    of its costliest IOs."""
    names = {s.resource for s in sc.streams if s.initiator in members}
    for r in sc.resources:
        if r.name in names:
            if r.nominal_iops is not None:
                return r.nominal_iops
            worst = max((s.cost for s in sc.streams if s.resource == r.name), default=1.0)
            return 1.0 / (r.slope_s_per_io * worst)
    return 0.0
