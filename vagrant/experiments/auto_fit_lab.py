#!/usr/bin/env python3
"""threshold = "auto" in the lab: the daemon's LQ fit on the known plant. Runs INSIDE the guest.

    .venv/bin/python vagrant/qemu/lab.py --smp 1 --array nbd:c_ms=5,m_ms=5 run --timeout 1800 \\
        vagrant/experiments/auto_fit_lab.py [--reps 3] [--step 8] [--rounds 2]
    make lab-auto-fit PLANT=c_ms=5,m_ms=5               # the same

(docs/lab.md, "The array as a known plant".)  The paper's topology on the
lab-array disk (closed_loop.py --paper's: the VG on the array, the reader on LV 0,
three writer hosts on LVs 1-3) and santhrottled with the product's defaults and
only `threshold = "auto"` for the VG (no fallback: it observes until its fit is
confident, then controls at C / (1 - alpha)).  The reader (4 KiB random reads,
QD1, 256 kB/s) runs throughout; the writers (sequential 128 KiB QD1, spread
round-robin over the 3 hosts, each in its own region) step through
`--levels` (0, 1, 2, 3, 6, 9, 12), `--step` s each, `--rounds` times, so that
the array's Q spans 0.2 to 11 IOs.  Each repetition starts a fresh daemon (a
fresh fit).

Recorded every second (labkit.autofit, which auto_fit_host.py shares): the
daemon's status (a resource's `threshold`: its `fit`, C, m, R^2, windows, Q
range, confident, and `in_force_s`; the writers' classes), the array's diskstats and the
plant's own counters (/shared/work/array-stats.json).
At each repetition's end: the daemon's fit and threshold against the
configured C, m and C / (1 - 0.9), and, for comparison, a plain least-squares
fit of the array's 1 s windows (IO-weighted L against Q, as the daemon folds
them) over the same time.  Results: OUT/auto-fit.json (default
/shared/work/auto-fit, i.e. the run dir's work/auto-fit on the host) and a
table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from labkit import autofit, probes, topology
from labkit.daemon import Daemon, target_config

SOCK = "/run/santhrottle-exp/control.sock"


def one_rep(a: argparse.Namespace, t: dict, out: Path, rep: int, cfg: dict) -> dict:
    reader, hosts = t["iscsi"][0], t["iscsi"][1:]
    array = Path(t["disk"]).name
    name = f"auto-{rep}"
    d = Daemon(name, target_config(t, SOCK, out / f"state-{name}", "auto"), out)
    d.start()
    w = autofit.watcher(d, t["vg"], array, [h["initiator_ip"] for h in hosts])

    def start_writers(n: int) -> list[list[str]]:  # round-robin over the hosts
        per = [n // len(hosts) + (k < n % len(hosts)) for k in range(len(hosts))]
        return [autofit.writers(a, h["device"], j, 0) for h, j in zip(hosts, per, strict=True) if j]

    try:
        time.sleep(2.0)  # a first discovery
        schedule = autofit.run_levels(a, w, reader["device"], start_writers)
    finally:
        d.stop()
    return autofit.result(rep, w, array, schedule, cfg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/shared/work/auto-fit"))
    autofit.add_load_args(ap)
    ap.add_argument("--hosts", type=int, default=3)
    a = ap.parse_args()
    cfg = probes.plant_config()
    if cfg is None:
        print("no plant: run with lab.py --array nbd[:...] (docs/lab.md)", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    topology.load_modules(["virtio_blk"])
    t = topology.up(luns=1 + a.hosts, nvme=0, disk="array", lv_size_mib=1536)
    raw: dict = {
        "args": {k: str(v) for k, v in vars(a).items()},
        "config": cfg,
        "kernel": os.uname().release,
        "reps": [],
    }
    t_all = time.monotonic()
    try:
        for rep in range(a.reps):
            raw["reps"].append(one_rep(a, t, a.out, rep, cfg))
    finally:
        raw["guest_wall_s"] = time.monotonic() - t_all
        (a.out / "auto-fit.json").write_text(json.dumps(raw))
        topology.down()
    autofit.summary(raw["reps"], cfg)
    print(f"guest wall {raw['guest_wall_s']:.0f} s; results {a.out / 'auto-fit.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
