#!/usr/bin/env python3
"""Elastic levels, utilization and metering in the lab (docs/levels.md). In the guest.

    python3 vagrant/qemu/lab.py --array nbd:c_ms=10,m_ms=10 run --timeout 2400 \\
        vagrant/experiments/levels_lab.py
    make lab-levels            # the same, then levels_compare.py on the host

The topology with a bridge (labkit.topology) on the known plant (the
lab-array disk, L = C + m * Q), three iSCSI hosts on three LVs of one VG:
LUN 0 is the group "tenant-a", LUN 1 "tenant-b", both with IOPS levels
(--levels, lowest first); LUN 2 is a probe for the utilization phase.
santhrottled runs in bridge mode on lab-br with the wire read by --sensor
(bridge.sensor: "capture", in Python, the default; "kernel"; both measure
utilization), one resource (every volume), its threshold far above the
plant's latency and promote_below_utilization = 1 (the rates alone move the
levels).

The delays a level needs (hold_delays())
    With both gates off, a tenant climbs while its rate reaches its level's
    cap, undelayed (levels.py releases a rising group), and is held only at
    its top level: the delay d = q / cap - L - path (Little's law) at the
    plant's L with the holds in force. The emulated guest moves tens of IOs
    per second where an array moves thousands, and the levels are scaled
    down with it, but TCP's timers are not: a delay past ~55 ms gives
    spurious tail-loss probes in this guest, and near RTO_min (200 ms)
    timeouts. So the lab's levels and bursts keep every such delay under
    HOLD_DELAY_MAX_S, and a config that needs more is refused before the
    topology comes up. The defaults: levels 4 / 8 / 16 / 32, 1 per
    second between bursts at QD1; on C = m = 10 ms a burst alone is held at
    32 with 16.5 ms (17 ms in the simulator, 21-23 ms at a hold's start), two
    at once with 3.5 ms. The former 5 / 10 / 20 / 40 with bursts at QD4
    needed 83 ms (the simulator: 84 ms, 124-130 ms at a hold's start).

Phases
    calibrate    both tenants at their burst's depth, the daemon paused: what
                 they move undelayed (levels_compare.py's calibration of the
                 simulator's path).
    levels       first, both tenants back at level 0 and class 0 (the calibration
                 climbs them; the simulator starts at 0); then each tenant follows
                 its schedule (--schedule-a/-b: seconds at a depth, or at a low
                 rate: "20:rate=1,30:qd=1,..."): its level every second from the
                 daemon's status (stamped: when the read ended), the target's TCP
                 retransmissions (nstat) over the phase.
    kill9        santhrottled is killed with SIGKILL during a burst and started
                 again on the same state_dir: the meter's totals before and
                 after (meter.json), `santhrottle meter --json`.
    utilization  LUN 2 alone at --util-loads (fio at a rate, QD1; or QD n):
                 each second the daemon's utilization of the resource (the
                 wire), a target-host santhrottled's (diskstats io_ticks of the
                 VG's PV, started for this phase on the target's veth, delaying
                 nothing) and `iostat -x -y -t 1`'s %util of LUN 2's LV and of
                 its PV on the target, and of the initiator's disk (the time the
                 initiator had a command out: what the wire sees), stamped; fio's
                 end and runtime.

Results: OUT/levels-lab.json (default /shared/work/levels: the run dir's
work/levels on the host).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from labkit import fio, probes, speed, topology
from labkit.daemon import BIN, Daemon, bridge_config, not_answering, poll_until, target_config
from labkit.sampler import Probe, Sampler

from santhrottle.controller.levels import PROMOTE_AT_FRACTION
from santhrottle.sim.plant import Closed, Device, closed_latency

SOCK = "/run/santhrottle-exp/control.sock"
TARGET_SOCK = "/run/santhrottle-exp/target.sock"  # the utilization phase's target-host daemon
IOSTAT_MARGIN_S = 6.0  # iostat runs this much longer than fio: fio's start-up under TCG
NAME = "levels"
RESOURCE = "array"
TENANTS = ("tenant-a", "tenant-b")  # LUN 0 and LUN 1
LEVEL_FIELDS = ("level", "rate", "delay_class", "target_class", "promotions", "demotions")
START_S = 120.0  # the bridge's set-up comes first in bridge mode
# The largest delay a level may need held (hold_delays()): this guest's spurious tail-loss
# probes start at constant delays of ~55 ms (none at 26-54 ms), and the knob's delay at a
# hold's start overshoots the held one by up to 1.6x in the simulator (84 -> 130 ms,
# 17 -> 23 ms): 25 ms keeps that under 40 ms.
HOLD_DELAY_MAX_S = 0.025

Segment = tuple[float, str, int]  # (seconds, "rate" or "qd", n)


def parse_schedule(text: str) -> list[Segment]:
    """ "20:rate=1,30:qd=1" -> [(20.0, "rate", 1), (30.0, "qd", 1)]."""
    out = []
    for part in text.split(","):
        secs, what = part.split(":")
        kind, n = what.split("=")
        if kind not in ("rate", "qd"):
            raise SystemExit(f"schedule: {part!r}: rate=N or qd=N")
        out.append((float(secs), kind, int(n)))
    return out


def load_name(load: tuple[str, int] | None) -> str:
    return "idle" if load is None else f"{load[0]}={load[1]}"


def hold_delays(
    levels: list[float],
    loads: tuple[list[tuple[str, int]], list[tuple[str, int]]],
    c_s: float,
    m_s: float,
    path_s: float = 0.0,
) -> list[dict]:
    """Per pair of loads the two tenants may run at once (each of one's with each of the
    other's, or with the other idle): each tenant's level and the delay that holds it
    there. A load is ("qd", n): n IOs in flight, or ("rate", n): one, at most n per
    second. Its rate undelayed (the plant L = C + m Q with the others', path_s outside
    it: the simulator's closed_latency) climbs it while it reaches PROMOTE_AT_FRACTION
    of its level's cap (both gates are off: a rising group is released); held at its top
    level only, where d = q / cap - L - path, L the plant's with the holds in force.
    path_s = 0 gives the largest d: the lab's own path per IO only shortens it."""
    dev = Device(c_s, m_s)
    top = len(levels) - 1
    firsts, seconds = (sorted(set(x)) for x in loads)
    out = []
    for pair in itertools.product([*firsts, None], [*seconds, None]):
        on = [(i, x) for i, x in enumerate(pair) if x is not None]
        if not on:
            continue
        depth = [n if kind == "qd" else 1 for _, (kind, n) in on]
        fio_cap = [float(n) if kind == "rate" else 0.0 for _, (kind, n) in on]
        streams = [Closed(q, path_s, c) for q, c in zip(depth, fio_cap, strict=True)]
        _, rates = closed_latency(dev, 0.0, streams)
        held = []
        for r, c in zip(rates, fio_cap, strict=True):
            k = 0
            while k < top and r >= PROMOTE_AT_FRACTION * levels[k]:
                k += 1
            # at its top and at its cap; one that fio caps under it needs no delay
            holds = k == top and r >= PROMOTE_AT_FRACTION * levels[k]
            held.append((k, holds and not (c and c <= levels[k])))
        capped = [
            Closed(q, path_s, levels[k] if h else c)
            for q, c, (k, h) in zip(depth, fio_cap, held, strict=True)
        ]
        lat, rates = closed_latency(dev, 0.0, capped)
        for (i, _), q, (k, h), r in zip(on, depth, held, rates, strict=True):
            out.append(
                {
                    "loads": [load_name(x) for x in pair],
                    "tenant": TENANTS[i],
                    "level": k,
                    "held": h,
                    "delay_s": max(0.0, q / r - lat - path_s) if h else 0.0,
                }
            )
    return out


def run_loads(a: argparse.Namespace) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Each tenant's loads: its schedule's segments (tenant-a's also the kill -9 burst)."""
    first = [(kind, n) for _, kind, n in a.schedule_a] + [("qd", a.burst_qd)]
    return first, [(kind, n) for _, kind, n in a.schedule_b]


def check_hold_delays(a: argparse.Namespace, plant: dict | None) -> list[dict]:
    """hold_delays() of the run's levels and loads on its plant, path 0; SystemExit
    naming the largest if it is over --hold-delay-max-ms. Without a known plant (a disk
    other than the lab's array): nothing to check."""
    if not plant:
        return []
    got = hold_delays(a.levels, run_loads(a), plant["c_ms"] / 1e3, plant["m_ms"] / 1e3)
    worst = max(got, key=lambda x: x["delay_s"])
    if worst["delay_s"] * 1e3 > a.hold_delay_max_ms:
        i = TENANTS.index(worst["tenant"])
        mine, theirs, other = worst["loads"][i], worst["loads"][1 - i], TENANTS[1 - i]
        raise SystemExit(
            f"levels {a.levels} on C {plant['c_ms']:g} ms, m {plant['m_ms']:g} ms: "
            f"{worst['tenant']} at {mine} ({other} {theirs}) is held at "
            f"{a.levels[worst['level']]:g} IOPS by {worst['delay_s'] * 1e3:.1f} ms, over "
            f"--hold-delay-max-ms {a.hold_delay_max_ms:g} (TCP's timers in this guest, "
            "docs/levels.md 'In the lab'): lower the bursts' depth or raise the top level"
        )
    return got


def config(a: argparse.Namespace, t: dict, out: Path) -> dict:
    """Bridge mode, the wire read by --sensor, one resource over the three portals, the
    two tenants' groups with their levels."""
    vols = [f"iscsi://{x['portal']}:{x['port']}/*/*" for x in t["iscsi"]]
    ini = [x["initiator_ip"] for x in t["iscsi"]]
    conf = bridge_config(t["bridge"], SOCK, out / "state")
    conf["bridge"]["sensor"] = a.sensor
    conf["controller"] = {"promote_below_utilization": 1.0}
    conf["metering"] = {"price_per_iops_hour": a.price_per_iops_hour}
    conf["resources"] = {RESOURCE: {"volumes": vols, "threshold": a.threshold}}
    conf["groups"] = {
        g: {"members": [ip], "iops_levels": a.levels} for g, ip in zip(TENANTS, ini, strict=False)
    }
    return conf


def sampler(d: Daemon, target: Daemon | None = None) -> Sampler:
    """Every second: epoch time; the daemon's levels, the resource's utilization and its
    sensor's convergences so far (and the target-host daemon's utilization, when there
    is one)."""

    def daemon_row() -> dict:
        st = d.status()
        return {
            "levels": {x["group"]: {k: x[k] for k in LEVEL_FIELDS} for x in st["levels"]},
            "utilization": {r["resource"]: r["utilization"] for r in st["resources"]},
            "converges": st.get("counters", {}).get("converges"),  # levels_compare.py
        }

    probes_ = [Probe("epoch", time.time), Probe("daemon", daemon_row, stamped=True)]
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


def tenant_jobs(dev: str, schedule: list[Segment], out: Path, tag: str) -> None:
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


def at_level_zero(d: Daemon) -> bool:
    """Both tenants at level 0 and class 0 (a group the daemon has not seen is)."""
    try:
        got = {x["group"]: x for x in d.status()["levels"]}
    except not_answering():
        return False
    return all(got.get(g, {}).get("level", 0) == 0 for g in TENANTS) and all(
        not got.get(g, {}).get("delay_class") for g in TENANTS
    )


def phase_levels(d: Daemon, t: dict, a: argparse.Namespace, out: Path) -> dict:
    """Once both tenants are back at level 0 (the simulator starts there), the schedules."""
    _, settled = poll_until(lambda: at_level_zero(d), speed.budget(90.0), step_s=1.0)
    print(f"levels: back at level 0 after {settled} s", flush=True)
    net0 = probes.nstat(t["netns"])
    s = sampler(d)
    s.start()
    t0, t1 = run_schedules(t, a, out, "levels")
    s.stop()
    net1 = probes.nstat(t["netns"])
    retrans = {k: net1[k] - net0.get(k, 0) for k in net1}
    return {
        "settled_s": settled,
        "start_epoch": t0,
        "end_epoch": t1,
        "rows": s.rows,
        "target_retrans": retrans,
    }


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
    disk = Path(probe["device"]).name  # the initiator's own disk: what the wire sees
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
                iostat_argv([probe["dm"], *pvs, disk], int(a.util_s + IOSTAT_MARGIN_S)),
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
                    "initiator_disk": disk,
                    "iostat": reports,
                    "iostat_util_pct": [x["util"].get(probe["dm"]) for x in reports],
                    "daemon": s.rows,
                }
            )
    finally:
        tgt.stop()
    return rows


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--levels", type=lambda s: [float(x) for x in s.split(",")], default=[4.0, 8.0, 16.0, 32.0]
    )
    ap.add_argument(
        "--schedule-a",
        type=parse_schedule,
        default=parse_schedule("20:rate=1,30:qd=1,30:rate=1,20:qd=1,20:rate=1"),
    )
    ap.add_argument(
        "--schedule-b",
        type=parse_schedule,
        default=parse_schedule("35:rate=1,30:qd=1,35:rate=1,20:qd=1"),
    )
    ap.add_argument("--burst-qd", type=int, default=1, help="the calibration's and kill -9's")
    ap.add_argument(
        "--hold-delay-max-ms",
        type=float,
        default=HOLD_DELAY_MAX_S * 1e3,
        help="refuse levels and loads that need a longer delay held (hold_delays())",
    )
    ap.add_argument("--sensor", default="capture", choices=("capture", "kernel"))
    ap.add_argument("--calibrate-s", type=float, default=20.0)
    ap.add_argument("--kill-burst-s", type=float, default=20.0)
    ap.add_argument("--threshold", default="1s", help="far above the plant: no latency gate")
    ap.add_argument("--price-per-iops-hour", type=float, default=0.0001)
    ap.add_argument("--util-loads", default="rate=5,rate=20,rate=40,qd=2")
    ap.add_argument("--util-s", type=float, default=20.0)
    ap.add_argument("--disk", default="array", choices=("array", "slow", "fast"))
    ap.add_argument("--out", default="/shared/work/levels")
    return ap


def main() -> int:
    a = parser().parse_args()
    plant = probes.plant_config()
    holds = check_hold_delays(a, plant if a.disk == "array" else None)  # before anything
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if topology.status() is not None:
        topology.down()
    t = topology.up(luns=3, nvme=0, disk=a.disk, bridge=True, lv_size_mib=512, login=False)
    res: dict = {
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "disk": a.disk,
        "array": plant,
        "args": vars(a),
        "hold_delays": holds,
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
