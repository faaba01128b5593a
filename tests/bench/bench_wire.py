"""Wire sensor bench: storage traffic replayed through a veth pair (goal: >= 200,000
packets/s with at most half of one core, no completion lost).

Method (run by `make bench` through tests/bench/run.py, or alone:
`.venv/bin/python tests/bench/bench_wire.py [--json]`; needs root and tcpreplay):

  * The traffic (wire_traffic.py): 16 connections, half iSCSI and half NVMe/TCP,
    4 KiB reads (70 %) and writes, four commands in flight per connection, the
    PDUs cut to a 1448-byte MSS, a pure ACK for every two segments the other way;
    written to a pcap.
  * A fresh network namespace with a veth pair; the sensor (bridge/capture.py's
    ring on one end, bridge/tracker.py behind it) in a process of its own, inside
    the namespace; tcpreplay sends the pcap into the other end at each rate of RATES_PPS packets a
    second (`--pps`, `--preload-pcap`). The sensor starts mid-session (no SYN):
    every stream begins with a resynchronisation.
  * The sensor reports what it saw: frames, the commands and completions it
    matched against those the traffic holds, the ring's drops, and its CPU time
    (user + system of its process) over the span from the first frame to the
    last. Its CPU share of one core = CPU time / span.
  * For scale, the same frames decoded from memory (no kernel): microseconds of
    CPU per frame, the packets a second one core could take.

The namespace is deleted in a finally; nothing outside it is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import wire_traffic

N_CONNS = 16
N_IOS = 60_000
GOAL_PPS = 200_000
# The goal's rate, then one the sensor keeps up with on a slow host: what it loses
# there is what it gets wrong, not what it has no time for.
RATES_PPS = (GOAL_PPS, 40_000)
GOAL_CPU_SHARE = 0.5

SENSOR = r"""
import json, os, sys, time
from santhrottle.bridge.capture import Ring
from santhrottle.bridge.tracker import Tracker
tr = Tracker()
first = last = None
def seg(t, *a):
    tr.segment(t, *a)
with Ring(sys.argv[1]) as ring:
    print("ready", flush=True)
    c0 = os.times()
    while True:
        before = time.monotonic()
        n = ring.poll(200, seg)
        now = time.monotonic()
        if n and first is None:
            first = before
        if n:
            last = now
        elif first is not None and now - last > 1.5:
            break
    c1 = os.times()
    _, drops = ring.kernel_stats()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    print(json.dumps({"frames": ring.counters.frames, "segments": ring.counters.segments,
        "acks": ring.counters.acks, "commands": tr.counters.commands,
        "completions": tr.counters.completions, "unmatched": tr.counters.unmatched,
        "kernel_drops": ring.counters.kernel_drops, "cpu_s": cpu, "span_s": last - first}))
"""


def _skipped(why: str) -> dict[str, Any]:
    return {"name": NAME, "skipped": why, "summary": f"skipped ({why})", "met": False}


NAME = "wire sensor, iSCSI + NVMe/TCP replayed through a veth"


def offline_us_per_frame(frames: list[bytes], repeats: int = 3) -> float:
    from santhrottle.bridge.capture import CaptureCounters, FrameDecoder
    from santhrottle.bridge.tracker import Tracker

    views = [memoryview(f) for f in frames]
    out = []
    for _ in range(repeats):
        tr, dec = Tracker(), FrameDecoder(CaptureCounters())
        c0 = time.process_time()
        for v in views:
            dec.frame(v, 0, len(v), 0.0, tr.segment)
        out.append((time.process_time() - c0) / len(views) * 1e6)
    return statistics.median(out)


def _replay(ns: str, pcap: Path, pps: int) -> dict[str, Any]:
    """One replay at pps into stw0; what the sensor on stw1 saw."""
    sensor = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", SENSOR, "stw1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        if sensor.stdout is None or sensor.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the sensor did not start: {sensor.communicate()[1][-500:]}")
        rep = subprocess.run(
            ["ip", "netns", "exec", ns, "tcpreplay", "-i", "stw0", f"--pps={pps}",
             "--preload-pcap", str(pcap)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        out, err = sensor.communicate(timeout=120)
        if rep.returncode or not out.strip():
            raise RuntimeError(f"tcpreplay: {rep.stderr[-300:]} sensor: {err[-300:]}")
    finally:
        if sensor.poll() is None:
            sensor.kill()  # our own child, by PID
            sensor.wait()
    got: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    got["offered_pps"] = pps
    got["pps"] = got["frames"] / got["span_s"] if got["span_s"] else 0.0
    got["cpu_share"] = got["cpu_s"] / got["span_s"] if got["span_s"] else float("inf")
    return got


def bench_wire() -> dict[str, Any]:
    if os.geteuid() != 0:
        return _skipped("needs root (a network namespace)")
    if not shutil.which("tcpreplay"):
        return _skipped("tcpreplay is not installed (make setup)")
    frames, counts = wire_traffic.build(N_CONNS, N_IOS)
    us = offline_us_per_frame(frames)
    ns = f"stwire-{os.getpid()}"
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="santhrottle-wire-") as tmp:
        pcap = Path(tmp) / "storage.pcap"
        wire_traffic.write_pcap(pcap, frames)
        r = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
        if r.returncode:
            return _skipped(f"cannot create a network namespace: {r.stderr.strip()}")
        try:
            ip = ["ip", "-n", ns]
            subprocess.run([*ip, "link", "add", "stw0", "type", "veth", "peer", "name", "stw1"],
                           check=True)  # fmt: skip
            for k in ("all", "default"):  # no IPv6 chatter on the link
                subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw",
                                f"net.ipv6.conf.{k}.disable_ipv6=1"], check=True)  # fmt: skip
            for dev in ("stw0", "stw1"):
                subprocess.run([*ip, "link", "set", dev, "up"], check=True)
            for pps in RATES_PPS:
                runs.append(_replay(ns, pcap, pps))
        except RuntimeError as e:
            return _skipped(str(e))
        finally:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    goal = runs[0]
    lost = counts["completions"] - goal["completions"]
    met = (
        goal["pps"] >= GOAL_PPS and goal["cpu_share"] <= GOAL_CPU_SHARE
        and lost == 0 and not goal["kernel_drops"]
    )  # fmt: skip
    parts = [
        f"at {g['offered_pps']:,} pps offered: {g['frames']:,} of {len(frames):,} frames seen "
        f"({g['pps']:,.0f}/s), CPU {g['cpu_share']:.2f} of a core, completions "
        f"{g['completions']:,} of {counts['completions']:,} ({g['unmatched']} unmatched), "
        f"ring drops {g['kernel_drops']:,}"
        for g in runs
    ]
    return {
        "name": NAME,
        "met": met,
        "summary": "; ".join(parts) + f"; from memory {us:.2f} us of CPU per frame "
        f"({1e6 / us:,.0f} frames/s per core)",
        "frames_sent": len(frames),
        "completions_expected": counts["completions"],
        "runs": runs,
        "offline_us_per_frame": us,
        "goal": f">= {GOAL_PPS:,} packets/s at <= {GOAL_CPU_SHARE} core, 0 completions lost",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = bench_wire()
    print(json.dumps(r) if args.json else f"{r['name']}: {r['summary']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
