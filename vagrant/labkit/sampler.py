"""The one sampler: a thread that reads its probes on a fixed period, one row per sample.

What it owns
    The polling loop every experiment measures with, and its rules:

    rows     each sample is a row {"t": seconds since the sampler's start, taken
             before the probes read, and one key per probe that read this time};
             a probe that raises leaves "<name>_error" (the reason) instead, and
             the sampling goes on.
    probes   Probe(name, read, every=N): read() every N-th sample; what it
             returns must be JSON (labkit.probes has the lab's: diskstats, the
             target's connections, the plant's counters, the daemon's status).
             stamped=True: the row also keeps "<name>_t", when the read ended (a
             slow read, `ss` or the daemon's status under TCG, ends seconds after
             the row's t, and what it saw is of some instant in between).
    period   fixed rate: sample k is due at start + k x period; after a stall of
             the guest (seconds where the emulated CPU is saturated) the next
             sample is taken at once and the schedule starts again from it, never
             a burst of the samples missed (each would repeat the window across
             the stall: labkit.analysis).
    events   mark(what): (t, what), on the rows' clock ("writers on", ...).
    nice     the thread's own nice value (os.setpriority on its native id), for a
             guest whose vCPUs the daemons and fio share.
    cpu_s    per probe, the CPU the sampler's thread spent in its reads (its
             thread_time): what the measurement itself cost the guest, e.g. the
             daemon's status asked every 0.5 s, a cost the uncontrolled phase,
             without a daemon, does not pay.

    The clock and the wait are parameters, so that a test drives the loop in
    virtual time (tests/unit/test_labkit_sampler.py).

Worked example
    s = Sampler([Probe("ds", probes.diskstats(["dm-0"])), Probe("status", d.status_row,
    every=5)], period_s=0.1); s.start(); ...; s.stop()
    -> s.rows == [{"t": 0.0, "ds": {"dm-0": [...]}, "status": {...}},
                  {"t": 0.1, "ds": {...}}, ...]
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PERIOD_S = 0.1


@dataclass(frozen=True)
class Probe:
    name: str
    read: Callable[[], Any]
    every: int = 1  # samples
    stamped: bool = False  # keep "<name>_t": when the read ended


class Sampler(threading.Thread):
    def __init__(
        self,
        probes: list[Probe],
        period_s: float = PERIOD_S,
        nice: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        super().__init__(daemon=True, name="sampler")
        self.probes, self.period_s, self.nice, self.clock = probes, period_s, nice, clock
        self.rows: list[dict] = []
        self.events: list[tuple[float, str]] = []
        self.stop_ev = threading.Event()
        self.wait = wait or self.stop_ev.wait
        self.t0 = clock()
        self.k = 0
        self.cpu = cpu
        self.cpu_s: dict[str, float] = {p.name: 0.0 for p in probes}

    def now(self) -> float:
        """Seconds on the rows' clock."""
        return self.clock() - self.t0

    def mark(self, what: str) -> None:
        self.events.append((round(self.now(), 3), what))

    def sample(self) -> dict:
        """One row: every probe due at this sample."""
        row: dict[str, Any] = {"t": round(self.now(), 3)}
        for p in self.probes:
            if self.k % p.every:
                continue
            c0 = self.cpu()
            try:
                row[p.name] = p.read()
            except Exception as e:  # keep sampling; record why
                row[f"{p.name}_error"] = str(e)
            if p.stamped:
                row[f"{p.name}_t"] = round(self.now(), 3)
            self.cpu_s[p.name] += self.cpu() - c0
        self.k += 1
        self.rows.append(row)
        return row

    def run(self) -> None:
        if self.nice is not None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        nxt = self.clock()
        while not self.stop_ev.is_set():
            self.sample()
            # after a stall, the next sample on time, not a burst of the ones missed
            nxt = max(nxt + self.period_s, self.clock())
            self.wait(max(0.0, nxt - self.clock()))

    def stop(self) -> None:
        self.stop_ev.set()
        if self.is_alive():
            self.join()
