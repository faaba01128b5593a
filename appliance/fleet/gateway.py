"""Gateway: one bounded call to etcd over its endpoints, through etcd's JSON gateway (etcd3gw).

Problem
    The fleet's adapter (fleet/etcd.py) calls etcd every 100 ms tick and must
    never hang: a member may be down, cut off, without a raft leader, or
    refuse the appliance's credentials, and each must become one
    EngineUnavailable naming the endpoints and their causes, within a bound.

What it does
    One etcd3gw client (HTTP/JSON to the gRPC gateway every member serves on
    its client port, /v3/) per endpoint.  A call tries the endpoint that
    answered last, and on a transport failure, a timeout or an etcd "no
    leader" the next one, until call_budget_s is spent; each attempt waits at
    most request_timeout_s for the connection and as long for the answer.
    "lease not found" is LeaseLost; any other refusal is EngineUnavailable at
    once (another member would say the same).

    TLS and authentication (docs/fleet.md, "Security"): https:// endpoints
    are checked against the CA file `ca` (else the system's CAs), the client
    certificate (`cert`, `key`) goes to members that ask for one, and with a
    `user` every request carries the token etcd gave that user for its
    password (/v3/auth/authenticate; etcd's gateway does not pass a client
    certificate's name on as a user).  A token etcd no longer knows ("invalid
    auth token": a member restarted, the token's TTL ran out) is asked for
    again and the request repeated once; a refused password, a missing user
    and a denied permission are EngineUnavailable saying so.

    etcd3gw's public API only, as in Debian 12's 2.0.0 and PyPI's 2.7: an
    Etcd3Client's post, get_url and transaction, its session attribute (a
    requests.Session of ours, which gives every request the attempt's
    timeout: 2.0.0 passes none) and its exceptions.  Keys and values are
    base64 here (b64, unb64).

Bounds
    A call lasts at most call_budget_s + request_timeout_s (the last attempt's
    connect and read each get at most the budget left); a token asked for
    again adds one more request on that attempt.  Not thread-safe: one caller.

Worked example
    gw = Gateway(["https://10.77.0.1:2379", "https://10.77.0.2:2379"], 0.5, 1.0,
                 Security(ca="/etc/santhrottle/etcd/ca.pem", user="gw-a", password="..."))
    gw.call(lambda c: c.post(c.get_url("/kv/range"), json={"key": b64(b"/x")}))
    # 10.77.0.1 is down: its connect fails at once, 10.77.0.2 answers
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
from etcd3gw import exceptions as gw_errors
from etcd3gw.client import Etcd3Client

from santhrottle.appliance.fleet.engine import EngineUnavailable, LeaseLost
from santhrottle.appliance.fleet.names import parse_endpoint

# etcd answers that say "this member cannot serve now, another may".
_RETRY_ANSWERS = ("no leader", "timed out", "leader changed", "not capable", "too many requests")
# etcd answers that say "this token is not (or no longer) one I gave": ask again.
_TOKEN_ANSWERS = ("invalid auth token", "auth token is expired")
# transport failures as a few words (requests' own text is a paragraph)
_NO_CLIENT_CERT = (
    "the member refused the TLS handshake: no client certificate, or one its CA did not "
    "sign (fleet.cert, fleet.key)"
)
_KNOWN_CAUSES = (
    ("Connection refused", "connection refused"),
    ("No route to host", "no route to host"),
    ("Network is unreachable", "network is unreachable"),
    ("CERTIFICATE_VERIFY_FAILED", "the member's certificate is not signed by fleet.ca"),
    ("doesn't match", "the member's certificate does not name this endpoint"),
    ("certificate required", _NO_CLIENT_CERT),
    ("unknown ca", _NO_CLIENT_CERT),
    ("bad certificate", _NO_CLIENT_CERT),
    ("EOF occurred in violation of protocol", _NO_CLIENT_CERT),
    ("WRONG_VERSION_NUMBER", "the member does not speak TLS here (http:// endpoint?)"),
    (
        "CommonName of client sending a request against gateway",
        "the client certificate has a Common Name, which etcd's gateway refuses once "
        "authentication is on: issue fleet.cert without one",
    ),
    ("Read timed out", "read timed out"),
    ("timed out", "timed out"),
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Security:
    """TLS and authentication towards etcd ([fleet] ca, cert, key, user, password_file).

    ca: PEM file of the CA that signed the members' certificates (None: the
    system's); cert, key: this appliance's client certificate and its key
    (both or neither); user, password: its etcd user (both or neither)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("a client certificate needs both cert and key")
        if (self.user is None) != (self.password is None):
            raise ValueError("an etcd user needs both user and password")

    @property
    def tls(self) -> bool:
        return self.ca is not None or self.cert is not None


