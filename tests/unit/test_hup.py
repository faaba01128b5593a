"""SIGHUP's reloads (appliance/daemon/control/hup.py): one thread, bursts coalesced."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from santhrottle.appliance.daemon.control import hup as hup_mod
from santhrottle.appliance.daemon.control.hup import HupReloads

pytestmark = pytest.mark.unit


def test_a_burst_of_signals_is_one_reload_a_second_in_one_thread(monkeypatch):
    monkeypatch.setattr(hup_mod, "MIN_INTERVAL_S", 0.2)
    done: list[float] = []
    h = HupReloads(lambda: done.append(time.monotonic()))
    for _ in range(1000):  # before start(): kept for it
        h.signal(signal.SIGHUP, None)
    threads = threading.active_count()
    h.start()
    time.sleep(0.1)
    assert len(done) == 1 and threading.active_count() == threads + 1
    for _ in range(1000):
        h.signal(signal.SIGHUP, None)
    time.sleep(0.4)
    assert len(done) == 2 and done[1] - done[0] >= 0.2
    h.close()
    assert threading.active_count() == threads


def test_a_reload_that_fails_never_ends_the_reloads(caplog):
    calls = []

    def reload() -> None:
        calls.append(1)
        raise RuntimeError("reload refused: s.toml: broken")

    h = HupReloads(reload)
    h.start()
    h.signal(signal.SIGHUP, None)
    deadline = time.monotonic() + 5
    # the reload thread logs after reload() raised: wait for the line, not for the call
    while "reload refused: s.toml: broken" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls and "reload refused: s.toml: broken" in caplog.text
    h.close()


def test_the_handler_never_blocks_on_a_full_pipe():
    h = HupReloads(lambda: None)  # never started: nobody reads
    t0 = time.monotonic()
    for _ in range(200_000):  # more than a pipe holds
        h.signal(signal.SIGHUP, None)
    assert time.monotonic() - t0 < 10
    h.close()
