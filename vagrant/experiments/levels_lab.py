#!/usr/bin/env python3
"""Elastic levels, utilization and metering in the lab (docs/levels.md). In the guest.

    python3 vagrant/qemu/lab.py --array nbd:c_ms=10,m_ms=10 run --timeout 2400 \\
        vagrant/experiments/levels_lab.py
    make lab-levels            # the same, then levels_compare.py on the host

The topology with a bridge (labkit.topology) on the known plant (the
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
                 wire), a target-host santhrottled's (diskstats io_ticks of the
                 VG's PV, started for this phase on the target's veth, delaying
                 nothing) and `iostat -x -y -t 1`'s %util of LUN 2's LV and of
                 its PV on the target, stamped; fio's end and runtime.

Results: OUT/levels-lab.json (default /shared/work/levels: the run dir's
work/levels on the host).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from labkit import fio, probes, speed, topology
from labkit.daemon import BIN, Daemon, bridge_config, poll_until, target_config
from labkit.sampler import Probe, Sampler

SOCK = "/run/santhrottle-exp/control.sock"
TARGET_SOCK = "/run/santhrottle-exp/target.sock"  # the utilization phase's target-host daemon
IOSTAT_MARGIN_S = 6.0  # iostat runs this much longer than fio: fio's start-up under TCG
NAME = "levels"
RESOURCE = "array"
TENANTS = ("tenant-a", "tenant-b")  # LUN 0 and LUN 1
LEVEL_FIELDS = ("level", "rate", "delay_class", "target_class", "promotions", "demotions")
START_S = 120.0  # the bridge's set-up comes first in bridge mode


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


def config(a: argparse.Namespace, t: dict, out: Path) -> dict:
    """Bridge mode, the wire read in Python (the sensor that measures utilization), one
    resource over the three portals, the two tenants' groups with their levels."""
    vols = [f"iscsi://{x['portal']}:{x['port']}/*/*" for x in t["iscsi"]]
    ini = [x["initiator_ip"] for x in t["iscsi"]]
    conf = bridge_config(t["bridge"], SOCK, out / "state")
    conf["bridge"]["sensor"] = "capture"
    conf["controller"] = {"promote_below_utilization": 1.0}
    conf["metering"] = {"price_per_iops_hour": a.price_per_iops_hour}
    conf["resources"] = {RESOURCE: {"volumes": vols, "threshold": a.threshold}}
    conf["groups"] = {
        g: {"members": [ip], "iops_levels": a.levels} for g, ip in zip(TENANTS, ini, strict=False)
    }
    return conf


def sampler(d: Daemon, target: Daemon | None = None) -> Sampler:
    """Every second: epoch time; the daemon's levels and the resource's utilization
    (and the target-host daemon's utilization, when there is one)."""

    def daemon_row() -> dict:
        st = d.status()
        return {
            "levels": {x["group"]: {k: x[k] for k in LEVEL_FIELDS} for x in st["levels"]},
            "utilization": {r["resource"]: r["utilization"] for r in st["resources"]},
        }

    probes_ = [Probe("epoch", time.time), Probe("daemon", daemon_row)]
    if target is not None:
        probes_.append(
            Probe(
                "target",
                lambda: {
                    "utilization": {
                        r["resource"]: r["utilization"] for r in target.status()["resources"]
                    }
                },
            )
        )
    return Sampler(probes_, period_s=1.0)


def job(dev: str, kind: str, n: int, secs: float) -> fio.Job:
    """4 KiB random reads: QD1 at n IOPS (rate), or at depth n (qd)."""
    opts = ["--iodepth=1", f"--rate_iops={n}"] if kind == "rate" else [f"--iodepth={n}"]
    return fio.start(
        fio.argv("j", dev, "--rw=randread", "--bs=4k", *opts, runtime=secs, size="200m")
    )


def tenant_jobs(dev: str, schedule: list[tuple[float, str, int]], out: Path, tag: str) -> None:
    """Run one tenant's schedule, segment after segment (in a thread)."""
    for k, (secs, kind, n) in enumerate(schedule):
        (out / f"fio-{tag}-{k}.json").write_text(job(dev, kind, n, secs).wait())


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


def phase_levels(d: Daemon, t: dict, a: argparse.Namespace, out: Path) -> dict:
    net0 = probes.nstat(t["netns"])
    s = sampler(d)
    s.start()
    t0, t1 = run_schedules(t, a, out, "levels")
    s.stop()
    net1 = probes.nstat(t["netns"])
    retrans = {k: net1[k] - net0.get(k, 0) for k in net1}
    return {"start_epoch": t0, "end_epoch": t1, "rows": s.rows, "target_retrans": retrans}


def phase_calibrate(d: Daemon, t: dict, a: argparse.Namespace) -> dict:
    """Both tenants at the burst's depth, undelayed (paused): their IOPS, fio's."""
    d.request("pause", timeout_s=10.0)
    jobs = {
        g: job(x["device"], "qd", a.burst_qd, a.calibrate_s)
        for g, x in zip(TENANTS, t["iscsi"], strict=False)
    }
    got = {g: j.result() for g, j in jobs.items()}
    d.request("resume", timeout_s=10.0)
    res = {}
    for g, r in got.items():
        with contextlib.suppress(KeyError, TypeError):
            res[g] = {"iops": r["read"]["iops"], "lat_mean_s": r["read"]["clat_ns"]["mean"] / 1e9}
    return res


def meter_file(out: Path) -> dict:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((out / "state" / "meter.json").read_text())
    return {}


def meter_totals(out: Path) -> dict:
    return meter_file(out).get("totals", {})