def b64(data: bytes) -> str:
    """etcd's JSON gateway carries keys and values as base64."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"not base64 text: {text!r}")
    return base64.b64decode(text.encode("ascii"), validate=True)


class _Session(requests.Session):
    """A session whose requests without a timeout get timeout_s (connect and read),
    and that takes nothing from the environment: no proxy, no CA bundle
    (REQUESTS_CA_BUNDLE would override fleet.ca), no .netrc."""

    timeout_s: float = 1.0

    def __init__(self) -> None:
        super().__init__()
        self.trust_env = False

    def request(self, method: Any, url: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self.timeout_s
        return super().request(method, url, *args, **kwargs)


def short(cause: BaseException) -> str:
    """The cause in a few words (etcd3gw keeps requests' long text in detail_text;
    etcd's gateway answers JSON whose "error" is etcd's own words)."""
    text = getattr(cause, "detail_text", None) or str(cause) or type(cause).__name__
    with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
        text = str(json.loads(text)["error"]) or text
    for known, said in _KNOWN_CAUSES:
        if known.lower() in text.lower():
            return said
    return text.strip().replace("\n", " ")[:120]


class _Retry(Exception):
    """This endpoint failed; another may answer."""


class Gateway:
    def __init__(
        self,
        endpoints: Sequence[str],
        request_timeout_s: float,
        call_budget_s: float,
        security: Security | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint")
        self.endpoints = [parse_endpoint(e) for e in endpoints]
        self.security = security or Security()
        if self.security.tls and any(proto != "https" for proto, _, _ in self.endpoints):
            raise ValueError("with a CA or a client certificate, every endpoint is https://")
        self.request_timeout_s = request_timeout_s
        self.call_budget_s = call_budget_s
        self.clients = [self._client(proto, host, port) for proto, host, port in self.endpoints]
        self.current = 0  # the endpoint that answered last
        self._token: str | None = None  # etcd's token for security.user
        self.authentications = 0  # tokens asked for

    def _client(self, protocol: str, host: str, port: int) -> Etcd3Client:
        client = Etcd3Client(host=host, port=port, protocol=protocol, api_path="/v3/")
        client.session.close()
        session = _Session()
        session.timeout_s = self.request_timeout_s
        sec = self.security
        if sec.ca is not None:
            session.verify = sec.ca
        if sec.cert is not None and sec.key is not None:
            session.cert = (sec.cert, sec.key)
        client.session = session
        return client

    def close(self) -> None:
        for c in self.clients:
            c.session.close()

    def call(self, fn: Callable[[Etcd3Client], T]) -> T:
        """fn on the endpoints in turn, until one answers or the budget is spent."""
        deadline = time.monotonic() + self.call_budget_s
        causes: list[str] = []
        n = len(self.clients)
        for i in range(n * 2):  # at most twice round, while the budget lasts
            left = deadline - time.monotonic()
            if left <= 0.01:
                break
            at = (self.current + i) % n
            client = self.clients[at]
            client.session.timeout_s = min(self.request_timeout_s, left)
            name = f"{client.host}:{client.port}"
            t0 = time.monotonic()
            try:
                got = self._attempt(client, fn)
            except _Retry as e:
                causes.append(f"{name}: {e} ({time.monotonic() - t0:.2f} s)")
                continue
            except LeaseLost:
                self.current = at
                raise
            except EngineUnavailable as e:
                raise EngineUnavailable(f"etcd {name}: {e}") from None
            self.current = at
            return got
        spent = self.call_budget_s - (deadline - time.monotonic())
        raise EngineUnavailable(f"etcd did not answer in {spent:.2f} s: " + "; ".join(causes))

    def _attempt(self, client: Etcd3Client, fn: Callable[[Etcd3Client], T]) -> T:
        try:
            return self._authenticated(client, fn)
        except (gw_errors.ConnectionFailedError, gw_errors.ConnectionTimeoutError) as e:
            raise _Retry(short(e)) from None
        except gw_errors.Etcd3Exception as e:
            detail = (e.detail_text or "").lower()
            if "lease not found" in detail:
                raise LeaseLost("the lease has ended (etcd: requested lease not found)") from None
            if any(a in detail for a in _RETRY_ANSWERS):
                raise _Retry(short(e)) from None
            if "permission denied" in detail:
                who = f"user {self.security.user}" if self.security.user else "no user"
                raise EngineUnavailable(f"permission denied ({who})") from None
            if "user name is empty" in detail:
                raise EngineUnavailable(
                    "etcd asks for a user (user name is empty): set fleet.user and "
                    "fleet.password_file"
                ) from None
            raise EngineUnavailable(f"unexpected answer: {short(e)}") from None
        except requests.RequestException as e:
            raise _Retry(short(e)) from None
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
            raise EngineUnavailable(f"unreadable answer: {short(e)}") from None

    def _authenticated(self, client: Etcd3Client, fn: Callable[[Etcd3Client], T]) -> T:
        """fn(client), with the user's token when there is a user (asked for
        again, and fn repeated once, when etcd no longer knows it: a request
        with an unknown token was refused, not applied)."""
        if self.security.user is None:
            return fn(client)
        if self._token is None:
            self._authenticate(client)
        try:
            return fn(client)
        except gw_errors.Etcd3Exception as e:
            if not any(a in (e.detail_text or "").lower() for a in _TOKEN_ANSWERS):
                raise
        self._authenticate(client)
        return fn(client)

    def _authenticate(self, client: Etcd3Client) -> None:
        """A token for security.user from this member; every member takes it."""
        sec = self.security
        try:
            got = client.post(
                client.get_url("/auth/authenticate"),
                json={"name": sec.user, "password": sec.password},
                headers={"Authorization": None},  # not the old token: etcd would refuse it
            )
        except (gw_errors.ConnectionFailedError, gw_errors.ConnectionTimeoutError):
            raise
        except gw_errors.Etcd3Exception as e:
            if any(a in (e.detail_text or "").lower() for a in _RETRY_ANSWERS):
                raise
            raise EngineUnavailable(f"etcd refused user {sec.user!r}: {short(e)}") from None
        token = got.get("token") if isinstance(got, dict) else None
        if not isinstance(token, str) or not token:
            raise EngineUnavailable(f"etcd gave user {sec.user!r} no token")
        self._token = token
        self.authentications += 1
        for c in self.clients:
            c.session.headers["Authorization"] = token
