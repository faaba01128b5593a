#!/usr/bin/env python3
"""The lab's IPv6 initiators come up and move data (issue 21). Runs INSIDE the guest.

    .venv/bin/python vagrant/qemu/lab.py run --timeout 900 vagrant/experiments/ipv6_lab.py \\
        --out results/ipv6-lab.json                     # make lab-ipv6

topology.up(ipv6=True) on the unthrottled disk: two iSCSI initiators, the second
(ini1) over IPv6, and one NVMe/TCP host over IPv6 (fd00:5374::/64, nodad; the LIO
portal "[fd00:5374::12]:3260", the nvmet port adrfam ipv6).  Per initiator: its
family and addresses, the target's established connections to 3260 / 4420 with
their peers (ss in netns tgt, so each session is seen to come from the address
it was given), and fio 64k qd1 reads and writes (16 MiB each) with the target's
TCP retransmissions around them.  No santhrottled: the product's IPv6 data path
is not on this branch; this checks the lab's half.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from labkit import fio, topology
from labkit.curves import counters as tcp_counters

SIZE = 16 << 20


def peers(port: int) -> list[str]:
    out = topology.sh(
        ["ip", "netns", "exec", "tgt", "ss", "-tnH", "state", "established", f"( sport = :{port} )"]
    )
    return sorted({line.split()[-1].rsplit(":", 1)[0].strip("[]") for line in out.splitlines()})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--luns", type=int, default=2)
    a = ap.parse_args()
    if topology.status() is not None:
        topology.down()
    t0 = time.monotonic()
    t = topology.up(luns=a.luns, nvme=1, disk="fast", lv_size_mib=128, ipv6=True)
    res: dict = {
        "kernel": os.uname().release,
        "timings_s": t["timings_s"],
        "target_peers": {"3260": peers(3260), "4420": peers(4420)},
        "target_listeners": topology.sh(["ip", "netns", "exec", "tgt", "ss", "-tlnH"]).split("\n"),
        "initiators": [],
    }
    ok = True
    try:
        inis = [("iscsi", x, x["initiator_ip"], x["portal"]) for x in t["iscsi"]] + [
            ("nvme", x, x["host_traddr"], x["traddr"]) for x in t["nvme"]
        ]
        for proto, x, src, dst in inis:
            r = {
                "protocol": proto,
                "family": x["family"],
                "source": src,
                "target": dst,
                "device": x["device"],
            }
            c0 = tcp_counters()
            for rw in ("read", "write"):
                secs = fio.once(x["device"], rw, "64k", 1, SIZE)
                r[f"{rw}_mb_s"] = SIZE / secs / 1e6
            c1 = tcp_counters()
            r["target_retrans"] = c1["TcpRetransSegs"] - c0["TcpRetransSegs"]
            port = "3260" if proto == "iscsi" else "4420"
            r["seen_by_target"] = src in res["target_peers"][port]
            ok &= r["seen_by_target"]
            res["initiators"].append(r)
            print(
                f"{proto} IPv{x['family']} {src} -> {dst} ({x['device']}): read "
                f"{r['read_mb_s']:.1f} MB/s, write {r['write_mb_s']:.1f} MB/s, target retrans "
                f"{r['target_retrans']}, a connection from {src} at the target: "
                f"{r['seen_by_target']}",
                flush=True,
            )
    finally:
        topology.down()
        res["wall_s"] = time.monotonic() - t0
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1))
    print(f"target peers: {res['target_peers']}")
    print(f"wrote {a.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
