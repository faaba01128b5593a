#!/usr/bin/env python3
"""Initiator groups in the lab: two reader groups beside the writers. In the guest.

    python3 vagrant/qemu/lab.py --array nbd:c_ms=10,m_ms=5 run --timeout 2400 \\
        vagrant/experiments/groups_lab.py [--seconds 90]
    make lab-groups            # the same, then groups_compare.py on the host

(docs/groups.md, "In the lab".)  The topology with a bridge (topology.py
--bridge) on the known plant (the lab-array disk, L = C + m * Q), five iSCSI
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
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bridge_lab  # noqa: E402
import closed_loop  # noqa: E402
import plant_lab  # noqa: E402
import topology  # noqa: E402  (closed_loop put vagrant/qemu/guest on the path)

SOCK = closed_loop.SOCK
NAME = "groups"
RESOURCE = "array"
READERS = ("gold", "silver")  # LUN 0 and LUN 1
WRITER_GROUP = "bulk"
SECTOR_BYTES = 512
# lab.py --array nbd's plant writes its cumulative counters here (vagrant/qemu/lqarray.py)
ARRAY_STATS = Path("/shared/work/array-stats.json")
VIEW_BEFORE_END_S = 10.0  # `santhrottle group list` this long before a phase's end
DS_SECTORS_WRITTEN = 6  # closed_loop.diskstats() fields


def groups_toml(a: argparse.Namespace, t: dict, bulk_target: str | None) -> str:
    ini = [x["initiator_ip"] for x in t["iscsi"]]
    bulk = f'throughput_target = "{bulk_target}"\n' if bulk_target else ""
    return (
        f'[groups.gold]\nmembers = ["{ini[0]}"]\nlatency_target = "{a.gold_target}"\n'
        f"priority = {a.gold_priority}\n"
        f'[groups.silver]\nmembers = ["{ini[1]}"]\nlatency_target = "{a.silver_target}"\n'
        f"priority = {a.silver_priority}\n"
        f"[groups.{WRITER_GROUP}]\nmembers = {json.dumps(ini[2:])}\n"
        f"priority = {a.bulk_priority}\n{bulk}"
    )


def daemon_config(a: argparse.Namespace, t: dict, out: Path, bulk_target: str | None) -> Path:
    b = t["bridge"]
    vols = [f"iscsi://{x['portal']}:{x['port']}/*/*" for x in t["iscsi"]]  # a portal each
    conf = out / f"santhrottle-{NAME}.toml"  # closed_loop.stop_daemon's name for it
    conf.write_text(
        f'[daemon]\nmode = "bridge"\ncontrol_socket = "{SOCK}"\nnetns = "{b["netns"]}"\n'
        f'state_dir = "{out / "state"}"\n'
        f'[bridge]\nname = "{b["name"]}"\ninitiator_port = "{b["initiator_port"]}"\n'
        f'array_port = "{b["array_port"]}"\n'
        f'[datapath]\nlink_speed = "10gbit"\n[metrics]\nport = 0\n'
        f"[resources.{RESOURCE}]\nvolumes = {json.dumps(vols)}\n" + groups_toml(a, t, bulk_target)
    )
    return conf


class Sampler(threading.Thread):
    """Every second: epoch time, the daemon's group rows, the writers' sectors written."""

    def __init__(self, writer_dms: list[str]) -> None:
        super().__init__(daemon=True)
        self.writer_dms = writer_dms
        self.rows: list[dict] = []
        self.stop_ev = threading.Event()

    def run(self) -> None:
        from santhrottle.appliance.daemon.control import request

        nxt = time.monotonic()
        while not self.stop_ev.is_set():
            row: dict = {"epoch": time.time()}
            try:
                st = request(SOCK, "status", timeout_s=2.0)
                row["groups"] = {g["group"]: {k: g[k] for k in (
                    "latency_s", "throughput_bps", "iops", "y", "pwfte", "share", "demand",
                    "delay_class", "overloaded", "members")} for g in st["groups"]}  # fmt: skip
            except Exception as e:  # keep sampling; record why
                row["error"] = str(e)
            with contextlib.suppress(OSError, ValueError):  # the known plant's own counters
                a = json.loads(ARRAY_STATS.read_text())
                row["array"] = (a["t"], a["ios"], a["lat_sum_s"], a["inflight_s"])
            ds = closed_loop.diskstats()
            row["written_sectors"] = sum(ds[d][DS_SECTORS_WRITTEN] for d in self.writer_dms
                                         if d in ds)  # fmt: skip
            self.rows.append(row)
            nxt += 1.0
            self.stop_ev.wait(max(0.0, nxt - time.monotonic()))


def stats(xs: list[float]) -> dict | None:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    q = statistics.quantiles(xs, n=20) if len(xs) > 1 else xs * 19
    return {"n": len(xs), "mean": statistics.fmean(xs), "median": statistics.median(xs),
            "p5": q[0], "p95": q[-1]}  # fmt: skip


def phase(a: argparse.Namespace, t: dict, name: str, writers: bool, out: Path) -> dict:
    """Both readers (fio, rate-limited QD1 4 KiB) and, if asked, the writers, for
    a.seconds; the steady part (after a.warmup) summarised per group."""
    isc = t["iscsi"]
    w_jobs = []
    if writers:
        w_jobs = [closed_loop.fio(x["device"], "--rw=write", f"--bs={a.writer_bs}",
                                  f"--iodepth={a.writer_qd}", runtime=a.seconds + 2)
                  for x in isc[2:]]  # fmt: skip
    sampler = Sampler([x["dm"] for x in isc[2:]])
    sampler.start()
    t0 = time.time()
    rds = {}
    for g, x in zip(READERS, isc[:2], strict=True):
        prefix = out / f"lat-{name}-{g}"
        rds[g] = closed_loop.fio(
            x["device"], "--rw=randread", "--bs=4k", "--iodepth=1",
            f"--rate_iops={a.reader_iops}", f"--write_lat_log={prefix}", "--log_avg_msec=1000",
            "--log_unix_epoch=1", runtime=a.seconds,
        )  # fmt: skip
    time.sleep(max(0.0, t0 + a.seconds - VIEW_BEFORE_END_S - time.time()))
    # what an admin sees near the phase's end (docs/groups.md, "Measured in the lab")
    view = subprocess.run([str(closed_loop.BIN / "santhrottle"), "group", "list", "--socket",
                           SOCK], capture_output=True, text=True, check=False)  # fmt: skip
    for p in rds.values():
        p.communicate()
    sampler.stop_ev.set()
    sampler.join()
    for w in w_jobs:
        w.communicate()
    lo, hi = t0 + a.warmup, t0 + a.seconds
    steady = [r for r in sampler.rows if lo <= r["epoch"] <= hi]
    res: dict = {"phase": name, "writers": writers, "start_epoch": t0, "groups": {},
                 "group_list": view.stdout or view.stderr}  # fmt: skip
    for g in READERS:
        log = next(iter(sorted(out.glob(f"lat-{name}-{g}_clat*.log"))), None)
        fio_w = [v for e, v in (bridge_lab.fio_log(log) if log else []) if lo <= e <= hi]
        res["groups"][g] = {"fio_latency_s": stats(fio_w)}
    for g in (*READERS, WRITER_GROUP):
        rows = [r["groups"][g] for r in steady if g in r.get("groups", {})]
        res["groups"].setdefault(g, {}).update({
            "wire_latency_s": stats([x["latency_s"] for x in rows]),
            "throughput_bps": stats([x["throughput_bps"] for x in rows]),
            "y": stats([x["y"] for x in rows]),
            "pwfte": stats([x["pwfte"] for x in rows]),
            "share": stats([x["share"] for x in rows]),
            "delay_class": stats([float(x["delay_class"]) for x in rows]),
            "overloaded": sum(1 for x in rows if x["overloaded"]),
        })  # fmt: skip
    arr = [r["array"] for r in steady if "array" in r]
    if len(arr) > 1:  # the plant's own mean IO latency and IOs in flight
        (t0_, n0, l0, q0), (t1_, n1, l1, q1) = arr[0], arr[-1]
        res["array"] = {"latency_s": (l1 - l0) / (n1 - n0) if n1 > n0 else None,
                        "q": (q1 - q0) / (t1_ - t0_) if t1_ > t0_ else None,
                        "iops": (n1 - n0) / (t1_ - t0_) if t1_ > t0_ else None}  # fmt: skip
    if len(steady) > 1:
        dt = steady[-1]["epoch"] - steady[0]["epoch"]
        nbytes = (steady[-1]["written_sectors"] - steady[0]["written_sectors"]) * SECTOR_BYTES
        res["groups"][WRITER_GROUP]["disk_write_bps"] = nbytes / dt if dt > 0 else None
    res["rows"] = sampler.rows
    return res


def show(r: dict) -> None:
    def ms(s):
        return f"{s['mean'] * 1e3:6.2f} (p95 {s['p95'] * 1e3:6.2f})" if s else "     -"

    arr = r.get("array") or {}
    print(f"phase {r['phase']}: the array {(arr.get('latency_s') or 0) * 1e3:.2f} ms, "
          f"Q {arr.get('q') or 0:.2f}\n{r['group_list']}", flush=True)  # fmt: skip
    for g, v in r["groups"].items():
        mb = (v.get("disk_write_bps") or (v["throughput_bps"] or {}).get("mean") or 0) / 1e6
        print(f"  {g:<7} fio {ms(v.get('fio_latency_s'))} ms  wire {ms(v['wire_latency_s'])} ms"
              f"  {mb:6.2f} MB/s  pwfte {(v['pwfte'] or {}).get('mean', 0):5.2f}  class "
              f"{(v['delay_class'] or {}).get('mean', 0):5.1f}", flush=True)  # fmt: skip


def request(cmd: str) -> dict:
    from santhrottle.appliance.daemon.control import request as req

    return req(SOCK, cmd, timeout_s=10.0)


def run(a: argparse.Namespace, t: dict, out: Path) -> list[dict]:
    conf = daemon_config(a, t, out, None)
    # the bridge's set-up comes first in bridge mode: a longer start than the target's
    daemon = closed_loop.launch_daemon(conf, out / f"santhrottled-{NAME}.log", timeout_s=120.0)
    closed_loop.first_status(SOCK)
    topology.iscsi_login(t["iscsi"])  # through the running bridge: the wire names them
    results = []
    try:
        plan = [("idle", False, "pause"), ("uncontrolled", True, None),
                ("controlled", True, "resume")]  # fmt: skip
        if a.bulk_target:
            plan.append(("overload", True, "reload"))
        for name, writers, cmd in plan:
            if cmd == "reload":
                daemon_config(a, t, out, a.bulk_target)
            if cmd:
                request(cmd)
            results.append(phase(a, t, name, writers, out))
            show(results[-1])
        (out / "status-end.json").write_text(json.dumps(request("status"), indent=1))
    finally:
        closed_loop.stop_daemon(daemon, out, NAME)
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
    res: dict = {"kernel": os.uname().release, "cpus": os.cpu_count(), "disk": a.disk,
                 "array": plant_lab.array_config(), "args": vars(a),
                 "initiators": [x["initiator_ip"] for x in t["iscsi"]]}  # fmt: skip
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
