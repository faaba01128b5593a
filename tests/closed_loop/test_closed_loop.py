"""CI's short version of the closed-loop experiment (docs/lab.md): one threshold, two bursts.

A lab-tier test that boots its own guest through vagrant/experiments/report.py
(the experiment needs the null_blk array, not the session topology of
tests/lab). Fails when the bound is not held.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

CHECKOUT = Path(__file__).resolve().parents[2]
REPORT = CHECKOUT / "vagrant" / "experiments" / "report.py"
LAB_UNAVAILABLE = 3  # vagrant/qemu/lab.py: QEMU or the kernel package is missing
# the guest picks T from its uncontrolled phase (closed_loop.auto_threshold): 1-2 ms
THRESHOLD_MIN_S, THRESHOLD_MAX_S = 0.001, 0.002


def test_short_closed_loop_holds_the_threshold():
    out = CHECKOUT / "results" / f"ci-closed-loop-{os.getpid()}"
    p = subprocess.run(
        [sys.executable, str(REPORT), "--short", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if p.returncode == LAB_UNAVAILABLE:
        why = [x for x in (p.stderr + p.stdout).splitlines() if x.startswith("lab unavailable")]
        pytest.skip(why[0] if why else "lab unavailable (vagrant/qemu/lab.py exit 3)")
    assert p.returncode == 0, f"{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    print(p.stdout[-2500:])
    s = json.loads((out / "summary.json").read_text())
    (c,) = s["controlled"]
    thr = c["threshold_s"]
    assert THRESHOLD_MIN_S <= thr <= THRESHOLD_MAX_S
    assert s["uncontrolled"]["read_latency_p95_s"] >= 2 * thr  # the test is not trivial
    assert c["read_latency_p95_s"] <= thr, c
    assert c["sets_left_after_stop"] == []
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
    # santhrottle (the long runs: 1.7 per uncontrolled phase, 1.5 per controlled one;
    # docs/lab.md), which is random.
    assert c["glided_descents"] > 0 and c["unordered_descents"] == 0, c
    assert c["target_sack_reorder"] == 0, c
