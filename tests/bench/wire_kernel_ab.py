"""The tc program's CPU a frame, this checkout's against another revision's, in one run.

`.venv/bin/python tests/bench/wire_kernel_ab.py --against REV [--rounds N]` (root,
clang; bridge/bpf/wire.bpf.o built: `make bpf`): REV's bridge/bpf/wire.bpf.c is
compiled with the flags `make bpf` uses, and both objects are loaded in turn on one
end of a veth pair in a namespace of their own (this one first in even rounds, REV's
in odd ones), each time afresh, while the bench's traffic (wire_traffic.py: 16
connections of iSCSI and NVMe/TCP, 60,000 commands, 280,199 frames) is sent into
the other end from this process; the kernel times every run of the program
(BPF_ENABLE_STATS). Reported per object: its run time over its runs (ns a frame),
the median and the spread (min..max) over the rounds, and the ratio of the medians
(this / REV: below 1 is cheaper). A round whose program did not match every
completion is an error. The namespace is deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT))
import wire_traffic  # noqa: E402


def compile_rev(rev: str, into: Path) -> Path:
    src = into / "wire.bpf.c"
    show = ["git", "-C", str(ROOT), "show", f"{rev}:bridge/bpf/wire.bpf.c"]
    src.write_bytes(subprocess.run(show, capture_output=True, check=True).stdout)
    multiarch = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    out = into / "wire.bpf.o"
    subprocess.run(["clang", "-O2", "-g", "-target", "bpf", "-Wall", "-Werror",
                    f"-I/usr/include/{multiarch}", "-c", str(src), "-o", str(out)],
                   check=True)  # fmt: skip
    return out


def ns_a_frame(obj: Path, dev: str, tx: socket.socket, frames: list[bytes], want: int) -> float:
    from santhrottle.bridge.kernel import KernelWire

    with KernelWire(dev, obj) as w:
        stats = w.enable_run_stats()
        try:
            for f in frames:
                tx.send(f)
            deadline = time.monotonic() + 60
            while w.counters().get("frames", 0) < len(frames) and time.monotonic() < deadline:
                time.sleep(0.05)
            k = w.counters()
            run_ns, runs = w.run_time()
        finally:
            os.close(stats)
    if k.get("completions") != want:
        raise SystemExit(f"{obj}: {k.get('completions')} of {want} completions matched")
    return run_ns / runs


def main() -> int:
    from santhrottle.appliance.netns import entered
    from santhrottle.bridge.kernel import OBJECT
    from tests.privileged.bridge_ns import veth_pair

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="the git revision to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    frames, counts = wire_traffic.build(16, 60_000, seed=1)
    got: dict[str, list[float]] = {"this": [], args.against: []}
    with tempfile.TemporaryDirectory() as tmp:
        objs = {"this": OBJECT, args.against: compile_rev(args.against, Path(tmp))}
        with veth_pair("wab") as ns, entered(ns):
            tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            tx.bind(("wab0", 0))
            for r in range(args.rounds):
                for name in list(objs) if r % 2 == 0 else list(objs)[::-1]:
                    ns_frame = ns_a_frame(objs[name], "wab1", tx, frames, counts["completions"])
                    got[name].append(ns_frame)
                    print(f"round {r} {name}: {ns_frame:.0f} ns a frame", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in got.items()}
    for k, v in got.items():
        print(f"{k}: {med[k]:.0f} [{min(v):.0f}..{max(v):.0f}] ns a frame ({len(frames):,} frames)")
    print(f"ratio this / {args.against}: {med['this'] / med[args.against]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
