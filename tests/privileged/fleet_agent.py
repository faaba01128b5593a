"""One appliance's EtcdCoordinator in a process of its own, driven over stdin/stdout.

Run inside a network namespace (`ip netns exec NS python fleet_agent.py ARRAY TTL
ENDPOINT... [--ca F --cert F --key F --user U --password-file F]`): reads one
JSON request a line, {"op": "campaign", "args": ["vg0"]},
answers one JSON line, {"ok": result, "s": seconds} or {"err": "EngineUnavailable",
"msg": "...", "s": seconds}.  While joined and idle it refreshes its lease every
ttl/4 (as the daemon would every few ticks), so killing the process is an
appliance that dies: its lease then ends by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import select
import sys
import time
from typing import Any

from santhrottle.appliance.fleet.engine import EngineUnavailable
from santhrottle.appliance.fleet.etcd import EtcdCoordinator
from santhrottle.appliance.fleet.gateway import Security


def plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    return v


def etcd_leader(c: EtcdCoordinator) -> str:
    """The endpoint whose member is etcd's raft leader (its status says so)."""
    for client in c.gateway.clients:
        client.timeout = 1.0
        got = client.post(client.get_url("/maintenance/status"), json={})
        if got["leader"] == got["header"]["member_id"]:
            return f"{client.host}:{client.port}"
    raise AssertionError("no member says it leads")


def bench(c: EtcdCoordinator, what: str, n: int) -> list[float]:
    """n calls of one kind, their seconds each (joined, leading "vg0" for "txn")."""
    lead = c.campaign("vg0") if what == "txn" else None
    calls = {
        "put": lambda: c.publish_samples({"seq": 1, "reads": [["vg0", 6, 0.004, None, None]]}),
        "txn": lambda: c.publish_decisions("vg0", lead.epoch if lead else 0, {"c": {"h": 3}}),
        "range": c.snapshot,
        "keepalive": c.refresh,
    }
    out = []
    refreshed = time.monotonic()
    for _ in range(n):
        if time.monotonic() - refreshed > c.ttl_s / 4:  # as the idle loop would
            c.refresh()
            refreshed = time.monotonic()
        t0 = time.perf_counter()
        calls[what]()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("array")
    ap.add_argument("ttl", type=int)
    ap.add_argument("endpoints", nargs="+")
    for opt in ("--ca", "--cert", "--key", "--user", "--password-file"):
        ap.add_argument(opt)
    a = ap.parse_args()
    password = None
    if a.password_file:
        with open(a.password_file) as f:
            password = f.readline().rstrip("\n")
    sec = Security(a.ca, a.cert, a.key, a.user, password)
    array, ttl = a.array, a.ttl
    c = EtcdCoordinator(array, a.endpoints, ttl_s=ttl, security=sec)
    every_s = ttl / 4
    next_refresh = time.monotonic() + every_s
    refreshing = True
    print(json.dumps({"ready": True}), flush=True)
    while True:
        wait = max(0.0, next_refresh - time.monotonic())
        readable, _, _ = select.select([sys.stdin], [], [], wait)
        if not readable:
            if refreshing and c._lease is not None:
                with contextlib.suppress(EngineUnavailable):  # the next call will say so
                    c.refresh()
            next_refresh = time.monotonic() + every_s
            continue
        line = sys.stdin.readline()
        if not line:
            return
        req = json.loads(line)
        op, args = req["op"], req.get("args", [])
        t0 = time.monotonic()
        try:
            if op == "refreshing":
                refreshing = bool(args[0])
                got: Any = None
            elif op == "granted_ttl_s":
                got = c.granted_ttl_s
            elif op == "lease":
                got = c.lease
            elif op == "authentications":
                got = c.gateway.authentications
            elif op == "etcd_leader":
                got = etcd_leader(c)
            elif op == "bench":
                got = bench(c, *args)
            else:
                got = getattr(c, op)(*args)
            answer = {"ok": plain(got)}
        except Exception as e:  # the test shows what it was
            answer = {"err": type(e).__name__, "msg": str(e)}
        answer["s"] = time.monotonic() - t0
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
