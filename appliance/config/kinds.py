"""The configuration's value types: a Kind parses one TOML value and describes itself.

What it owns
    Kind (a description for the reference table and a parse function that
    raises KindError with the problem, without the key: config/parse.py
    adds the file, line and key), and one constructor per type of value the
    schema's keys take (durations, rates, names, paths, ports, volumes).

Worked example
    delay_us(10, 100_000).parse("250us") -> 250; .parse(5) raises
    KindError('5 is not a duration: write e.g. "500us"').
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from santhrottle.appliance.units import (
    UnitError,
    fmt_duration,
    fmt_us,
    parse_bit_rate,
    parse_byte_rate,
    parse_duration_s,
    parse_duration_us,
)
from santhrottle.bridge.volumes import VolumeNameError, parse_volume

# Interface, namespace, resource and block device names.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
# iptables multiport takes at most 15 ports.
MAX_PORTS = 15
# An interface name is at most 15 characters (the kernel's IFNAMSIZ, 16, with its NUL).
IFNAME_MAX_CHARS = 15
# A read-latency threshold above a minute is no threshold an array is held to.
MAX_THRESHOLD_S = 60.0
# The fastest link HTB's and netem's sizing is checked for (tc takes 64-bit rates).
MAX_LINK_BITS_S = 10 * 10**12
# The control socket: root only, or root and one group (daemon.socket_group).
SOCKET_MODES = ("0600", "0660")


class KindError(ValueError):
    """A value of the wrong type or out of its bounds: the message, without the key."""


@dataclass(frozen=True)
class Kind:
    """A value type: parses a TOML value, describes itself for the docs."""

    describe: str
    parse: Callable[[Any], Any]


T = TypeVar("T")


def kind_error(value: Any, what: str) -> KindError:
    """KindError quoting the value as written: "5 is not a duration: ..."."""
    return KindError(f"{value!r} {what}")


def _with_unit(v: Any, parse: Callable[[str], T], hint: str) -> T:
    """A string with its unit through parse; hint names what it must be (e.g.
    'a duration: write e.g. "500us"'). The unit parser's message as it is."""
    if not isinstance(v, str):
        raise kind_error(v, f"is not {hint}")
    try:
        return parse(v)
    except UnitError as e:
        raise KindError(str(e)) from None


def delay_us(lo_us: int, hi_us: int) -> Kind:
    def parse(v: Any) -> int:
        us = _with_unit(v, parse_duration_us, 'a duration: write e.g. "500us"')
        if not lo_us <= us <= hi_us:
            raise kind_error(v, f"is outside {fmt_us(lo_us)}..{fmt_us(hi_us)}")
        return us

    return Kind(f"duration, {fmt_us(lo_us)}..{fmt_us(hi_us)}, whole us", parse)


def duration_s(lo_s: float = 0.0, hi_s: float | None = None, positive: bool = False) -> Kind:
    def parse(v: Any) -> float:
        s = _with_unit(v, parse_duration_s, 'a duration: write e.g. "15ms"')
        if positive and s <= 0:
            raise kind_error(v, "must be above 0")
        if positive and not lo_s and hi_s is not None and s > hi_s:
            raise kind_error(v, f"is above {fmt_duration(hi_s)}")
        if s < lo_s or (hi_s is not None and s > hi_s):
            raise kind_error(v, f"is outside {fmt_duration(lo_s)}..{fmt_duration(hi_s or 0)}")
        return s

    if hi_s is not None and positive and not lo_s:
        desc = f"duration > 0, at most {fmt_duration(hi_s)}"
    elif hi_s is not None:
        desc = f"duration, {fmt_duration(lo_s)}..{fmt_duration(hi_s)}"
    else:
        desc = "duration > 0" if positive else "duration >= 0"
    return Kind(desc, parse)


# A threshold the daemon derives itself (Pesto's, controller/lqfit.py).
AUTO = "auto"


def threshold() -> Kind:
    """A read-latency threshold: a duration > 0 (at most MAX_THRESHOLD_S), or "auto"."""
    dur = duration_s(0.0, MAX_THRESHOLD_S, positive=True)

    def parse(v: Any) -> float | str:
        if v == AUTO:
            return AUTO
        try:
            return float(dur.parse(v))
        except KindError as e:
            raise KindError(f'{e}; or "auto"') from None

    return Kind(f'{dur.describe}, or "auto"', parse)


def byte_rate() -> Kind:
    def parse(v: Any) -> float:
        return _with_unit(v, parse_byte_rate, 'a byte rate: write e.g. "1MiB/s"')

    return Kind("byte rate (B/s, kB/s, KiB/s, MB/s, MiB/s, ...)", parse)


def bit_rate() -> Kind:
    def parse(v: Any) -> int:
        try:
            bits = parse_bit_rate(v)
        except UnitError as e:
            raise KindError(str(e)) from None
        if bits > MAX_LINK_BITS_S:
            raise kind_error(v, "is above 10tbit")
        return bits

    return Kind("link speed, 1mbit..10tbit (e.g. 10gbit)", parse)


