"""The Prometheus exporter's HTTP server: bounded, timed out, and guarded off the loopback.

Problem
    The exporter ran one thread per connection, never timed out a partial
    request and listened with a backlog of 5: ~1,000 idle connections from an
    unprivileged user left 600 threads and CLOSE-WAIT sockets behind and took
    the file descriptors the sensors needed (/proc/diskstats could not be
    opened any more).

What it owns
    MetricsServer: one listening socket (backlog LISTEN_BACKLOG) and one thread, an
    event loop over at most MAX_CONNECTIONS connections (like the control socket's,
    daemon/control/server.py): no thread per connection, at most that many
    descriptors whatever is sent. When every slot is taken, a connection that has
    sent nothing for EVICT_IDLE_S (0.5 s: a scraper sends its request, or its TLS
    hello, half a round trip after it connects, and a loaded host may not run it for
    a while), else one whose request is still not whole after EVICT_PARTIAL_S (1 s),
    makes room, so neither an idle nor a dribbling flood keeps a scraper out; past
    that, new connections wait in the kernel's backlog. A connection has
    READ_TIMEOUT_S for its TLS handshake and its whole request (request line and
    headers, at most MAX_REQUEST_BYTES: a byte now and then does not keep it),
    WRITE_TIMEOUT_S to take the answer, then it is closed (HTTP/1.1 with
    `Connection: close`: one scrape per connection). GET or HEAD of / or /metrics
    answers the registry's exposition (prometheus_client's encoders, OpenMetrics
    when asked for); anything else is a short 4xx. A burst of scrapes shares one
    collection: an exposition made after a connection was accepted answers it too
    (it shows the daemon as it was after that scrape came), so 500 scrapes at once
    cost a few collections of the daemon's registry (~10 ms each), not 500. A
    connection whose whole request waits unread is never evicted: only the silent
    and the dribbling make room.
    Off the loopback (config/metrics.py): HTTPS through the standard ssl
    module with the configured certificate and key (and, with a client CA,
    a client certificate asked of every scrape), and HTTP basic
    authentication against bcrypt hashes (as the Prometheus exporter-toolkit
    keeps them; the bcrypt module, Debian's python3-bcrypt, is needed then):
    401 without a good user and password.  A password checked once is
    remembered (a digest of it, AUTH_CACHE_ENTRIES at most), so a scrape every
    15 s costs one bcrypt check, not one each.

Worked example
    MetricsServer("127.0.0.1", 9753, registry): 1,000 connections that send
    nothing: 256 are open at a time, each closed after 0.5 s when another waits
    (and after 5 s anyway); a scrape among them is answered within seconds.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import logging
import selectors
import socket
import ssl
import struct
import termios
import threading
import time
from collections.abc import Mapping

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger("santhrottled")

# Connections open at once (a descriptor each, no thread): room for a burst of
# scrapers on a loaded host, whose requests may come late; when all are taken, one
# that has sent nothing for EVICT_IDLE_S (a scraper sends its request at once: half a
# round trip, but a busy host may not run a scraper for tens of ms after its connect),
# else one whose request is not whole after EVICT_PARTIAL_S, makes room. A flood that
# keeps every slot needs 512 new connections a second; a scraper among them is served
# when its turn comes.
MAX_CONNECTIONS = 256
EVICT_IDLE_S = 0.5
EVICT_PARTIAL_S = 1.0
LISTEN_BACKLOG = 128
# A connection's TLS handshake and whole request, then its answer, within these.
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
MAX_REQUEST_BYTES = 8192
RECV_CHUNK_BYTES = 4096
SHUTDOWN_WAIT_S = 5.0
# With no connection, the loop sleeps this long (a wake-up socket ends the sleep at stop).
IDLE_WAKE_S = 60.0
# After an exception in the loop itself (a bug), the loop waits this long.
LOOP_ERROR_PAUSE_S = 0.05
HTTP_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
}
AUTH_CACHE_ENTRIES = 64
PATHS = frozenset({"/", "/metrics"})


class ExporterConfigError(ValueError):
    """The exporter's TLS or users cannot be used: one line."""


def tls_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """A server context of the certificate and key (and a client CA to check
    scrapers against); ExporterConfigError naming the file otherwise."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ExporterConfigError(
            f"metrics.tls_cert_file {cert} / tls_key_file {key}: {_why(e)}"
        ) from None
    if client_ca is not None:
        try:
            ctx.load_verify_locations(client_ca)
        except (OSError, ssl.SSLError) as e:
            raise ExporterConfigError(
                f"metrics.tls_client_ca_file {client_ca}: {_why(e)}"
            ) from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _why(e: Exception) -> str:
    """An OSError's words, an ssl.SSLError's reason (it is an OSError too)."""
    if isinstance(e, ssl.SSLError) and e.reason:
        return str(e.reason)
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)


class BasicAuth:
    """HTTP basic authentication against bcrypt hashes (user -> hash)."""

    def __init__(self, users: Mapping[str, str]) -> None:
        try:
            import bcrypt
        except ImportError:
            raise ExporterConfigError(
                "metrics.basic_auth_users needs the bcrypt module (Debian: python3-bcrypt)"
            ) from None
        self._check = bcrypt.checkpw
        self.users = {u: h.encode() for u, h in users.items()}
        self._good: dict[bytes, None] = {}  # digests of user:password pairs checked good
        self._lock = threading.Lock()

    def allows(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        want = self.users.get(user.decode("utf-8", "replace"))
        if want is None:
            return False
        digest = hashlib.sha256(want + b"\0" + user + b"\0" + password).digest()
        with self._lock:
            if digest in self._good:
                return True
        if not self._check(password, want):
            return False
        with self._lock:
            if len(self._good) >= AUTH_CACHE_ENTRIES:
                self._good.pop(next(iter(self._good)))
            self._good[digest] = None
        return True


def _pending(sock: socket.socket) -> bool:
    """Bytes wait in the socket's receive queue (FIONREAD; a TLS socket's too)."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0] > 0
    except OSError:
        return False


