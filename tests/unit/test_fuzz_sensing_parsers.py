"""The byte and text parsers of sensing never let an unexpected exception escape: the
sock_diag datagram decoder (conns.py: parse_datagram(), _dump_sockets(), and
parse_diag_dump() for captured records) and /proc/diskstats (diskstats.py: the parser,
interval(), write_bps_of()). Regression tests for each reproduced escape, Hypothesis
over each (derandomized), and seeded corpora of mutated captured input that count their
cases and escapes. An escape is any exception but the documented one (conns.py:
SockDiagError, an OSError; diskstats.py: ValueError from interval() and write_bps_of()
only); every documented error is one line, every latency and rate finite and
non-negative. The tree readers: test_fuzz_sensing.py. `pytest -s` prints the counts.
"""

import errno
import math
import random
import socket
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from santhrottle.appliance.sensing.conns import (
    SockDiagError,
    TcpConn,
    _dump_sockets,
    parse_datagram,
    parse_diag_dump,
)
from santhrottle.appliance.sensing.diskstats import (
    COUNTER_LIMIT,
    MIN_INTERVAL_S,
    DiskstatsReader,
    interval,
    parse_diskstats,
    read_latency_of,
    write_bps_of,
)

LAB = Path(__file__).parents[1] / "fixtures" / "lab"
FUZZ = settings(derandomize=True, deadline=None, database=None)


def one_line(e: BaseException) -> bool:
    return bool(str(e)) and "\n" not in str(e)


# -- sock_diag: the reproduced escapes --------------------------------------------------

HDR = struct.Struct("=IHHII")


def _msg(mtype: int, payload: bytes, length: int | None = None) -> bytes:
    return HDR.pack(HDR.size + len(payload) if length is None else length, mtype, 2, 1, 0) + payload


def _diag(sport: int = 3260, family: int = socket.AF_INET) -> bytes:
    body = struct.pack("=BBBB", family, 1, 0, 0) + struct.pack(">HH", sport, 40000)
    body += b"\x0a\0\0\x01".ljust(16, b"\0") + b"\x0a\0\0\x02".ljust(16, b"\0") + bytes(32)
    return _msg(18, body + bytes(124 - 16 - len(body)))


DONE = _msg(3, struct.pack("=i", 0))


@pytest.mark.parametrize(
    ("datagram", "says"),
    [
        (_msg(2, b"\xea\xff"), "NLMSG_ERROR of 18 bytes, truncated"),
        (HDR.pack(400, 18, 2, 1, 0) + bytes(84), "nlmsg_len 400 runs past the datagram"),
        (_diag() + HDR.pack(0, 18, 2, 1, 0), "nlmsg_len 0 is shorter than its header"),
        (HDR.pack(8, 3, 2, 1, 0), "nlmsg_len 8 is shorter than its header"),
        (_diag() + b"\0\0\0", "3 trailing byte(s), less than a header"),
        (b"", "empty datagram"),
        (_msg(2, struct.pack("=i", -(2**31)) + bytes(16)), "error 2147483648"),  # strerror
        (_msg(2, struct.pack("=i", 0) + bytes(16)), "an acknowledgement inside a dump"),
    ],
    ids=["short-error", "len-past-end", "zero-len", "len-under-header", "trailing", "empty",
         "errno-out-of-range", "ack"],
)  # fmt: skip
def test_malformed_datagrams_raise_one_line(datagram, says):
    out: dict = {}
    with pytest.raises(SockDiagError) as e:
        parse_datagram(datagram, 18, None, out)
    assert says in str(e.value) and one_line(e.value)
    assert isinstance(e.value, OSError)  # the callers' except OSError still holds


class FakeSock:
    """Replays datagrams; recv past the end times out, as the real socket does after
    RECV_TIMEOUT_S when the kernel never ends the dump."""

    def __init__(self, datagrams):
        self.datagrams = list(datagrams)

    def send(self, data):
        return len(data)

    def recv_into(self, buf):
        if not self.datagrams:
            raise TimeoutError("timed out")
        d = self.datagrams.pop(0)
        buf[: len(d)] = d
        return len(d)


