#!/usr/bin/env python3
"""threshold = "auto" in the lab: the daemon's LQ fit on the known plant. Runs INSIDE the guest.

    python3 vagrant/qemu/lab.py --smp 1 --array nbd:c_ms=5,m_ms=5 run --timeout 1800 \\
        vagrant/experiments/auto_fit_lab.py [--reps 3] [--step 8] [--rounds 2]
    make lab-auto-fit PLANT=c_ms=5,m_ms=5               # the same

(docs/lab.md, "The array as a known plant".)  The paper's topology on the
lab-array disk (closed_loop.py --paper: the VG on the array, the reader on LV 0,
three writer hosts on LVs 1-3) and santhrottled with the product's defaults and
only `threshold = "auto"` for the VG (no fallback: it observes until its fit is
confident, then controls at C / (1 - alpha)).  The reader (4 KiB random reads,
QD1, 256 kB/s) runs throughout; the writers (sequential 128 KiB QD1, spread
round-robin over the 3 hosts, each in its own region) step through
`--levels` (0, 1, 2, 3, 6, 9, 12), `--step` s each, `--rounds` times, so that
the array's Q spans 0.2 to 11 IOs.  Each repetition starts a fresh daemon (a
fresh fit).

Recorded every second: the daemon's status (a resource's `threshold`: its `fit`,
C, m, R^2, windows, Q range, confident, and `in_force_s`; the writers' classes),
the array's diskstats and the plant's own counters (/shared/work/array-stats.json).
At each repetition's end: the daemon's fit and threshold against the
configured C, m and C / (1 - 0.9), and, for comparison, a plain least-squares
fit of the array's 1 s windows (IO-weighted L against Q, as the daemon folds
them) over the same time.  Results: OUT/auto-fit.json (default
/shared/work/auto-fit, i.e. the run dir's work/auto-fit on the host) and a
table on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import closed_loop  # noqa: E402
import plant_lab  # noqa: E402
import topology  # noqa: E402  (closed_loop put vagrant/qemu/guest on the path)

ALPHA = 0.9  # controller.auto_alpha's default


class Watch(threading.Thread):
    """Every second: the daemon's status for the VG, the array's diskstats, the plant's counters."""

    def __init__(self, vg: str, array: str, writer_ips: list[str], sock: str = closed_loop.SOCK,
                 server_stats=plant_lab.server_stats) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.vg, self.array, self.writer_ips = vg, array, writer_ips
        self.sock, self.server_stats = sock, server_stats
        self.rows: list[dict] = []
        self.stop_ev = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        from santhrottle.appliance.daemon.control import request

        nxt = time.monotonic()
        while not self.stop_ev.is_set():
            row: dict = {
                "t": round(time.monotonic() - self.t0, 3),
                "ds": plant_lab.diskstats().get(self.array),
                "server": self.server_stats(),
            }
            try:
                st = request(self.sock, "status", timeout_s=2.0)
                r = next((x for x in st["resources"] if x["resource"] == self.vg), None)
                if r is not None:
                    row["fit"] = r["threshold"]["fit"]  # status' ThresholdView
                    row["in_force_s"] = r["threshold"]["in_force_s"]
                    row["devices"] = r.get("devices")
                    row["mode"] = r.get("mode")
                row["classes"] = [
                    i["class"] for i in st["initiators"] if i["initiator"] in self.writer_ips
                ]
            except Exception as e:  # keep sampling; record why
                row["status_error"] = str(e)
            self.rows.append(row)
            nxt += 1.0
            self.stop_ev.wait(max(0.0, nxt - time.monotonic()))


def window_fit(rows: list[dict]) -> dict | None:
    """The array's 1 s windows: Q = weighted IO time / interval, L = weighted / IOs (IO-weighted
    means, as the daemon folds its ticks), plain least squares over windows of >= 10 IOs."""
    pts = []
    for a, b in itertools.pairwise(rows):
        if not a.get("ds") or not b.get("ds"):
            continue
        d = plant_lab.ds_delta(a["ds"], b["ds"], b["t"] - a["t"])
        if d["ios"] >= 10:
            pts.append((d["q"], d["l_s"]))
    return plant_lab.fit(pts)


