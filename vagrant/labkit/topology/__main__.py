"""`python3 -m labkit.topology up | status | down`: the lab topology from the command line.

Also the two hidden subcommands up() and down() run under nsenter in the target's
namespace (labkit.topology.target): _target-up (the plan on stdin) and _target-down.
"""

from __future__ import annotations

import argparse
import json
import sys

from labkit.topology import ULA_PREFIX, down, status, up
from labkit.topology.target import target_down, target_up


def _indices(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else tuple(int(x) for x in text.split(",") if x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m labkit.topology", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="bring the topology up")
    u.add_argument("--luns", type=int, default=4, help="iSCSI LVs/targets/initiators (0-8)")
    u.add_argument("--nvme", type=int, default=1, help="NVMe/TCP LVs/subsystems (0-8)")
    u.add_argument("--lv-size-mib", type=int, default=256)
    u.add_argument(
        "--disk",
        choices=("slow", "fast", "nullb", "array"),
        default="slow",
        help="the QEMU-throttled disk (slow), the unthrottled one, a null_blk array, or "
        "the known plant (array: lab.py --array nbd; docs/lab.md)",
    )
    u.add_argument("--nullb-mbps", type=int, default=20, help="null_blk bandwidth cap, MB/s")
    u.add_argument("--nullb-queue-depth", type=int, default=4, help="null_blk hw queue depth")
    u.add_argument("--no-login", action="store_true", help="create node records, do not log in")
    u.add_argument("--no-rps", action="store_true", help="leave RPS off (shows the retransmits)")
    u.add_argument(
        "--bridge",
        action="store_true",
        help="a transparent bridge between the two (netns labbr)",
    )
    u.add_argument(
        "--links",
        type=int,
        default=1,
        help="veth pairs; iSCSI initiator k uses link k %% links",
    )
    u.add_argument(
        "--ipv6",
        action="store_true",
        help=f"the last iSCSI initiator and NVMe/TCP host 0 over IPv6 ({ULA_PREFIX}/64)",
    )
    u.add_argument("--ipv6-iscsi", help="which iSCSI initiators use IPv6 (indices: 0,3)")
    u.add_argument("--ipv6-nvme", help="which NVMe/TCP hosts use IPv6 (indices: 0)")
    sub.add_parser("down", help="tear it down")
    sub.add_parser("status", help="print the stored description (JSON)")
    sub.add_parser("_target-up")
    sub.add_parser("_target-down")
    a = ap.parse_args(argv)
    if a.cmd == "up":
        t = up(
            a.luns,
            a.nvme,
            a.lv_size_mib,
            a.disk,
            login=not a.no_login,
            rps=not a.no_rps,
            nullb_mbps=a.nullb_mbps,
            nullb_queue_depth=a.nullb_queue_depth,
            links=a.links,
            bridge=a.bridge,
            ipv6=a.ipv6,
            ipv6_iscsi=_indices(a.ipv6_iscsi),
            ipv6_nvme=_indices(a.ipv6_nvme),
        )
        print(json.dumps(t, indent=1))
    elif a.cmd == "down":
        down()
    elif a.cmd == "status":
        print(json.dumps(status(), indent=1))
    elif a.cmd == "_target-up":
        print(json.dumps(target_up(json.loads(sys.stdin.read()))))
    elif a.cmd == "_target-down":
        print(json.dumps(target_down()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