def test_a_dump_that_never_ends_times_out_and_the_errno_is_kept():
    with pytest.raises(SockDiagError, match="no reply within"):
        _dump_sockets(FakeSock([_diag(), _diag()]), frozenset({3260}), bytearray(1 << 16))
    eperm = _msg(2, struct.pack("=i", -errno.EPERM) + bytes(16))
    with pytest.raises(SockDiagError) as e:
        _dump_sockets(FakeSock([eperm]), frozenset({3260}), bytearray(1 << 16))
    assert e.value.errno == errno.EPERM
    got = _dump_sockets(FakeSock([_diag() * 3, _diag(22) + DONE]), None, bytearray(1 << 16))
    assert [len(ids) for _, ids in got] == [4, 0]


def test_captured_records_that_are_not_connections_are_skipped():
    good = {"idiag_src": "10.0.0.11", "idiag_sport": 3260, "idiag_dst": "10.0.0.2",
            "idiag_dport": 1, "idiag_state": 1}  # fmt: skip
    bad = [
        "a string",
        None,
        {**good, "idiag_sport": float("inf")},  # int(): OverflowError
        {**good, "idiag_dport": 70000},
        {**good, "idiag_dst": "999.1.1.1"},
        {**good, "idiag_dst": "١.٢.٣.٤"},
        {**good, "idiag_src": "10.0.0.11\x00"},
    ]
    assert parse_diag_dump([*bad, good], [3260]) == [TcpConn("10.0.0.11", 3260, "10.0.0.2", 1)]


# -- sock_diag: Hypothesis and the seeded corpus ----------------------------------------


def _parse(datagram: bytes, wanted) -> str:
    """ "done", "more" or "error"; anything else raised is an escape (the test fails)."""
    out: dict[int, list[bytes]] = {}
    try:
        done = parse_datagram(datagram, 18, wanted, out)
    except SockDiagError as e:
        assert one_line(e)
        return "error"
    assert all(len(sid) == 36 for ids in out.values() for sid in ids)
    if wanted is not None:
        assert all(sid[:2] in wanted for ids in out.values() for sid in ids)
    return "done" if done else "more"


WANTED = st.sampled_from([None, (b"\x0c\xbc",), (b"\x0c\xbc", b"\x11\x44")])


@settings(FUZZ, max_examples=400)
@given(st.binary(max_size=400), WANTED)
def test_fuzz_sock_diag_random_bytes(data, wanted):
    _parse(data, wanted)


@st.composite
def _datagrams(draw):
    """Near-valid datagrams: messages of any type whose length field may lie."""
    parts = []
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        mtype = draw(st.sampled_from([18, 18, 18, 2, 3, 20, 0xFFFF]))
        payload = draw(st.one_of(st.just(_diag()[16:]), st.binary(max_size=140)))
        length = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=2**32 - 1)))
        parts.append(_msg(mtype, payload, length))
    data = b"".join(parts)
    cut = draw(st.integers(min_value=0, max_value=len(data)))
    return data if draw(st.booleans()) else data[:cut]


@settings(FUZZ, max_examples=200)
@given(_datagrams(), WANTED)
def test_fuzz_sock_diag_structured(data, wanted):
    _parse(data, wanted)


@settings(FUZZ, max_examples=100)
@given(st.lists(_datagrams(), max_size=5))
def test_fuzz_sock_diag_whole_dump_ends(datagrams):
    """A dump over any datagrams returns or raises SockDiagError: it never loops."""
    try:
        got = _dump_sockets(FakeSock(datagrams), frozenset({3260}), bytearray(1 << 16))
    except SockDiagError as e:
        assert one_line(e)
    else:
        assert [fam for fam, _ in got] == [socket.AF_INET, socket.AF_INET6]


SOCK_DIAG_CASES = 5000


