#!/usr/bin/env python3
"""A fleet of two bridge appliances on two fabrics, under the closed loop. In the guest.

    .venv/bin/python vagrant/qemu/lab.py --smp 2 --array nbd:c_ms=2,m_ms=5 run --timeout 2400 \\
        vagrant/experiments/fleet_lab.py [--out DIR] [--on 20 --cycles 3 ...]
    make lab-fleet                                    # the same

The topology (labkit.topology with a bridge, plus labkit.fabrics): the
paper's reader (LUN 0) and three writer hosts (LUNs 1-3, 4 sequential 128 KiB
QD1 writers each) on the known plant's VG, each iSCSI initiator logged in over
fabric A (bridge lab-br, netns labbr, 10.0.0.0/24) and fabric B (lab-br2,
labbr2, 10.0.1.0/24), fio on a dm-multipath device (service-time) over its
two sessions; a 3-member etcd cluster on a management network (members in
labbr, labbr2 and labetcd3).  santhrottled in bridge mode, one per bridge, each
started under `ip netns exec` of its bridge's namespace, [hosts.iniK] joining
an initiator's two addresses, the resource "labvg" every volume of both portals.

Phases, T = --threshold (15 ms):
  uncontrolled  no daemon;
  single        daemon A alone (no [fleet]), fabric B's paths failed in every
                multipath device (dmsetup message fail_path): one appliance on
                one path, the comparison;
  fleet         both daemons in fleet mode (array "lab", appliances br-a, br-b);
  kill          the writers on throughout, the fleet settled; kill -9 of the
                daemon `fleet status` names leader of labvg: the time until the
                survivor leads, until the reader's 1 s windows are back under T,
                the appliances etcd lists after the lease's TTL, fio's errors and
                the kernel's multipath messages; the dead daemon's delays stay on
                its bridge (what it left is recorded);
  partition     the killed daemon cleaned up and started again; both in the
                fleet, the writers on, the leader's namespace's management link
                down for --partition-s: when it reports "degraded", the reader's
                windows meanwhile, then up: when both are back in "fleet", the
                resource's class on each before, during and after.
Per phase: the reader's read latency over 1 s windows (the LV's diskstats at the
target, as closed_loop.py; and the initiator's multipath device), p50/p95/p99,
the time above T, the writers' MB/s, the target's retransmissions.

Results: OUT/fleet-lab.json (default /shared/work/fleet: the run dir's work/fleet)
and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import fleet_faults
from fleet_segments import (
    FleetDaemon,
    Segment,
    back_under,
    both_in_fleet,
    lat_windows,
    log,
    pct_ms,
    summary,
    until,
)
from labkit import fabrics, topology


def parse_ms(text: str) -> float:
    from santhrottle.appliance.units import parse_duration_s

    return parse_duration_s(text)


def ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def table(res: dict) -> str:
    """Per phase: the reader's 1 s windows (by time) at the LV and at the initiator's
    multipath device, the writers' MB/s, the target's retransmissions, the highest class,
    fio's errors, the fleet's lost leases; then the faults' figures."""
    head = (
        f"{'phase':<13} {'win':>4} {'LV p50':>7} {'p95':>6} {'p99':>6} {'>T%':>5} "
        f"{'mp p50':>7} {'p95':>6} {'MB/s':>5} {'retr':>4} {'cls':>3} {'err':>3} "
        f"{'leases lost':>11}"
    )
    lines = [head]
    for name, s in res["phases"].items():
        lv, mp = s.get("lv_1s") or {}, s.get("mpath_1s") or {}
        lost = "/".join(str(c.get("leases_lost")) for c in (s.get("fleet_counters") or {}).values())
        lines.append(
            f"{name:<13} {lv.get('windows', 0):>4} {lv.get('p50_ms')!s:>7} {lv.get('p95_ms')!s:>6} "
            f"{lv.get('p99_ms')!s:>6} {lv.get('above_T_pct')!s:>5} {mp.get('p50_ms')!s:>7} "
            f"{mp.get('p95_ms')!s:>6} {s['write_bytes_per_s'] / 1e6:>5.1f} "
            f"{s['target_retrans_segs']:>4} {s.get('max_delay_class') or 0:>3} "
            f"{s['io_errors']:>3} {lost or '-':>11}"
        )
    for k in ("kill", "partition"):
        if k in res:
            lines.append(f"{k}: " + json.dumps(res[k], default=str))
    return "\n".join(lines)


