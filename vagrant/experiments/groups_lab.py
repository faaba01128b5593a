#!/usr/bin/env python3
"""Initiator groups in the lab: two reader groups beside the writers. In the guest.

    .venv/bin/python vagrant/qemu/lab.py --array nbd:c_ms=10,m_ms=5 run --timeout 2400 \\
        vagrant/experiments/groups_lab.py [--seconds 90]
    make lab-groups            # the same, then groups_compare.py on the host

(docs/groups.md, "In the lab".)  The topology with a bridge (labkit.topology)
on the known plant (the lab-array disk, L = C + m * Q), five iSCSI
hosts on five LVs of one VG: LUN 0 is the group "gold" (a reader, read latency
target --gold-target, priority --gold-priority), LUN 1 the group "silver" (a
reader, --silver-target, --silver-priority), LUNs 2-4 the writers (group
"bulk": best effort, or with --bulk-target a throughput target in the
overload phase).  santhrottled runs in bridge mode on lab-br with one resource,
every volume of the five portals, and the groups in [groups.NAME]; the sessions
log in through its bridge.

Phases (one daemon run; each --seconds long, the first --warmup left out)
    idle         the readers alone, the daemon paused (it measures, delays
                 nobody): what the lab adds to the plant (the emulated
                 target's software path).
    uncontrolled the readers and the writers, the daemon still paused.
    controlled   the same, the daemon resumed: the groups' arbiter decides.
    overload     (with --bulk-target) the bulk group gets a throughput target by
                 a live reload: not every target can be met.
Every second: the daemon's status (each group's latency as it sees it, its
throughput, y, PWFTE, share, class), the writers' LVs' diskstats and the
plant's own counters (its mean IO latency and IOs in flight); each reader's
fio latency log (1 s means); `santhrottle group list` 10 s before the end.
Per phase and group: the mean and p95 of its 1 s latency (fio's, and the
wire's as the daemon saw it), its MB/s; the plant's mean IO latency.

Results: OUT/groups-lab.json (default /shared/work/groups: the run dir's
work/groups on the host), which groups_compare.py sets beside the simulator.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from labkit import analysis, fio, probes, topology
from labkit.analysis import SECTOR_BYTES, WRITE_SECTORS
from labkit.daemon import Daemon, bridge_config
from labkit.sampler import Probe, Sampler

SOCK = "/run/santhrottle-exp/control.sock"
NAME = "groups"
RESOURCE = "array"
READERS = ("gold", "silver")  # LUN 0 and LUN 1
WRITER_GROUP = "bulk"
VIEW_BEFORE_END_S = 10.0  # `santhrottle group list` this long before a phase's end
GROUP_FIELDS = (
    "latency_s",
    "throughput_bps",
    "iops",
    "y",
    "pwfte",
    "share",
    "demand",
    "delay_class",
    "overloaded",
    "members",
)
START_S = 120.0  # the bridge's set-up comes first in bridge mode


def groups(a: argparse.Namespace, t: dict, bulk_target: str | None) -> dict:
    ini = [x["initiator_ip"] for x in t["iscsi"]]
    return {
        "gold": {"members": [ini[0]], "latency_target": a.gold_target, "priority": a.gold_priority},
        "silver": {
            "members": [ini[1]],
            "latency_target": a.silver_target,
            "priority": a.silver_priority,
        },
        WRITER_GROUP: {
            "members": ini[2:],
            "priority": a.bulk_priority,
            "throughput_target": bulk_target or None,
        },
    }


def config(a: argparse.Namespace, t: dict, out: Path, bulk_target: str | None) -> dict:
    vols = [f"iscsi://{x['portal']}:{x['port']}/*/*" for x in t["iscsi"]]  # a portal each
    conf = bridge_config(t["bridge"], SOCK, out / "state")
    conf["resources"] = {RESOURCE: {"volumes": vols}}
    conf["groups"] = groups(a, t, bulk_target)
    return conf


def sampler(d: Daemon, writer_dms: list[str]) -> Sampler:
    """Every second: epoch time, the daemon's group rows, the plant's own counters, the
    writers' sectors written."""

    def group_rows() -> dict:
        st = d.status()
        return {g["group"]: {k: g[k] for k in GROUP_FIELDS} for g in st["groups"]}

    def written() -> int:
        ds = probes.all_diskstats()
        return sum(ds[x][WRITE_SECTORS] for x in writer_dms if x in ds)

    return Sampler(
        [
            Probe("epoch", time.time),
            Probe("groups", group_rows),
            Probe("array", probes.plant_stats),
            Probe("written_sectors", written),
        ],
        period_s=1.0,
    )


