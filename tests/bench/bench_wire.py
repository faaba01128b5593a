"""Wire sensor bench: storage traffic replayed through a veth pair (goal: >= 200,000
packets/s with at most half of one core, no completion lost).

Method (run by `make bench` through tests/bench/run.py, or alone:
`.venv/bin/python tests/bench/bench_wire.py [--json]`; needs root and tcpreplay):

  * The traffic (wire_traffic.py): 16 connections, half iSCSI and half NVMe/TCP,
    4 KiB reads (70 %) and writes, four commands in flight per connection, the
    PDUs cut to a 1448-byte MSS, a pure ACK for every two segments the other way;
    written to a pcap.
  * A fresh network namespace with a veth pair; the sensor on one end, in a process
    of its own inside the namespace; tcpreplay sends the pcap into the other end at
    each rate of RATES_PPS packets a second (`--pps`, `--preload-pcap`). The sensor
    starts mid-session (no SYN): every stream begins with a resynchronisation. Two
    sensors, one after the other:
      kernel   bridge/kernel.py's tc program on the end's ingress (bridge.sensor =
               "kernel"); its CPU is the time the kernel measured it running
               (BPF_ENABLE_STATS) plus its process's (reading the sums);
      capture  bridge/capture.py's ring and bridge/tracker.py in Python
               ("capture"); its CPU is its process's (user + system).
  * Each reports what it saw: frames, the commands and completions it matched
    against those the traffic holds, what it lost (the ring's drops), and its CPU
    share of one core: CPU time over the span from the first frame to the last
    (kernel: tcpreplay's own span, its sends being the program's runs).
  * Then, when tests/fixtures/wire/lab-wire.pcap.gz is there (a capture of the lab's
    bridge: vagrant/experiments/bridge_lab.py --capture), that lab traffic replayed at
    the goal's rate through each sensor, against the completions the Python path
    decodes from it in memory.
  * For scale, the same frames decoded from memory by the Python path (no kernel):
    microseconds of CPU per frame, the packets a second one core could take.

The goal is judged on the sensor bridge mode runs by default ("auto": the kernel's
when it loads). The namespace is deleted in a finally; nothing outside it is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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


KERNEL_SENSOR = r"""
import json, os, sys, time
from santhrottle.bridge.kernel import KernelWire
w = KernelWire(sys.argv[1])
stats = w.enable_run_stats()
print("ready", flush=True)
c0 = os.times()
seen, quiet = 0, None
while True:
    time.sleep(0.2)
    n = w.counters().get("frames", 0)
    if n != seen:
        seen, quiet = n, None
    elif n and quiet is None:
        quiet = time.monotonic()
    elif quiet is not None and time.monotonic() - quiet > 1.5:
        break
sums = w.volume_sums()
c1 = os.times()
run_ns, runs = w.run_time()
k = w.counters()
w.close()
os.close(stats)
print(json.dumps({"frames": k["frames"], "segments": k["segments"],
    "commands": k["commands"], "completions": k["completions"], "unmatched": k["unmatched"],
    "desyncs": k["desyncs"], "kernel_drops": 0, "run_ns": run_ns, "runs": runs,
    "reads": sum(v.reads for v in sums.values()),
    "process_cpu_s": (c1.user - c0.user) + (c1.system - c0.system)}))
