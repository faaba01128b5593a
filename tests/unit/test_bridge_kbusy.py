"""bridge/kbusy.py: the in-kernel sensor's busy time per volume from the program's spans
(wire.bpf.c's busy_move), its aged-out and lost commands retired.

The wire is test_bridge_ksums.py's fake; the program itself is proved on the host kernel
in tests/privileged/test_bridge_kernel.py (known timing, the capture sensor and
Wireshark on the same frames)."""

from __future__ import annotations

import time

import pytest

from santhrottle.bridge.kbusy import KernelBusy, busy_ns_at, lost
from santhrottle.bridge.kernel import Conn, VolumeSums
from santhrottle.bridge.ksums import KernelSums
from santhrottle.bridge.tracker import ISCSI, Volume
from tests.unit.test_bridge_ksums import FakeWire

pytestmark = pytest.mark.unit

C = Conn("10.0.0.2", "10.0.0.11", 51000, 3260)
C2 = Conn("10.0.0.3", "10.0.0.11", 51001, 3260)
S = 1_000_000_000


def busy(ns: int = 0, since: int = 0, retired: int = 0, out: int = 0) -> VolumeSums:
    return VolumeSums(0, 0, 0, 0, busy_ns=ns, since_ns=since, retired=retired, outstanding=out)


def test_the_busy_time_is_the_closed_spans_and_the_open_one_up_to_now():
    assert busy_ns_at(busy(200_000_000), (0, 0), 5 * S) == 200_000_000  # idle
    assert busy_ns_at(busy(200_000_000, 1 * S, 0, 2), (0, 0), 3 * S // 2) == 700_000_000
    # a read a little before the span's start (the program's clock is read per segment)
    assert busy_ns_at(busy(0, 2 * S, 0, 1), (0, 0), 2 * S - 10) == 0


def test_aged_out_commands_the_program_has_not_taken_off_close_the_span_when_they_aged():
    # one command in flight since 1 s, aged out at 61 s: busy 60 s, not up to now (100 s)
    assert busy_ns_at(busy(0, 1 * S, 0, 1), (1, 61 * S), 100 * S) == 60 * S
    # two in flight, one aged out: the other holds the span open
    assert busy_ns_at(busy(0, 1 * S, 0, 2), (1, 61 * S), 100 * S) == 99 * S
    # already taken off by the program (its retired is the count): nothing again
    assert busy_ns_at(busy(60 * S, 0, 1, 0), (1, 61 * S), 100 * S) == 60 * S


def test_per_volume_the_busiest_connections_growth_since_the_last_take():
    vol = Volume(ISCSI, "10.0.0.11:3260", "iqn.t", 0)
    kb = KernelBusy(lambda c, raw: vol if raw == 0 else None)
    kb.read([((C, 0), busy(1 * S)), ((C2, 0), busy(0, 0, 0, 1)), ((C, 1 << 48), busy(S))], 0)
    kb.take(0.0)
    # C: 0.3 s more closed; C2: open since 0, now 0.5 s; LUN 1: no volume known
    kb.read([((C, 0), busy(S + 300_000_000)), ((C2, 0), busy(0, 0, 0, 1))], S // 2)
    assert kb.take(0.5) == {vol: pytest.approx(0.5)}
    # a read behind the last adds nothing, and does not count twice when it catches up
    kb.read([((C2, 0), busy(0, 0, 0, 1))], S // 2 - 1000)
    kb.read([((C2, 0), busy(0, 0, 0, 1))], S // 2 + 1000)
    assert kb.take(0.6) == {vol: pytest.approx(1e-6)}
    # the entry made anew (its closed total went down): counts from zero
    kb.read([((C, 0), busy(100_000_000))], S)
    assert kb.take(1.0) == {vol: pytest.approx(0.1)}


def test_commands_counted_in_flight_that_the_map_no_longer_holds_are_lost():
    k, k2, k3 = (C, 0), (C2, 0), (C, 1)
    before = {k: busy(0, S, 0, 2), k2: busy(0, S, 0, 1), k3: busy(0, S, 3, 4)}
    after = dict(before) | {k2: busy(0, S, 0, 2)}  # k2 moved across the walk
    assert lost(before, after, frozenset(), {}) == {k: 2, k3: 4}
    # k held; of k3's, userspace retired 2 more than the program took off (3 of 5)
    assert lost(before, after, frozenset({k}), {k3: (5, S)}) == {k3: 2}


def test_an_aged_out_command_is_retired_through_the_program_and_counted():
    w = FakeWire()
    ks = KernelSums(w)  # type: ignore[arg-type]
    w.sums[C, 0] = busy(0, 1, 0, 2)
    old = time.monotonic_ns() - 61 * S
    w.open[C, 5] = (old, 1, 0)  # a read of LUN 0, 61 s in flight
    w.open[C, 6] = (time.monotonic_ns(), 1, 0)
    walk = ks.walk_inflight(time.monotonic())
    assert walk.aged == 1 and walk.held == frozenset({(C, 0)})
    assert w.retired[C, 0][0] == 1 == ks.busy.retired[C, 0][0]
    w.open.clear()  # the other one lost: the map no longer holds it, nothing moved
    ks.walk_inflight(time.monotonic())
    assert w.retired[C, 0][0] == 2
