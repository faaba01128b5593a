"""bridge/flow.py: PDU headers found in a TCP byte stream cut into segments any way."""

from __future__ import annotations

import random

import pytest

from santhrottle.bridge import flow as F
from santhrottle.bridge import pdu as P
from tests.unit import storage_pdus as B

ISN = 0xFFFFFF00  # the stream wraps the sequence space


def _iscsi_reads(n: int, size: int = 4096, **kw: object) -> tuple[bytes, list[int]]:
    """The target's side of n reads: Data-In with status for each, tags 100.."""
    out = b"".join(B.data_in(100 + i, bytes([i % 251]) * size, **kw) for i in range(n))  # type: ignore[arg-type]
    return out, [100 + i for i in range(n)]


def _segments(stream: bytes, sizes: list[int], start: int) -> list[tuple[int, bytes]]:
    out, pos, seq = [], 0, start
    for s in sizes:
        if pos >= len(stream):
            break
        out.append((seq % F.SEQ_MOD, stream[pos : pos + s]))
        seq += len(stream[pos : pos + s])
        pos += s
    if pos < len(stream):
        out.append((seq % F.SEQ_MOD, stream[pos:]))
    return out


def _walk(stream_obj: F.Stream, segs: list[tuple[int, bytes]]) -> list[P.Pdu]:
    got: list[P.Pdu] = []
    for seq, data in segs:
        got += [p for p, _ in stream_obj.feed(seq, data)]
    return got


def test_the_module_headers_worked_example():
    s = F.Stream(F.Iscsi(to_target=True))
    s.start(999)
    cmd, out = B.scsi_read(1), B.iscsi(B.DATA_OUT, 0x80, 2, data=b"w" * 4096)
    stream = cmd + out
    first = s.feed(1000, stream[:60])
    assert [p.tag for p, _ in first] == [1] and s.carry_seq == 1048 and len(s.carry) == 12
    assert [p.tag for p, _ in s.feed(1060, stream[60:160])] == [2]
    assert s.pdu_seq == 1048 + 48 + 4096


@pytest.mark.parametrize("seed", range(5))
def test_any_segmentation_finds_every_header(seed):
    rng = random.Random(seed)
    stream, tags = _iscsi_reads(40, size=rng.choice([512, 4096, 65536]))
    sizes = [rng.choice([1, 7, 47, 48, 49, 1448, 9000, 65536]) for _ in range(len(stream))]
    s = F.Stream(F.Iscsi(to_target=False))
    s.start(ISN)
    got = _walk(s, _segments(stream, sizes, ISN + 1))
    assert [p.tag for p in got] == tags
    assert s.counters.resyncs == 0 and s.counters.desyncs == 0


def test_retransmissions_and_overlaps_are_skipped():
    stream, tags = _iscsi_reads(6, size=1000)
    s = F.Stream(F.Iscsi(to_target=False))
    s.start(ISN)
    segs = _segments(stream, [1500] * 10, ISN + 1)
    replay = [segs[0], segs[1], segs[1], (segs[1][0], segs[1][1] + segs[2][1]), segs[3], segs[2]]
    replay += segs[4:]
    assert [p.tag for p in _walk(s, replay)] == tags
    assert s.counters.retransmitted_bytes == 2 * 1500 + 1500


def test_a_gap_resynchronises_at_the_next_header_that_chains():
    stream, tags = _iscsi_reads(30, size=2000)
    segs = _segments(stream, [1448] * 100, ISN + 1)
    s = F.Stream(F.Iscsi(to_target=False))
    s.start(ISN)
    got = _walk(s, segs[:5] + segs[9:])  # four segments lost
    assert s.counters.gaps == 1 and s.counters.resyncs == 1
    # what the lost bytes held is gone; from the resync on every header is found
    lost_end = 9 * 1448
    first_after = next(i for i in range(30) if i * (48 + 2000) >= lost_end)
    assert [p.tag for p in got][-(30 - first_after) :] == tags[first_after:]


def test_a_start_mid_session_finds_digests_by_chaining():
    stream, tags = _iscsi_reads(10, size=3000, header_digest=True, data_digest=True)
    seen = []
    s = F.Stream(F.Iscsi(to_target=False), on_digests=seen.append)
    got = _walk(s, _segments(stream[1000:], [1448] * 100, 5000))  # no SYN, mid-PDU
    assert [p.tag for p in got] == tags[1:]
    assert s.digests == (True, True) and seen == [(True, True)]


def test_nvme_stream_mixed_pdus_and_resync():
    cmds = b"".join(
        B.capsule_cmd(i, 0x01, nsid=1, nlb=7, data=b"w" * 4096) + B.h2c_data(i, b"v" * 8192)
        for i in range(20)
    )
    s = F.Stream(F.NvmeTcp(to_controller=True))
    s.start(ISN)
    got = _walk(s, _segments(cmds, [1448] * 1000, ISN + 1))
    assert [(p.kind, p.tag) for p in got] == [
        x for i in range(20) for x in ((P.CMD, i), (P.DATA_OUT, i))
    ]
    mid = F.Stream(F.NvmeTcp(to_controller=True))
    got = _walk(mid, _segments(cmds[5000:], [9000] * 100, 77))
    assert [p.tag for p in got][-10:] == [i for i in range(15, 20) for _ in (0, 1)]


def test_a_non_header_where_one_must_be_counts_and_resyncs():
    a, b = B.scsi_response(1), B.scsi_response(2)
    garbage = b"\xff" * 100
    s = F.Stream(F.Iscsi(to_target=False))
    s.start(ISN)
    got = _walk(s, [((ISN + 1) % F.SEQ_MOD, a + garbage + b)])
    assert [p.tag for p in got] == [1, 2]
    assert s.counters.desyncs == 1 and s.counters.resyncs == 1


def test_a_login_is_emitted_with_its_body_across_segments():
    login = B.login_request("iqn.2026-11.lab:array")
    s = F.Stream(F.Iscsi(to_target=True))
    s.start(ISN)
    out = []
    for seq, data in _segments(login + B.scsi_read(4), [60, 50, 1000], ISN + 1):
        out += s.feed(seq, data)
    (pdu0, body0), (pdu1, _) = out
    assert pdu0.kind == P.LOGIN and b"TargetName=iqn.2026-11.lab:array" in body0
    assert pdu1.tag == 4


def test_a_resync_takes_the_first_header_not_one_chaining_inside_data():
    # write data holding every byte value: somewhere in it two "headers" chain
    data = bytes(range(256)) * 16
    stream = b"".join(B.scsi_write(i, nbytes=4096, immediate=data) for i in range(50))
    s = F.Stream(F.Iscsi(to_target=True))
    got = _walk(s, _segments(stream, [1448] * 1000, 12345))  # no SYN: a resync first
    assert [p.tag for p in got] == list(range(50))
    assert s.counters.desyncs == 0
