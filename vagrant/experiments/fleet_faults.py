"""fleet_lab.py's faults under load: kill -9 of the leader, a partition of the leader's
management link. In the guest (imported by fleet_lab.py)."""

from __future__ import annotations

import argparse
import time

from fleet_segments import (
    LEASE_WAIT_S,
    PREFIX,
    RESOURCE,
    FleetDaemon,
    Segment,
    back_under,
    both_in_fleet,
    classes_of,
    current_leader,
    lat_windows,
    log,
    pct_ms,
    until,
)
from labkit import fabrics

NO_LEADER = "no leader of the resource within 60 s"


def _leader_under_load(
    t: dict, a: argparse.Namespace, ds: list[FleetDaemon], kind: str, total: float
) -> tuple[Segment, FleetDaemon | None]:
    """A segment of `kind` with the writers on for `total` s, a.fault_settle s into it:
    the segment and the resource's leader (None: no leader within 60 s)."""
    seg = Segment(t, a, kind, ds)
    seg.begin(total + 2)
    seg.writers(total)
    time.sleep(a.fault_settle)
    lead, _ = until(lambda: current_leader(seg, ds), 60.0, step=0.5)
    log(f"{kind}: leader of {RESOURCE}: {lead}")
    return seg, next((d for d in ds if d.name == lead), None)


def _lease_bound_s(a: argparse.Namespace, base_s: float, per_ttl_s: float = 3.0) -> float:
    """A wait of base_s at the 1 s lease, longer by per_ttl_s per extra second of TTL
    (the lease, its expiry and the engine's call budget all grow with it)."""
    return base_s + per_ttl_s * (a.lease_ttl - 1)


def fault_kill(
    t: dict, a: argparse.Namespace, ds: list[FleetDaemon], etcd, thr_s: float
) -> tuple[dict, dict, FleetDaemon]:
    """kill -9 of the resource's leader under load; returns the segment, the figures and
    the killed daemon."""
    total = a.fault_settle + a.fault_after
    seg, victim = _leader_under_load(t, a, ds, "kill", total)
    if victim is None:
        return seg.end(), {"error": NO_LEADER}, None
    survivor = next(d for d in ds if d is not victim)
    before = victim.fleet() or {}
    epoch0 = (before.get("leaders", {}).get(RESOURCE) or {}).get("epoch")
    try:
        cls0 = (victim.status()["resources"] or [{}])[0].get("delay_class")
    except Exception as e:  # recorded
        cls0 = f"? ({e})"
    victim.kill9()
    t_kill = seg.now()
    log(f"kill: {victim.name} killed (kill -9)")
    seg.s.mark("leader killed")
    _, took = until(
        lambda: RESOURCE in ((survivor.fleet() or {}).get("leading") or []),
        _lease_bound_s(a, 15.0),
    )
    seg.s.mark("survivor leads")
    log(f"kill: {survivor.name} leads after {took} s")
    time.sleep(_lease_bound_s(a, LEASE_WAIT_S, per_ttl_s=1.0))  # the victim's lease expired
    fs = survivor.fleet() or {}
    keys = etcd.keys(PREFIX + "appliances/")
    in_etcd = None if keys is None else [k.removeprefix(PREFIX + "appliances/") for k in keys]
    left = victim.left()
    time.sleep(max(0.0, total - seg.now()))
    ph = seg.end()
    res = {
        "leader_killed": victim.name,
        "survivor": survivor.name,
        "epoch_before": epoch0,
        "epoch_after": (fs.get("leaders", {}).get(RESOURCE) or {}).get("epoch"),
        "class_at_kill": cls0,
        "survivor_leads_after_s": None if took is None else round(took, 2),
        "appliances_in_fleet_status": fs.get("appliances"),
        "appliances_in_etcd": in_etcd,
        "orphans": sorted(
            set(in_etcd if in_etcd is not None else fs.get("appliances") or []) - {survivor.name}
        ),
        "killed_left_on_its_bridge": left,
        "reader_after_kill": back_under(ph, t_kill, thr_s),
        "survivor_classes_after": classes_of(ph, survivor.name, t_kill, 1e9)[-5:],
        "io_errors": ph["io_errors"],
        "path_failures": ph["path_failures"],
        "t_kill": t_kill,
    }
    w = lat_windows(ph, a.fault_settle / 2, t_kill)
    v = [x for _, x in w]
    res["reader_before_kill"] = {"p50_ms": pct_ms(v, 50), "p95_ms": pct_ms(v, 95)}
    return ph, res, victim


def fault_partition(t: dict, a: argparse.Namespace, ds: list[FleetDaemon], thr_s: float) -> tuple:
    """The leader's management link down for a.partition_s under load, then up."""
    total = a.fault_settle + a.partition_s + a.fault_after
    seg, cut = _leader_under_load(t, a, ds, "partition", total)
    if cut is None:
        return seg.end(), {"error": NO_LEADER}
    other = next(d for d in ds if d is not cut)
    fabrics.mgmt_link(cut.bridge["netns"], up=False)
    t_down = seg.now()
    seg.s.mark("link down")
    _, degraded_s = until(
        lambda: (cut.fleet() or {}).get("mode") == "degraded", _lease_bound_s(a, 10.0)
    )
    log(f"partition: {cut.name} link down; degraded after {degraded_s} s")
    _, other_leads_s = until(
        lambda: RESOURCE in ((other.fleet() or {}).get("leading") or []), _lease_bound_s(a, 10.0)
    )
    time.sleep(max(0.0, a.partition_s - (seg.now() - t_down)))
    during_cut = cut.fleet() or {}
    fabrics.mgmt_link(cut.bridge["netns"], up=True)
    t_up = seg.now()
    seg.s.mark("link up")
    log(f"partition: {cut.name} link up")
    fss, back_s = until(lambda: both_in_fleet(ds), _lease_bound_s(a, 30.0), step=0.1)
    time.sleep(max(0.0, total - seg.now()))
    ph = seg.end()
    res = {
        "partitioned": cut.name,
        "was_leader": True,
        "degraded_after_s": None if degraded_s is None else round(degraded_s, 2),
        "degraded_reason": during_cut.get("reason"),
        "mode_during": during_cut.get("mode"),
        "other_leads_after_s": None if other_leads_s is None else round(other_leads_s, 2),
        "both_in_fleet_after_link_up_s": None if back_s is None else round(back_s, 2),
        "leader_after": None if not fss else (fss[0]["leaders"].get(RESOURCE) or {}),
        "reader_after": back_under(ph, t_up, thr_s),
        "io_errors": ph["io_errors"],
        "path_failures": ph["path_failures"],
        "t_down": t_down,
        "t_up": t_up,
    }
    for key, (x, y) in {
        "reader_before": (a.fault_settle / 2, t_down),
        "reader_during": (t_down, t_up),
    }.items():
        w = [v for _, v in lat_windows(ph, x, y)]
        res[key] = {
            "windows": len(w),
            "over_T": sum(1 for v in w if v > thr_s),
            "p50_ms": pct_ms(w, 50),
            "p95_ms": pct_ms(w, 95),
        }
    for d in ds:  # the resource's class on each: before, during, around the rejoin
        res[f"class_{d.name}"] = {
            "before": classes_of(ph, d.name, t_down - 3, t_down)[-3:],
            "during": classes_of(ph, d.name, t_down, t_up),
            "after": classes_of(ph, d.name, t_up, t_up + 6),
        }
    return ph, res