def phase_kill9(d: Daemon, t: dict, a: argparse.Namespace, out: Path) -> dict:
    """SIGKILL in a burst, a new daemon on the same state_dir."""
    burst = [(a.kill_burst_s, "qd", a.burst_qd)]
    th = threading.Thread(target=tenant_jobs, args=(t["iscsi"][0]["device"], burst, out, "kill"))
    th.start()
    time.sleep(a.kill_burst_s / 2)
    before = meter_totals(out)
    d.kill9()
    killed_at = time.time()
    on_disk = meter_totals(out)
    d.start(START_S)  # the same file and state_dir; its log goes on
    restarted = time.time()
    th.join()
    # the new daemon's meter writes from its first convergences on: wait for two
    _, waited = poll_until(
        lambda: (meter_file(out).get("saved_at") or 0.0) > restarted + 2.0, speed.budget(60.0)
    )
    after = meter_totals(out)
    report = subprocess.run(
        [str(BIN / "santhrottle"), "meter", "--json", "--config", str(d.conf)],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "before_kill": before,
        "on_disk_at_kill": on_disk,
        "after_restart": after,
        "killed_epoch": killed_at,
        "restarted_epoch": restarted,
        "meter_written_after_s": waited,
        "meter_report": report.stdout or report.stderr,
    }


def slaves(dm: str) -> list[str]:
    """The devices under a device-mapper device (its PVs), from sysfs."""
    with contextlib.suppress(OSError):
        return sorted(os.listdir(f"/sys/block/{dm}/slaves"))
    return []


def iostat_argv(devices: list[str], seconds: int) -> list[str]:
    """iostat -x's 1 s reports of `devices`, the first (since boot) left out (-y), each
    stamped (-t, ISO 8601 under S_TIME_FORMAT=ISO: iostat_env())."""
    return ["iostat", "-x", "-d", "-y", "-t", "-o", "JSON", *devices, "1", str(seconds)]


def iostat_env() -> dict:
    return {**os.environ, "S_TIME_FORMAT": "ISO"}


def iostat_reports(text: str) -> list[dict]:
    """[{"timestamp": ISO text, "util": {device: %util}}] from iostat's JSON."""
    out = []
    with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
        for x in json.loads(text)["sysstat"]["hosts"][0]["statistics"]:
            util = {d["disk_device"]: d["util"] for d in x["disk"]}
            out.append({"timestamp": x.get("timestamp"), "util": util})
    return out


def phase_utilization(d: Daemon, t: dict, a: argparse.Namespace, out: Path) -> list[dict]:
    """Per load on LUN 2: the bridge daemon's utilization (the wire), a target-host
    daemon's (diskstats io_ticks of the VG's PV: the product's own reading of the
    counter iostat reads; --threshold far above the plant, it delays nothing) and
    iostat -x of the LV and its PV, stamped; fio's report (its end and runtime: the
    load's window, levels_compare.py)."""
    probe = t["iscsi"][2]
    pvs = slaves(probe["dm"])
    tgt = Daemon(
        f"{NAME}-target",
        target_config(t, TARGET_SOCK, out / "state-target", threshold=a.threshold),
        out,
    )
    rows = []
    try:
        try:
            tgt.start()  # stopped again (with cleanup) below, whatever happens
            target: Daemon | None = tgt
        except RuntimeError as e:  # the bridge's comparison goes on without it
            print(f"utilization: no target-host daemon: {e}", flush=True)
            target = None
        for spec in a.util_loads.split(","):
            kind, n = spec.split("=")
            s = sampler(d, target)
            iostat = subprocess.Popen(
                iostat_argv([probe["dm"], *pvs], int(a.util_s + IOSTAT_MARGIN_S)),
                stdout=subprocess.PIPE,
                text=True,
                env=iostat_env(),
            )
            s.start()
            t0 = time.time()
            report = job(probe["device"], kind, int(n), a.util_s).wait()
            s.stop()
            io_out, _ = iostat.communicate()
            reports = iostat_reports(io_out)
            fio_job = {}
            with contextlib.suppress(ValueError, KeyError, IndexError):
                r = json.loads(report)
                fio_job = {"end_ms": r["timestamp_ms"], "runtime_ms": r["jobs"][0]["job_runtime"]}
            rows.append(
                {
                    "load": spec,
                    "start_epoch": t0,
                    "fio": fio_job,
                    "lv": probe["dm"],
                    "pvs": pvs,
                    "iostat": reports,
                    "iostat_util_pct": [x["util"].get(probe["dm"]) for x in reports],
                    "daemon": s.rows,
                }
            )
    finally:
        tgt.stop()
    return rows


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
        "array": probes.plant_config(),
        "args": vars(a),
        "initiators": [x["initiator_ip"] for x in t["iscsi"]],
    }
    t_all = time.monotonic()
    d = Daemon(NAME, config(a, t, out), out)
    try:
        d.start(START_S)
        topology.iscsi_login(t["iscsi"])  # through the running bridge: the wire names them
        res["calibrate"] = phase_calibrate(d, t, a)
        print(f"calibrate: {res['calibrate']}", flush=True)
        res["levels"] = phase_levels(d, t, a, out)
        print(f"levels: retransmissions {res['levels']['target_retrans']}", flush=True)
        res["kill9"] = phase_kill9(d, t, a, out)
        print(f"kill9: {json.dumps(res['kill9']['on_disk_at_kill'])[:200]}", flush=True)
        res["utilization"] = phase_utilization(d, t, a, out)
        (out / "status-end.json").write_text(json.dumps(d.status(timeout_s=10.0), indent=1))
    finally:
        res["guest_wall_s"] = time.monotonic() - t_all
        d.stop()
        (out / "levels-lab.json").write_text(json.dumps(res, indent=1))
        topology.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