@pytest.mark.fuzz
def test_corpus_sock_diag_datagrams():
    """5,000 datagrams: valid dumps (uniform, mixed, ending in DONE or an error) with
    bytes flipped, cut, repeated or lengths rewritten; 0 escapes."""
    escapes, outcomes = [], {"done": 0, "more": 0, "error": 0}
    for case in range(SOCK_DIAG_CASES):
        rng = random.Random(case)
        msgs = [_diag(rng.choice([3260, 4420, 22])) for _ in range(rng.randint(0, 8))]
        msgs.append(rng.choice([DONE, _msg(2, struct.pack("=i", -errno.EINVAL) + bytes(16))]))
        data = bytearray(b"".join(msgs))
        for _ in range(rng.randint(1, 4)):
            how = rng.randrange(4)
            if how == 0 and data:  # flip a byte
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif how == 1:  # cut
                del data[rng.randrange(len(data) + 1) :]
            elif how == 2 and len(data) >= 4:  # rewrite a length field
                at = rng.randrange(0, len(data) - 3, 4)
                data[at : at + 4] = rng.choice([0, 15, 16, 17, 124, 2**31, 2**32 - 1]).to_bytes(
                    4, "little"
                )
            else:  # repeat a slice
                a = rng.randrange(len(data) + 1)
                data += data[a : a + rng.randrange(200)]
        try:
            outcomes[_parse(bytes(data), rng.choice([None, (b"\x0c\xbc",)]))] += 1
        except AssertionError:
            raise
        except Exception as e:
            escapes.append(f"case {case}: {type(e).__name__}: {e}")
    print(f"\nfuzz sock_diag corpus: {SOCK_DIAG_CASES} datagrams, {len(escapes)} escapes, "
          f"outcomes {outcomes}")  # fmt: skip
    assert escapes == []
    assert min(outcomes.values()) > 20  # every outcome is exercised


# -- diskstats ---------------------------------------------------------------------------

L14 = "8 0 sda 10 0 80 40 5 0 40 20 0 30 60"


@pytest.mark.parametrize(
    "bad",
    ["9" * 400, str(COUNTER_LIMIT), "٣", "²", "+1", "1_0", "-1", "1.5", "0x10"],
)
def test_a_counter_that_is_not_ascii_digits_below_2_64_is_malformed(bad):
    line = L14.replace(" 80 ", f" {bad} ")
    for text in (line, "\n".join([line] * 3)):  # line by line, and a block by columns
        snap = parse_diskstats(text)
        assert snap.devices == {} and len(snap.malformed) == text.count("\n") + 1


@pytest.mark.parametrize("dt", [float("nan"), float("inf"), -1.0, 0.0, 1e-300, MIN_INTERVAL_S / 2])
def test_an_interval_that_is_not_finite_or_too_short_is_a_valueerror(dt):
    snap = parse_diskstats(L14)
    for call in (lambda: interval(snap, snap, dt), lambda: write_bps_of(snap, snap, dt, ["sda"])):
        with pytest.raises(ValueError) as e:
            call()
        assert one_line(e.value)


def test_the_largest_counters_give_finite_rates_at_the_shortest_interval():
    top = COUNTER_LIMIT - 1
    old = parse_diskstats("8 0 sda " + " ".join(["0"] * 11))
    new = parse_diskstats("8 0 sda " + " ".join([str(top)] * 11))
    d = interval(old, new, MIN_INTERVAL_S).devices["sda"]
    for v in (d.read_latency_s, d.write_latency_s, d.write_bps, d.read_bps, d.utilization):
        assert math.isfinite(v) and v >= 0
    assert math.isfinite(read_latency_of([d])[1])


TOKENS = st.one_of(
    st.integers(min_value=0, max_value=2**66).map(str),
    st.integers(min_value=-5, max_value=5).map(str),
    st.sampled_from(["٣", "²", "+1", "1_0", "", "nan", "1e3", "sda", "dm-0", "\x00"]),
)


@st.composite
def _diskstats_text(draw):
    lines = []
    for i in range(draw(st.integers(min_value=0, max_value=8))):
        n = draw(st.sampled_from([14, 14, 18, 20, 3, 13, 15, 21]))
        fields = [str(draw(st.integers(min_value=0, max_value=2**64 - 1))) for _ in range(n)]
        if n > 2:
            fields[2] = f"d{i % 4}"
        for _ in range(draw(st.integers(min_value=0, max_value=2))):
            if fields:
                fields[draw(st.integers(min_value=0, max_value=n - 1))] = draw(TOKENS)
        lines.append(" ".join(fields))
    return "\n".join(lines)


