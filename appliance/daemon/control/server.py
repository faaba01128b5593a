"""The control socket: a Unix stream socket speaking one JSON object per line.

What it owns
    ControlServer, the daemon's side: one thread, one event loop (selectors)
    over every connection (the CLI's side, request(), is daemon/control/client.py's,
    importable from here too). The messages (the
    commands and their arguments, replies, PROTOCOL_VERSION) are
    daemon/control/requests.py's: nothing reaches the daemon unchecked.

    Request:  {"cmd": "threshold_set", "args": {"resource": "vg0", "threshold_s": 0.015}}
    Reply:    {"protocol": 2, "ok": true, "data": ...}
          or  {"protocol": 2, "ok": false, "error": "one line for the admin"}

What a client cannot do
    Stall the daemon: the loop never holds the daemon's lock during socket
    I/O (commands.handle takes it and returns fresh objects, encoded and sent
    after). Exhaust the server: at most max_connections (64); when all are
    taken, the one idle longest (no request for evict_idle_s, 0.5 s) makes
    room, else new ones wait in the listen backlog (128: a burst of 100 CLI
    calls). A connection without a complete request for idle_timeout_s (5 s)
    is closed; a request line is at most MAX_REQUEST_BYTES; one request per
    connection at a time (the next line is read once the answer is sent);
    writes are non-blocking. Use it without the right: SO_PEERCRED on every
    connection: uid 0 (and the server's own uid), or, with a group, a peer
    whose primary or supplementary groups (/proc/PID/status) hold it; others
    get one line and are closed. Mode 0600 root:root, or 0660 root:GROUP with
    a group; any other mode is a ValueError.

Worked example
    srv = ControlServer("/run/santhrottle/control.sock", daemon.handle, 0o660, "storage")
    srv.start()
    request("/run/santhrottle/control.sock", "ping") -> {"pong": True}
    srv.close()  # joins the loop, closes every connection, removes the socket
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from santhrottle.appliance.daemon.control.client import socket_in_use
from santhrottle.appliance.daemon.control.requests import (
    Context,
    Handler,
    Refused,
    answer,
    encode,
)
from santhrottle.appliance.daemon.core.audit import Caller

log = logging.getLogger("santhrottled.control")

MAX_REQUEST_BYTES = 64 * 1024
# How long close() waits for the loop to end.
SHUTDOWN_WAIT_S = 5.0
MAX_CONNECTIONS = 64
IDLE_TIMEOUT_S = 5.0
# When every slot is taken, a connection without a request for this long
# makes room for a new one (a CLI call sends its request at once).
EVICT_IDLE_S = 0.5
LISTEN_BACKLOG = 128
RECV_CHUNK_BYTES = 64 * 1024
# After an exception in the loop itself (a bug), the loop waits this long.
LOOP_ERROR_PAUSE_S = 0.05
# The socket's modes: root only, or root and one group.
MODE_ROOT = 0o600
MODE_GROUP = 0o660
ROOT_UID = 0
_UCRED = struct.Struct("3i")  # pid, uid, gid


class _Conn:
    __slots__ = ("caller", "eof", "events", "inbuf", "last", "outbuf", "sock")

    def __init__(self, sock: socket.socket, now: float, caller: Caller | None = None) -> None:
        self.sock = sock
        self.caller = caller  # its peer (SO_PEERCRED): the audit trail's "who"
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.eof = False  # the peer sent everything (or must send nothing more)
        self.events = 0
        self.last = now  # the last complete request, accept or send progress


class ControlServer:
    def __init__(
        self,
        path: str,
        dispatch: Handler,
        mode: int = MODE_ROOT,
        group: str | None = None,
        *,
        allow_uids: Collection[int] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        evict_idle_s: float = EVICT_IDLE_S,
        refused: Refused | None = None,
        context: Callable[[], Context] | None = None,
    ) -> None:
        want = MODE_GROUP if group is not None else MODE_ROOT
        if mode != want:
            raise ValueError(
                f"control socket mode {mode:04o}: must be {want:04o}"
                + (f" with group {group!r}" if group is not None else " without a group")
            )
        self.group = group
        self.gid: int | None = None
        if group is not None:
            try:
                self.gid = grp.getgrnam(group).gr_gid
            except KeyError:
                raise ValueError(f"control socket group {group!r} does not exist") from None
        self.path = path
        self.dispatch = dispatch
        self.on_refused = refused  # a state change the checks refused: the audit trail
        self.context = context  # the daemon's bounds the arguments are checked against
        self.allow_uids = frozenset({ROOT_UID, os.geteuid()} if allow_uids is None else allow_uids)
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.evict_idle_s = evict_idle_s
        self.refused = 0  # connections refused for their peer's credentials
        self.evicted = 0  # idle connections closed to make room
        self.loop_errors = 0  # exceptions the loop caught (a bug; logged)
        p = Path(path)
        p.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        if p.is_socket():
            if socket_in_use(path):
                raise OSError(f"{path}: another santhrottled is running")
            p.unlink()  # left by a daemon that died
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o777 & ~mode)
        try:
            try:
                self._listener.bind(path)
            except OSError as e:
                raise OSError(f"{path}: {e.strerror or e}") from None
            if self.gid is not None:
                os.chown(path, ROOT_UID if os.geteuid() == ROOT_UID else -1, self.gid)
            os.chmod(path, mode)
            self._listener.listen(LISTEN_BACKLOG)
        except BaseException:
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
        finally:
            os.umask(old)
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._listening = False
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: dict[int, _Conn] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(SHUTDOWN_WAIT_S)
        for c in list(self._conns.values()):
            self._drop(c)
        self._sel.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    @property
    def connections(self) -> int:
        return len(self._conns)

    # ------------------------------------------------------------ the loop
    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self._once()
            except Exception:  # a bug: logged and counted, the loop goes on
                self.loop_errors += 1
                log.exception("control: event loop")
                self._stop.wait(LOOP_ERROR_PAUSE_S)  # never a hot loop of tracebacks

    def _once(self) -> None:
        now = time.monotonic()
        room = self._room(now, evict=False)
        self._listen(room)
        busy = any(self._ready(c) for c in self._conns.values())
        timeout = 0.0 if busy else self._next_deadline(now, room)
        for k, mask in self._sel.select(timeout):
            if k.data == "listen":
                self._accept()
            elif k.data == "wake":
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            else:
                self._event(k.data, mask)
        now = time.monotonic()
        for c in list(self._conns.values()):
            if self._live(c):
                self._guarded(c, self._step, c, now)

    def _next_deadline(self, now: float, room: bool) -> float | None:
        """Seconds until a connection's idle timeout, or (full) until one may be evicted."""
        if not self._conns:
            return None
        oldest = min(c.last for c in self._conns.values())
        nxt = oldest + self.idle_timeout_s
        if not room:
            idle = [c.last for c in self._conns.values() if self._idle(c)]
            if idle:
                nxt = min(nxt, min(idle) + self.evict_idle_s)
        return max(0.0, nxt - now)

    def _idle(self, c: _Conn) -> bool:
        return not c.outbuf and b"\n" not in c.inbuf

    def _room(self, now: float, evict: bool) -> bool:
        """A free slot; when full, the connection idle longest past evict_idle_s
        makes room (evict=True drops it)."""
        if len(self._conns) < self.max_connections:
            return True
        idle = [c for c in self._conns.values() if self._idle(c)]
        victim = min(idle, key=lambda c: c.last, default=None)
        if victim is None or now - victim.last < self.evict_idle_s:
            return False
        if evict:
            self.evicted += 1
            self._drop(victim)
        return True

    def _listen(self, on: bool) -> None:
        """Full: new connections wait in the listen backlog, not in a thread or a slot."""
        if on and not self._listening:
            self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        elif self._listening and not on:
            self._sel.unregister(self._listener)
        self._listening = on

    def _guarded(self, c: _Conn, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # a bug in one connection's handling: drop it, keep serving
            self.loop_errors += 1
            log.exception("control: connection")
            self._drop(c)

    def _live(self, c: _Conn) -> bool:
        return self._conns.get(c.sock.fileno()) is c

    def _event(self, c: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_READ and self._live(c):
            self._guarded(c, self._recv, c)
        if mask & selectors.EVENT_WRITE and self._live(c):
            self._guarded(c, self._send, c)

    def _accept(self) -> None:
        while True:
            now = time.monotonic()
            if not self._room(now, evict=False):
                return  # the rest wait in the backlog
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and the like: the backlog keeps them
                log.warning("control: accept: %s", e)
                return
            sock.setblocking(False)
            creds = peer_credentials(sock)
            refusal = peer_refusal(creds, self.allow_uids, self.group, self.gid)
            if refusal is not None:
                self.refused += 1
                with contextlib.suppress(OSError):
                    sock.send(encode({"ok": False, "error": refusal}))
                sock.close()
                continue
            self._room(now, evict=True)
            caller = None if isinstance(creds, str) else Caller("socket", creds[1], creds[0])
            c = _Conn(sock, now, caller)
            self._conns[sock.fileno()] = c
            self._interest(c)

    @staticmethod
    def _ready(c: _Conn) -> bool:
        """A complete request waits and the last answer is sent."""
        return not c.outbuf and b"\n" in c.inbuf

    def _recv(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(RECV_CHUNK_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(c)
            return
        if not data:
            c.eof = True
        c.inbuf += data
        if b"\n" not in c.inbuf and len(c.inbuf) > MAX_REQUEST_BYTES:
            self._fail(c, "request too large")
        self._interest(c)

    def _fail(self, c: _Conn, error: str) -> None:
        """A last answer, then close."""
        c.inbuf.clear()
        c.outbuf += encode({"ok": False, "error": error})
        c.eof = True

    def _step(self, c: _Conn, now: float) -> None:
        """One request of this connection, or its end: drained, or idle too long."""
        if self._ready(c):
            line, _, rest = bytes(c.inbuf).partition(b"\n")
            c.inbuf[:] = rest
            c.last = now
            if len(line) > MAX_REQUEST_BYTES:
                self._fail(c, "request too large")
            else:
                c.outbuf += encode(
                    answer(line, self.dispatch, c.caller, self.on_refused, self.context)
                )
            self._send(c)
            return
        if c.eof and not c.outbuf:
            self._drop(c)
        elif now - c.last >= self.idle_timeout_s:
            self._drop(c)  # no complete request (or no reading of the answer) in time

    def _send(self, c: _Conn) -> None:
        if c.outbuf:
            try:
                n = c.sock.send(c.outbuf)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:  # the peer went away
                self._drop(c)
                return
            if n:
                del c.outbuf[:n]
                c.last = time.monotonic()
        if c.eof and not c.outbuf and b"\n" not in c.inbuf:
            self._drop(c)
            return
        self._interest(c)

    def _interest(self, c: _Conn) -> None:
        want = 0
        if not c.eof and b"\n" not in c.inbuf and not c.outbuf:
            want |= selectors.EVENT_READ
        if c.outbuf:
            want |= selectors.EVENT_WRITE
        if want == c.events:
            return
        if c.events == 0:
            self._sel.register(c.sock, want, c)
        elif want == 0:
            self._sel.unregister(c.sock)
        else:
            self._sel.modify(c.sock, want, c)
        c.events = want

    def _drop(self, c: _Conn) -> None:
        fd = c.sock.fileno()
        if fd >= 0 and self._conns.get(fd) is c:
            del self._conns[fd]
            if c.events:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._sel.unregister(c.sock)
        c.events = 0
        c.sock.close()


def peer_credentials(sock: socket.socket) -> tuple[int, int, int] | str:
    """(pid, uid, gid) of a connection's peer (SO_PEERCRED), or why there are none."""
    try:
        pid, uid, gid = _UCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        )
    except OSError as e:
        return f"permission denied: no peer credentials ({e.strerror or e})"
    return pid, uid, gid


def peer_refusal(
    creds: tuple[int, int, int] | str,
    allow_uids: Collection[int],
    group: str | None,
    gid: int | None,
) -> str | None:
    """Why a connection's peer (its credentials) may not use the socket, or None."""
    if isinstance(creds, str):
        return creds
    pid, uid, pgid = creds
    if uid in allow_uids or (gid is not None and (pgid == gid or gid in proc_groups(pid))):
        return None
    return (
        f"permission denied for uid {uid}: root" + (f" or group {group}" if group else "") + " only"
    )


def proc_groups(pid: int) -> set[int]:
    """The supplementary groups of a process (/proc/PID/status Groups:); empty if gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:] if g.isdigit()}
    except OSError:
        pass
    return set()
