"""CI's short version of the closed-loop experiment (docs/lab.md): one threshold, three bursts.

A lab-tier test that boots its own guest through vagrant/experiments/report.py
--short: the paper's workload on a known plant (lab.py --array
nbd:c_ms=2,m_ms=10: nbdkit on the host, installed by lab.py's deps; 12
sequential 128 KiB QD1 writers from 3 hosts, the 256 kB/s reader), the daemon
with the product's defaults at T = half the uncontrolled p95 within 10-20 ms, then
the same controlled phase with santhrottled in bridge mode on a bridge between the
initiators and the target (the wire its sensor).  Without santhrottle the reader
waits C + m x Q at the target, Q the writers' IOs at the array: about 100 ms when
the guest keeps ~10 of them there, but only 26-28 ms where a busy host slows the
emulated writers to over half a second of their own per IO.  T follows: 20 ms on a
quiet host, lower on a busy one, so the precondition, uncontrolled p95 >= 2 T, holds
whatever the host (docs/lab.md); the test fails when the controller does not hold T.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

CHECKOUT = Path(__file__).resolve().parents[2]
REPORT = CHECKOUT / "vagrant" / "experiments" / "report.py"
LAB_UNAVAILABLE = 3  # vagrant/qemu/lab.py: QEMU or the kernel package is missing
# report.py --short: closed_loop.py --paper --thresholds auto:10ms-20ms
THRESHOLD_MIN_S, THRESHOLD_MAX_S = 0.010, 0.020
# the test's own budget on an idle host (report.py's guest timeout, 1,500 s, is under
# it): 7.5-8 min on a 2-core host (docs/lab.md); it grows with how much slower the guest
# measured itself in the run (labkit.speed: each phase's `speed_factor`), as the guest's
# limit does
BUDGET_S = 1800
# The writers' load on the plant, rho = X m (X their IOs a second, m the plant's ms per
# IO in flight): the array's queue, and the reader's wait, grow without bound as rho
# nears 1.  The writers are QD1: each IO takes the plant's time plus what the host adds
# (the emulated guest's own time, the plant's process waiting for a core).  Where that
# is most of it the plant stays under half loaded and the reader under 2 x the lowest T
# (two busy loops and another guest beside this one: rho 0.28, uncontrolled p95 11.9 ms,
# against rho 0.90-0.95 and 61-69 ms in three runs at speed factors 1.8-5.0): that host
# cannot run this check, which skips with its figures.  A plant loaded beyond it that
# still leaves the reader under 2 T is a broken lab: that fails.
BUSY_HOST_RHO = 0.5


def test_short_closed_loop_holds_the_threshold():
    out = CHECKOUT / "results" / f"ci-closed-loop-{os.getpid()}"
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, str(REPORT), "--short", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=BUDGET_S * 4,
    )
    wall = time.monotonic() - t0
    if p.returncode == LAB_UNAVAILABLE:
        why = [x for x in (p.stderr + p.stdout).splitlines() if x.startswith("lab unavailable")]
        pytest.skip(why[0] if why else "lab unavailable (vagrant/qemu/lab.py exit 3)")
    assert p.returncode == 0, f"{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    print(p.stdout[-3000:])
    s = json.loads((out / "summary.json").read_text())
    (c,) = s["controlled"]
    thr = c["threshold_s"]
    unc = s["uncontrolled"]["read_latency_p95_s"]
    print(
        f"CI closed loop: T {thr * 1e3:g} ms, uncontrolled p95 {unc * 1e3:.2f} ms, controlled "
        f"p95 {c['read_latency_p95_s'] * 1e3:.2f} ms (p99 {c['read_latency_p99_s'] * 1e3:.2f}, "
        f"above T {c['time_above_threshold_pct']:.1f} %), writes "
        f"{c['write_bytes_per_s'] / 1e6:.2f} MB/s, target retrans {c['target_retrans_segs']} "
        f"(uncontrolled {s['uncontrolled']['target_retrans_segs']}), wall {wall:.0f} s"
    )
    assert THRESHOLD_MIN_S <= thr <= THRESHOLD_MAX_S
    assert c["sets_left_after_stop"] == []
    (b,) = s["bridge"]
    assert b["sets_left_after_stop"] == []
    assert c["target_sack_reorder"] == 0, c
    raw = json.loads((out / "raw.json").read_text())
    slow = max((ph.get("speed_factor") or 1.0 for ph in raw["phases"]), default=1.0)
    budget = BUDGET_S * slow
    print(
        f"wall {wall:.0f} s of its {budget:.0f} s budget ({BUDGET_S} s x the guest's speed "
        f"factor {slow:.2f}; margin {budget - wall:.0f} s)"
    )
    assert wall <= budget, f"the closed loop took {wall:.0f} s, over its {budget:.0f} s budget"
    # the plant's construction and the host's load, not the controller: a host too busy to
    # load the plant skips, a broken lab fails, each said as such
    rho = _writers_load(raw, s["uncontrolled"]["write_bytes_per_s"])
    if unc < 2 * thr:
        why = (
            f"the known plant gave only {unc * 1e3:.1f} ms uncontrolled (under 2 T): its "
            f"writers loaded it to rho {rho:.2f} (speed factor {slow:.2f})"
        )
        if rho < BUSY_HOST_RHO:
            pytest.skip(f"the host is too busy for the closed loop: {why}")
        pytest.fail(f"a broken lab: {why}")
    assert c["read_latency_p95_s"] <= thr, c
    print(
        "target: retrans {target_retrans_segs}, tail-loss probes {target_loss_probes}, "
        "fast retrans {target_fast_retrans}, timeouts {target_timeouts}; "
        "spurious by the initiators' DSACKs {target_dsack_recv}; reorderings seen "
        "{target_sack_reorder}; on the writers' connections {target_retrans_writers}, the "
        "reader's {target_retrans_others}; iSCSI connections' min RTT {min_rtt_ms} ms".format(**c)
    )
    print(f"descents: {c['glided_descents']} through glide leaves, {c['unordered_descents']} not")
    # Lowered delays glide in one netem FIFO per group of initiators (docs/datapath.md):
    # the writers' packets are never reordered.  Retransmissions are printed, not
    # asserted: under TCG the target sends spurious tail-loss probes with or without
    # santhrottle (docs/lab.md), which is random.
    assert c["glided_descents"] > 0 and c["unordered_descents"] == 0, c
    # the same phase with santhrottled in bridge mode on a bridge in front of the target
    # (closed_loop.py --bridge, in --paper): the wire its sensor, the same bound
    print(
        f"through the bridge: p95 {b['read_latency_p95_s'] * 1e3:.2f} ms (p99 "
        f"{b['read_latency_p99_s'] * 1e3:.2f}, above T {b['time_above_threshold_pct']:.1f} %), "
        f"writes {b['write_bytes_per_s'] / 1e6:.2f} MB/s, target retrans "
        f"{b['target_retrans_segs']}"
    )
    assert b["threshold_s"] == pytest.approx(thr)
    assert b["read_latency_p95_s"] <= thr, b


def _writers_load(raw: dict, write_bytes_per_s: float) -> float:
    """rho = X m: the writers' IOs a second (their bytes over fio's block size, "128k")
    times the plant's m (raw.json's array_config)."""
    bs = raw["args"]["writer_bs"].lower()
    scale = {"k": 1 << 10, "m": 1 << 20}.get(bs[-1:], 1)
    ios_per_s = write_bytes_per_s / (int(bs.rstrip("km")) * scale)
    return ios_per_s * raw["array_config"]["m_ms"] / 1e3
