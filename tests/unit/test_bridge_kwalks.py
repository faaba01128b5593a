"""bridge/kwalks.py: the in-kernel sensor's flows and commands in flight walked by a thread
of their own, outside the sensor's lock; the tick and the convergence read its results.

The wire is test_bridge_ksums.py's fake with KernelWire's reading interface; the real
one under a real daemon in tests/privileged/test_bridge_daemon.py and
test_bridge_hostile.py (50,000 live connections)."""

from __future__ import annotations

import logging
import random
import threading
import time

import pytest

from santhrottle.bridge.conns import LISTED, summary
from santhrottle.bridge.kernel import Conn, EspState, FlowState, VolumeSums
from santhrottle.bridge.ksums import KernelSums
from santhrottle.bridge.kwalks import AGE_S, FEW_INFLIGHT, REST, WALK_S, Walker, rest_s
from santhrottle.bridge.tracker import ISCSI, Volume
from tests.unit.test_bridge_ksums import C, FakeWire

LUN0 = Volume(ISCSI, "10.0.0.11:3260", "", 0)


class CountingWire(FakeWire):
    """Counts the walks of the two large maps; refuses them while `lock` is held."""

    def __init__(self, lock: threading.Lock | None = None) -> None:
        super().__init__()
        self.lock = lock
        self.walks = {"flows": 0, "inflight": 0}

    def _walked(self, name: str) -> None:
        assert self.lock is None or not self.lock.locked(), f"{name} read under the lock"
        self.walks[name] += 1

    def flows(self) -> list[FlowState]:
        self._walked("flows")
        return super().flows()

    def inflight(self) -> dict[tuple[Conn, int], tuple[int, int, int]]:
        self._walked("inflight")
        return super().inflight()