def stats(xs: list[float]) -> dict | None:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    q = statistics.quantiles(xs, n=20) if len(xs) > 1 else xs * 19
    return {
        "n": len(xs),
        "mean": statistics.fmean(xs),
        "median": statistics.median(xs),
        "p5": q[0],
        "p95": q[-1],
    }


def phase(a: argparse.Namespace, d: Daemon, t: dict, name: str, writers: bool, out: Path) -> dict:
    """Both readers (fio, rate-limited QD1 4 KiB) and, if asked, the writers, for
    a.seconds; the steady part (after a.warmup) summarised per group."""
    isc = t["iscsi"]
    w_jobs = []
    if writers:
        w_jobs = [
            fio.start(
                fio.argv(
                    "j",
                    x["device"],
                    "--rw=write",
                    f"--bs={a.writer_bs}",
                    f"--iodepth={a.writer_qd}",
                    runtime=a.seconds + 2,
                    size="200m",
                )
            )
            for x in isc[2:]
        ]
    s = sampler(d, [x["dm"] for x in isc[2:]])
    s.start()
    t0 = time.time()
    rds = {}
    for g, x in zip(READERS, isc[:2], strict=True):
        prefix = out / f"lat-{name}-{g}"
        rds[g] = fio.start(
            fio.argv(
                "j",
                x["device"],
                "--rw=randread",
                "--bs=4k",
                "--iodepth=1",
                f"--rate_iops={a.reader_iops}",
                f"--write_lat_log={prefix}",
                "--log_avg_msec=1000",
                "--log_unix_epoch=1",
                runtime=a.seconds,
                size="200m",
            )
        )
    time.sleep(max(0.0, t0 + a.seconds - VIEW_BEFORE_END_S - time.time()))
    # what an admin sees near the phase's end (docs/groups.md, "Measured in the lab")
    view = d.cli("group", "list")
    for j in rds.values():
        j.wait()
    s.stop()
    for w in w_jobs:
        w.wait()
    lo, hi = t0 + a.warmup, t0 + a.seconds
    steady = [r for r in s.rows if lo <= r["epoch"] <= hi]
    res: dict = {
        "phase": name,
        "writers": writers,
        "start_epoch": t0,
        "groups": {},
        "group_list": view.stdout or view.stderr,
    }
    for g in READERS:
        log = next(iter(sorted(out.glob(f"lat-{name}-{g}_clat*.log"))), None)
        fio_w = [v for e, v in (fio.lat_log(log) if log else []) if lo <= e <= hi]
        res["groups"][g] = {"fio_latency_s": stats(fio_w)}
    for g in (*READERS, WRITER_GROUP):
        rows = [r["groups"][g] for r in steady if g in (r.get("groups") or {})]
        res["groups"].setdefault(g, {}).update(
            {
                "wire_latency_s": stats([x["latency_s"] for x in rows]),
                "throughput_bps": stats([x["throughput_bps"] for x in rows]),
                "y": stats([x["y"] for x in rows]),
                "pwfte": stats([x["pwfte"] for x in rows]),
                "share": stats([x["share"] for x in rows]),
                "delay_class": stats([float(x["delay_class"]) for x in rows]),
                "overloaded": sum(1 for x in rows if x["overloaded"]),
            }
        )
    arr = [r["array"] for r in steady if r.get("array")]
    if len(arr) > 1:  # the plant's own mean IO latency and IOs in flight
        pd = analysis.plant_delta(arr[0], arr[-1]) or {}
        res["array"] = {"latency_s": pd.get("l_s"), "q": pd.get("q"), "iops": pd.get("iops")}
    written = [r for r in steady if "written_sectors" in r]
    if len(written) > 1:
        dt = written[-1]["epoch"] - written[0]["epoch"]
        nbytes = (written[-1]["written_sectors"] - written[0]["written_sectors"]) * SECTOR_BYTES
        res["groups"][WRITER_GROUP]["disk_write_bps"] = nbytes / dt if dt > 0 else None
    res["rows"] = s.rows
    return res


