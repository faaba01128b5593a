#!/usr/bin/env python3
"""santhrottled under cProfile, each thread on its own CPU clock. Runs INSIDE the guest.

    python3 daemon_profile.py OUT.prof --config FILE     # santhrottled's own arguments

closed_loop.py --profile-daemon starts each phase's daemon this way: where the daemon
spends the CPU that the one-vCPU guest's emulated initiators share. Every thread
(the tick loop, the convergence worker, the control socket, the metrics) gets a
profiler on time.thread_time, so the time the guest stalls counts for nothing.
OUT.prof (pstats) is the tick loop's (the main thread's), OUT.prof's siblings
OUT.NAME.prof each other thread's and OUT.all.prof their sum; they are written
when the daemon returns (SIGTERM)."""

from __future__ import annotations

import cProfile
import pstats
import sys
import threading
import time
from pathlib import Path

_PROFILES: dict[str, cProfile.Profile] = {}
_LOCK = threading.Lock()


def _profiled_run(run):  # threading.Thread.run, each thread under a profiler of its own
    def wrapped(self: threading.Thread) -> None:
        prof = cProfile.Profile(time.thread_time)
        with _LOCK:
            _PROFILES[f"{self.name}-{len(_PROFILES)}"] = prof
        prof.runcall(run, self)

    return wrapped


def _dump(out: Path, main: cProfile.Profile) -> None:
    main.dump_stats(out)
    total = pstats.Stats(main)
    with _LOCK:
        threads = dict(_PROFILES)
    for name, prof in threads.items():
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
        try:
            prof.dump_stats(out.with_suffix(f".{safe}.prof"))
            total.add(pstats.Stats(prof))
        except Exception as e:  # a thread still running: its profile as far as it got
            print(f"daemon_profile: {name}: {e}", file=sys.stderr)
    total.dump_stats(out.with_suffix(".all.prof"))


def main() -> int:
    from santhrottle.appliance.daemon.main import main as daemon_main

    out, argv = Path(sys.argv[1]), sys.argv[2:]
    threading.Thread.run = _profiled_run(threading.Thread.run)  # type: ignore[method-assign]
    prof = cProfile.Profile(time.thread_time)
    try:
        return prof.runcall(daemon_main, argv)
    finally:
        _dump(out, prof)


if __name__ == "__main__":
    sys.exit(main())
