"""How fast the guest runs now: the lab's time budgets scale with it. In the guest.

Problem
    Under TCG the guest runs at the host's pace: a host with two busy loops beside
    the lab emulates the same guest two to three times slower than an idle one, and
    other lab guests on it slow it further.  A step whose timeout was set on an idle
    host (an `ansible-playbook` run of 212-233 s under a 600 s limit) then fails on
    a loaded one (724 s), though nothing is wrong but the host's load.

Measured signal
    calibrate(): the seconds the guest takes for a fixed piece of work, a Python loop
    of CALIBRATION_LOOPS iterations and a process started and waited for (what the
    lab's steps are made of: Python and fork/exec), the median of CALIBRATION_RUNS.

The rule
    factor = max(1, calibrate() / REFERENCE_S), REFERENCE_S the same work on an idle
    host (the development machine, one vCPU or two); budget(base_s) = base_s x factor:
    a step that takes base_s on an idle host gets as much more as the guest is slower
    now.  factor() measures once per process and keeps it (a step measures again with
    factor(fresh=True)); it also writes it to /shared/work/lab-speed.json, where the
    host's runner reads it and stretches the whole guest's limit the same way
    (labkit.qemu).

Worked example
    on the idle host calibrate() -> 0.21 s: factor 1.0, budget(600) = 600 s; beside two
    busy loops calibrate() -> 0.55 s: factor 2.6, budget(600) = 1,571 s.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

# The calibration's work and its time on an idle host (the 2-core development machine,
# 2026-11-28, the lab guest with one vCPU and with two: 0.19-0.23 s).
CALIBRATION_LOOPS = 300_000
CALIBRATION_RUNS = 3
REFERENCE_S = 0.21
SPEED_FILE = Path("/shared/work/lab-speed.json")

_factor: float | None = None


def _work() -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(CALIBRATION_LOOPS):
        x += i * i % 7
    subprocess.run(["true"], check=True)
    return time.perf_counter() - t0


def calibrate(runs: int = CALIBRATION_RUNS) -> float:
    """The fixed work's seconds here and now (the median of `runs`)."""
    return statistics.median(_work() for _ in range(runs))


def factor(fresh: bool = False, record: Path | None = SPEED_FILE) -> float:
    """How many times slower than an idle host the guest runs (at least 1), measured once
    per process (or again with fresh); recorded for the host's runner when in a guest."""
    global _factor
    if _factor is None or fresh:
        _factor = max(1.0, calibrate() / REFERENCE_S)
        if record is not None and os.environ.get("SANTHROTTLE_IN_GUEST") == "1":
            _record(record, _factor)
    return _factor


def _record(path: Path, f: float) -> None:
    """The largest factor seen in this guest, for the host (labkit.qemu)."""
    try:
        seen = json.loads(path.read_text()).get("factor", 1.0)
    except (OSError, ValueError):
        seen = 1.0
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"factor": max(seen, f), "last": f, "t": time.time()}))
    os.replace(tmp, path)


def budget(base_s: float) -> float:
    """A step's time limit: what it needs on an idle host, times how much slower now."""
    return base_s * factor()
