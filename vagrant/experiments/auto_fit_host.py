#!/usr/bin/env python3
"""threshold = "auto" on this host's own kernel: the daemon's LQ fit of the known plant
seen through a loop device instead of QEMU. Runs ON THE HOST, as root.

    .venv/bin/python vagrant/experiments/auto_fit_host.py --array nbd:c_ms=2,m_ms=5 \\
        [--reps 3] [--step 8] [--rounds 2] [--out results/auto-fit-host]
    make lab-auto-fit-host PLANT=c_ms=2,m_ms=5            # the same

(docs/lab.md, "The daemon's fit on this host's kernel".)  The plant is lab.py's
(vagrant/qemu/lqarray.py in nbdkit, the same parameters), attached as /dev/loopN
through nbdfuse (labkit.plant.HostArray), so that the IOs the daemon's sensor
counts in /proc/diskstats cross only this kernel's block layer, FUSE and a unix
socket on their way to the plant, not QEMU's NBD client and an emulated guest.
santhrottled runs with the product's defaults in a network namespace of its own
(a veth, `leaf = "pfifo"`: this kernel has no netem; nothing is delayed), with one
declared resource, `devices = ["loopN"]`, `threshold = "auto"` and no fallback.
The load and the report are auto_fit_lab.py's (labkit.autofit): the reader (4 KiB
random reads, QD1, 256 kB/s) throughout, 0, 1, 2, 3, 6, 9 and 12 sequential 128 KiB
QD1 writers `--step` s each, `--rounds` times, a fresh daemon per repetition; every
second the daemon's status, the loop device's diskstats and the plant's own counters;
the daemon's C, m, R^2 and threshold against the configured plant, and a plain
least-squares fit of the loop device's 1 s windows. Results: OUT/auto-fit.json and a
table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labkit import autofit
from labkit.daemon import Daemon
from labkit.plant import HostArray, PlantError, host_missing, parse_array

CHECKOUT = Path(__file__).resolve().parents[2]
RESOURCE = "array"


class NetNs:
    """A network namespace with one veth, the daemon's datapath device; deleted on exit."""

    def __init__(self) -> None:
        self.name, self.dev = f"st-af-{os.getpid()}", "st-af0"

    def __enter__(self) -> NetNs:
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        try:
            subprocess.run(
                ["ip", "-n", self.name, "link", "add", self.dev, "type", "veth", "peer", "st-af1"],
                check=True,
            )
            subprocess.run(["ip", "-n", self.name, "link", "set", self.dev, "up"], check=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False)


def daemon(ns: NetNs, device: str, out: Path, name: str) -> Daemon:
    """santhrottled in the namespace's veth, classifying without delaying (pfifo: this
    kernel has no netem), one declared resource on the loop device, threshold "auto"."""
    conf = {
        "daemon": {
            "control_socket": str(out / f"{name}.sock"),
            "netns": ns.name,
            "state_dir": str(out / f"state-{name}"),
        },
        "datapath": {"devices": [ns.dev], "leaf": "pfifo", "link_speed": "10gbit"},
        "metrics": {"port": 0},
        "resources": {RESOURCE: {"threshold": "auto", "devices": [device]}},
    }
    return Daemon(name, conf, out, nice=0)


def one_rep(a: argparse.Namespace, ns: NetNs, arr: HostArray, rep: int, cfg: dict) -> dict:
    dev = f"/dev/{arr.device}"
    d = daemon(ns, arr.device, a.out, f"auto-{rep}")
    d.start()
    w = autofit.watcher(d, RESOURCE, arr.device, [], plant_stats=arr.server_stats)
    try:
        time.sleep(2.0)  # a first tick
        # the reader in region 0, the writers from region 1 on, each in its own
        schedule = autofit.run_levels(
            a, w, dev, lambda n: [autofit.writers(a, dev, n, 1)] if n else []
        )
    finally:
        d.stop(cleanup=None, timeout_s=30.0)
    return autofit.result(rep, w, arr.device, schedule, cfg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--array", default="nbd:c_ms=2,m_ms=5", help="the plant, as lab.py --array takes it"
    )
    ap.add_argument("--out", type=Path, default=CHECKOUT / "results" / "auto-fit-host")
    autofit.add_load_args(ap)
    a = ap.parse_args()
    a.out = a.out.resolve()  # the daemon's paths are absolute
    try:
        cfg = parse_array(a.array)
    except PlantError as e:
        print(f"auto_fit_host: --array: {e}", file=sys.stderr)
        return 2
    why = host_missing()
    if cfg is None or why:
        print(f"auto_fit_host: {why or 'no plant (--array nbd:...)'}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    raw: dict = {
        "args": {k: str(v) for k, v in vars(a).items()},
        "config": cfg,
        "kernel": os.uname().release,
        "reps": [],
    }
    t_all = time.monotonic()
    try:
        with (
            tempfile.TemporaryDirectory(prefix="st-af-") as tmp,
            HostArray(cfg, Path(tmp), size_gib=8) as arr,
            NetNs() as ns,
        ):
            print(f"plant {cfg} on /dev/{arr.device}", flush=True)
            for rep in range(a.reps):
                raw["reps"].append(one_rep(a, ns, arr, rep, cfg))
    except (PlantError, RuntimeError, subprocess.CalledProcessError) as e:
        print(f"auto_fit_host: {e}", file=sys.stderr)
        return 1
    finally:
        raw["wall_s"] = time.monotonic() - t_all
        (a.out / "auto-fit.json").write_text(json.dumps(raw))
    autofit.summary(raw["reps"], cfg)
    print(f"wall {raw['wall_s']:.0f} s; results {a.out / 'auto-fit.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
