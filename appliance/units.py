"""Values with units, parsed strictly: the one parser of the config, the CLI and the data path.

    durations   15ms  500us  2.5s  1m  0      -> parse_duration_ns / _s / _us
    byte rates  20MB/s  1MiB/s  512KiB/s      -> parse_byte_rate
    bit rates   25gbit  10Gbit  100mbit       -> parse_bit_rate (tc's spelling)

Grammar: a non-negative decimal number of ASCII digits (no exponent, at most
MAX_NUMBER_DIGITS digits), optional spaces, a unit.  A bare 0 is the one value
that needs no unit.  Every value is finite and bounded (MAX_DURATION_NS,
MAX_BYTE_RATE_BYTES_S, MAX_BIT_RATE_BITS_S): a 400-digit rate is an error,
never inf.  Durations are parsed
in exact decimal arithmetic into whole nanoseconds ("0.0005s" is exactly
500 us, never 499.99999), so a caller that needs whole microseconds (the
data path's delay step) can ask for them and get an error otherwise.
A value that does not fit raises UnitError naming the value; the caller
adds where it came from (a config key and its line, a CLI option).

Worked example
    parse_duration_s("15ms") -> 0.015; parse_duration_us("1.5ms") -> 1500;
    parse_duration_us("1.2345ms") -> UnitError "... finer than 1us";
    parse_byte_rate("1MiB/s") -> 1048576.0; parse_bit_rate("25gbit") ->
    25_000_000_000; fmt_us(1500) -> "1.5ms"; parse_byte_rate("9" * 400 + "MB/s")
    -> UnitError "... more than 30 digits".
"""

from __future__ import annotations

import math
import re

# [0-9], not \d: Unicode digits ('١٢', '１２') are no numbers here.
_NUM = r"(?P<num>[0-9]+(?:\.[0-9]+)?|\.[0-9]+)"
_DURATION = re.compile(rf"^{_NUM}\s*(?P<unit>ns|us|µs|ms|s|m|h)$")
_BYTE_RATE = re.compile(rf"^{_NUM}\s*(?P<unit>B|kB|KB|KiB|MB|MiB|GB|GiB)/s$")
_BIT_RATE = re.compile(rf"^{_NUM}\s*(?P<unit>bit|kbit|mbit|gbit|tbit)$", re.IGNORECASE)

DURATION_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
BYTE_RATE_BYTES = {
    "B": 1,
    "kB": 1000,
    "KB": 1000,
    "KiB": 1024,
    "MB": 1000**2,
    "MiB": 1024**2,
    "GB": 1000**3,
    "GiB": 1024**3,
}
BIT_RATE_BITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
# The slowest link the data path sizes HTB and netem for.
MIN_BIT_RATE_BITS_S = 1_000_000
# The fastest link: 10tbit, the configuration's bound too (a link speed of
# 999...tbit would size HTB and netem beyond what the kernel takes).
MAX_BIT_RATE_BITS_S = 10 * 10**12
MAX_BYTE_RATE_BYTES_S = 2**64 - 1
# The longest duration: a signed 64-bit count of nanoseconds (ktime_t), ~292 years.
MAX_DURATION_NS = 2**63 - 1
# Digits of a number, integer and fraction together: more than any bounded value
# needs, and never a bignum conversion (int() refuses 4,300 digits with a traceback).
MAX_NUMBER_DIGITS = 30


class UnitError(ValueError):
    """A value that is not a number with one of the accepted units."""


def _match(pattern: re.Pattern[str], text: object) -> re.Match[str] | None:
    """The pattern on the stripped text; None for anything that is not such a string."""
    if not isinstance(text, str):
        return None
    return pattern.match(text.strip())


def _exact(text: object, num: str, scale: int) -> tuple[int, int]:
    """'1.25', 1000 -> (1250, 1000): the value x scale as a fraction value/den, exactly;
    UnitError for more than MAX_NUMBER_DIGITS digits."""
    whole, _, frac = num.partition(".")
    digits = (whole + frac).lstrip("0")
    if len(digits) > MAX_NUMBER_DIGITS:
        raise UnitError(f"{_cut(text)}: more than {MAX_NUMBER_DIGITS} digits")
    return int((whole or "0") + frac) * scale, 10 ** len(frac)


def _cut(text: object, limit: int = 40) -> str:
    """repr() of a value for an error line, cut to `limit` characters."""
    r = repr(text)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(str(text))} chars)"