def integer(lo: int, hi: int) -> Kind:
    def parse(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise kind_error(v, f"must be a whole number within [{lo}, {hi}]")
        return v

    return Kind(f"whole number, {lo}..{hi}", parse)


def number(lo: float, hi: float) -> Kind:
    def parse(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise kind_error(v, f"must be a number within [{lo:g}, {hi:g}]")
        return float(v)

    return Kind(f"number, {lo:g}..{hi:g}", parse)


def boolean() -> Kind:
    def parse(v: Any) -> bool:
        if not isinstance(v, bool):
            raise kind_error(v, "must be true or false")
        return v

    return Kind("true or false", parse)


def choice(options: Sequence[str]) -> Kind:
    def parse(v: Any) -> str:
        if v not in options:
            raise kind_error(v, f"must be one of {', '.join(options)}")
        return str(v)

    return Kind(" or ".join(f'"{o}"' for o in options), parse)


def abs_path(max_bytes: int = 4095) -> Kind:
    def parse(v: Any) -> str:
        if not isinstance(v, str) or not v.startswith("/") or "\0" in v:
            raise kind_error(v, "must be an absolute path")
        if len(v.encode("utf-8", "surrogateescape")) > max_bytes:
            raise kind_error(v, f"is longer than {max_bytes} bytes")
        return v

    return Kind(
        "absolute path" if max_bytes == 4095 else f"absolute path, <= {max_bytes} bytes", parse
    )


def socket_mode() -> Kind:
    def parse(v: Any) -> int:
        if v not in SOCKET_MODES:
            raise kind_error(
                v, f"must be {' or '.join(map(repr, SOCKET_MODES))} (0660 with socket_group)"
            )
        return int(v, 8)

    return Kind(" or ".join(f'"{m}"' for m in SOCKET_MODES), parse)


def name(what: str, max_chars: int | None = None) -> Kind:
    """A name of letters, digits and _ . + - (at most max_chars: an interface's is
    IFNAME_MAX_CHARS, the kernel's own bound)."""

    def parse(v: Any) -> str:
        if not isinstance(v, str) or not NAME_RE.match(v):
            article = "an" if what[:1] in "aeiou" else "a"
            raise kind_error(v, f"is not {article} {what} name (letters, digits and _ . + -)")
        if max_chars is not None and len(v) > max_chars:
            raise kind_error(v, f"is longer than {max_chars} characters, the longest {what} name")
        return v

    return Kind(f"{what} name", parse)


def names(what: str, examples: str, max_chars: int | None = None) -> Kind:
    one = name(what, max_chars).parse

    def parse(v: Any) -> tuple[str, ...]:
        if not isinstance(v, list):
            raise kind_error(v, f"must be a list of {what} names ({examples})")
        try:
            out = tuple(one(x) for x in v)
        except KindError as e:
            raise KindError(f"must be a list of {what} names ({examples}): {e}") from None
        twice = next((n for i, n in enumerate(out) if n in out[:i]), None)
        if twice is not None:  # a device twice: its jumps, its counts twice
            raise KindError(f"{quote(twice)} is given twice")
        return out

    return Kind(f"list of {what} names", parse)


ETCD_DEFAULT_PORT = 2379


def parse_endpoint(text: str) -> tuple[str, str, int]:
    """An etcd endpoint: 'host:port', '[v6]:port' or 'http[s]://host:port' ->
    (protocol, host, port), the port 2379 when absent; ValueError otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"etcd endpoint must be a string, got {text!r}")
    url = urlsplit(text if "//" in text else f"http://{text}")
    try:
        port = url.port
    except ValueError:
        port = -1
    if url.scheme not in ("http", "https") or not url.hostname or port == -1 or url.path:
        raise ValueError(f"etcd endpoint must be [http[s]://]host:port, got {text!r}")
    return url.scheme, url.hostname, port or ETCD_DEFAULT_PORT


def _checked_list(
    describe: str,
    hint: str,
    check: Callable[[str], object],
    errors: type[Exception] | tuple,
    unique: bool = False,
) -> Kind:
    """A list of strings, each passing check() (its errors' text is the message)."""

    def parse(v: Any) -> tuple[str, ...]:
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise kind_error(v, f"must be a list of {hint}")
        for x in v:
            try:
                check(x)
            except errors as e:
                raise KindError(str(e)) from None
        if unique and len(set(v)) != len(v):
            raise kind_error(v, "names one twice")
        return tuple(v)

    return Kind(describe, parse)


def endpoints() -> Kind:
    """etcd endpoints: a list of [http[s]://]host:port (the port 2379 when absent)."""
    return _checked_list(
        "list of [http[s]://]host:port",
        'etcd endpoints ("10.77.0.1:2379")',
        parse_endpoint,
        ValueError,
        unique=True,
    )


def volume_names() -> Kind:
    return _checked_list(
        "list of iscsi://PORTAL/IQN/LUN or nvme://PORTAL/NQN/NSID",
        'volume names ("iscsi://10.0.0.5/iqn.x:a/0")',
        parse_volume,
        VolumeNameError,
    )


def ports() -> Kind:
    def parse(v: Any) -> tuple[int, ...]:
        if not isinstance(v, list):
            raise kind_error(v, "must be a list of TCP ports (1-65535)")
        return check_ports(v)

    return Kind(f"list of 1..{MAX_PORTS} TCP ports", parse)


def check_ports(values: Sequence[Any]) -> tuple[int, ...]:
    """The storage ports, or a KindError: 1..MAX_PORTS distinct TCP ports."""
    if not values:
        raise KindError("no storage ports given")
    out: list[int] = []
    for p in values:
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
            raise KindError(f"bad port {p!r}: expected 1-65535")
        if p in out:
            raise KindError(f"port {p} given twice")
        out.append(p)
    if len(out) > MAX_PORTS:
        raise KindError(f"{len(out)} storage ports: iptables multiport takes at most {MAX_PORTS}")
    return tuple(out)


def parse_ports_text(text: str) -> tuple[int, ...]:
    """'3260,4420' (the CLI's spelling) -> (3260, 4420); KindError otherwise."""
    vals: list[Any] = []
    for part in text.split(","):
        p = part.strip()
        if not p.isdigit():
            raise KindError(f"bad port {part!r} in {text!r}: expected 1-65535")
        vals.append(int(p))
    return check_ports(vals)


def ip_address() -> Kind:
    def parse(v: Any) -> str:
        if not isinstance(v, str):
            raise kind_error(v, 'is not an IP address: write it as a string, e.g. "127.0.0.1"')
        try:
            return str(ipaddress.ip_address(v))
        except (ValueError, TypeError):
            raise kind_error(v, "is not an IP address") from None

    return Kind("IP address", parse)


_BCRYPT_RE = re.compile(r"^\$2[aby]\$\d{2}\$[./A-Za-z0-9]{53}$")


def bcrypt_users() -> Kind:
    """A table of user = bcrypt hash (as htpasswd -B and the exporter-toolkit write it)."""

    def parse(v: Any) -> dict[str, str]:
        if not isinstance(v, dict) or not v:
            raise kind_error(v, 'must be a table of user = "bcrypt hash" ($2y$10$...)')
        for user, h in v.items():
            if not NAME_RE.match(user):
                raise kind_error(user, "is not a user name (letters, digits and _ . + -)")
            if not isinstance(h, str) or not _BCRYPT_RE.match(h):
                raise KindError(f"{user}: not a bcrypt hash: write e.g. htpasswd -nBC 10 {user}")
        return dict(v)

    return Kind("table of user = bcrypt hash", parse)


def tcp_port_or_0() -> Kind:
    def parse(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 65536:
            raise kind_error(v, "must be a TCP port (0 disables the exporter)")
        return v

    return Kind("TCP port, 0 = off", parse)


IOPS_SUFFIX = "iops"
# No array does a billion IOs per second; a target that large is a typo.
MAX_IOPS = 1e9


def throughput() -> Kind:
    """A throughput target: a byte rate ("200MB/s") or IOs per second ("5000iops");
    parsed to (value, "B/s" or "iops")."""
    rate = byte_rate()

    def parse(v: Any) -> tuple[float, str]:
        if isinstance(v, str) and v.strip().lower().endswith(IOPS_SUFFIX):
            num = v.strip()[: -len(IOPS_SUFFIX)].strip()
            try:
                iops = float(num)
            except ValueError:
                raise kind_error(v, 'is not a throughput: e.g. "200MB/s" or "5000iops"') from None
            if not iops > 0.0:
                raise kind_error(v, "must be more than 0 iops")
            if not iops < MAX_IOPS:
                raise kind_error(v, f"must be below {MAX_IOPS:g} iops")
            return iops, IOPS_SUFFIX
        try:
            bps = float(rate.parse(v))
        except KindError:
            raise kind_error(v, 'is not a throughput: e.g. "200MB/s" or "5000iops"') from None
        if bps <= 0.0:
            raise kind_error(v, "must be more than 0 B/s")
        return bps, "B/s"

    return Kind('byte rate ("200MB/s") or IOs per second ("5000iops")', parse)


# ------------------------------------------------------- values sent at run time
# A value quoted in an error is cut to this many characters.
MAX_QUOTE_CHARS = 60


def quote(v: Any) -> str:
    """A value as a client wrote it (true, null, 'text', 5), cut to MAX_QUOTE_CHARS."""
    r = json.dumps(v) if v is None or isinstance(v, bool) else repr(v)
    return r if len(r) <= MAX_QUOTE_CHARS else r[: MAX_QUOTE_CHARS - 3] + "..."


def positive_number(v: Any, what: str) -> float:
    """A finite number (not a bool) above 0, or KindError quoting v (what: "a number of
    seconds", ...): a control request's value before its Kind checks it."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise KindError(f"{quote(v)} is not {what}")
    try:
        x = float(v)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        raise KindError(f"{quote(v)} is not a finite number")
    if x <= 0:
        raise KindError(f"{quote(v)} must be above 0")
    return x