def _check_interval(old, new, dt) -> None:
    try:
        res = interval(old, new, dt)
        bps = write_bps_of(old, new, dt, list(new.devices))
    except ValueError as e:
        assert one_line(e) and not (math.isfinite(dt) and dt >= MIN_INTERVAL_S)
        return
    for d in res.devices.values():
        for v in (d.read_latency_s, d.write_latency_s):
            assert v is None or (math.isfinite(v) and v >= 0)
        for v in (d.write_bps, d.read_bps, d.utilization):
            assert math.isfinite(v) and v >= 0
    assert all(math.isfinite(v) and v >= 0 for v in bps.values())
    reads, lat = read_latency_of(res.devices.values())
    assert reads >= 0 and (lat is None or (math.isfinite(lat) and lat >= 0))


INTERVALS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([MIN_INTERVAL_S, 0.1, 1.0]),
)


@settings(FUZZ, max_examples=120)
@given(_diskstats_text(), _diskstats_text(), INTERVALS)
def test_fuzz_diskstats_parse_and_interval(a, b, dt):
    old, new = parse_diskstats(a), parse_diskstats(b)
    for snap in (old, new):
        assert all(0 <= v < COUNTER_LIMIT for d in snap.devices.values() for v in (*d[:2], *d[3:]))
    _check_interval(old, new, dt)


@settings(FUZZ, max_examples=150)
@given(_diskstats_text(), st.sets(st.sampled_from(["d0", "d1", "d2", "d3", "d"]), max_size=5))
def test_fuzz_a_snapshot_of_some_devices_has_theirs_as_the_whole_file_does(
    tmp_path_factory, text, names
):
    """DiskstatsReader.snapshot(names): every named device the whole file's snapshot has,
    with the same counters; and, where it picks lines, no other device."""
    path = tmp_path_factory.mktemp("proc")
    (path / "diskstats").write_text(text)
    reader = DiskstatsReader(path)
    whole, some = reader.snapshot(), reader.snapshot(names)
    assert {n: some.devices[n] for n in names if n in some.devices} == {
        n: whole.devices[n] for n in names if n in whole.devices
    }
    if 2 * len(names) < text.count("\n"):
        assert set(some.devices) <= names
    reader.close()


DISKSTATS_CASES = 500


@pytest.mark.fuzz
def test_corpus_mutated_diskstats():
    """500 mutated copies of the captured pair: lines cut, fields replaced, counters sent
    backwards or to 2**64 - 1; 0 escapes, every rate finite and non-negative."""
    text0 = (LAB / "proc" / "diskstats.0").read_text().splitlines()
    text1 = (LAB / "proc" / "diskstats.1").read_text().splitlines()
    junk = ["٣", "-7", "+3", "x", "1_000", str(COUNTER_LIMIT), str(COUNTER_LIMIT - 1), "0"]
    escapes, malformed = [], 0
    for case in range(DISKSTATS_CASES):
        rng = random.Random(case)
        lines = [list(text0), list(text1)]
        for _ in range(rng.randint(1, 6)):
            side = lines[rng.randrange(2)]
            i = rng.randrange(len(side))
            fields = side[i].split()
            if not fields:
                continue
            how = rng.randrange(3)
            if how == 0:
                fields = fields[: rng.randrange(len(fields))]
            elif how == 1:
                fields[rng.randrange(len(fields))] = rng.choice(junk)
            else:  # this counter backwards in the second snapshot
                j = rng.randrange(3, 14)
                if j < len(fields) and fields[j].isdigit():
                    fields[j] = str(max(0, int(fields[j]) - rng.randrange(1, 10**6)))
            side[i] = " ".join(fields)
        try:
            old, new = (parse_diskstats("\n".join(x)) for x in lines)
            malformed += len(old.malformed) + len(new.malformed)
            _check_interval(old, new, rng.choice([0.1, 1.0, MIN_INTERVAL_S]))
        except AssertionError:
            raise
        except Exception as e:
            escapes.append(f"case {case}: {type(e).__name__}: {e}")
    print(f"\nfuzz diskstats corpus: {DISKSTATS_CASES} pairs, {len(escapes)} escapes, "
          f"{malformed} malformed lines")  # fmt: skip
    assert escapes == [] and malformed > DISKSTATS_CASES // 2
