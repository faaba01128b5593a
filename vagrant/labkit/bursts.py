"""The paper's load: a reader throughout, the writers switched on and off together. In the guest.

What it owns
    Schedule(lead_s, on_s, off_s, cycles): the reader starts, `lead_s` later the
    writers run for `on_s` and are off for `off_s`, `cycles` times.

    run(sampler, reader, writers, schedule): the marks on the sampler's clock
    ("reader on", "settle" when nothing is to be learned, "writers on", "writers
    off", "reader off") and the fio jobs.  The writers run one of two ways:
    restarted, a new fio per host and on-period whose runtime (`on_s`) counts
    from its first IO, so that under TCG, where a writer host's fio starts 9-22 s
    after its mark, a pause lasts that much longer than `off_s` at the array; or,
    given the writers' devices (`paused`), one fio per host for the whole
    schedule, SIGSTOPped for each pause and SIGCONTed for each next on-period
    (the first counts from its first write): a pause is `off_s` at the array
    whatever the emulation's speed, plus the IOs in flight at the stop.  The
    reader's runtime is READER_RUNTIME_FACTOR x the schedule's nominal length (it
    only bounds it): it is stopped when the schedule ends, or, with `release`, in
    the last on-period half an on-period after the writers' devices show writes
    (the reader leaves: nobody to protect any more; the throttle's release is
    timed from there).  Returns the jobs, reader first.

Worked example
    run(s, fio.reader(dev0, "256k", ...), lambda rt: [fio.writers(d, "128k", 1, rt, jobs=4)
    for d in devs], Schedule(4, 20, 5, 4), learn=True, release=[dm1, dm2, dm3])
    -> s.events == [(0.0, "reader on"), (4.0, "writers on"), (38.2, "writers off"), ...,
       (..., "reader off"), ...]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from labkit import fio
from labkit.analysis import WRITE_SECTORS
from labkit.probes import all_diskstats
from labkit.sampler import Sampler

# The reader's fio runtime, in multiples of the schedule's nominal length (it is stopped
# when the schedule ends; this only bounds it).
READER_RUNTIME_FACTOR = 3
POLL_S = 0.1
# How long a paused schedule waits for its writers' first write (fio's start under TCG
# takes up to some 20 s)
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Schedule:
    lead_s: float
    on_s: float
    off_s: float
    cycles: int

    def nominal_s(self) -> float:
        return self.lead_s + self.cycles * (self.on_s + self.off_s)


def wait_for_writes(before: dict[str, list[int]], dms: list[str], timeout_s: float) -> None:
    """Until one of the devices has written since `before` (or timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = all_diskstats()
        if any(now[d][WRITE_SECTORS] > before[d][WRITE_SECTORS] for d in dms):
            return
        time.sleep(POLL_S)


def run(
    s: Sampler,
    reader: Callable[[float], list[str]],
    writers: Callable[[float], list[list[str]]],
    sched: Schedule,
    learn: bool = True,
    release: list[str] | None = None,
    paused: list[str] | None = None,
) -> list[fio.Job]:
    """The schedule (module header); reader(runtime) and writers(runtime) give the fio
    command lines; learn False: every on-period counts ("settle" at the start); release:
    the writers' devices, whose first writes in the last on-period start the reader's
    countdown to leaving; paused: the writers' devices, and one fio per host for the
    whole schedule, paused between the on-periods."""
    rd = fio.start(reader(READER_RUNTIME_FACTOR * sched.nominal_s()))
    jobs = [rd]
    s.mark("reader on")
    if not learn:
        s.mark("settle")
    time.sleep(sched.lead_s)
    if paused:
        jobs += _paused(s, rd, writers, sched, paused, release)
    else:
        jobs += _restarted(s, rd, writers, sched, release)
    rd.stop()  # the schedule is over
    return jobs


def _reader_leaves(s: Sampler, rd: fio.Job, before: dict, release: list[str], on_s: float) -> None:
    """Halfway through the last on-period's writes (not through the writers' start)."""
    wait_for_writes(before, release, on_s)
    time.sleep(on_s / 2)
    rd.stop()  # the reader leaves: nobody to protect
    s.mark("reader off")


def _restarted(
    s: Sampler,
    rd: fio.Job,
    writers: Callable[[float], list[list[str]]],
    sched: Schedule,
    release: list[str] | None,
) -> list[fio.Job]:
    """A new fio per host and on-period, for on_s from its first IO."""
    jobs: list[fio.Job] = []
    for c in range(sched.cycles):
        last = c == sched.cycles - 1
        before = all_diskstats()
        ws = [fio.start(w) for w in writers(sched.on_s)]
        jobs += ws
        s.mark("writers on")
        if last and release:
            _reader_leaves(s, rd, before, release, sched.on_s)
        for w in ws:
            w.wait()
        s.mark("writers off")
        time.sleep(sched.off_s)
    return jobs


def _paused(
    s: Sampler,
    rd: fio.Job,
    writers: Callable[[float], list[list[str]]],
    sched: Schedule,
    devices: list[str],
    release: list[str] | None,
) -> list[fio.Job]:
    """One fio per host for the whole schedule: the first on-period from its first
    write, each pause exactly off_s (SIGSTOP), each next on-period from SIGCONT."""
    before = all_diskstats()
    ws = [fio.start(w) for w in writers(READER_RUNTIME_FACTOR * sched.nominal_s())]
    s.mark("writers on")
    wait_for_writes(before, devices, START_TIMEOUT_S)
    for c in range(sched.cycles):
        if c:
            before = all_diskstats()
            for w in ws:
                w.resume()
            s.mark("writers on")
        if c == sched.cycles - 1 and release:
            _reader_leaves(s, rd, before, release, sched.on_s)
            time.sleep(sched.on_s / 2)
        else:
            time.sleep(sched.on_s)
        for w in ws:  # found again (a host's fio may have started its jobs late), then
            w.processes(fresh=True)  # paused together
        for w in ws:
            w.pause()
        s.mark("writers off")
        time.sleep(sched.off_s)
    for w in ws:
        w.stop()
    return ws