def refigure(out: Path) -> dict:
    """On the host: an earlier run's results summarized again from its raw.json (the
    phases' windows by time; the faults' reader figures around their recorded times)."""
    res = json.loads((out / "fleet-lab.json").read_text())
    raw = json.loads((out / "raw.json").read_text())
    thr_s = parse_ms(res["args"]["threshold"])
    settle = float(res["args"]["fault_settle"])
    for kind, ph in raw.items():
        res["phases"][kind] = summary(ph, thr_s)
    k = res.get("kill") or {}
    if "t_kill" in k:
        k["reader_after_kill"] = back_under(raw["kill"], k["t_kill"], thr_s)
        w = [v for _, v in lat_windows(raw["kill"], settle / 2, k["t_kill"])]
        k["reader_before_kill"] = {"p50_ms": pct_ms(w, 50), "p95_ms": pct_ms(w, 95)}
    p = res.get("partition") or {}
    if "t_down" in p:
        ph = raw["partition"]
        for key, (x, y) in {
            "reader_before": (settle / 2, p["t_down"]),
            "reader_during": (p["t_down"], p["t_up"]),
        }.items():
            w = [v for _, v in lat_windows(ph, x, y)]
            p[key] = {
                "windows": len(w),
                "over_T": sum(1 for v in w if v > thr_s),
                "p50_ms": pct_ms(w, 50),
                "p95_ms": pct_ms(w, 95),
            }
        p["reader_after"] = back_under(ph, p["t_up"], thr_s)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/shared/work/fleet"))
    ap.add_argument("--threshold", default="15ms")
    ap.add_argument("--lv-size-mib", type=int, default=1536)
    ap.add_argument("--writers", type=int, default=3, help="writer hosts")
    ap.add_argument("--writer-jobs", type=int, default=4)
    ap.add_argument("--writer-bs", default="128k")
    ap.add_argument("--writer-qd", type=int, default=1)
    ap.add_argument("--reader-rate", default="256k")
    ap.add_argument("--lead", type=float, default=4.0)
    ap.add_argument("--on", type=float, default=20.0)
    ap.add_argument("--off", type=float, default=5.0)
    ap.add_argument("--cycles", type=int, default=3, help="on/off cycles of single and fleet")
    ap.add_argument("--unc-cycles", type=int, default=2)
    ap.add_argument("--fault-settle", type=float, default=15.0)
    ap.add_argument("--fault-after", type=float, default=20.0)
    ap.add_argument("--partition-s", type=float, default=20.0)
    # nice of etcd and of the daemons: 0 here, not the unit's -10.  On the guest's two
    # emulated vCPUs two daemons and three etcd members at -10 starve fio, iscsid's and the
    # network's kernel threads (nice 0): a run at -10 moved 0.6 MB/s in the fleet phase,
    # its phase of 79 s took 6 min and the reader's multipath device saw p50 126 ms.
    ap.add_argument("--etcd-nice", type=int, default=0)
    ap.add_argument("--daemon-nice", type=int, default=0, help="the unit's: -10")
    # [fleet] lease_ttl: 3 s, not the default 1 s.  The guest's daemons stall for seconds
    # (ticks late by up to 17 s); with 1 s every agent round failed and no leader held.
    ap.add_argument("--lease-ttl", type=int, default=3, help="[fleet] lease_ttl, seconds")
    ap.add_argument("--only", default="uncontrolled,single,fleet,kill,partition")
    ap.add_argument(
        "--from",
        dest="from_",
        type=Path,
        help="on the host: summarize an earlier run's DIR (fleet-lab.json, raw.json)",
    )
    a = ap.parse_args()
    if a.from_:
        res = refigure(a.from_)
        (a.from_ / "fleet-lab-refigured.json").write_text(json.dumps(res, indent=1, default=str))
        print(table(res))
        return 0
    only = set(a.only.split(","))
    a.out.mkdir(parents=True, exist_ok=True)
    thr_s = parse_ms(a.threshold)
    topology.load_modules(["virtio_blk"])
    res: dict = {
        "args": {k: str(v) for k, v in vars(a).items()},
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "phases": {},
        "timings_s": {},
    }
    raw: dict = {}
    t: dict | None = None
    etcd = None
    ds: list[FleetDaemon] = []
    t_all = time.monotonic()

    def mark(what: str) -> None:
        res["timings_s"][what] = round(time.monotonic() - t_all, 1)
        log(what)
        (a.out / "fleet-lab.json").write_text(json.dumps(res, indent=1, default=str))

    try:
        t = topology.up(
            luns=a.writers + 1, nvme=0, disk="array", lv_size_mib=a.lv_size_mib, bridge=True
        )
        fabrics.setup_fabric_b(t)
        fabrics.login_b(t)
        fabrics.setup_multipath(t)
        res["multipath"] = {x["mpath"]: fabrics.path_status(x) for x in t["iscsi"]}
        mark("topology up (two fabrics, multipath)")
        fabrics.setup_mgmt()
        etcd = fabrics.Etcd(a.out, nice=a.etcd_nice)
        etcd.start()
        res["etcd"] = {"ready_s": round(etcd.wait_ready(), 1), "data_fs": etcd.fs}
        mark("etcd up")
        ds = [
            FleetDaemon("br-a", t["bridge"], 0, a.out, t, a.threshold, a.lease_ttl, a.daemon_nice),
            FleetDaemon(
                "br-b", t["bridge_b"], 1, a.out, t, a.threshold, a.lease_ttl, a.daemon_nice
            ),
        ]

        def run(kind: str, daemons: list[FleetDaemon], n: int) -> None:
            seg = Segment(t, a, kind, daemons)
            seg.cycles(n, settle=not daemons)
            raw[kind] = seg.end()
            res["phases"][kind] = s = summary(raw[kind], thr_s)
            mark(
                f"phase {kind}: p50 {ms(s['read_latency_p50_s'])} p95 "
                f"{ms(s['read_latency_p95_s'])} ms, {s['write_bytes_per_s'] / 1e6:.1f} MB/s"
            )

        if "uncontrolled" in only:
            run("uncontrolled", [], a.unc_cycles)
        if "single" in only:
            for x in t["iscsi"]:
                fabrics.fail_path(x, x["device_b"])
            res["single_paths"] = {x["mpath"]: fabrics.path_status(x) for x in t["iscsi"]}
            single = FleetDaemon(
                "single-a", t["bridge"], None, a.out, t, a.threshold, a.lease_ttl, a.daemon_nice
            )
            single.start()
            try:
                run("single", [single], a.cycles)
            finally:
                single.stop()
                for x in t["iscsi"]:
                    fabrics.reinstate_path(x, x["device_b"])
        if only & {"fleet", "kill", "partition"}:
            for d in ds:
                d.launch()
            for d in ds:
                d.wait_up()
            mark("both daemons up")
            fss, took = until(lambda: both_in_fleet(ds), 60.0, step=0.2)
            res["fleet_formed_s"] = None if took is None else round(took, 1)
            res["fleet_at_start"] = fss
            mark("both daemons in the fleet")
        if "fleet" in only:
            run("fleet", ds, a.cycles)
        if "kill" in only:
            raw["kill"], res["kill"], victim = fleet_faults.fault_kill(t, a, ds, etcd, thr_s)
            res["phases"]["kill"] = summary(raw["kill"], thr_s)
            mark(f"kill: {res['kill']}")
            if victim is not None:  # None: no leader to kill (recorded); on to the partition
                victim.cleanup()
                victim.start()
                fss, took = until(lambda: both_in_fleet(ds), 60.0, step=0.2)
                res["rejoin_after_restart_s"] = None if took is None else round(took, 1)
                mark(f"{victim.name} restarted: both in the fleet after {took} s")
        if "partition" in only:
            raw["partition"], res["partition"] = fleet_faults.fault_partition(t, a, ds, thr_s)
            res["phases"]["partition"] = summary(raw["partition"], thr_s)
            mark(f"partition: {res['partition']}")
    except Exception:
        log(f"failed: {traceback.format_exc()}")
        raise
    finally:
        log("stopping")
        for d in ds:
            d.stop()
        if etcd is not None:
            etcd.stop()
        res["guest_wall_s"] = round(time.monotonic() - t_all, 1)
        (a.out / "fleet-lab.json").write_text(json.dumps(res, indent=1, default=str))
        (a.out / "raw.json").write_text(json.dumps(raw, default=str))
        fabrics.teardown(t)
        topology.down()
        res["left_after_teardown"] = {
            "netns": sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else [],
            "dm": subprocess.run(
                ["dmsetup", "ls"],
                capture_output=True,
                text=True,
                env=dict(os.environ, **fabrics.ENV),
            ).stdout.strip(),
            "iscsi_sessions": len(topology.iscsi_sessions()),
        }
        (a.out / "fleet-lab.json").write_text(json.dumps(res, indent=1, default=str))
    print(table(res), flush=True)
    print(f"results: {a.out / 'fleet-lab.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
