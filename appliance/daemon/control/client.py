"""The control socket's client: one request, one answer, never a hang or a traceback.

What it owns
    request(path, cmd, **args): the CLI's (and the lab scripts') side of the
    protocol of daemon/control/server.py.  One deadline for the whole exchange;
    a listen backlog that is full (a burst of calls) is retried until it.
    Nobody there is DaemonAbsent; a daemon that does not answer, closes, or
    sends what is not a reply is DaemonUnavailable; a refusal, a socket we
    may not use and another protocol version are RemoteError: each one line.

Worked example
    request("/run/santhrottle/control.sock", "ping") -> {"pong": True};
    with no daemon: DaemonAbsent "santhrottled is not running (no socket ...)".
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from santhrottle.appliance.daemon.control.requests import (
    DaemonAbsent,
    DaemonUnavailable,
    RemoteError,
    one_line,
    parse_reply,
)

CLIENT_TIMEOUT_S = 10.0
RECV_CHUNK_BYTES = 64 * 1024
# The largest reply the client reads (a status of 10,000 initiators is ~4 MB).
MAX_REPLY_BYTES = 64 * 1024 * 1024
# A client whose connect finds the backlog full tries again after this long.
CONNECT_RETRY_S = 0.01


def request(path: str, cmd: str, timeout_s: float = CLIENT_TIMEOUT_S, **args: Any) -> Any:
    """One request to the daemon: its answer's data, or DaemonUnavailable (nobody
    answers: no socket, a timeout, a dropped connection, a reply that is not
    JSON) or RemoteError (the daemon refused; another protocol version), each
    with one line. The whole exchange takes at most timeout_s."""
    deadline = time.monotonic() + timeout_s
    try:
        line = json.dumps({"cmd": cmd, "args": args}, allow_nan=False).encode() + b"\n"
    except (ValueError, TypeError) as e:
        raise RemoteError(one_line(f"{cmd}: not sent: {e}")) from None
    s = _connect(path, deadline)
    with s:
        sent: OSError | None = None
        try:
            s.sendall(line)
        except OSError as e:  # a timeout, or the daemon refused us in one line: read
            sent = e
        reply = _read_line(s, path, deadline, timeout_s, sent)
    return parse_reply(reply, path)


def _connect(path: str, deadline: float) -> socket.socket:
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            s.connect(path)
            return s
        except BlockingIOError:  # the listen backlog is full (a burst): again
            why = "busy"
        except FileNotFoundError:
            s.close()
            raise DaemonAbsent(f"santhrottled is not running (no socket {path})") from None
        except PermissionError:  # a daemon may run: it is the socket that refuses
            s.close()
            raise RemoteError(f"permission denied on {path} (root or its group only)") from None
        except ConnectionRefusedError:
            s.close()
            raise DaemonAbsent(f"santhrottled is not running (nobody listens on {path})") from None
        except OSError as e:
            why = f"santhrottled does not answer on {path}: {e.strerror or e}"
        s.close()
        if why != "busy":
            raise DaemonUnavailable(why)
        if time.monotonic() >= deadline:
            raise DaemonUnavailable(f"santhrottled does not answer on {path} (busy)")
        time.sleep(CONNECT_RETRY_S)


def _read_line(
    s: socket.socket, path: str, deadline: float, timeout_s: float, sent: OSError | None
) -> bytes:
    buf = bytearray()
    while b"\n" not in buf:
        if len(buf) > MAX_REPLY_BYTES:
            raise DaemonUnavailable(
                f"santhrottled's reply on {path} is over {MAX_REPLY_BYTES} bytes"
            )
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            s.settimeout(left)
            chunk = s.recv(RECV_CHUNK_BYTES)
        except TimeoutError:
            raise DaemonUnavailable(
                f"santhrottled does not answer on {path} (no answer within {timeout_s:g}s)"
            ) from None
        except OSError as e:
            chunk, sent = b"", sent or e
        if not chunk:
            why = f": {sent.strerror or sent}" if sent is not None else ""
            raise DaemonUnavailable(f"santhrottled closed {path} without an answer{why}")
        buf += chunk
    return bytes(buf[: buf.index(b"\n")])


def socket_in_use(path: str) -> bool:
    """A daemon answers on this Unix socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True