def one_rep(a, t: dict, out: Path, rep: int, cfg: dict) -> dict:
    reader, hosts = t["iscsi"][0], t["iscsi"][1:]
    array = Path(t["disk"]).name
    name = f"auto-{rep}"
    daemon = closed_loop.start_daemon(t, name, "auto", out, None, None)
    w = Watch(t["vg"], array, [h["initiator_ip"] for h in hosts])

    def start_writers(n: int) -> list:
        per = [n // len(hosts) + (k < n % len(hosts)) for k in range(len(hosts))]
        return [plant_lab.writers(a, h["device"], j, 0, a.step)
                for h, j in zip(hosts, per, strict=True) if j]  # fmt: skip

    try:
        time.sleep(2.0)  # a first discovery
        schedule = run_levels(a, w, reader["device"], start_writers)
    finally:
        closed_loop.stop_daemon(daemon, out, name)
    return result(rep, w, schedule, cfg)


def run_levels(a, w: Watch, reader_dev: str, start_writers) -> list[tuple[float, int]]:
    """The reader throughout; the writers through a.levels, a.step s each, a.rounds times
    (start_writers(n): the fio processes of n writers, [] for none). Returns the schedule
    (the Watch's time, writers) and stops the Watch."""
    levels = [int(x) for x in a.levels.split(",")]
    schedule: list[tuple[float, int]] = []
    w.start()
    rd = plant_lab.reader(a, reader_dev, a.rounds * len(levels) * a.step + 2)
    for _ in range(a.rounds):
        for n in levels:
            schedule.append((round(time.monotonic() - w.t0, 3), n))
            ws = start_writers(n)
            for p in ws:
                p.communicate()
            if not ws:
                time.sleep(a.step)
    rd.communicate()
    w.stop_ev.set()
    w.join()
    return schedule


def result(rep: int, w: Watch, schedule: list[tuple[float, int]], cfg: dict) -> dict:
    """One repetition: the daemon's last fit and threshold against the configured plant, and
    the plain fit of the array's 1 s windows (shown, and stored in auto-fit.json)."""
    fits = [r for r in w.rows if r.get("fit")]
    last = fits[-1] if fits else {}
    fit = last.get("fit") or {}
    first_conf = next((r["t"] for r in fits if (r["fit"] or {}).get("fitted")), None)
    configured = {"c_s": cfg["c_ms"] / 1e3, "m_s": cfg["m_ms"] / 1e3,
                  "threshold_s": cfg["c_ms"] / 1e3 / (1 - ALPHA)}  # fmt: skip
    res = {
        "rep": rep,
        "schedule": schedule,
        "rows": w.rows,
        "daemon_fit": fit,
        "in_force_s": last.get("in_force_s"),
        "devices": last.get("devices"),
        "first_confident_s": first_conf,
        "window_fit": window_fit(w.rows),
        "configured": configured,
    }
    show(res)
    return res


def rel(x: float | None, ref: float) -> str:
    return "-" if x is None else f"{(x / ref - 1) * 100:+.0f} %"


def show(r: dict) -> None:
    f, c, wf = r["daemon_fit"], r["configured"], r["window_fit"] or {}
    if not f or f.get("intercept_s") is None:
        print(f"rep {r['rep']}: the daemon has no fit", flush=True)
        return
    force = r["in_force_s"]
    c_fit = f["intercept_s"]
    print(
        f"rep {r['rep']}: daemon C {c_fit * 1e3:.2f} ms ({rel(c_fit, c['c_s'])})"
        f", m {f['slope_s_per_io'] * 1e3:.2f} ms ({rel(f['slope_s_per_io'], c['m_s'])}), R^2 "
        f"{f['r_squared']:.3f}, {f['windows']:.0f} windows, Q {f['q_lo']:.2f}..{f['q_hi']:.2f}, "
        f"confident {f.get('fitted')} (first at {r['first_confident_s']} s); in force "
        f"{'-' if force is None else f'{force * 1e3:.2f} ms'} (configured plant: "
        f"{c['threshold_s'] * 1e3:.1f} ms) | plain fit of the 1 s windows: C "
        f"{wf.get('c_s', float('nan')) * 1e3:.2f}, m {wf.get('m_s', float('nan')) * 1e3:.2f}, "
        f"R^2 {wf.get('r2', float('nan')):.3f} | devices {r['devices']}",
        flush=True,
    )


def add_load_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--levels", default="0,1,2,3,6,9,12", help="writer counts, in order")
    ap.add_argument("--step", type=float, default=8.0, help="s per level")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reader-rate", default="256k")
    ap.add_argument("--writer-bs", default="128k")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/shared/work/auto-fit"))
    add_load_args(ap)
    ap.add_argument("--hosts", type=int, default=3)
    a = ap.parse_args()
    cfg = plant_lab.array_config()
    if cfg is None:
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    topology.load_modules(["virtio_blk"])
    t = topology.up(luns=1 + a.hosts, nvme=0, disk="array", lv_size_mib=1536)
    raw: dict = {"args": {k: str(v) for k, v in vars(a).items()}, "config": cfg,
                 "kernel": os.uname().release, "reps": []}  # fmt: skip
    t_all = time.monotonic()
    try:
        for rep in range(a.reps):
            raw["reps"].append(one_rep(a, t, a.out, rep, cfg))
    finally:
        raw["guest_wall_s"] = time.monotonic() - t_all
        (a.out / "auto-fit.json").write_text(json.dumps(raw))
        topology.down()
    summary(raw["reps"], cfg)
    print(f"guest wall {raw['guest_wall_s']:.0f} s; results {a.out / 'auto-fit.json'}")
    return 0


def summary(reps: list[dict], cfg: dict) -> None:
    """The daemon's fit over the repetitions: median (range)."""
    got = [r for r in reps if r["daemon_fit"].get("intercept_s") is not None]
    if got:

        def med(key, scale=1e3):
            v = [r["daemon_fit"][key] * scale for r in got]
            return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"

        forces = [r["in_force_s"] * 1e3 for r in got if r["in_force_s"] is not None]
        print(f"\ndaemon's fit over {len(got)} reps, median (range): C {med('intercept_s')} ms, "
              f"m {med('slope_s_per_io')} ms/IO, R^2 {med('r_squared', 1)}, windows "
              f"{med('windows', 1)}; in force "
              f"{statistics.median(forces) if forces else float('nan'):.2f} ms "
              f"({min(forces, default=float('nan')):.2f}-{max(forces, default=float('nan')):.2f});"
              f" configured C {cfg['c_ms']} ms, m {cfg['m_ms']} ms/IO, C/(1-{ALPHA}) "
              f"{cfg['c_ms'] / (1 - ALPHA):.1f} ms")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
