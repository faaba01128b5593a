#!/usr/bin/env python3
"""The lab's array as a known plant: measure it as the initiators see it. Runs INSIDE the guest.

    .venv/bin/python vagrant/qemu/lab.py --array nbd:c_ms=2,m_ms=5 run --timeout 2400 \\
        vagrant/experiments/plant_lab.py [--reps 3] [--modes raw,iscsi]

(docs/lab.md, "The array as a known plant".)  The array is the third virtio disk
(serial lab-array), an nbdkit server on the host that lab.py --array nbd starts
(vagrant/qemu/lqarray.py).  Against it: the paper's small reader (4 KiB random
reads, QD1, 256 kB/s) and 0, 1, 2, 3, 6, 9, 12 sequential 128 KiB QD1 writers,
the writers spread round-robin over 3 hosts.

  raw    fio on the array's block device in the guest (no iSCSI), each job
         in its own region;
  iscsi  the topology of closed_loop.py on the array (labkit.topology, disk "array"):
         the reader on LV 0 through its own initiator, host k's writers on
         LV k through initiator k.

Per point (writer count, repetition): the writers start, `warm` s later the
reader runs `steady` s; the reader's fio mean / p50 / p95 / p99, the reader's
latency at the target (its dm device's diskstats) and its 1 s means, and the
array's diskstats over the reader's run: Q = weighted IO time / interval (the
mean number of IOs in flight, Little's law), L = the mean latency of all its IOs,
IOPS and write MB/s; the server's own counters (/shared/work/array-stats.json:
its Q and L, what the plant was configured to do) and the guest's CPU use.
A least-squares fit of L against Q over the points of each mode gives C, m and
R^2, to compare with the configured C and m.  Results go to OUT/plant.json
(default /shared/work/plant, i.e. the run dir's work/plant on the host) and a
table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from labkit import analysis, fio, probes, topology
from labkit.sampler import Probe, Sampler


def reader(a, dev: str, runtime: float) -> list[str]:
    return fio.reader(dev, a.reader_rate, runtime, name="sram", extra=("--offset=0",))


def writers(a, dev: str, jobs: int, first_region: int, runtime: float) -> list[str]:
    """`jobs` sequential writers on `dev`, each in its own region (fio.REGION_MIB:
    4 per host, 1200 MiB of a 1536 MiB LV)."""
    return fio.writers(
        dev,
        a.writer_bs,
        1,
        runtime,
        jobs=jobs,
        region_mib=fio.REGION_MIB,
        first_region=first_region,
        name="w",
    )


def clat(res: dict) -> dict:
    c = res["read"]["clat_ns"]
    pct = c.get("percentile", {})
    return {
        "reads": res["read"]["total_ios"],
        "mean_s": c["mean"] / 1e9,
        "p50_s": pct.get("50.000000", 0) / 1e9,
        "p95_s": pct.get("95.000000", 0) / 1e9,
        "p99_s": pct.get("99.000000", 0) / 1e9,
    }


# -------------------------------------------------------------- one point
def point(
    a, mode: str, n: int, rdev: str, reader_ds: str | None, array_ds: str, hosts: list[str]
) -> dict:
    """n writers spread over `hosts` (devices), the reader on rdev."""
    t_start = time.monotonic()
    run = a.warm + a.steady + 2
    per = [n // len(hosts) + (k < n % len(hosts)) for k in range(len(hosts))]
    ws = []
    for k, (dev, jobs) in enumerate(zip(hosts, per, strict=True)):
        if jobs:
            # raw: all writers share the one device, each host's jobs their own regions
            first = 1 + k * 4 if mode == "raw" else 0
            ws.append(fio.start(writers(a, dev, jobs, first, run)))
    time.sleep(a.warm if n else 0.5)
    dev = reader_ds or array_ds
    s = Sampler([Probe("ds", probes.diskstats([dev]))])  # the reader's 1 s windows
    d0, s0, c0, t0 = (
        probes.all_diskstats(),
        probes.plant_stats(),
        probes.guest_cpu(),
        time.monotonic(),
    )
    s.start()
    rd = fio.start(reader(a, rdev, a.steady))
    res = rd.result()
    d1, s1, c1, t1 = (
        probes.all_diskstats(),
        probes.plant_stats(),
        probes.guest_cpu(),
        time.monotonic(),
    )
    s.stop()
    wr_mb = sum((w.result() or {}).get("write", {}).get("bw_bytes", 0) for w in ws) / 1e6
    dt = t1 - t0
    row = {
        "mode": mode,
        "writers": n,
        "reader_fio": clat(res),
        "array": analysis.device_delta(d0[array_ds], d1[array_ds], dt),
        "server": analysis.plant_delta(s0, s1),
        "guest_cpu_busy": probes.busy_share(c0, c1),
        "writers_fio_mb_s": wr_mb,
        "reader_windows_s": [w.read_latency_s for w in analysis.windows(s.rows, dev, [], None)],
        "interval_s": dt,
        "wall_s": time.monotonic() - t_start,
    }
    if reader_ds:
        r = analysis.device_delta(d0[reader_ds], d1[reader_ds], dt)
        row["reader_target_s"] = r["read_l_s"]
    else:
        row["reader_target_s"] = row["array"]["read_l_s"]
    return row


def show(row: dict) -> None:
    f = row["reader_fio"]
    ar, sv = row["array"], row["server"] or {}
    w = [x for x in row["reader_windows_s"] if x is not None]
    p95w = sorted(w)[int(0.95 * (len(w) - 1))] if w else float("nan")
    print(
        f"{row['mode']:5} w={row['writers']:2d} reader fio {f['mean_s'] * 1e3:6.2f}/"
        f"{f['p95_s'] * 1e3:6.2f} ms (mean/p95) target {(row['reader_target_s'] or 0) * 1e3:6.2f}"
        f" (1s p95 {p95w * 1e3:6.2f}) | array Q {ar['q']:5.2f} L {(ar['l_s'] or 0) * 1e3:6.2f} ms"
        f" {ar['iops']:5.0f} IOPS {ar['write_mb_s']:5.1f} MB/s | server Q {sv.get('q', 0):5.2f}"
        f" L {(sv.get('l_s') or 0) * 1e3:6.2f} n {sv.get('n_arrival') or 0:5.2f} | guest cpu"
        f" {row['guest_cpu_busy'] * 100:3.0f}% | {row['wall_s']:.1f} s",
        flush=True,
    )


def fit(pts: list[tuple[float, float | None]]) -> dict | None:
    """Least squares L = C + m Q over the points (labkit.analysis.fit_line), as a record."""
    f = analysis.fit_line(pts)
    return None if f is None else {"c_s": f.c_s, "m_s": f.m_s, "r2": f.r2, "points": f.points}


def summarize(rows: list[dict], mode: str) -> dict:
    rs = [r for r in rows if r["mode"] == mode]
    out = {
        "fit_array": fit([(r["array"]["q"], r["array"]["l_s"]) for r in rs]),
        "fit_server": fit([(r["server"]["q"], r["server"]["l_s"]) for r in rs if r["server"]]),
        "fit_reader_target": fit([(r["array"]["q"], r["reader_target_s"]) for r in rs]),
        "fits_by_rep": {},
        "by_writers": {},
    }
    for rep in sorted({r.get("rep", 0) for r in rs}):
        g = [r for r in rs if r.get("rep", 0) == rep]
        out["fits_by_rep"][rep] = {
            "fit_array": fit([(r["array"]["q"], r["array"]["l_s"]) for r in g]),
            "fit_server": fit([(r["server"]["q"], r["server"]["l_s"]) for r in g if r["server"]]),
            "fit_reader_target": fit([(r["array"]["q"], r["reader_target_s"]) for r in g]),
        }
    for n in sorted({r["writers"] for r in rs}):
        g = [r for r in rs if r["writers"] == n]

        def med(vals):
            vals = [v for v in vals if v is not None]
            return (statistics.median(vals), min(vals), max(vals)) if vals else None

        win = [x for r in g for x in r["reader_windows_s"] if x is not None]
        out["by_writers"][n] = {
            "reps": len(g),
            "reader_fio_mean_s": med([r["reader_fio"]["mean_s"] for r in g]),
            "reader_fio_p95_s": med([r["reader_fio"]["p95_s"] for r in g]),
            "reader_target_s": med([r["reader_target_s"] for r in g]),
            "reader_target_1s_p95_s": sorted(win)[int(0.95 * (len(win) - 1))] if win else None,
            "array_q": med([r["array"]["q"] for r in g]),
            "array_l_s": med([r["array"]["l_s"] for r in g]),
            "server_q": med([r["server"]["q"] for r in g if r["server"]]),
            "server_l_s": med([r["server"]["l_s"] for r in g if r["server"]]),
            "write_mb_s": med([r["array"]["write_mb_s"] for r in g]),
            "guest_cpu_busy": med([r["guest_cpu_busy"] for r in g]),
            "wall_s": med([r["wall_s"] for r in g]),
        }
    return out


def print_summary(mode: str, s: dict, cfg: dict | None) -> None:
    def ms(t):
        return "-" if t is None else f"{t[0] * 1e3:.1f} ({t[1] * 1e3:.1f}-{t[2] * 1e3:.1f})"

    print(
        f"\n{mode}: writers | reader fio mean | fio p95 | target | target 1s p95 | "
        "array Q | array L | server Q | server L | MB/s | guest CPU"
    )
    for n, b in s["by_writers"].items():
        q, sq = b["array_q"], b["server_q"]
        p95w = b["reader_target_1s_p95_s"]
        print(
            f"  {n:2} | {ms(b['reader_fio_mean_s'])} | {ms(b['reader_fio_p95_s'])} | "
            f"{ms(b['reader_target_s'])} | {'-' if p95w is None else f'{p95w * 1e3:.1f}'} | "
            f"{q[0]:.2f} ({q[1]:.2f}-{q[2]:.2f}) | {ms(b['array_l_s'])} | "
            f"{'-' if not sq else f'{sq[0]:.2f}'} | {ms(b['server_l_s'])} | "
            f"{b['write_mb_s'][0]:.1f} | {b['guest_cpu_busy'][0] * 100:.0f}%"
        )
    for key in ("fit_array", "fit_server", "fit_reader_target"):
        f = s[key]
        if f:
            print(
                f"  {key}: C {f['c_s'] * 1e3:.2f} ms, m {f['m_s'] * 1e3:.2f} ms/IO, "
                f"R^2 {f['r2']:.3f} ({f['points']} points)"
            )
    reps = s.get("fits_by_rep") or {}
    if len(reps) > 1:  # each repetition's own fit: median (range)
        for key in ("fit_array", "fit_server", "fit_reader_target"):
            fs = [f[key] for f in reps.values() if f[key]]
            if fs:
                cs = [f["c_s"] * 1e3 for f in fs]
                mm = [f["m_s"] * 1e3 for f in fs]
                print(
                    f"  {key} per repetition ({len(fs)}): C {statistics.median(cs):.2f} "
                    f"({min(cs):.2f}-{max(cs):.2f}) ms, m {statistics.median(mm):.2f} "
                    f"({min(mm):.2f}-{max(mm):.2f}) ms/IO"
                )
    if cfg:
        print(f"  configured: {cfg}")


def array_device() -> str:
    return topology.find_disk("lab-array")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/shared/work/plant"))
    ap.add_argument("--writers", default="0,1,2,3,6,9,12")
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default="raw,iscsi")
    ap.add_argument("--warm", type=float, default=3.0)
    ap.add_argument("--steady", type=float, default=8.0)
    ap.add_argument("--reader-rate", default="256k")
    ap.add_argument("--writer-bs", default="128k")
    a = ap.parse_args()
    counts = [int(x) for x in a.writers.split(",")]
    modes = a.modes.split(",")
    cfg = probes.plant_config()
    if cfg is None:
        print("no plant: run with lab.py --array nbd[:...] (docs/lab.md)", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    topology.load_modules(["virtio_blk"])
    raw: dict = {
        "args": {k: str(v) for k, v in vars(a).items()},
        "config": cfg,
        "kernel": os.uname().release,
        "rows": [],
    }
    t_all = time.monotonic()
    try:
        if "raw" in modes:
            dev = array_device()
            name = Path(dev).name
            for rep in range(a.reps):
                for n in counts:
                    row = point(a, "raw", n, dev, None, name, [dev] * a.hosts)
                    row["rep"] = rep
                    raw["rows"].append(row)
                    show(row)
            # fio's data must not look like a volume group to LVM
            subprocess.run(["wipefs", "-a", "-q", dev], check=False)
        if "iscsi" in modes:
            t0 = time.monotonic()
            t = topology.up(luns=1 + a.hosts, nvme=0, disk="array", lv_size_mib=1536)
            raw["topology_up_s"] = time.monotonic() - t0
            rdr, hosts = t["iscsi"][0], t["iscsi"][1:]
            name = Path(t["disk"]).name
            for rep in range(a.reps):
                for n in counts:
                    row = point(
                        a, "iscsi", n, rdr["device"], rdr["dm"], name, [h["device"] for h in hosts]
                    )
                    row["rep"] = rep
                    raw["rows"].append(row)
                    show(row)
    finally:
        raw["wall_s"] = time.monotonic() - t_all
        raw["summary"] = {m: summarize(raw["rows"], m) for m in modes}
        (a.out / "plant.json").write_text(json.dumps(raw, indent=1))
        if topology.status() is not None:
            topology.down()
    for m in modes:
        print_summary(m, raw["summary"][m], cfg)
    print(f"\nwall {raw['wall_s']:.0f} s; results {a.out / 'plant.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
