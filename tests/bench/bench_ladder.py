"""What a ladder's class count costs: tree build, read-back, teardown.

Method (run by `make bench` through tests/bench/run.py, or alone:
`.venv/bin/python tests/bench/bench_ladder.py [--json]`; needs root):

  * A fresh network namespace with a veth device; per ladder, the data path
    applied there (one `tc -batch`: an HTB class and a leaf qdisc per
    class), its tree read back (what the daemon and `datapath show` do),
    and removed; median of REPEATS each.
  * The leaves are pfifo: this host kernel has no sch_netem. A netem qdisc
    allocates its own state on top, so the figures are a floor for netem
    leaves. Kernel memory is not measured here: on a shared machine
    MemAvailable moves by megabytes between two reads.
  * Ladders: the default (0.5 ms steps to 10 ms, x1.05 above, 250 ms: 88
    classes), the previous default (linear 0.5 ms to 50 ms: 100 classes),
    and a linear ladder with the default's reach (250 ms: 500 classes).

The namespace is deleted in a finally; nothing outside it is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

REPEATS = 3
LADDERS = (  # name, step_us, max_delay_us, ratio
    ("default (x1.05, 250 ms)", 500, 250_000, 1.05),
    ("linear 0.5 ms to 50 ms", 500, 50_000, 1.0),
    ("linear 0.5 ms to 250 ms", 500, 250_000, 1.0),
)


def bench_ladder() -> dict[str, Any]:
    name = "ladder size: tree build, read-back, teardown"
    if os.geteuid() != 0:
        return {"name": name, "skipped": "needs root", "summary": "skipped (needs root)",
                "met": True, "goal_ms": None}  # fmt: skip
    from santhrottle.appliance import datapath as dp

    ns = f"stladder-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    rows = []
    try:
        subprocess.run(
            ["ip", "-n", ns, "link", "add", "stl0", "type", "veth", "peer", "name", "stl1"],
            check=True,
        )
        subprocess.run(["ip", "-n", ns, "link", "set", "stl0", "up"], check=True)
        for label, step, top, ratio in LADDERS:
            spec = dp.DatapathSpec(
                ("stl0",), step_us=step, max_delay_us=top, ladder_ratio=ratio, leaf="pfifo"
            )
            build, read, down = [], [], []
            for _ in range(REPEATS):
                with dp.Datapath(spec, netns=ns) as d:
                    t0 = time.perf_counter()
                    d.apply()
                    t1 = time.perf_counter()
                    d.device("stl0").observe()
                    t2 = time.perf_counter()
                    d.cleanup()
                    t3 = time.perf_counter()
                build.append((t1 - t0) * 1000)
                read.append((t2 - t1) * 1000)
                down.append((t3 - t2) * 1000)
            rows.append(
                {
                    "ladder": label,
                    "classes": spec.max_class,
                    "build_ms": statistics.median(build),
                    "build_ms_range": [min(build), max(build)],
                    "read_back_ms": statistics.median(read),
                    "teardown_ms": statistics.median(down),
                }
            )
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    return {
        "name": name,
        "rows": rows,
        "met": True,
        "goal_ms": None,
        "summary": "; ".join(
            f"{r['ladder']}: {r['classes']} classes, build {r['build_ms']:.0f} ms "
            f"[{r['build_ms_range'][0]:.0f}..{r['build_ms_range'][1]:.0f}], read back "
            f"{r['read_back_ms']:.0f} ms, teardown {r['teardown_ms']:.0f} ms"
            for r in rows
        ),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    r = bench_ladder()
    print(json.dumps(r, indent=1) if args.json else f"{r['name']}: {r['summary']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
