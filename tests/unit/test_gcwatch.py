"""The daemon's garbage collector (core/gcwatch.py): what it imported and built to start
is frozen once it is up, without the garbage; a collection that held the GIL for long
is counted and said by the tick, at most once a minute.  In the lab guest the daemon
logged ticks 2-5 s late in its controlled phases with nothing to say why."""

from __future__ import annotations

import gc
import logging
import weakref

from santhrottle.appliance.daemon.core import gcwatch
from santhrottle.appliance.daemon.core.gcwatch import GcWatch


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_freeze_started_collects_the_garbage_then_freezes_what_is_left():
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle: garbage once unreferenced
    dead = weakref.ref(a)
    kept = [[i] for i in range(100)]
    del a, b
    try:
        gcwatch.freeze_started()
        assert dead() is None  # collected, not frozen with the rest
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()


def _collection(watch: GcWatch, now: list[float], took: float, generation: int = 2) -> None:
    watch._callback("start", {"generation": generation})
    now[0] += took
    watch._callback("stop", {"generation": generation, "collected": 7})


def test_a_slow_collection_is_counted_and_said_by_the_tick_once_a_minute(caplog):
    now = [1000.0]
    watch = GcWatch(clock=lambda: now[0])
    _collection(watch, now, 0.01)
    _collection(watch, now, gcwatch.SLOW_COLLECTION_S / 2, generation=1)
    assert (watch.slow, watch.slow_s) == (0, 0.0)
    with caplog.at_level(logging.WARNING, logger="santhrottled"):
        _collection(watch, now, 4.2)
        assert caplog.records == []  # the callback only notes it
        watch.say()
        (rec,) = caplog.records
        assert rec.getMessage().startswith("gc: a generation-2 collection took 4.20 s")
        _collection(watch, now, 1.0)
        _collection(watch, now, 2.0)
        watch.say()  # within SAY_EVERY_S: counted, not said
        assert len(caplog.records) == 1
        now[0] += gcwatch.SAY_EVERY_S
        _collection(watch, now, 0.6)
        watch.say()
    assert len(caplog.records) == 2
    assert caplog.records[1].getMessage().endswith("; 2 more since the last said")
    assert watch.slow == 4 and abs(watch.slow_s - 7.8) < 1e-9


def test_install_and_uninstall_leave_the_collector_as_it_was():
    calls: list[float] = []

    def clock() -> float:  # 1 ms a read, however long the collection really took
        calls.append(len(calls) * 0.001)
        return calls[-1]

    watch = GcWatch(clock=clock)
    before = list(gc.callbacks)
    watch.install()
    watch.install()
    assert len(gc.callbacks) == len(before) + 1
    gc.collect()  # runs the callback: timed at its start and its stop
    watch.uninstall()
    timed = len(calls)
    assert gc.callbacks == before
    assert timed >= 2 and timed % 2 == 0 and watch.slow == 0
    gc.collect()  # uninstalled: no longer timed
    assert len(calls) == timed


def test_the_cadence_freezes_once_up_and_times_the_collector_while_it_runs():
    """core/cadence.py: the first convergence and tick, then freeze_started(), then
    the fixed rate with the watch installed; removed when run() returns."""
    from types import SimpleNamespace

    from santhrottle.appliance.daemon.core.cadence import Cadence

    now = [0.0]
    cadence = Cadence(
        lambda: now[0],
        lambda s: now.__setitem__(0, now[0] + s),
        lambda: SimpleNamespace(tick_s=0.1, converge_s=3600.0),
    )
    seen = []

    def tick(_at: float) -> None:
        seen.append((gc.get_freeze_count() > 0, cadence.gc._callback in gc.callbacks))
        if len(seen) == 3:
            cadence.stop()

    gc.unfreeze()
    try:
        cadence.run(tick, lambda: None, lambda _n: None, lambda: None)
    finally:
        gc.unfreeze()
    assert seen == [(False, True), (True, True), (True, True)]
    assert cadence.gc._callback not in gc.callbacks