def show(r: dict) -> None:
    def ms(s):
        return f"{s['mean'] * 1e3:6.2f} (p95 {s['p95'] * 1e3:6.2f})" if s else "     -"

    arr = r.get("array") or {}
    print(
        f"phase {r['phase']}: the array {(arr.get('latency_s') or 0) * 1e3:.2f} ms, "
        f"Q {arr.get('q') or 0:.2f}\n{r['group_list']}",
        flush=True,
    )
    for g, v in r["groups"].items():
        mb = (v.get("disk_write_bps") or (v["throughput_bps"] or {}).get("mean") or 0) / 1e6
        print(
            f"  {g:<7} fio {ms(v.get('fio_latency_s'))} ms  wire {ms(v['wire_latency_s'])} ms"
            f"  {mb:6.2f} MB/s  pwfte {(v['pwfte'] or {}).get('mean', 0):5.2f}  class "
            f"{(v['delay_class'] or {}).get('mean', 0):5.1f}",
            flush=True,
        )


def run(a: argparse.Namespace, t: dict, out: Path) -> list[dict]:
    d = Daemon(NAME, config(a, t, out, None), out)
    d.start(START_S)
    topology.iscsi_login(t["iscsi"])  # through the running bridge: the wire names them
    results = []
    try:
        plan = [
            ("idle", False, "pause"),
            ("uncontrolled", True, None),
            ("controlled", True, "resume"),
        ]
        if a.bulk_target:
            plan.append(("overload", True, "reload"))
        for name, writers, cmd in plan:
            if cmd == "reload":
                d.write(config(a, t, out, a.bulk_target))
            if cmd:
                d.request(cmd, timeout_s=10.0)
            results.append(phase(a, d, t, name, writers, out))
            show(results[-1])
        (out / "status-end.json").write_text(json.dumps(d.status(timeout_s=10.0), indent=1))
    finally:
        d.stop()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=90.0, help="each phase")
    ap.add_argument("--warmup", type=float, default=30.0, help="left out of each phase")
    ap.add_argument("--reader-iops", type=int, default=25)
    ap.add_argument("--writer-bs", default="16k")
    ap.add_argument("--writer-qd", type=int, default=2)
    ap.add_argument("--gold-target", default="30ms")
    ap.add_argument("--gold-priority", type=float, default=2.0)
    ap.add_argument("--silver-target", default="40ms")
    ap.add_argument("--silver-priority", type=float, default=1.0)
    ap.add_argument("--bulk-priority", type=float, default=1.0)
    ap.add_argument("--bulk-target", default="1.2MB/s", help='"": no overload phase')
    ap.add_argument("--disk", default="array", choices=("array", "slow", "fast"))
    ap.add_argument("--out", default="/shared/work/groups")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if topology.status() is not None:
        topology.down()
    t = topology.up(luns=5, nvme=0, disk=a.disk, bridge=True, lv_size_mib=512, login=False)
    res: dict = {
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "disk": a.disk,
        "array": probes.plant_config(),
        "args": vars(a),
        "initiators": [x["initiator_ip"] for x in t["iscsi"]],
    }
    t_all = time.monotonic()
    try:
        res["phases"] = run(a, t, out)
    finally:
        res["guest_wall_s"] = time.monotonic() - t_all
        (out / "groups-lab.json").write_text(json.dumps(res, indent=1))
        topology.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
