"""Drift check bench: the CPU the daemon's drift check costs per convergence.

Method (run by `make bench` through tests/bench/run.py, side by side against
another revision with `make bench-compare REV=... ARGS=drift`, or alone:
`.venv/bin/python tests/bench/bench_drift.py [--json]`; needs root):

  * A fresh network namespace with a veth device; the data path applied
    there with the default ladder (193 tc objects) and pfifo leaves, one
    initiator pinned at class 5 (the jumps in).
  * CONVERGENCES calls of the daemon's DriftWatch.check(), the call its
    convergence worker makes after each convergence, on a clock that moves
    1 s between calls: nothing drifts, so this is the steady cost -- the
    full comparison every CHECK_EVERY_S and, where the revision has one,
    the presence read at every other convergence.
  * The CPU of each call, this process's (user + sys) plus its children's
    (the programs a check runs, `iptables -S` and `ip6tables -S` through
    nsenter): the mean per convergence is the figure (check_ms_per_convergence);
    the median (a convergence without a full comparison) and the max next to it.

The namespace is deleted in a finally; nothing outside it is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import threading
from typing import Any

import scratch

CONVERGENCES = 60


def _cpu_ms() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime) * 1000.0


def bench_drift() -> dict[str, Any]:
    name = "drift check, CPU per convergence (one device, the default ladder)"
    if os.geteuid() != 0:
        return _skipped(name, "needs root (a network namespace with ipset, tc and iptables)")
    from santhrottle.appliance import datapath as dp
    from santhrottle.appliance.daemon.core.drift import DriftWatch
    from santhrottle.appliance.datapath.actuation import Actuation

    try:
        with scratch.veth_netns("std") as ns:
            spec = dp.DatapathSpec(("std0",), leaf="pfifo", link_bits_s=10_000_000_000)
            act = Actuation(dp.Datapath(spec, netns=ns))
            try:
                act.apply()
                act.reconcile({"192.0.2.11": (5, "all")}, ordered=False)
                watch, lock = DriftWatch(), threading.RLock()
                per = []
                for i in range(CONVERGENCES):
                    t0 = _cpu_ms()
                    watch.check(act, lock, float(i))
                    per.append(_cpu_ms() - t0)
                found = watch.found
            finally:
                act.cleanup()
    except scratch.NoNetns as e:
        return _skipped(name, str(e))
    out: dict[str, Any] = {
        "name": name,
        "convergences": CONVERGENCES,
        "check_ms_per_convergence": statistics.fmean(per),
        "check_ms_median": statistics.median(per),
        "check_ms_max": max(per),
        "drift_found": found,
        "loadavg_1min": os.getloadavg()[0],
        "goal_ms": None,
    }
    out["met"] = not found
    out["summary"] = (
        f"{out['check_ms_per_convergence']:.2f} ms of CPU per convergence on average "
        f"(median {out['check_ms_median']:.2f}, max {out['check_ms_max']:.1f}: a full "
        f"comparison) over {CONVERGENCES} convergences, programs included; load average "
        f"{out['loadavg_1min']:.1f}"
    )
    return out


def _skipped(name: str, why: str) -> dict[str, Any]:
    return scratch.skipped(name, why, None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    r = bench_drift()
    if args.json:
        json.dump(r, sys.stdout, indent=1)
        print()
    else:
        print(f"{r['name']}: {r['summary']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