def _conns(n: int) -> list[Conn]:
    return [Conn(f"192.0.2.{20 + i % 5}", "10.0.0.11", 1024 + i // 5, 3260) for i in range(n)]


def _sensor(n: int) -> tuple[CountingWire, KernelSums, Walker, list[float]]:
    """n connections, each in sync both ways with a read in flight on LUN 0; a walker."""
    lock = threading.Lock()
    w = CountingWire(lock)
    now = [100.0]
    ks = KernelSums(w, clock=lambda: now[0])  # type: ignore[arg-type]
    start = time.monotonic_ns()
    conns = _conns(n)
    w.open = {(c, 1): (start, 1, 0) for c in conns}
    w.flow_states = [
        FlowState(c, d, 0, 0, 0, 0, 0, 0.0, 0, 7) for c in conns for d in (True, False)
    ]
    w.sums[C, 0] = VolumeSums(reads=1, read_ns=1000, write_bytes=0)
    walker = Walker(ks, lock, clock=lambda: now[0])
    ks.walker = True  # as walker.start() sets it, without its thread
    return w, ks, walker, now


def test_with_a_walker_the_tick_and_the_convergence_never_walk_the_large_maps():
    """Whatever the connections, a tick (take_tick, in_flight) and a convergence
    (take_writes, out_of_sync, sync_summary) read the last walk's results; only the
    walker reads the flows and the commands in flight, and never under the lock."""
    w, ks, walker, now = _sensor(2000)
    for _ in range(30):
        ks.take_tick()
        now[0] += 0.1
        assert ks.in_flight() == {}  # nothing walked yet
    ks.take_writes()
    assert ks.out_of_sync() == {} and ks.sync_summary(now[0]).directions == {}
    assert w.walks == {"flows": 0, "inflight": 0}
    walker.walk_once()
    assert w.walks == {"flows": 1, "inflight": 1}
    assert ks.in_flight() == {LUN0: 2000}
    assert ks.out_of_sync() == {("iscsi", "10.0.0.11:3260", ""): (2000, 0)}
    assert ks.sync_summary(now[0]).directions == {"in sync": 4000}
    for _ in range(30):
        ks.take_tick()
        ks.in_flight()
        now[0] += 0.1
    assert w.walks == {"flows": 1, "inflight": 1}


def test_many_commands_in_flight_are_walked_when_asked_or_every_age_s():
    w, ks, walker, now = _sensor(FEW_INFLIGHT + 1)
    walker.walk_once()  # the first: due
    assert w.walks == {"flows": 1, "inflight": 1}
    now[0] += WALK_S
    walker.walk_once()  # nobody asked, not AGE_S yet
    assert w.walks == {"flows": 2, "inflight": 1}
    ks.in_flight()  # a tick without reads asks
    now[0] += WALK_S
    walker.walk_once()
    assert w.walks == {"flows": 3, "inflight": 2}
    now[0] += AGE_S
    walker.walk_once()  # ageing is due
    assert w.walks == {"flows": 4, "inflight": 3}


def test_few_commands_in_flight_are_walked_every_time():
    """A tick's first reads in flight after a quiet spell are a walk old, not AGE_S."""
    w, ks, walker, now = _sensor(10)
    for k in range(1, 4):
        walker.walk_once()
        now[0] += WALK_S
        assert w.walks == {"flows": k, "inflight": k}  # nobody asked
    w.open[C, 5] = (time.monotonic_ns(), 1, 0)
    walker.walk_once()
    assert ks.in_flight() == {LUN0: 11}


def test_the_walker_ages_out_commands_older_than_a_minute_and_counts_them():
    w, ks, walker, _ = _sensor(3)
    old = (C, 9)
    w.open[old] = (time.monotonic_ns() - 61 * 10**9, 1, 0)
    walker.walk_once()
    assert w.forgotten == [old] and ks.counters.aged == 1
    assert ks.in_flight() == {LUN0: 3}


def test_a_walk_that_fails_keeps_the_last_results_and_is_logged_once(caplog):
    w, ks, walker, now = _sensor(4)
    walker.walk_once()

    def refuse() -> list[FlowState]:
        raise OSError(1, "bpf_map_lookup_batch: Operation not permitted")

    w.flows = refuse  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            now[0] += WALK_S
            walker.walk_once()
    assert len(caplog.records) == 1 and "Operation not permitted" in caplog.text
    assert ks.out_of_sync() == {("iscsi", "10.0.0.11:3260", ""): (4, 0)}


def test_the_walks_summary_is_what_a_status_would_make_of_every_row():
    """Counts by state, seconds out of sync, and the first LISTED rows in the status'
    order: the same from the walk as from every row (IPsec's rows too)."""
    rnd = random.Random(46)
    w, ks, walker, now = _sensor(0)
    w.flow_states = [
        FlowState(
            c,
            d,
            rnd.choice((0, 0, 0, 1, 2, 3)),
            rnd.choice((0, 1, 2)),
            rnd.randrange(5),
            0,
            0,
            rnd.choice((0.0, rnd.random() * 30)),
            rnd.randrange(10**6),
            1,
        )
        for c in _conns(400)
        for d in (True, False)
    ]
    w.esp = [EspState("10.0.0.2", "10.0.0.11", 0x1234, 12.5, 40, 9000)]
    walker.walk_once()
    got = ks.sync_summary(now[0])
    want = summary(ks.sync_rows(now[0]))
    assert got.directions == want.directions
    assert got.out_of_sync_s == pytest.approx(want.out_of_sync_s)
    assert len(got.rows) == LISTED
    key = [(r.state == "in sync", -r.out_of_sync_s) for r in got.rows]
    assert key == sorted(key) == [(r.state == "in sync", -r.out_of_sync_s) for r in want.rows]


def test_the_walker_rests_in_proportion_to_its_walk():
    """At most 1 / (1 + REST) of a core, however long a walk takes."""
    assert rest_s(0.1) == pytest.approx(WALK_S - 0.1)
    for took in (0.5, 2.0, 10.0):
        assert took / (took + rest_s(took)) <= 1 / (1 + REST) + 1e-9


def test_the_walker_thread_walks_and_stops():
    w, ks, _, _ = _sensor(5)
    lock = threading.Lock()
    w.lock = lock
    walker = Walker(ks, lock, walk_s=0.01)
    walker.start()
    try:
        deadline = time.monotonic() + 10
        while w.walks["flows"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        walker.close()
    assert w.walks["flows"] >= 3 and ks.walker
    n = w.walks["flows"]
    time.sleep(0.05)
    assert w.walks["flows"] == n  # stopped
