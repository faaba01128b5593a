#!/usr/bin/env python3
"""Elastic levels, utilization and metering in the lab (docs/levels.md). In the guest.

    python3 vagrant/qemu/lab.py --array nbd:c_ms=10,m_ms=10 run --timeout 2400 \\
        vagrant/experiments/levels_lab.py
    make lab-levels            # the same, then levels_compare.py on the host

The topology with a bridge (topology.py --bridge) on the known plant (the
lab-array disk, L = C + m * Q), three iSCSI hosts on three LVs of one VG:
LUN 0 is the group "tenant-a", LUN 1 "tenant-b", both with IOPS levels
(--levels, lowest first); LUN 2 is a probe for the utilization phase.
santhrottled runs in bridge mode on lab-br with the wire read in Python
(bridge.sensor = "capture": the sensor that measures utilization), one
resource (every volume), its threshold far above the plant's latency and
promote_below_utilization = 1 (the rates alone move the levels).

Phases
    calibrate    both tenants at their burst's depth, the daemon paused: what
                 they move undelayed (levels_compare.py's calibration of the
                 simulator's path).
    levels       each tenant follows its schedule (--schedule-a/-b: seconds at
                 a depth, or at a low rate: "20:rate=2,30:qd=4,..."): its level
                 every second from the daemon's status, the target's TCP
                 retransmissions (nstat) over the phase.
    kill9        santhrottled is killed with SIGKILL during a burst and started
                 again on the same state_dir: the meter's totals before and
                 after (meter.json), `santhrottle meter --json`.
    utilization  LUN 2 alone at --util-loads (fio at a rate, QD1; or QD n):
                 each second the daemon's utilization of the resource (the
                 wire) and `iostat -x 1`'s %util of LUN 2's LV on the target.

Results: OUT/levels-lab.json (default /shared/work/levels: the run dir's
work/levels on the host).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import closed_loop  # noqa: E402
import plant_lab  # noqa: E402
import topology  # noqa: E402  (closed_loop put vagrant/qemu/guest on the path)

SOCK = closed_loop.SOCK
NAME = "levels"
RESOURCE = "array"
TENANTS = ("tenant-a", "tenant-b")  # LUN 0 and LUN 1


def parse_schedule(text: str) -> list[tuple[float, str, int]]:
    """ "20:rate=2,30:qd=4" -> [(20.0, "rate", 2), (30.0, "qd", 4)]."""
    out = []
    for part in text.split(","):
        secs, what = part.split(":")
        kind, n = what.split("=")
        if kind not in ("rate", "qd"):
            raise SystemExit(f"schedule: {part!r}: rate=N or qd=N")
        out.append((float(secs), kind, int(n)))
    return out


def daemon_config(a: argparse.Namespace, t: dict, out: Path) -> Path:
    b = t["bridge"]
    vols = [f"iscsi://{x['portal']}:{x['port']}/*/*" for x in t["iscsi"]]
    ini = [x["initiator_ip"] for x in t["iscsi"]]
    conf = out / f"santhrottle-{NAME}.toml"
    conf.write_text(
        f'[daemon]\nmode = "bridge"\ncontrol_socket = "{SOCK}"\nnetns = "{b["netns"]}"\n'
        f'state_dir = "{out / "state"}"\n'
        f'[bridge]\nname = "{b["name"]}"\ninitiator_port = "{b["initiator_port"]}"\n'
        f'array_port = "{b["array_port"]}"\nsensor = "capture"\n'
        f'[datapath]\nlink_speed = "10gbit"\n[metrics]\nport = 0\n'
        f"[controller]\npromote_below_utilization = 1.0\n"
        f"[metering]\nprice_per_iops_hour = {a.price_per_iops_hour}\n"
        f'[resources.{RESOURCE}]\nvolumes = {json.dumps(vols)}\nthreshold = "{a.threshold}"\n'
        + "".join(
            f'[groups.{g}]\nmembers = ["{ip}"]\niops_levels = {json.dumps(a.levels)}\n'
            for g, ip in zip(TENANTS, ini, strict=False)
        )
    )
    return conf


class Sampler(threading.Thread):
    """Every second: epoch time, the daemon's levels and the resource's utilization."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.rows: list[dict] = []
        self.stop_ev = threading.Event()

    def run(self) -> None:
        from santhrottle.appliance.daemon.control import request

        nxt = time.monotonic()
        while not self.stop_ev.is_set():
            row: dict = {"epoch": time.time()}
            try:
                st = request(SOCK, "status", timeout_s=2.0)
                row["levels"] = {
                    x["group"]: {
                        k: x[k]
                        for k in (
                            "level",
                            "rate",
                            "delay_class",
                            "target_class",
                            "promotions",
                            "demotions",
                        )
                    }
                    for x in st["levels"]
                }
                row["utilization"] = {r["resource"]: r["utilization"] for r in st["resources"]}
            except Exception as e:  # keep sampling; record why
                row["error"] = str(e)
            self.rows.append(row)
            nxt += 1.0
            self.stop_ev.wait(max(0.0, nxt - time.monotonic()))