"""
SENSORS = {"kernel": KERNEL_SENSOR, "capture": SENSOR}
TCPREPLAY_SPAN = re.compile(r"sent in ([0-9.]+) seconds")


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


def _replay(ns: str, pcap: Path, pps: int, kind: str) -> dict[str, Any]:
    """One replay at pps into stw0; what the sensor on stw1 saw."""
    sensor = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", SENSORS[kind], "stw1"],
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
    got["sensor"] = kind
    got["offered_pps"] = pps
    if kind == "kernel":  # the program runs as the packets arrive: tcpreplay's span
        m = TCPREPLAY_SPAN.search(rep.stdout)
        got["span_s"] = float(m.group(1)) if m else 0.0
        got["cpu_s"] = got["run_ns"] / 1e9 + got["process_cpu_s"]
        got["ns_per_frame"] = got["run_ns"] / got["runs"] if got["runs"] else None
    got["pps"] = got["frames"] / got["span_s"] if got["span_s"] else 0.0
    got["cpu_share"] = got["cpu_s"] / got["span_s"] if got["span_s"] else float("inf")
    return got


# Lab traffic: the array-side port of the lab's bridge captured while two readers read
# and two writers wrote zeros (vagrant/experiments/bridge_lab.py --capture).
LAB_PCAP = Path(__file__).resolve().parents[1] / "fixtures" / "wire" / "lab-wire.pcap.gz"


def offline_completions(pcap: Path) -> int:
    """The completions the Python path matches in pcap, decoded from memory: the count
    each sensor must reach when the capture is replayed."""
    from scapy.utils import RawPcapReader

    from santhrottle.bridge.capture import CaptureCounters, FrameDecoder
    from santhrottle.bridge.tracker import Tracker

    tr, dec = Tracker(), FrameDecoder(CaptureCounters())
    for raw, _meta in RawPcapReader(str(pcap)):
        v = memoryview(raw)
        dec.frame(v, 0, len(v), 0.0, tr.segment)
    return tr.counters.completions


def _lab_replays(ns: str, tmp: str) -> dict[str, Any] | None:
    """The lab's capture replayed at GOAL_PPS through each sensor (None without it)."""
    import gzip

    if not LAB_PCAP.exists():
        return None
    pcap = Path(tmp) / "lab.pcap"
    pcap.write_bytes(gzip.decompress(LAB_PCAP.read_bytes()))
    want = offline_completions(pcap)
    runs = []
    for kind in SENSORS:
        try:
            runs.append(_replay(ns, pcap, GOAL_PPS, kind))
        except RuntimeError as e:
            runs.append({"sensor": kind, "skipped": str(e)})
    return {"completions_expected": want, "runs": runs}


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
            for dev in ("stw0", "stw1"):  # the lab's capture holds GRO'd frames up to 64 KiB
                subprocess.run([*ip, "link", "set", dev, "mtu", "65535", "up"], check=True)
            lab = _lab_replays(ns, tmp)
            for kind in SENSORS:
                for pps in RATES_PPS:
                    try:
                        runs.append(_replay(ns, pcap, pps, kind))
                    except RuntimeError as e:
                        if kind != "kernel":
                            raise
                        runs.append({"sensor": kind, "offered_pps": pps, "skipped": str(e)})
                        break
        except RuntimeError as e:
            return _skipped(str(e))
        finally:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    done = [r for r in runs if "skipped" not in r]
    goal = done[0]  # the kernel's at the goal's rate when it loaded, else the capture's
    lost = counts["completions"] - goal["completions"]
    met = (
        goal["pps"] >= GOAL_PPS and goal["cpu_share"] <= GOAL_CPU_SHARE
        and lost == 0 and not goal["kernel_drops"]
    )  # fmt: skip
    parts = [
        f"{g['sensor']} at {g['offered_pps']:,} pps offered: "
        + (
            f"not run ({g['skipped'][:120]})"
            if "skipped" in g
            else f"{g['frames']:,} of {len(frames):,} frames seen ({g['pps']:,.0f}/s), CPU "
            f"{g['cpu_share']:.3f} of a core, completions {g['completions']:,} of "
            f"{counts['completions']:,} ({g['unmatched']} unmatched), ring drops "
            f"{g['kernel_drops']:,}"
            + (f", {g['ns_per_frame']:.0f} ns per frame" if g.get("ns_per_frame") else "")
        )
        for g in runs
    ]
    if lab is not None:
        k = next((g for g in lab["runs"] if "skipped" not in g), None)
        met = met and k is not None and k["completions"] == lab["completions_expected"]
    if lab is not None:  # the lab's traffic: every completion the Python decoding finds
        parts += [
            f"lab capture, {g['sensor']} at {GOAL_PPS:,} pps: "
            + (
                f"not run ({g['skipped'][:120]})"
                if "skipped" in g
                else f"{g['frames']:,} frames at {g['pps']:,.0f}/s"
                + (f", {g['ns_per_frame']:.0f} ns per frame" if g.get("ns_per_frame") else "")
                + f", completions {g['completions']:,} of {lab['completions_expected']:,} "
                f"({g['unmatched']} unmatched), ring drops {g['kernel_drops']:,}"
            )
            for g in lab["runs"]
        ]
    return {
        "name": NAME,
        "met": met,
        "lab_capture": lab,
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
