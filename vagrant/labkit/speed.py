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
    factor = max(1, calibrate() / reference), the reference the fastest calibration
    this host's guests have made (the runner keeps it in the lab cache and hands it to
    each guest in SANTHROTTLE_LAB_SPEED_REF), at most REFERENCE_S, the development
    machine's idle guest (a slower host's limits are then only more generous); budget(base_s) =
    base_s x factor: a step that takes base_s on an idle host gets as much more as the
    guest is slower now.  factor() measures once per process and keeps the largest it
    has seen (a step measures again with factor(fresh=True)); it also writes it, and its
    fastest calibration, to /shared/work/lab-speed.json, where the runner reads them: it
    stretches the whole guest's limit by the factor and lowers the cache's reference
    to a faster calibration (labkit.qemu).

Worked example
    reference 0.10 s; beside two busy loops calibrate() -> 0.26 s: factor 2.6,
    budget(600) = 1,560 s; on the idle host calibrate() -> 0.10 s: factor 1.0.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

CALIBRATION_LOOPS = 300_000
CALIBRATION_RUNS = 3
# The reference before a host has one of its own (labkit.qemu keeps the fastest seen):
# the calibration on the 2-core development machine's guest, 2026-11-28
REFERENCE_S = 0.21
REFERENCE_ENV = "SANTHROTTLE_LAB_SPEED_REF"
SPEED_FILE = Path("/shared/work/lab-speed.json")

_factor: float | None = None
_fastest: float | None = None


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


def reference() -> float:
    """The runner's (the fastest this host's guests made), never above REFERENCE_S: a
    cache whose first guests all ran on a loaded host would otherwise make loaded the
    norm (2026-11-28: a first reference of 0.398 s, taken beside two busy loops, gave
    the rollout guest a factor of 1.2 where it ran 2 times slower)."""
    try:
        return min(float(os.environ[REFERENCE_ENV]), REFERENCE_S)
    except (KeyError, ValueError):
        return REFERENCE_S


def factor(fresh: bool = False, record: Path | None = SPEED_FILE) -> float:
    """How many times slower than the fastest this host ran the guest it runs (at least
    1): measured once per process, again with fresh; the largest seen counts.  Recorded
    for the runner when in a guest."""
    global _factor, _fastest
    if _factor is None or fresh:
        s = calibrate()
        _fastest = s if _fastest is None else min(_fastest, s)
        _factor = max(_factor or 1.0, s / reference())
        if record is not None and os.environ.get("SANTHROTTLE_IN_GUEST") == "1":
            _record(record, _factor, s, _fastest)
    return _factor


def _record(path: Path, f: float, last_s: float, fastest_s: float) -> None:
    """The largest factor and the fastest calibration seen in this guest, for the runner."""
    try:
        seen = json.loads(path.read_text())
    except (OSError, ValueError):
        seen = {}
    out = {
        "factor": max(float(seen.get("factor", 1.0)), f),
        "fastest_s": min(float(seen.get("fastest_s", fastest_s)), fastest_s),
        "last_s": last_s,
        "reference_s": reference(),
        "t": time.time(),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, path)


def budget(base_s: float) -> float:
    """A step's time limit: what it needs on an idle host, times how much slower now."""
    return base_s * factor()