def tenant_jobs(dev: str, schedule: list[tuple[float, str, int]], out: Path, tag: str) -> None:
    """Run one tenant's schedule, segment after segment (in a thread)."""
    for k, (secs, kind, n) in enumerate(schedule):
        job = ["--rw=randread", "--bs=4k"]
        job += ["--iodepth=1", f"--rate_iops={n}"] if kind == "rate" else [f"--iodepth={n}"]
        got, _ = closed_loop.fio(dev, *job, runtime=secs).communicate()
        (out / f"fio-{tag}-{k}.json").write_text(got or "")


def run_schedules(t: dict, a: argparse.Namespace, out: Path, tag: str) -> tuple[float, float]:
    threads = [
        threading.Thread(target=tenant_jobs, args=(x["device"], s, out, f"{tag}-{g}"))
        for g, x, s in zip(TENANTS, t["iscsi"], (a.schedule_a, a.schedule_b), strict=False)
    ]
    t0 = time.time()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return t0, time.time()


def phase_levels(t: dict, a: argparse.Namespace, out: Path) -> dict:
    net0 = closed_loop.nstat(t["netns"])
    sampler = Sampler()
    sampler.start()
    t0, t1 = run_schedules(t, a, out, "levels")
    sampler.stop_ev.set()
    sampler.join()
    net1 = closed_loop.nstat(t["netns"])
    retrans = {k: net1.get(k, 0) - net0.get(k, 0) for k in net1 if "Retrans" in k}
    return {"start_epoch": t0, "end_epoch": t1, "rows": sampler.rows, "target_retrans": retrans}


def phase_calibrate(t: dict, a: argparse.Namespace, out: Path) -> dict:
    """Both tenants at the burst's depth, undelayed (paused): their IOPS, fio's."""
    request("pause")
    ps = {
        g: closed_loop.fio(
            x["device"],
            "--rw=randread",
            "--bs=4k",
            f"--iodepth={a.burst_qd}",
            runtime=a.calibrate_s,
        )
        for g, x in zip(TENANTS, t["iscsi"], strict=False)
    }
    got = {g: p.communicate()[0] for g, p in ps.items()}
    request("resume")
    res = {}
    for g, text in got.items():
        with contextlib.suppress(ValueError, KeyError, IndexError):
            job = json.loads(text)["jobs"][0]["read"]
            res[g] = {"iops": job["iops"], "lat_mean_s": job["clat_ns"]["mean"] / 1e9}
    return res


def meter_totals(out: Path) -> dict:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((out / "state" / "meter.json").read_text())["totals"]
    return {}


def phase_kill9(
    t: dict, a: argparse.Namespace, out: Path, daemon: subprocess.Popen, conf: Path
) -> tuple[dict, subprocess.Popen]:
    """SIGKILL in a burst, a new daemon on the same state_dir."""
    burst = [(a.kill_burst_s, "qd", a.burst_qd)]
    th = threading.Thread(target=tenant_jobs, args=(t["iscsi"][0]["device"], burst, out, "kill"))
    th.start()
    time.sleep(a.kill_burst_s / 2)
    before = meter_totals(out)
    os.kill(daemon.pid, signal.SIGKILL)
    daemon.wait()
    killed_at = time.time()
    on_disk = meter_totals(out)
    daemon = closed_loop.launch_daemon(conf, out / f"santhrottled-{NAME}-2.log", timeout_s=120.0)
    closed_loop.first_status(SOCK)
    th.join()
    time.sleep(3.0)
    after = meter_totals(out)
    report = subprocess.run(
        [str(closed_loop.BIN / "santhrottle"), "meter", "--json", "--config", str(conf)],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "before_kill": before,
        "on_disk_at_kill": on_disk,
        "after_restart": after,
        "killed_epoch": killed_at,
        "meter_report": report.stdout or report.stderr,
    }, daemon


