"""systemd's notify protocol (sd_notify(3)): one datagram to $NOTIFY_SOCKET; no-op without it."""

from __future__ import annotations

import os
import socket


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
