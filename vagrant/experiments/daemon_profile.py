#!/usr/bin/env python3
"""santhrottled under cProfile, on its main thread's CPU clock. Runs INSIDE the guest.

    python3 daemon_profile.py OUT.prof --config FILE     # santhrottled's own arguments

closed_loop.py --profile-daemon starts each phase's daemon this way: where the tick
loop (the main thread) spends its CPU, which the one-vCPU guest's emulated
initiators share. The clock is time.thread_time, so the other threads (the
convergence's discovery, the control socket, the metrics) and the time the guest
stalls count for nothing; OUT.prof
(pstats) is written when the daemon returns (SIGTERM)."""

from __future__ import annotations

import cProfile
import sys
import time


def main() -> int:
    from santhrottle.appliance.daemon.main import main as daemon_main

    out, argv = sys.argv[1], sys.argv[2:]
    prof = cProfile.Profile(time.thread_time)
    try:
        return prof.runcall(daemon_main, argv)
    finally:
        prof.dump_stats(out)


if __name__ == "__main__":
    sys.exit(main())
