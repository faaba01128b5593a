"""SIGHUP, the daemon's other way to be told to reload: `systemctl reload`, `kill -HUP`.

Problem
    The handler was installed after the control socket answered, and it
    started a thread per signal: a SIGHUP in between (a script that reloads
    as soon as the socket is there) killed the daemon, its delays left in
    the kernel; a burst of 2,000 made 1,642 reloads and as many audit lines.

What it owns
    HupReloads: installed first thing at the start, its handler only writes
    a byte to a pipe (nothing in a signal handler that can block or take a
    lock); one thread, started once the daemon serves, reads the pipe and
    runs the reload (control/commands.py's, audited as `via=SIGHUP`) once for
    all the signals that came meanwhile, at most one every MIN_INTERVAL_S.

Worked example
    hup = HupReloads(lambda: commands.handle("reload", {}, Caller("SIGHUP")))
    signal.signal(signal.SIGHUP, hup.signal)   # first thing
    ... start ...; hup.start()                 # reloads from now on
    2,000 SIGHUPs within 2 s -> 3 reloads (at 0, 1 and 2 s), each one audit line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("santhrottled")

# What one read of the pipe takes: every signal pending then is one reload.
READ_BYTES = 65536
# A reload, then the signals of the next second are one more: a loop of `systemctl
# reload` costs one reload (and one audit line) a second, not one each.
MIN_INTERVAL_S = 1.0


class HupReloads:
    """SIGHUP -> one reload for each burst, in one thread (see the module's text)."""

    def __init__(self, reload: Callable[[], None]) -> None:
        self.reload = reload
        self._r, self._w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self._w, False)
        self._thread = threading.Thread(target=self._loop, name="reload", daemon=True)
        self._closing = threading.Event()

    def signal(self, _signum: int, _frame: Any) -> None:
        """The handler: a byte in the pipe (full: a reload is pending anyway)."""
        with contextlib.suppress(OSError):
            os.write(self._w, b"h")

    def start(self) -> None:
        """Reload from now on (the signals that came before: one reload now)."""
        self._thread.start()

    def close(self) -> None:
        """No more reloads: the thread sees the pipe's end and stops."""
        self._closing.set()
        with contextlib.suppress(OSError):
            os.close(self._w)
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            with contextlib.suppress(OSError):
                os.close(self._r)

    def _loop(self) -> None:
        while True:
            try:
                if not os.read(self._r, READ_BYTES):
                    return
            except OSError:
                return
            try:
                self.reload()
            except Exception as e:  # a refusal is the reload's own line; never the thread's end
                log.error("%s", e)
            if self._closing.wait(MIN_INTERVAL_S):
                return
