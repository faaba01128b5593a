#!/usr/bin/env python3
"""`make lab`: run the closed-loop experiments in the lab guest, then report.

    python3 vagrant/experiments/report.py --paper [--out DIR]  # make lab: known plant
    python3 vagrant/experiments/report.py --short [--out DIR]  # CI: T 10-20 ms, C 2, m 10 ms
    python3 vagrant/experiments/report.py [--out DIR]          # the null_blk experiment
    python3 vagrant/experiments/report.py --from DIR           # report an earlier run
    python3 vagrant/experiments/report.py --paper --protocol nvme  # NVMe/TCP hosts
    python3 vagrant/experiments/report.py --light [--out DIR]  # make lab-light (report_light)

Prints a table per threshold (reader latency p50/p95/p99 from the target's
diskstats over 1 s windows, time above threshold, writer throughput, target
retransmissions), the interference table, the release time of the throttle
after the reader leaves, and the simulator's prediction with the LQ line
fitted to the lab's array; writes fig14.png, fig16-<T>.png, summary.json next
to the raw series (raw.json); then the throttle curves (seconds per GB of one
initiator's 64k qd1 reads and writes against the delay, paper figures 8 and
9: throttle-curves.json, fig8-9.png; skipped with --short or --no-curves).
The last line names the results folder.  The paper's figures and lines are
report_paper.py's, a --light run's report_light.py's; this file runs the guests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import curves_report
import report_bridge_check
import report_light
import report_paper
from report_figures import plot
from report_paper import PROTOCOL_NAMES

CHECKOUT = Path(__file__).resolve().parents[2]
LAB_PY = CHECKOUT / "vagrant" / "qemu" / "lab.py"
GUEST = CHECKOUT / "vagrant" / "experiments" / "closed_loop.py"
# The throttle curves (paper 3.3, figures 8 and 9) come from the data path's
# own lab script: a second guest boot, on the unthrottled disk.
CURVES_SCRIPT = CHECKOUT / "vagrant" / "experiments" / "datapath_lab.py"
CURVES_JSON = "throttle-curves.json"
# `make lab`'s guest: one vCPU.  A second one brings retransmissions of its own
# on the reader's connection, which santhrottle never delays (docs/lab.md,
# "One vCPU: no background").
FULL_RUN_SMP = 1

# `make lab`: the method paper's experiment on the known plant (docs/lab.md, "The
# array as a known plant"): C = 2 ms, m = 5 ms to start from, closed_loop.py --paper
# --plant auto (a steeper slope where this host's emulated writers need one).
PAPER_ARRAY = "nbd:c_ms=2,m_ms=5"
# its guest's limit: 36 min on a fast host, up to 3 uncontrolled phases more where the
# slope is chosen again, and a slower emulation
PAPER_TIMEOUT_S = 5400
# make lab-light (work conservation): the paper's workload with one writer job per
# host, so that the array, not the emulated CPU, limits the writers (docs/lab.md,
# "Work conservation"), on a light plant: C = 2 ms, m = 3 ms to start from (moved
# toward an uncontrolled p95 of 0.6 x 20 ms), T = 20 ms where that p95 stays under
# 0.8 T; three repetitions of controlled, observed, bridge-observed, bridged and
# uncontrolled phases (closed_loop.py --light --observed): 49 min where the guest runs
# 3.5 times slower than the reference
LIGHT_ARRAY = "nbd:c_ms=2,m_ms=3"
LIGHT_ARGS = ["--writer-jobs", "1", "--thresholds", "20ms", "--observed"]
LIGHT_TIMEOUT_S = 3600
# CI's short run (tests/closed_loop): twice the slope, so that the reader waits
# >= 2 T uncontrolled even where the emulated guest, not the array, limits the
# writers (docs/lab.md, "CI's short closed loop").
CI_ARRAY = "nbd:c_ms=2,m_ms=10"
# ... and its threshold: half the uncontrolled p95, within 10-20 ms (closed_loop.py's
# auto_threshold): 20 ms on a quiet host; where a busy host slows the emulated writers
# so much that even this slope leaves the reader under 40 ms, a lower T keeps the
# precondition, uncontrolled p95 >= 2 T
CI_THRESHOLDS = "auto:10ms-20ms"


def report(out: Path) -> int:
    raw = json.loads((out / "raw.json").read_text())
    if raw["args"].get("bridge_check"):  # closed_loop.py --bridge-check: its own table
        return report_bridge_check.report(out)
    if "light" in raw:
        sm = report_light.summary(raw)
        (out / "summary.json").write_text(json.dumps(sm, indent=1, default=str))
        print("\n".join(report_light.lines(sm)))
        print(f"results: {out}")
        return 0
    sm = report_paper.summary(raw)
    (out / "summary.json").write_text(json.dumps(sm, indent=1, default=str))
    figs = plot(raw, out)
    report_paper.print_report(raw, sm)
    curves = out / CURVES_JSON
    if curves.exists():
        png = out / "fig8-9.png"
        print("\nthrottle curves (paper 3.3, figs 8/9): one initiator, `read` mode for reads,")
        print(
            "`all` mode for writes, on the unthrottled disk"
            + curves_report.report(json.loads(curves.read_text()), str(png))
        )
        figs.append(png)
    for f in figs:
        print(f"figure: {f}")
    print(f"results: {out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--from", dest="from_dir", type=Path, help="report an earlier run")
    ap.add_argument(
        "--short",
        action="store_true",
        help="CI's version: one threshold, two cycles, no interference sweep",
    )
    ap.add_argument(
        "--paper",
        action="store_true",
        help=f"the paper's experiment on the known plant (--array {PAPER_ARRAY}, "
        "closed_loop.py --paper)",
    )
    ap.add_argument(
        "--light",
        action="store_true",
        help=f"work conservation on a light plant (from --array {LIGHT_ARRAY}, "
        f"closed_loop.py --paper --light {' '.join(LIGHT_ARGS)})",
    )
    ap.add_argument("--array", default=None, help="lab.py --array (the known plant's spec)")
    ap.add_argument(
        "--protocol",
        choices=tuple(PROTOCOL_NAMES),
        default="iscsi",
        help="the reader and writers (closed_loop.py --protocol) and the curves' initiator: "
        "iSCSI or NVMe/TCP",
    )
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument(
        "--no-curves", action="store_true", help="skip the throttle curves (a second guest boot)"
    )
    args, extra = ap.parse_known_args()
    if args.from_dir:
        return report(args.from_dir.resolve())
    out = (args.out or CHECKOUT / "results" / time.strftime("lab-%Y%m%d-%H%M%S")).resolve()
    if not out.is_relative_to(CHECKOUT):
        ap.error(f"--out must be inside the checkout {CHECKOUT} (the guest sees only that)")
    out.mkdir(parents=True, exist_ok=True)
    guest_args = ["--out", str(out)]
    array = args.array
    timeout = args.timeout or 1500
    if args.paper:  # the slope chosen for the paper's regime on this host (labkit.regime)
        array = array or PAPER_ARRAY
        guest_args += ["--paper", "--plant", "auto"]
        timeout = args.timeout or PAPER_TIMEOUT_S
    if args.light:  # a light plant, T over its uncontrolled p95 (report_light)
        array = array or LIGHT_ARRAY
        guest_args += ["--paper", "--light", "--no-static", "--skip-interference", *LIGHT_ARGS]
        timeout = args.timeout or LIGHT_TIMEOUT_S
    if args.short:  # CI: the paper's workload on a known plant, T 10-20 ms, three bursts
        array = array or CI_ARRAY
        guest_args += [
            "--paper",
            "--plant",
            "fixed",
            "--thresholds",
            CI_THRESHOLDS,
            "--cycles",
            "3",
            "--no-static",
            "--skip-interference",
        ]
        timeout = args.timeout or 1500
    guest_args += ["--protocol", args.protocol, *extra]
    # one vCPU (SANTHROTTLE_LAB_SMP overrides), CI's short run too: its retransmissions
    # are then santhrottle's, not the second emulator thread's (docs/lab.md)
    smp = os.environ.get("SANTHROTTLE_LAB_SMP") or str(FULL_RUN_SMP)
    lab = [sys.executable, str(LAB_PY), *(["--smp", smp] if smp else [])]
    if array:
        lab += ["--array", array]
    p = subprocess.run([*lab, "run", "--timeout", str(timeout), str(GUEST), *guest_args])
    if p.returncode != 0:
        print(f"lab run failed (exit {p.returncode}); results so far in {out}", file=sys.stderr)
        return p.returncode
    if not (args.short or args.light or args.no_curves):
        if array:  # the curves run on the unthrottled disk: no plant needed
            lab = lab[: lab.index("--array")] + lab[lab.index("--array") + 2 :]
        curves = ["--curves", "read/read,all/write", "--protocol", args.protocol]
        sweep = ["sweep", "--quick", "--no-overhead", *curves, "--out", str(out / CURVES_JSON)]
        p = subprocess.run([*lab, "run", "--timeout", "1200", str(CURVES_SCRIPT), *sweep])
        if p.returncode != 0:
            print(f"throttle curves failed (exit {p.returncode}); reporting without them")
    return report(out)


if __name__ == "__main__":
    sys.exit(main())
