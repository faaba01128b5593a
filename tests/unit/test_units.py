"""The one parser of values with units (appliance/units.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from santhrottle.appliance import units as u


@pytest.mark.parametrize(
    ("text", "us"),
    [
        ("0", 0),
        ("500us", 500),
        ("500µs", 500),
        ("5ms", 5000),
        ("5 ms", 5000),
        ("1.5ms", 1500),
        ("0.5ms", 500),
        (".5ms", 500),
        ("2s", 2_000_000),
        ("0.0005s", 500),  # exact: never 499.99999 us
        ("1m", 60_000_000),
        ("1000ns", 1),
    ],
)
def test_durations_in_whole_microseconds(text, us):
    assert u.parse_duration_us(text) == us
    assert u.parse_duration_s(text) == pytest.approx(us / 1e6)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5", "is not a duration"),
        ("-5ms", "is not a duration"),
        ("5MS", "is not a duration"),
        ("ms", "is not a duration"),
        ("", "is not a duration"),
        ("1e3us", "is not a duration"),
        (5, "is not a duration"),
        (None, "is not a duration"),
        ("1.2345ms", "finer than 1us"),
        ("1500ns", "finer than 1us"),
    ],
)
def test_durations_rejected_with_one_line(text, message):
    with pytest.raises(u.UnitError, match=message) as e:
        u.parse_duration_us(text)
    assert "\n" not in str(e.value)


def test_nanoseconds_are_the_finest():
    assert u.parse_duration_ns("1.5us") == 1500
    with pytest.raises(u.UnitError, match="finer than 1ns"):
        u.parse_duration_ns("0.5ns")


@pytest.mark.parametrize(
    ("us", "text"), [(0, "0"), (500, "500us"), (5000, "5ms"), (1500, "1.5ms"), (2_000_000, "2s")]
)
def test_fmt_us_round_trips(us, text):
    assert u.fmt_us(us) == text
    assert u.parse_duration_us(text) == us


def test_rates():
    assert u.parse_byte_rate("20MB/s") == 20e6
    assert u.parse_byte_rate("1MiB/s") == 1048576
    assert u.parse_byte_rate("0") == 0.0
    for bad in ("20MB", "fast", "20 Mb/s", 20):
        with pytest.raises(u.UnitError, match="is not a byte rate"):
            u.parse_byte_rate(bad)
    assert u.parse_bit_rate("10gbit") == 10**10
    assert u.parse_bit_rate("25Gbit") == 25 * 10**9
    assert u.parse_bit_rate("1.5gbit") == 1_500_000_000
    for bad in ("10g", "fast", 10):
        with pytest.raises(u.UnitError, match="is not a link speed"):
            u.parse_bit_rate(bad)
    with pytest.raises(u.UnitError, match="below 1mbit"):
        u.parse_bit_rate("100kbit")


@pytest.mark.parametrize("bps", [1048576.0, 262144.0, 20e6, 1000.0, 1.5])
def test_fmt_byte_rate_round_trips(bps):
    assert u.parse_byte_rate(u.fmt_byte_rate(bps)) == bps


@pytest.mark.parametrize("bits", [10**10, 25 * 10**9, 1_500_000_000, 10**6, 1_234_567])
def test_fmt_bit_rate_round_trips(bits):
    assert u.parse_bit_rate(u.fmt_bit_rate(bits)) == bits


# Issue 17: values that overflow, are not finite or are not ASCII digits are one
# UnitError line, never inf, a bignum traceback or a Unicode digit read as a number.
@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (u.parse_byte_rate, "9" * 400 + "MB/s", "more than 30 digits"),  # was inf, accepted
        (u.parse_byte_rate, "99999999999999999999GiB/s", "above 18446744073709551615 B/s"),
        (u.parse_bit_rate, "9" * 400 + "tbit", "more than 30 digits"),
        (u.parse_bit_rate, "11tbit", "above 10tbit"),
        (u.parse_duration_us, "1" * 5000 + "ms", "more than 30 digits"),  # int() traceback
        (u.parse_duration_ns, "9999999999999h", "longer than 9223372036s"),
        (u.parse_duration_us, "١٢ms", "is not a duration"),  # Arabic-Indic digits
        (u.parse_duration_us, "１２ms", "is not a duration"),  # full-width digits
        (u.parse_byte_rate, "１２MB/s", "is not a byte rate"),
        (u.parse_bit_rate, "١٠gbit", "is not a link speed"),
        (u.parse_duration_us, "nanms", "is not a duration"),
        (u.parse_duration_us, "infms", "is not a duration"),
        (u.parse_byte_rate, "infMB/s", "is not a byte rate"),
        (u.parse_bit_rate, "1e308gbit", "is not a link speed"),
    ],
)
def test_overflow_nonfinite_and_unicode_digits_refused(parse, text, message):
    with pytest.raises(u.UnitError, match=message) as e:
        parse(text)
    assert "\n" not in str(e.value) and len(str(e.value)) < 200  # the value is cut


def test_leading_zeros_are_not_digits_that_count():
    assert u.parse_duration_us("0" * 100 + "5ms") == 5000
    assert u.parse_byte_rate("0" * 100 + "1MB/s") == 1e6


def test_the_largest_values_still_parse():
    assert u.parse_duration_ns(f"{u.MAX_DURATION_NS}ns") == u.MAX_DURATION_NS
    assert u.parse_bit_rate(f"{u.MAX_BIT_RATE_BITS_S}bit") == u.MAX_BIT_RATE_BITS_S
    assert u.parse_byte_rate(f"{u.MAX_BYTE_RATE_BYTES_S}B/s") == float(u.MAX_BYTE_RATE_BYTES_S)


_UNIT_TEXT = st.text(
    alphabet=st.sampled_from([*"0123456789.  -+eEnN", *"usmhbitkKMGTBi/µ", "١", "１", "\x00"]),
    max_size=40,
) | st.builds(lambda d, unit: d + unit, st.text("0123456789", min_size=25, max_size=60),
              st.sampled_from(["ns", "ms", "s", "h", "MB/s", "GiB/s", "gbit", "tbit"]))  # fmt: skip


@settings(derandomize=True, max_examples=400, deadline=None)
@given(_UNIT_TEXT)
def test_fuzz_every_parser_returns_a_bounded_value_or_one_unit_error(text):
    import math

    for parse, hi in (
        (u.parse_duration_ns, u.MAX_DURATION_NS),
        (u.parse_byte_rate, u.MAX_BYTE_RATE_BYTES_S),
        (u.parse_bit_rate, u.MAX_BIT_RATE_BITS_S),
    ):
        try:
            v = parse(text)
        except u.UnitError as e:
            assert "\n" not in str(e)
            continue
        assert math.isfinite(v) and 0 <= v <= hi, (text, v)
