"""The fault campaign inside the lab guest: the load, the daemon, the repetitions (faults.py).

What it owns
    The closed loop's load as the lab's closed-loop experiment runs it
    (vagrant/experiments/closed_loop.py: the null_blk array, 20 MB/s and a
    hardware queue of 4, under VG labvg; LV 0's reader, 4 KiB random reads
    at QD1 and 256 kB/s; LVs 1-3 one 64 KiB QD4 sequential writer each; the
    daemon discovering VG and writers by itself), but with the writers on
    for the whole block instead of in bursts; and the order of one block:

        load on, LEAD_S for the controller to learn, then per repetition
        PRE_S quiet | the fault (faults_inject.FAULTS) | POST_S | orphan
        check, each repetition's readings before and after; load off.

    A fio that ends before the block does (an I/O error stops it: fio's
    default continue_on_error=none) is counted in that repetition and the
    load restarted.  Every repetition is appended to OUT/faults.json as it
    ends, so a guest that times out leaves what it measured.

Worked example
    faults_run.main(Namespace(out=DIR, faults="kill9", reps=1, threshold="2ms", ...))
    -> DIR/faults.json {"meta": {...}, "reps": [{"fault": "kill9", "rep": 0,
       "sessions_alive": true, "io_errors": 0, "orphans": [], "target_retrans": 0,
       "tick_late_max_ms": 240, "time_to_hold_s": 2.1, ...}]}
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter

import faults_inject as fi
import faults_measure as m
from labkit import fio, topology
from labkit.daemon import config_text, target_config, unit_nice

SOCK = "/run/santhrottle-faults/control.sock"
LEAD_S = 15.0  # the writers' first burst: the controller learns them
PRE_S = 5.0
POST_S = 15.0
FIO_RUNTIME_S = 7200.0  # stopped by SIGINT at the block's end


def config(t: dict, threshold: str, max_delay: str, setpoint: float) -> dict:
    """The daemon's file: the VG's threshold, the null_blk lab's ladder and setpoint, its
    state in the default /var/lib/santhrottle (the guest's tmpfs: a restart finds it)."""
    return target_config(t, SOCK, None, threshold, max_delay=max_delay, setpoint_fraction=setpoint)


class Load:
    """The reader and the writers (fio, one process each) for one block."""

    def __init__(self, t: dict, a: argparse.Namespace) -> None:
        self.t, self.a = t, a
        self.jobs: dict[str, fio.Job] = {}

    def start(self) -> None:
        a = self.a
        reader, writers = self.t["iscsi"][0], self.t["iscsi"][1:]
        self.jobs = {
            "reader": fio.start(fio.reader(reader["device"], a.reader_rate, FIO_RUNTIME_S))
        }
        for k, w in enumerate(writers, 1):
            self.jobs[f"writer{k}"] = fio.start(
                fio.writers(w["device"], a.writer_bs, a.writer_qd, FIO_RUNTIME_S)
            )

    def ended(self) -> list[str]:
        return [n for n, j in self.jobs.items() if not j.running()]

    def stop(self) -> list[dict]:
        """SIGINT every fio (our own children, by PID); each one's error and bytes."""
        out = []
        for n, j in self.jobs.items():
            early = not j.running()
            j.stop()
            rec = {"job": n, "ended_early": early, "rc": j.proc.returncode}
            job = j.result()
            if job is None:
                rec["error"] = "no fio JSON"
            else:
                rec.update(
                    error=job["error"],
                    read_bytes=job["read"]["io_bytes"],
                    write_bytes=job["write"]["io_bytes"],
                )
            out.append(rec)
        self.jobs = {}
        return out


def io_errors(jobs: list[dict]) -> int:
    return sum(1 for j in jobs if j["ended_early"] or j.get("error") not in (0, None))


def repetition(ctx: fi.Ctx, s: m.Sampler, load: Load, fault: str, rep: int, thr_s: float) -> dict:
    u = ctx.unit
    t_pre = time.monotonic()
    time.sleep(PRE_S)
    sess0, conns0, net0 = m.sessions(ctx.topo_mod), m.target_conns(), m.nstat()
    klog0 = len(m.kernel_log_lines())
    try:
        res = fi.FAULTS[fault](ctx, rep)
    except Exception as e:  # the campaign goes on; the row says what broke
        t = time.monotonic()
        res = {"start": t, "end": t, "fault_error": f"{type(e).__name__}: {e}"[:500]}
    time.sleep(max(0.0, res["end"] + POST_S - time.monotonic()))
    if not u.alive():  # as Restart=on-failure would: a dead daemon is started again
        res["daemon_died"] = {
            "exit": u.proc.returncode if u.proc else None,
            "log": [x[:200] for x in u.tail.between(t_pre, time.monotonic())[-6:]],
        }
        res["restart_ready_s"] = u.start()
    orph = m.orphan_check(u.sock, u.config["datapath"]["devices"])
    sess1, conns1, net1 = m.sessions(ctx.topo_mod), m.target_conns(), m.nstat()
    klog = [x for x in m.kernel_log_lines()[klog0:] if m.KERNEL_ISCSI.search(x)]
    jobs = []
    if load.ended():
        jobs = load.stop()
        load.start()
        time.sleep(LEAD_S)
    t_end = time.monotonic()
    wins = s.windows(t_pre - 2 * m.WINDOW_S, t_end)
    pre = [lat for t, lat in wins if t_pre + m.WINDOW_S <= t <= res["start"]]
    after = [lat for t, lat in wins if t >= res["end"]]
    probes = [p for p in s.probes if res["start"] <= p["t"] <= t_end]
    lines = u.tail.between(t_pre, t_end)
    late = m.tick_lateness_ms(lines)
    # when the daemon logged its late ticks over 500 ms (s from the fault's end; the
    # log is read every 0.2 s), to tell the fault's from the start's or the host's
    late_at = [
        [round(t - res["end"], 1), ms[0]]
        for t, x in u.tail.stamped(t_pre, t_end)
        if (ms := m.tick_lateness_ms([x])) and ms[0] > 500
    ]
    rec = {
        "fault": fault,
        "rep": rep,
        **{k: v for k, v in res.items() if k not in ("start", "end")},
        "fault_s": round(res["end"] - res["start"], 2),
        "sessions_alive": set(sess0) == set(sess1)
        and all(x["state"] == "LOGGED_IN" for x in sess1.values()),
        "sessions_before": len(sess0),
        "sessions_after": len(sess1),
        "connections_kept": conns0 == conns1,
        "connections_replaced": len(set(conns0) - set(conns1)),
        "io_errors": io_errors(jobs),
        "fio": jobs,
        "orphans": orph["orphans"],
        "missing": orph["missing"],
        "riding": orph["riding"],
        "orphan_status_errors": orph["status_errors"],
        "target_retrans": net1["TcpRetransSegs"] - net0["TcpRetransSegs"],
        "nstat": {k: net1[k] - net0[k] for k in net0},
        "tick_late_max_ms": max(late, default=0),
        "tick_late_lines": len(late),
        "tick_late_at": late_at,
        "daemon_errors": [
            x[:200] for x in lines if x.startswith(("ERROR", "Traceback", "CRITICAL"))
        ][:5],
        "time_to_hold_s": m.time_to_hold(wins, thr_s, res["end"]),
        "pre_held_pct": round(100 * sum(m.held(x, thr_s) for x in pre) / len(pre), 1)
        if pre
        else None,
        "worst_window_after_ms": round(max((x for x in after if x), default=0) * 1e3, 2),
        "probe_failures": sum(not p["ok"] for p in probes),
        "probe_max_s": max((p["latency_s"] for p in probes), default=None),
        "probe_errors": dict(Counter(p["error"][:100] for p in probes if not p["ok"])),
        "kernel_iscsi_log": klog[:6],
        # the series, relative to the fault's end: 1 s windows (ms), the daemon's answers
        "windows_ms": [
            [round(t - res["end"], 1), None if x is None else round(x * 1e3, 2)] for t, x in wins
        ],
        "probes": [
            [round(p["t"] - res["end"], 1), p.get("max_class", -1) if p["ok"] else None]
            for p in probes
        ],
        "t": round(t_pre, 1),
    }
    return rec


def main(a: argparse.Namespace) -> int:
    a.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if a.product:
        env["PYTHONPATH"] = str(a.product)
    where = m.run(
        [
            str(fi.BIN / "python"),
            "-c",
            "import santhrottle.appliance.daemon.main as d; print(d.__file__)",
        ],
        env=env,
    ).stdout.strip()
    thr_s = float(a.threshold.removesuffix("ms")) / 1e3
    t = topology.up(
        luns=a.writers + 1, nvme=0, disk="nullb", nullb_mbps=a.mbps, nullb_queue_depth=a.queue_depth
    )
    result: dict = {
        "meta": {
            "kernel": os.uname().release,
            "vcpus": os.cpu_count(),
            "threshold_s": thr_s,
            "product": a.product,
            "product_rev": a.rev,
            "daemon_module": where,
            "args": {k: str(v) for k, v in vars(a).items()},
            "pre_s": PRE_S,
            "post_s": POST_S,
            "lead_s": LEAD_S,
            "hold_s": m.HOLD_S,
        },
        "reps": [],
    }
    save = a.out / "faults.json"
    good_conf = config(t, a.threshold, a.max_delay, a.setpoint)
    good = config_text(good_conf)
    conf = a.out / "santhrottle.toml"
    conf.write_text(good)
    tail = m.LogTail()
    tail.start()
    unit = fi.Unit(good_conf, conf, a.out, env, unit_nice(), tail)
    ctx = fi.Ctx(unit, t, topology, good, a.out)
    s = m.Sampler(t["iscsi"][0]["dm"], SOCK)
    try:
        result["meta"]["first_start_s"] = unit.start()
        time.sleep(2.0)
        s.start()
        for fault in a.faults.split(","):
            load = Load(t, a)
            load.start()
            time.sleep(LEAD_S)
            for rep in range(a.reps):
                rec = repetition(ctx, s, load, fault, rep, thr_s)
                result["reps"].append(rec)
                save.write_text(json.dumps(result, indent=1))
                print(f"faults: {fault} #{rep}: {json.dumps(summary_line(rec))}", flush=True)
            jobs = load.stop()
            result["reps"][-1]["io_errors"] += io_errors(jobs)
            result["reps"][-1]["fio"] += jobs
    finally:
        s.stop()
        result["meta"]["stop"] = unit.stop()
        result["meta"]["members_after_stop"] = sorted(m.kernel_members())
        save.write_text(json.dumps(result, indent=1))
        tail.stop()
        topology.down()
    return 0


def summary_line(rec: dict) -> dict:
    keys = (
        "sessions_alive",
        "io_errors",
        "orphans",
        "target_retrans",
        "tick_late_max_ms",
        "time_to_hold_s",
        "pre_held_pct",
        "fault_s",
        "fault_error",
    )
    return {k: rec[k] for k in keys if k in rec}
