"""The control socket: a Unix stream socket speaking one JSON object per line.

Request:  {"cmd": "threshold_set", "args": {"resource": "vg0", "threshold_s": 0.015}}
Response: {"ok": true, "data": ...}  or  {"ok": false, "error": "one line for the admin"}

The socket is created with the configured mode (0600: root only) under a
umask that never lets it exist with wider permissions, in a directory
created 0755. One connection may carry several requests. The CLI is the
only client (appliance/cli/).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The control protocol's version: in every reply ("protocol") and in the CLI's --json.
PROTOCOL_VERSION = 1
MAX_REQUEST_BYTES = 64 * 1024
CLIENT_TIMEOUT_S = 10.0
# How often the server looks for a shutdown request (close() waits up to this).
SHUTDOWN_POLL_S = 0.05


class DaemonUnavailable(Exception):
    """No daemon answers on the control socket."""


class RemoteError(Exception):
    """The daemon refused the request; the message is its one line."""


Handler = Callable[[str, dict[str, Any]], Any]


class _Conn(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        while True:
            line = self.rfile.readline(MAX_REQUEST_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_REQUEST_BYTES:
                self._reply({"ok": False, "error": "request too large"})
                return
            try:
                req = json.loads(line)
                if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
                    raise ValueError('a request is {"cmd": ..., "args": {...}}')
                args = req.get("args") or {}
                if not isinstance(args, dict):
                    raise ValueError("args must be an object")
            except ValueError as e:
                self._reply({"ok": False, "error": f"bad request: {e}"})
                continue
            try:
                self._reply({"ok": True, "data": self.server.dispatch(req["cmd"], args)})
            except Exception as e:  # the daemon's one-line refusal, or a bug: never a crash
                self._reply({"ok": False, "error": str(e) or type(e).__name__})

    def _reply(self, obj: dict[str, Any]) -> None:
        self.wfile.write(json.dumps(obj, allow_nan=False, default=str).encode() + b"\n")
        self.wfile.flush()


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, path: str, dispatch: Handler) -> None:
        self.dispatch = dispatch
        super().__init__(path, _Conn)


class ControlServer:
    def __init__(self, path: str, dispatch: Handler, mode: int = 0o600) -> None:
        self.path = path
        p = Path(path)
        p.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        if p.is_socket():
            if _alive(path):
                raise OSError(f"{path}: another santhrottled is running")
            p.unlink()  # left by a daemon that died
        old = os.umask(0o777 & ~mode)
        try:
            self._server = _Server(path, dispatch)
        finally:
            os.umask(old)
        os.chmod(path, mode)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_S},
            name="control",
            daemon=True,
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _alive(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def request(path: str, cmd: str, timeout_s: float = CLIENT_TIMEOUT_S, **args: Any) -> Any:
    """One request to the daemon; raises DaemonUnavailable or RemoteError."""
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout_s)
        s.connect(path)
    except FileNotFoundError:
        raise DaemonUnavailable(f"santhrottled is not running (no socket {path})") from None
    except PermissionError:
        raise DaemonUnavailable(f"permission denied on {path} (root only)") from None
    except OSError as e:
        raise DaemonUnavailable(f"santhrottled does not answer on {path}: {e}") from None
    with s, s.makefile("rwb") as f:
        f.write(json.dumps({"cmd": cmd, "args": args}).encode() + b"\n")
        f.flush()
        line = f.readline()
    if not line:
        raise DaemonUnavailable(f"santhrottled closed {path} without an answer")
    resp = json.loads(line)
    if not resp.get("ok"):
        raise RemoteError(resp.get("error", "refused"))
    return resp.get("data")
