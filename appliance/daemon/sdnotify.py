"""systemd's notify protocol (sd_notify(3)): one datagram to $NOTIFY_SOCKET; no-op without it."""

from __future__ import annotations

import os
import socket

# A stop's steps (the convergence worker's last run, the meter's last write, the
# delays off, the data path removed) each get this long from systemd: the daemon
# says EXTEND_TIMEOUT_USEC before each, so TimeoutStopSec bounds a step without
# progress, not the whole stop, which an emulated or loaded CPU stretches.
STOP_STEP_S = 20.0


def stop_step() -> str:
    """The message that opens a stop's step: systemd waits STOP_STEP_S more."""
    return f"STOPPING=1\nEXTEND_TIMEOUT_USEC={int(STOP_STEP_S * 1e6)}"


def notify(message: str, env: dict[str, str] | None = None) -> bool:
    path = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):  # abstract namespace
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.connect(path)
            s.sendall(message.encode())
        except OSError:
            return False
    return True