def parse_duration_ns(text: object) -> int:
    """'15ms' -> 15_000_000; '0' -> 0. Units ns us µs ms s m h; a unit is required
    except for a bare 0; anything finer than 1 ns is an error."""
    if isinstance(text, str) and text.strip() == "0":
        return 0
    m = _match(_DURATION, text)
    if m is None:
        raise UnitError(
            f"{_cut(text)} is not a duration: give a number and a unit, e.g. 15ms, 500us, 2s"
        )
    value, den = _exact(text, m["num"], DURATION_NS[m["unit"]])
    if value % den:
        raise UnitError(f"{_cut(text)}: finer than 1ns")
    if value // den > MAX_DURATION_NS:
        raise UnitError(f"{_cut(text)}: longer than {MAX_DURATION_NS // 10**9}s")
    return value // den


def parse_duration_s(text: object) -> float:
    """'15ms' -> 0.015 (seconds)."""
    return parse_duration_ns(text) / 1e9


def parse_duration_us(text: object) -> int:
    """'1.5ms' -> 1500: whole microseconds, or an error (the data path's resolution)."""
    ns = parse_duration_ns(text)
    if ns % 1000:
        raise UnitError(f"{_cut(text)}: finer than 1us")
    return ns // 1000


def parse_byte_rate(text: object) -> float:
    """'20MB/s' -> 20e6 bytes per second; '1MiB/s' -> 1048576; finite, at most
    MAX_BYTE_RATE_BYTES_S."""
    if isinstance(text, str) and text.strip() == "0":
        return 0.0
    m = _match(_BYTE_RATE, text)
    if m is None:
        raise UnitError(
            f"{_cut(text)} is not a byte rate: give a number and a unit, e.g. 20MB/s, 512KiB/s"
        )
    value, den = _exact(text, m["num"], BYTE_RATE_BYTES[m["unit"]])
    if value > MAX_BYTE_RATE_BYTES_S * den:
        raise UnitError(f"{_cut(text)}: above {MAX_BYTE_RATE_BYTES_S} B/s")
    return value / den


def parse_bit_rate(text: object) -> int:
    """'10gbit' -> 10_000_000_000 bits per second (tc's units), at least 1mbit, at
    most MAX_BIT_RATE_BITS_S."""
    m = _match(_BIT_RATE, text)
    if m is None:
        raise UnitError(f"{_cut(text)} is not a link speed: write e.g. 10gbit, 25gbit, 100gbit")
    value, den = _exact(text, m["num"], BIT_RATE_BITS[m["unit"].lower()])
    bits = value // den
    if bits < MIN_BIT_RATE_BITS_S:
        raise UnitError(f"{_cut(text)}: below 1mbit")
    if bits > MAX_BIT_RATE_BITS_S:
        raise UnitError(f"{_cut(text)}: above {fmt_bit_rate(MAX_BIT_RATE_BITS_S)}")
    return bits


def fmt_duration(seconds: float) -> str:
    """0.015 -> '15ms', 2 -> '2s', 0.0005 -> '500us'."""
    if seconds >= 1.0:
        return f"{seconds:g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds * 1e6:g}us"


def fmt_us(us: int) -> str:
    """500 -> '500us', 5000 -> '5ms', 1500 -> '1.5ms', 2_000_000 -> '2s', 0 -> '0'
    (exact: parse_duration_us(fmt_us(x)) == x)."""
    if us == 0:
        return "0"
    if us % 1_000_000 == 0:
        return f"{us // 1_000_000}s"
    if us >= 1000 and us % 100 == 0:
        return f"{us / 1000:g}ms"
    return f"{us}us"


def fmt_bit_rate(bits_s: int) -> str:
    """25_000_000_000 -> '25gbit' (tc's spelling, the largest whole unit)."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        scale = BIT_RATE_BITS[unit]
        if bits_s % scale == 0:
            return f"{bits_s // scale}{unit}"
    return f"{bits_s}bit"


def fmt_byte_rate(bytes_s: float) -> str:
    """1048576 -> '1MiB/s', 262144 -> '256KiB/s', 2e7 -> '20MB/s' (a whole number
    of the largest unit that divides it; exact: parse_byte_rate gives it back)."""
    for unit in ("GiB", "MiB", "KiB", "GB", "MB", "kB"):
        scale = BYTE_RATE_BYTES[unit]
        if bytes_s >= scale and bytes_s % scale == 0:
            return f"{int(bytes_s // scale)}{unit}/s"
    return f"{bytes_s:g}B/s"


def fmt_ms(seconds: float | None, unit: str = "ms") -> str:
    """0.0125 -> '12.50ms' for tables; '-' for a value that is missing or not finite."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return f"{seconds * 1e3:.2f}{unit}"


def fmt_mb(bytes_per_s: float | None) -> str:
    """Bytes/s as MB/s with two decimals, '-' when missing."""
    return "-" if bytes_per_s is None else f"{bytes_per_s / 1e6:.2f}"
