"""The capture ring's walk and the lock it shares with the tick (bridge/capture.py)."""

from __future__ import annotations

import struct
import threading
import time

from santhrottle.bridge.capture import (
    FRAMES_PER_TURN,
    TP_STATUS_KERNEL,
    TP_STATUS_USER,
    CaptureCounters,
    FifoLock,
    FrameDecoder,
    Ring,
)

WAIT_S = 30.0  # a bound for a loaded host, never reached when the code is right
FRAME_BYTES = 32  # a frame's header (tpacket3_hdr's first 26 bytes), rounded up


def _until_asked(lock: FifoLock, takers: int, what: str) -> None:
    """Until `takers` hold the lock or wait for it."""
    deadline = time.monotonic() + WAIT_S
    while lock.asked != takers:
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def _ready_ring(frames: int, blocks: int = 2) -> Ring:
    """A Ring over plain memory: blocks the kernel has handed over, each of `frames`
    empty frames (the decoder is replaced by the test)."""
    first = 48
    block_bytes = first + frames * FRAME_BYTES
    ring = Ring.__new__(Ring)
    ring.map = bytearray(blocks * block_bytes)
    ring.view = memoryview(ring.map)
    ring.block_bytes, ring.blocks, ring.next_block = block_bytes, blocks, 0
    ring.clock = ring.wall_clock = lambda: 0.0
    ring.counters = CaptureCounters()
    ring.decoder = FrameDecoder(ring.counters)
    for b in range(blocks):
        off = b * block_bytes
        struct.pack_into("=III", ring.map, off + 8, TP_STATUS_USER, frames, first)
        for f in range(frames):
            struct.pack_into("=I", ring.map, off + first + f * FRAME_BYTES, FRAME_BYTES)
    return ring


def test_the_lock_goes_in_the_order_it_was_asked_for():
    lock = FifoLock()
    order: list[str] = []

    def take(name: str) -> None:
        with lock:
            order.append(name)

    lock.acquire()
    threads = []
    for name in ("tick", "status"):  # each asks once the one before is waiting
        t = threading.Thread(target=take, args=(name,))
        t.start()
        threads.append(t)
        _until_asked(lock, 1 + len(threads), f"{name} waits")
    lock.release()
    take("walk")  # the holder asks again at once: behind both
    for t in threads:
        t.join(WAIT_S)
    assert order == ["tick", "status", "walk"]
    assert lock.asked == 0


def test_a_taker_that_stops_waiting_does_not_hold_up_the_others():
    """A wait ended by an exception (^C in the command line's measure) gives up its
    ticket: the ones after it still get their turn."""
    lock = FifoLock()
    lock.acquire()
    stopped: list[BaseException] = []
    got: list[str] = []

    def interrupted() -> None:
        def wait(timeout: float | None = None) -> bool:
            raise KeyboardInterrupt

        lock._turns.wait = wait  # the next wait, in this taker's acquire
        try:
            lock.acquire()
        except KeyboardInterrupt as e:
            stopped.append(e)

    def later() -> None:
        with lock:
            got.append("later")

    t = threading.Thread(target=interrupted)
    t.start()
    t.join(WAIT_S)
    del lock._turns.wait  # the Condition's own again
    assert len(stopped) == 1 and lock.asked == 1
    after = threading.Thread(target=later)
    after.start()
    _until_asked(lock, 2, "the later taker waits")
    lock.release()
    after.join(WAIT_S)
    assert got == ["later"] and lock.asked == 0


def test_a_waiter_goes_between_two_turns_of_a_burst():
    """The walk holds the lock for FRAMES_PER_TURN frames and asks again at once; one
    who asked during a turn takes it before the next (with a plain Lock the walk mostly
    took it back first, and under a burst of SYNs a whole block of them, 0.2 s, was
    walked under one hold: the tick waited for it)."""
    per_block = 4 * FRAMES_PER_TURN
    ring = _ready_ring(frames=per_block)
    lock = FifoLock()
    walked: list[int] = []
    got: list[int] = []

    def tick() -> None:
        with lock:
            got.append(len(walked))

    waiter = threading.Thread(target=tick)

    def frame(view, pos, snap, t, segment) -> None:
        walked.append(pos)
        if len(walked) == per_block + 5:  # the tick asks in the second block's first turn
            waiter.start()
            _until_asked(lock, 2, "the tick waits")

    ring.decoder.frame = frame
    assert ring.poll(0, lambda *a: None, lock) == 2
    waiter.join(WAIT_S)
    assert got == [per_block + FRAMES_PER_TURN]  # after that turn, not the block's rest
    assert len(walked) == len(set(walked)) == 2 * per_block
    assert ring.counters.frames == 2 * per_block
    assert all(
        struct.unpack_from("=I", ring.map, b * ring.block_bytes + 8)[0] == TP_STATUS_KERNEL
        for b in range(2)
    )
