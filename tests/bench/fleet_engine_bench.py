"""The fleet engine's costs on this machine: etcd (3 members, each in a network namespace).

    sudo .venv/bin/python tests/bench/fleet_engine_bench.py [--n 500] [--failovers 5] [--disk]

Prints, for EtcdCoordinator calls made by an appliance inside a member's namespace
(tests/privileged/etcd_cluster.py; its own member first in the endpoint list):
    put        publish_samples: one put under the lease
    txn        publish_decisions: the fenced txn (two compares, one put)
    range      snapshot: one linearizable range over the array's prefix
    keepalive  refresh: one lease keep-alive
each as median, 10th / 90th / 99th percentile and max in ms; the lease TTL etcd
grants for a request of 1 s with the test's timers and with etcd's defaults; and
the leader failover (leader process killed -> another appliance's campaign
succeeds), --failovers times.  Data on tmpfs unless --disk (then under /tmp: the
WAL's fsync counts).  Needs root, ip, etcd; traffic only inside the namespaces.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))
from tests.privileged.etcd_cluster import (
    ELECTION_MS,
    HEARTBEAT_MS,
    Agent,
    cluster,
    missing,
)


def spread(xs: list[float]) -> str:
    ms = sorted(x * 1000 for x in xs)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return (
        f"median {statistics.median(ms):6.2f} ms  p10 {q[9]:6.2f}  p90 {q[89]:6.2f}  "
        f"p99 {q[98]:6.2f}  max {ms[-1]:6.2f}  (n={len(ms)})"
    )


def ops(n: int, disk: bool) -> None:
    with cluster(f"b{os.getpid()}", on_disk=disk) as c:
        a = Agent(c, 0, "bench")
        a.join("a", {})
        print(f"etcd {HEARTBEAT_MS}/{ELECTION_MS} ms, data on {'disk' if disk else 'tmpfs'}")
        a.call("bench", "range", 20)  # warm the connection
        for what in ("put", "txn", "range", "keepalive"):
            print(f"  {what:9s} {spread(a.call('bench', what, n))}")
        print(f"  lease TTL asked 1 s, granted {a.call('granted_ttl_s')} s")
        a.kill()


def default_ttl() -> None:
    with cluster(f"d{os.getpid()}", heartbeat_ms=100, election_ms=1000) as c:
        a = Agent(c, 0, "ttl")
        a.join("a", {})
        print(
            f"etcd defaults 100/1000 ms: lease TTL asked 1 s, granted {a.call('granted_ttl_s')} s"
        )
        a.kill()


def failovers(k: int) -> None:
    took = []
    with cluster(f"f{os.getpid()}") as c:
        for i in range(k):
            array = f"failover{i}"
            a, b, d = (
                Agent(c, i % 3, array),
                Agent(c, (i + 1) % 3, array),
                Agent(c, (i + 2) % 3, array),
            )
            for x, name in ((a, "a"), (b, "b"), (d, "d")):
                x.join(name, {})
            assert a.campaign("vg0") is not None
            time.sleep(1.0)
            a.kill()
            t0 = time.monotonic()
            while not (b.campaign("vg0") or d.campaign("vg0")):
                time.sleep(0.02)
            took.append(time.monotonic() - t0)
            b.kill()
            d.kill()
    print(f"leader failover, TTL 1 s, refresh every 0.25 s: {spread(took)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=500, help="calls per kind")
    ap.add_argument("--failovers", type=int, default=5)
    ap.add_argument("--disk", action="store_true", help="data under /tmp, not tmpfs")
    args = ap.parse_args()
    why = missing()
    if why:
        sys.exit(f"fleet_engine_bench: {why}")
    ops(args.n, args.disk)
    default_ttl()
    if args.failovers:
        failovers(args.failovers)


if __name__ == "__main__":
    main()
