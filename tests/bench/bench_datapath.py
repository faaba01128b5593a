"""Data path bench: moving 10,000 initiators between delay classes (goal <= 50 ms).

Method (run by `make bench` through tests/bench/run.py, or alone:
`.venv/bin/python tests/bench/bench_datapath.py [--json]`; needs root):

  * A fresh network namespace with a veth device; the data path applied
    there with pfifo leaves (the HTB/ipset/iptables layout is the real one;
    the leaf kind does not change what a class move costs: a move touches
    only the ipset).
  * 10,000 members loaded into santhrottle-all, then every one of them
    moved to another class with Datapath.set_classes() -- the call the
    daemon makes at each 1 s convergence -- timed end to end, including the
    diff against the known membership and starting nsenter + ipset.  With
    every member changing, set_classes rebuilds the set into a temporary
    set and swaps it in (one `ipset restore`).  Median and max of REPEATS.
  * The alternatives, timed the same way: the same moves forced in place
    (`ipset -exist restore` into the live set: one netlink round trip per
    line), and single pyroute2 netlink ops (what set_classes uses for small
    change sets).
  * The crossover: change sets of 1..512 members through both paths; the
    smallest size where the restore is faster is the measured bulk
    threshold (datapath/members.py, BULK_THRESHOLD).
  * For scale: building the tree of 100 classes (one `tc -batch`).
  * Wall times depend on what else runs: the CPU time the nsenter + ipset
    processes used (user + sys, most of it the kernel updating 10,000
    members) and the load average are reported next to them.

The namespace is deleted in a finally; nothing outside it is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from typing import Any

import scratch

N_INITIATORS = 10_000
REPEATS = 7
GOAL_MS = 50.0
CROSSOVER_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256, 512)


def _ips(n: int) -> list[str]:
    return [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(1, n + 1)]


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000.0


def bench_datapath() -> dict[str, Any]:
    name = "datapath set reconcile, 10,000 initiators moved between classes"
    if os.geteuid() != 0:
        return _skipped(name, "needs root (a network namespace with ipset and tc)")
    from santhrottle.appliance import datapath as dp
    from santhrottle.appliance.datapath import members

    try:
        with scratch.veth_netns("stb") as ns:
            # glide_leaves=0: the set moves alone (a descent through a glide leaf adds
            # two tc messages to the same ipset ops; measured in the lab, not here)
            spec = dp.DatapathSpec.linear(("stb0",), 500, 100, leaf="pfifo", glide_leaves=0)
            with dp.Datapath(spec, netns=ns) as d:
                build_ms = _time(d.apply)
                ips = _ips(N_INITIATORS)
                load_ms = _time(
                    lambda: d.set_classes({ip: 1 + i % 100 for i, ip in enumerate(ips)})
                )
                assert len(d.current()) == N_INITIATORS
                shift = iter(range(1, 10**6))

                def moves(swap_factor: float) -> tuple[list[float], float]:
                    """REPEATS moves of all 10,000 members; (wall ms, child CPU ms per move)."""
                    saved = members.SWAP_LINES_PER_INPLACE_LINE
                    members.SWAP_LINES_PER_INPLACE_LINE = swap_factor
                    try:
                        out = []
                        self0 = time.process_time()
                        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                        for _ in range(REPEATS):
                            s = next(shift)
                            want = {ip: 1 + (i + s) % 100 for i, ip in enumerate(ips)}
                            out.append(_time(lambda w=want: d.set_classes(w)))
                        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                        self_cpu.append((time.process_time() - self0) * 1000.0 / REPEATS)
                    finally:
                        members.SWAP_LINES_PER_INPLACE_LINE = saved
                    got = {ip: m.klass for ip, m in d.current().items()}
                    assert got == want, "the kernel holds what was asked"
                    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
                    return out, cpu * 1000.0 / REPEATS

                self_cpu: list[float] = []
                move_ms, restore_cpu_ms = moves(members.SWAP_LINES_PER_INPLACE_LINE)  # as shipped
                inplace_ms, inplace_cpu_ms = moves(0.0)  # always in place
                swap_ms, swap_cpu_ms = moves(float("inf"))  # always rebuild + swap
                # single netlink ops: 1,000 moves, extrapolated
                d.current()
                sub = ips[:1000]
                d.sets.bulk_threshold = 10**9
                nl_ms = _time(lambda: d.set_classes({ip: 50 for ip in sub}))
                nl_per_s = 1000 / (nl_ms / 1000)
                # crossover between the two paths
                cross = []
                for k, size in enumerate(CROSSOVER_SIZES):
                    part = ips[2000 : 2000 + size]
                    d.sets.bulk_threshold = 10**9
                    t_nl = statistics.median(
                        _time(lambda c=c, p=part: d.set_classes({ip: c for ip in p}))
                        for c in (10 + k, 60 + k, 10 + k + 1)
                    )
                    d.sets.bulk_threshold = 0
                    t_rs = statistics.median(
                        _time(lambda c=c, p=part: d.set_classes({ip: c for ip in p}))
                        for c in (20 + k, 70 + k, 20 + k + 1)
                    )
                    cross.append({"size": size, "netlink_ms": t_nl, "restore_ms": t_rs})
                crossover = next(
                    (c["size"] for c in cross if c["restore_ms"] < c["netlink_ms"]), None
                )
                d.cleanup()
    except scratch.NoNetns as e:
        return _skipped(name, str(e))
    out = {
        "name": name,
        "initiators": N_INITIATORS,
        "move_ms_median": statistics.median(move_ms),
        "move_ms_max": max(move_ms),
        "load_ms": load_ms,
        "restore_cpu_ms": restore_cpu_ms,
        "python_cpu_ms": self_cpu[0],
        "loadavg_1min": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "swap_ms_median": statistics.median(swap_ms),
        "swap_cpu_ms": swap_cpu_ms,
        "inplace_ms_median": statistics.median(inplace_ms),
        "inplace_cpu_ms": inplace_cpu_ms,
        "netlink_ops_per_s": nl_per_s,
        "netlink_10k_ms_estimate": N_INITIATORS / nl_per_s * 1000,
        "restore_lines_per_s": N_INITIATORS / (statistics.median(move_ms) / 1000),
        "crossover": cross,
        "crossover_size": crossover,
        "bulk_threshold": members.BULK_THRESHOLD,
        "build_100_classes_ms": build_ms,
        "goal_ms": GOAL_MS,
    }
    out["met"] = out["move_ms_median"] <= GOAL_MS
    out["summary"] = _summary(out)
    return out


def _skipped(name: str, why: str) -> dict[str, Any]:
    return scratch.skipped(name, why, GOAL_MS)


def _summary(r: dict[str, Any]) -> str:
    return (
        f"{r['move_ms_median']:.1f} ms median ({r['move_ms_max']:.1f} max; temporary sets + "
        f"swap in one ipset restore; CPU per move {r['restore_cpu_ms']:.0f} ms in nsenter+ipset "
        f"+ {r['python_cpu_ms']:.0f} ms in Python; "
        f"load average {r['loadavg_1min']:.1f} on {r['cpus']} CPUs); in place with "
        f"ipset -exist restore {r['inplace_ms_median']:.1f} ms ({r['inplace_cpu_ms']:.0f} ms "
        f"CPU); single netlink ops {r['netlink_ops_per_s'] / 1000:.1f}k/s (10,000 would take "
        f"{r['netlink_10k_ms_estimate']:.0f} ms); a restore beats single ops from "
        f"{r['crossover_size']} changes (bulk_threshold {r['bulk_threshold']}); 100-class "
        f"tree built in {r['build_100_classes_ms']:.0f} ms"
    )


def format_result(r: dict[str, Any]) -> str:
    """The line `make bench` prints (same shape as tests/bench/run.py's)."""
    return f"{r['name']}: {r['summary']}; goal <= {r['goal_ms']:g} ms: " + (
        "met" if r["met"] else "MISSED"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    r = bench_datapath()
    if args.json:
        json.dump(r, sys.stdout, indent=1)
        print()
    else:
        print(format_result(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
