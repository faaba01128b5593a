"""A kernel text file the sensors keep open and read again from offset 0.

Problem
    A sensor reads the same /proc or /sys file every tick.  Opening it each
    time walks the path (in the one-vCPU lab guest a sysfs open is about as
    dear as the read) and needs a free file descriptor: a process that some
    flood of connections has run out of descriptors would read no samples.

What it does
    KeptFile opens the file once and reads it with pread from offset 0: the
    kernel makes a /proc or sysfs file's text anew for a read at 0, and pread
    keeps no shared offset, so two threads may read one KeptFile at once.  A
    read that fails (a descriptor gone stale) opens the file again once; a
    second failure is the caller's OSError, and the file is closed.

Worked example
    f = KeptFile("/sys/block/dm-0/inflight"); f.read() -> b"       0        2\\n";
    the device removed: f.read() -> OSError (ENODEV), closed; a later read opens
    it again if a device of that name is back.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

# One read: 1,000 devices of /proc/diskstats are about 100 kB.
READ_CHUNK_BYTES = 1 << 20


class KeptFile:
    """One file, opened at the first read and kept open (module header)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._lock = threading.Lock()

    def read(self) -> bytes:
        try:
            return self._pread_all(self._open())
        except OSError:
            self.close()  # a descriptor gone stale: once more, freshly opened
        try:
            return self._pread_all(self._open())
        except OSError:
            self.close()
            raise

    def _open(self) -> int:
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            return self._fd

    @staticmethod
    def _pread_all(fd: int) -> bytes:
        parts, off = [], 0
        while True:
            chunk = os.pread(fd, READ_CHUNK_BYTES, off)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
            off += len(chunk)

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
