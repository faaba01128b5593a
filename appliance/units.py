"""Values with units, parsed strictly: `15ms`, `500us`, `2s`, `20MB/s`, `1MiB/s`, `25gbit`.

A number without a unit, a negative number, an unknown unit or trailing
garbage is an error naming the value; the caller adds where it came from
(a config key and line, a CLI argument).
"""

from __future__ import annotations

import math
import re

_NUM = r"(?P<num>[0-9]+(?:\.[0-9]+)?|\.[0-9]+)"
_DURATION = re.compile(rf"^{_NUM}\s*(?P<unit>ns|us|µs|ms|s|m|h)$")
_RATE = re.compile(rf"^{_NUM}\s*(?P<unit>B|kB|KB|KiB|MB|MiB|GB|GiB)/s$")

DURATION_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
RATE_BYTES = {
    "B": 1,
    "kB": 1000,
    "KB": 1000,
    "KiB": 1024,
    "MB": 1000**2,
    "MiB": 1024**2,
    "GB": 1000**3,
    "GiB": 1024**3,
}


class UnitError(ValueError):
    """A value that is not a number with one of the accepted units."""


def parse_duration_s(text: str) -> float:
    """'15ms' -> 0.015. Units: ns us ms s m h; a unit is required."""
    m = _DURATION.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise UnitError(
            f"{text!r} is not a duration: give a number and a unit, e.g. 15ms, 500us, 2s"
        )
    v = float(m["num"]) * DURATION_S[m["unit"]]
    if not math.isfinite(v):
        raise UnitError(f"{text!r} is not a finite duration")
    return v


def parse_rate_bps(text: str) -> float:
    """'20MB/s' -> 20e6 bytes per second; '1MiB/s' -> 1048576."""
    m = _RATE.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise UnitError(
            f"{text!r} is not a byte rate: give a number and a unit, e.g. 20MB/s, 512KiB/s"
        )
    return float(m["num"]) * RATE_BYTES[m["unit"]]


def fmt_duration(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds * 1e6:g}us"


def fmt_ms(seconds: float | None, unit: str = "ms") -> str:
    """0.0125 -> '12.50ms' for tables; '-' for a value that is missing or not finite."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return f"{seconds * 1e3:.2f}{unit}"


def fmt_mb(bytes_per_s: float | None) -> str:
    """Bytes/s as MB/s with two decimals, '-' when missing."""
    return "-" if bytes_per_s is None else f"{bytes_per_s / 1e6:.2f}"