def _whole(c: _Conn) -> bool:
    """Its whole request is here, read or waiting in the socket (a peek; behind TLS
    only once read): a scrape waiting its turn, not a dribbler."""
    if not c.whole and c.got and not isinstance(c.sock, ssl.SSLSocket):
        try:
            head = bytes(c.inbuf) + c.sock.recv(MAX_REQUEST_BYTES, socket.MSG_PEEK)
        except OSError:
            return False
        c.whole = _ends_request(head)
    return c.whole


def _ends_request(head: bytes) -> bool:
    return b"\r\n\r\n" in head or b"\n\n" in head


class _Conn:
    __slots__ = ("deadline", "got", "inbuf", "outbuf", "shaking", "sock", "started", "whole")

    def __init__(self, sock: socket.socket, now: float, read_timeout_s: float, tls: bool) -> None:
        self.sock = sock
        self.started = now
        self.deadline = now + read_timeout_s  # its TLS handshake and whole request by then
        self.shaking = tls  # the TLS handshake is under way
        self.got = False  # a byte of the request came
        self.inbuf = bytearray()
        self.outbuf = bytearray()  # the answer, being sent (the request is done)
        self.whole = False  # its whole request came (_whole)


class MetricsServer:
    """The exporter: bound in the constructor (OSError when the port is taken, before
    anything else starts), served by one thread's event loop, stopped by shutdown()."""

    def __init__(
        self,
        address: str,
        port: int,
        registry: CollectorRegistry,
        *,
        tls: ssl.SSLContext | None = None,
        auth: BasicAuth | None = None,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.registry = registry
        self.tls = tls
        self.auth = auth
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.served = 0  # answers sent
        self.dropped = 0  # connections closed without an answer (timeout, bad TLS, evicted)
        fam = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._sock = socket.socket(fam, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((address, port))
            self._sock.listen(LISTEN_BACKLOG)
        except BaseException:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._listening = False
        self._conns: dict[int, _Conn] = {}
        # per content type, the last exposition and when its collection began
        self._made: dict[str, tuple[float, bytes]] = {}
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name="metrics", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        return len(self._conns)

    def shutdown(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(SHUTDOWN_WAIT_S)
        for c in list(self._conns.values()):
            self._drop(c)
        self._sel.close()
        for s in (self._sock, self._wake_r, self._wake_w):
            s.close()

    # ------------------------------------------------------------ the loop
    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self._once()
            except Exception:  # a bug: logged, the loop goes on (never a hot loop)
                log.exception("metrics: event loop")
                self._stop.wait(LOOP_ERROR_PAUSE_S)

    def _once(self) -> None:
        now = time.monotonic()
        self._listen(self._room(now, evict=False))
        for c in [c for c in self._conns.values() if now >= c.deadline]:
            self.dropped += 1  # its request (or its answer) did not come in time
            self._drop(c)
        for key, _mask in self._sel.select(self._next_wake(now)):
            if key.fileobj is self._sock:
                self._accept()
            elif key.data is None:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            elif self._conns.get(key.fd) is key.data:
                self._step(key.data)

    def _next_wake(self, now: float) -> float:
        """Seconds until a connection's deadline, or (full, not listening) until one may
        be evicted for those waiting in the backlog."""
        wake = min((c.deadline for c in self._conns.values()), default=now + IDLE_WAKE_S)
        if not self._listening:
            for c in self._conns.values():
                if not c.outbuf:
                    wake = min(wake, c.started + (EVICT_PARTIAL_S if c.got else EVICT_IDLE_S))
        return max(wake - now, 0.0)

    def _room(self, now: float, evict: bool) -> bool:
        """A free slot; when full, a connection that has sent nothing for EVICT_IDLE_S
        (a scraper sends its request, or its TLS hello, at once), else one whose request
        is still not whole after EVICT_PARTIAL_S, makes room (evict=True drops it): an
        idle or a dribbling flood cannot keep the slots from a scraper."""
        if len(self._conns) < self.max_connections:
            return True

        def overdue(c: _Conn) -> bool:
            return now - c.started >= (EVICT_PARTIAL_S if c.got else EVICT_IDLE_S)

        for c in self._conns.values():  # came, not yet read: not silent
            if not c.got and _pending(c.sock):
                c.got = True
        victims = [c for c in self._conns.values() if not c.outbuf and overdue(c) and not _whole(c)]
        victim = min(victims, key=lambda c: (c.got, c.started), default=None)
        if victim is None:
            return False
        if evict:
            self.dropped += 1
            self._drop(victim)
        return True

    def _listen(self, on: bool) -> None:
        """Full: new connections wait in the kernel's backlog, holding nothing of ours."""
        if on and not self._listening:
            self._sel.register(self._sock, selectors.EVENT_READ, None)
        elif self._listening and not on:
            self._sel.unregister(self._sock)
        self._listening = on

    def _accept(self) -> None:
        while True:
            now = time.monotonic()
            if not self._room(now, evict=True):
                return
            try:
                raw, _peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and the like: the backlog keeps them
                log.warning("metrics: accept: %s", e.strerror or e)
                return
            raw.setblocking(False)
            sock: socket.socket = raw
            if self.tls is not None:
                try:
                    sock = self.tls.wrap_socket(
                        raw, server_side=True, do_handshake_on_connect=False
                    )
                except (OSError, ssl.SSLError):
                    raw.close()
                    self.dropped += 1
                    continue
            c = _Conn(sock, now, self.read_timeout_s, self.tls is not None)
            self._conns[sock.fileno()] = c
            self._sel.register(sock, selectors.EVENT_READ, c)

    def _step(self, c: _Conn) -> None:
        """What the connection's socket is ready for: the handshake, the request or
        the answer."""
        c.got = True  # ready: its peer has sent something (a TLS hello counts)
        try:
            if c.shaking:
                c.sock.do_handshake()  # type: ignore[attr-defined]
                c.shaking = False
            if c.outbuf:
                self._send(c)
                return
            self._recv(c)
        except ssl.SSLWantReadError:
            self._sel.modify(c.sock, selectors.EVENT_READ, c)
        except ssl.SSLWantWriteError:
            self._sel.modify(c.sock, selectors.EVENT_WRITE, c)
        except (OSError, ssl.SSLError):
            self.dropped += 1
            self._drop(c)

    def _recv(self, c: _Conn) -> None:
        while True:  # TLS may hold more than one record already decrypted
            chunk = c.sock.recv(RECV_CHUNK_BYTES)
            if not chunk:
                self.dropped += 1
                self._drop(c)
                return
            c.got = True
            c.inbuf += chunk
            if _ends_request(c.inbuf):
                self._respond(c)
                return
            if len(c.inbuf) > MAX_REQUEST_BYTES:
                self.dropped += 1
                self._drop(c)
                return
            if not isinstance(c.sock, ssl.SSLSocket) or not c.sock.pending():
                return

    def _respond(self, c: _Conn) -> None:
        head = bytes(c.inbuf)
        status, headers, body = self._answer(head, c.started)
        reason = HTTP_REASONS[status]
        lines = [f"HTTP/1.1 {status} {reason}", *headers, f"Content-Length: {len(body)}"]
        lines += ["Connection: close", "", ""]
        head_only = head.split(b" ", 1)[0] == b"HEAD"
        c.outbuf = bytearray("\r\n".join(lines).encode() + (b"" if head_only else body))
        c.deadline = time.monotonic() + WRITE_TIMEOUT_S
        self._sel.modify(c.sock, selectors.EVENT_WRITE, c)
        self._send(c)

    def _send(self, c: _Conn) -> None:
        n = c.sock.send(c.outbuf)
        del c.outbuf[:n]
        if not c.outbuf:
            self.served += 1
            self._drop(c)

    def _drop(self, c: _Conn) -> None:
        fd = c.sock.fileno()
        if fd >= 0 and self._conns.get(fd) is c:
            del self._conns[fd]
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(c.sock)
        with contextlib.suppress(OSError):
            c.sock.close()

    def _answer(self, head: bytes, since: float) -> tuple[int, list[str], bytes]:
        """The status, headers and body for a request whose connection came at `since`."""
        text = head.decode("latin-1")
        request, *header_lines = text.split("\n")
        parts = request.strip().split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, ["Content-Type: text/plain"], b"bad request\n"
        method, target, _version = parts
        headers = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if self.auth is not None and not self.auth.allows(headers.get("authorization")):
            return (
                401,
                ['WWW-Authenticate: Basic realm="santhrottle"', "Content-Type: text/plain"],
                b"unauthorized\n",
            )
        if method not in ("GET", "HEAD"):
            return 405, ["Allow: GET, HEAD", "Content-Type: text/plain"], b"GET or HEAD\n"
        if target.split("?", 1)[0] not in PATHS:
            return 404, ["Content-Type: text/plain"], b"the metrics are at /metrics\n"
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        made = self._made.get(content_type)
        if made is None or made[0] < since:  # none made since this scrape came
            at = time.monotonic()
            made = self._made[content_type] = (at, encoder(self.registry))
        return 200, [f"Content-Type: {content_type}"], made[1]