def phase_utilization(t: dict, a: argparse.Namespace, out: Path) -> list[dict]:
    probe = t["iscsi"][2]
    dm = probe["dm"]
    rows = []
    for spec in a.util_loads.split(","):
        kind, n = spec.split("=")
        job = ["--rw=randread", "--bs=4k"]
        job += ["--iodepth=1", f"--rate_iops={n}"] if kind == "rate" else [f"--iodepth={n}"]
        sampler = Sampler()
        iostat = subprocess.Popen(
            ["iostat", "-x", "-d", "-o", "JSON", dm, "1", str(int(a.util_s))],
            stdout=subprocess.PIPE,
            text=True,
        )
        sampler.start()
        t0 = time.time()
        p = closed_loop.fio(probe["device"], *job, runtime=a.util_s)
        p.communicate()
        sampler.stop_ev.set()
        sampler.join()
        io_out, _ = iostat.communicate()
        util = []
        with contextlib.suppress(ValueError, KeyError, IndexError):
            stats = json.loads(io_out)["sysstat"]["hosts"][0]["statistics"]
            util = [s["disk"][0]["util"] for s in stats]
        rows.append(
            {"load": spec, "start_epoch": t0, "iostat_util_pct": util, "daemon": sampler.rows}
        )
    return rows


def request(cmd: str) -> dict:
    from santhrottle.appliance.daemon.control import request as req

    return req(SOCK, cmd, timeout_s=10.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--levels", type=lambda s: [float(x) for x in s.split(",")], default=[5.0, 10.0, 20.0, 40.0]
    )
    ap.add_argument(
        "--schedule-a",
        type=parse_schedule,
        default=parse_schedule("20:rate=2,30:qd=4,30:rate=2,20:qd=4,20:rate=2"),
    )
    ap.add_argument(
        "--schedule-b",
        type=parse_schedule,
        default=parse_schedule("35:rate=2,30:qd=4,35:rate=2,20:qd=4"),
    )
    ap.add_argument("--burst-qd", type=int, default=4)
    ap.add_argument("--calibrate-s", type=float, default=20.0)
    ap.add_argument("--kill-burst-s", type=float, default=20.0)
    ap.add_argument("--threshold", default="1s", help="far above the plant: no latency gate")
    ap.add_argument("--price-per-iops-hour", type=float, default=0.0001)
    ap.add_argument("--util-loads", default="rate=5,rate=20,rate=40,qd=2")
    ap.add_argument("--util-s", type=float, default=20.0)
    ap.add_argument("--disk", default="array", choices=("array", "slow", "fast"))
    ap.add_argument("--out", default="/shared/work/levels")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if topology.status() is not None:
        topology.down()
    t = topology.up(luns=3, nvme=0, disk=a.disk, bridge=True, lv_size_mib=512, login=False)
    res: dict = {
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "disk": a.disk,
        "array": plant_lab.array_config(),
        "args": {k: v for k, v in vars(a).items()},
        "initiators": [x["initiator_ip"] for x in t["iscsi"]],
    }
    t_all = time.monotonic()
    conf = daemon_config(a, t, out)
    daemon = closed_loop.launch_daemon(conf, out / f"santhrottled-{NAME}.log", timeout_s=120.0)
    try:
        closed_loop.first_status(SOCK)
        topology.iscsi_login(t["iscsi"])  # through the running bridge: the wire names them
        res["calibrate"] = phase_calibrate(t, a, out)
        print(f"calibrate: {res['calibrate']}", flush=True)
        res["levels"] = phase_levels(t, a, out)
        print(f"levels: retransmissions {res['levels']['target_retrans']}", flush=True)
        res["kill9"], daemon = phase_kill9(t, a, out, daemon, conf)
        print(f"kill9: {json.dumps(res['kill9']['on_disk_at_kill'])[:200]}", flush=True)
        res["utilization"] = phase_utilization(t, a, out)
        (out / "status-end.json").write_text(json.dumps(request("status"), indent=1))
    finally:
        res["guest_wall_s"] = time.monotonic() - t_all
        closed_loop.stop_daemon(daemon, out, NAME)
        (out / "levels-lab.json").write_text(json.dumps(res, indent=1))
        topology.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
