"""bridge/flow.py: PDU headers found in a TCP byte stream cut into segments any way, a
walk that proves what it takes, and one that notices when it is off."""

from __future__ import annotations

import os
import random

import pytest

from santhrottle.bridge import flow as F
from santhrottle.bridge import pdu as P
from santhrottle.bridge import protocols as W
from tests.unit import storage_pdus as B

ISN = 0xFFFFFF00  # the stream wraps the sequence space


class Walk(F.Hooks):
    """A stream with a recording sink: the PDUs of the walk in sync (pdus), and what the
    provisional ones became."""

    def __init__(self, proto: W.Protocol, refuse: set[int] | None = None) -> None:
        self.pdus: list[P.Pdu] = []
        self.bodies: list[bytes] = []
        self.held: P.Pdu | None = None
        self.confirmed: list[P.Pdu] = []
        self.retracted: list[P.Pdu] = []
        self.reasons: list[str] = []
        self.refuse = refuse or set()  # tags the sink says show the walk is off
        self.s = F.Stream(proto, self._sink, self)

    def _sink(self, pdu: P.Pdu, body: bytes) -> bool:
        if pdu.tag in self.refuse:
            self.refuse.discard(pdu.tag)
            return False
        self.pdus.append(pdu)
        self.bodies.append(body)
        return True

    def provisional(self, pdu: P.Pdu, body: bytes) -> None:
        self.held = pdu

    def confirm(self) -> None:
        assert self.held is not None
        self.confirmed.append(self.held)
        self.pdus.append(self.held)
        self.held = None

    def retract(self) -> None:
        assert self.held is not None
        self.retracted.append(self.held)
        self.held = None

    def unmeasurable(self, reason: str) -> None:
        self.reasons.append(reason)

    def feed(self, segs: list[tuple[int, bytes]], t: float = 0.0) -> list[P.Pdu]:
        for seq, data in segs:
            self.s.feed(seq, data, t)
        return self.pdus

    @property
    def tags(self) -> list[int]:
        return [p.tag for p in self.pdus]


def _iscsi_reads(n: int, size: int = 4096, **kw: object) -> tuple[bytes, list[int]]:
    """The target's side of n reads: Data-In with status for each, tags 100.."""
    out = b"".join(B.data_in(100 + i, bytes([i % 251]) * size, **kw) for i in range(n))  # type: ignore[arg-type]
    return out, [100 + i for i in range(n)]


def _segments(stream: bytes, sizes: list[int], start: int) -> list[tuple[int, bytes]]:
    out, pos, seq = [], 0, start
    for s in sizes:
        if pos >= len(stream):
            break
        out.append((seq % W.SEQ_MOD, stream[pos : pos + s]))
        seq += len(stream[pos : pos + s])
        pos += s
    if pos < len(stream):
        out.append((seq % W.SEQ_MOD, stream[pos:]))
    return out


def test_the_module_headers_worked_example():
    w = Walk(W.Iscsi(to_target=True))
    w.s.start(999)
    cmd, out = B.scsi_read(1), B.iscsi(B.DATA_OUT, 0x80, 2, data=b"w" * 4096)
    stream = cmd + out
    w.s.feed(1000, stream[:60], 0.0)
    assert w.tags == [1] and w.s.carry_seq == 1048 and len(w.s.carry) == 12
    w.s.feed(1060, stream[60:160], 0.0)
    assert w.tags == [1], "the Data-Out's last byte is still to come"
    assert w.s.pdu_seq == 1048 + 48 + 4096
    w.s.feed(1160, stream[160:], 0.5)
    assert w.tags == [1, 2]


def test_a_pdu_is_handed_on_with_the_time_of_its_last_byte():
    """As Wireshark times a PDU that spans segments: where it is whole."""
    times: list[float] = []
    s = F.Stream(W.Iscsi(to_target=False), lambda p, b: times.append(now) or True)
    s.start(ISN)
    stream = B.data_in(1, b"r" * 4000) + B.scsi_response(2)
    for now, (seq, data) in enumerate(_segments(stream, [1448, 1448, 2000], ISN + 1)):
        s.feed(seq, data, float(now))
    assert times == [2.0, 2.0]


@pytest.mark.parametrize("seed", range(5))
def test_any_segmentation_finds_every_header(seed):
    rng = random.Random(seed)
    stream, tags = _iscsi_reads(40, size=rng.choice([512, 4096, 65536]))
    sizes = [rng.choice([1, 7, 47, 48, 49, 1448, 9000, 65536]) for _ in range(len(stream))]
    w = Walk(W.Iscsi(to_target=False))
    w.s.start(ISN)
    w.feed(_segments(stream, sizes, ISN + 1))
    assert w.tags == tags
    assert w.s.counters.resyncs == 0 and w.s.counters.desyncs == 0


def test_retransmissions_and_overlaps_are_skipped():
    stream, tags = _iscsi_reads(6, size=1000)
    w = Walk(W.Iscsi(to_target=False))
    w.s.start(ISN)
    segs = _segments(stream, [1500] * 10, ISN + 1)
    replay = [segs[0], segs[1], segs[1], (segs[1][0], segs[1][1] + segs[2][1]), segs[3], segs[2]]
    replay += segs[4:]
    assert w.feed(replay) and w.tags == tags
    assert w.s.counters.retransmitted_bytes == 2 * 1500 + 1500


def test_a_gap_inside_a_pdus_data_keeps_the_walk():
    stream, tags = _iscsi_reads(3, size=8000)
    segs = _segments(stream, [1448] * 100, ISN + 1)
    w = Walk(W.Iscsi(to_target=False))
    w.s.start(ISN)
    w.feed(segs[:2] + segs[4:])  # two segments of the first read's data lost
    assert w.tags == tags
    assert w.s.counters.gaps == 1 and w.s.counters.resyncs == 0 and w.s.state == F.SYNCED


def test_a_gap_over_a_header_resynchronises_at_the_next_header_that_chains():
    stream, tags = _iscsi_reads(30, size=2000)
    segs = _segments(stream, [1448] * 100, ISN + 1)
    w = Walk(W.Iscsi(to_target=False))
    w.s.start(ISN)
    w.feed(segs[:5] + segs[9:])  # four segments lost, headers among them
    assert w.s.counters.gaps == 1 and w.s.counters.resyncs == 1
    # what the lost bytes held is gone; from the resync on every header is found
    lost_end = 9 * 1448
    first_after = next(i for i in range(30) if i * (48 + 2000) >= lost_end)
    assert w.tags[-(30 - first_after) :] == tags[first_after:]
    assert w.s.counters.desyncs == 0, "a gap is not a desync"


def test_a_start_mid_session_finds_digests():
    stream, tags = _iscsi_reads(10, size=3000, header_digest=True, data_digest=True)
    w = Walk(W.Iscsi(to_target=False))
    w.feed(_segments(stream[1000:], [1448] * 100, 5000))  # no SYN, mid-PDU
    assert w.tags == tags[1:]
    assert w.s.digests == (True, True) and w.s.dd_known


def test_a_header_digest_found_by_its_crc_and_the_data_digest_by_the_next_header():
    """Each PDU alone in its segment, mid-session: the first is provisional (its
    successor beyond), its header digest recognised at once, the data digest taken
    from where the next header is."""
    stream = b"".join(B.data_in(100 + i, b"d" * 512, header_digest=True, data_digest=True)
                      for i in range(6))  # fmt: skip
    pdu_len = 48 + 4 + 512 + 4
    w = Walk(W.Iscsi(to_target=False))
    w.feed(_segments(stream, [pdu_len] * 6, 7000))
    assert [p.tag for p in w.confirmed] == [100]
    assert w.tags == [100 + i for i in range(6)]
    assert w.s.digests == (True, True) and w.s.counters.retracted == 0


def test_a_login_says_nothing_of_the_digests_it_negotiates():
    """The in-kernel walk learns the digests after the login's last answer (userspace
    reads its text): until then it finds them itself. The login's own data segment is
    never digested, so it is no evidence of the data digest: the next header is where the
    login's length says, and the first PDU with data after it proves the setting."""
    text = b"HeaderDigest=CRC32C\0DataDigest=CRC32C\0" + b"x" * 301
    login = B.iscsi(B.LOGIN_RESP, 0x87, 0, data=text)  # T, CSG 1, NSG 3: full feature
    assert P.decode_iscsi(login, 0, False, True, True).length == len(login)
    reads, tags = _iscsi_reads(6, size=2000, header_digest=True, data_digest=True)
    w = Walk(W.Iscsi(to_target=False))
    w.s.start(999)
    w.feed([(1000, login)])
    w.s.hd_known = w.s.dd_known = False  # the kernel's state until userspace has read it
    w.feed(_segments(reads, [1448] * 20, 1000 + len(login)))
    assert w.tags == [0, *tags]
    assert w.s.digests == (True, True) and w.s.dd_known
    assert w.s.counters.desyncs == w.s.counters.retracted == 0


def test_nvme_stream_mixed_pdus_and_resync():
    cmds = b"".join(
        B.capsule_cmd(i, 0x01, nsid=1, nlb=7, data=b"w" * 4096) + B.h2c_data(i, b"v" * 8192)
        for i in range(20)
    )
    w = Walk(W.NvmeTcp(to_controller=True))
    w.s.start(ISN)
    w.feed(_segments(cmds, [1448] * 1000, ISN + 1))
    assert [(p.kind, p.tag) for p in w.pdus] == [
        x for i in range(20) for x in ((P.CMD, i), (P.DATA_OUT, i))
    ]
    mid = Walk(W.NvmeTcp(to_controller=True))
    mid.feed(_segments(cmds[5000:], [9000] * 100, 77))
    assert mid.tags[-10:] == [i for i in range(15, 20) for _ in (0, 1)]


def test_a_non_header_where_one_must_be_counts_and_resyncs():
    a, b = B.scsi_response(1), B.scsi_response(2)
    garbage = b"\xff" * 100
    w = Walk(W.Iscsi(to_target=False))
    w.s.start(ISN)
    w.feed([((ISN + 1) % W.SEQ_MOD, a + garbage + b + B.scsi_response(3))])
    assert w.tags == [1, 2, 3]
    assert w.s.counters.desyncs == 1 and w.s.counters.resyncs == 1


def test_a_login_is_emitted_with_its_body_across_segments():
    login = B.login_request("iqn.2026-11.lab:array")
    w = Walk(W.Iscsi(to_target=True))
    w.s.start(ISN)
    w.feed(_segments(login + B.scsi_read(4), [60, 50, 1000], ISN + 1))
    assert w.pdus[0].kind == P.LOGIN and b"TargetName=iqn.2026-11.lab:array" in w.bodies[0]
    assert w.tags[1] == 4


def test_a_resync_takes_the_first_header_not_one_chaining_inside_data():
    # write data holding every byte value: somewhere in it two "headers" chain
    data = bytes(range(256)) * 16
    stream = b"".join(B.scsi_write(i, nbytes=4096, immediate=data) for i in range(50))
    w = Walk(W.Iscsi(to_target=True))
    w.feed(_segments(stream, [1448] * 1000, 12345))  # no SYN: a resync first
    assert w.tags == list(range(50))
    assert w.s.counters.desyncs == 0


def test_a_resync_takes_a_login_mid_stream():
    """A capture that holds the login but not the SYN: the login is taken, its body
    with it (the names are in it)."""
    login = B.login_request("iqn.2026-11.lab:array")
    stream = B.scsi_read(9)[20:] + login + B.scsi_read(4) + B.scsi_read(5)
    w = Walk(W.Iscsi(to_target=True))
    w.feed([(500, stream)])
    assert [p.kind for p in w.pdus] == [P.LOGIN, P.CMD, P.CMD]
    assert b"TargetName=iqn.2026-11.lab:array" in w.bodies[0]


def test_a_false_header_with_a_long_length_is_retracted_not_walked():
    """The issue's case: bytes inside a login header decode as a NOP-Out that claims
    79,616 bytes of data. The walker must not skip them as data: a header whose
    successor is beyond the bytes at hand is provisional, and where its successor
    should be there is none -- or a header inside its claimed data proves itself."""
    fake = bytearray(48)
    fake[0], fake[1], fake[5:8] = 0x00, 0x80, (79616).to_bytes(3, "big")
    real = b"".join(B.scsi_read(i) for i in range(200))
    w = Walk(W.Iscsi(to_target=True))
    # the false header alone in a segment, then real commands, one per segment
    w.feed([(1000, bytes(fake)), *_segments(real, [48] * 200, 1048)])
    assert w.s.counters.retracted == 1 and not w.retracted, "dropped before it did anything"
    lost = 200 - len(w.tags)
    assert lost <= 1, f"{lost} commands lost behind a false header"


def test_a_provisional_header_is_confirmed_by_its_successor():
    reads = [B.scsi_read(i) for i in range(5)]
    w = Walk(W.Iscsi(to_target=True))
    w.feed([(1000 + 48 * i, r) for i, r in enumerate(reads)])  # one command per segment
    assert [p.tag for p in w.confirmed] == [0]
    assert w.tags == [0, 1, 2, 3, 4] and w.s.state == F.SYNCED


def test_a_read_with_a_data_segment_is_a_desync():
    """One flipped byte in a READ's DataSegmentLength: the walk notices at that header
    (a READ carries no data segment) instead of skipping what it claims."""
    cmds = [bytearray(B.scsi_read(i)) for i in range(100)]
    cmds[10][6] = 0x40  # DSL 0x004000
    stream = b"".join(bytes(c) for c in cmds)
    w = Walk(W.Iscsi(to_target=True))
    w.s.start(ISN)
    w.feed(_segments(stream, [1448] * 10, ISN + 1))
    assert w.s.counters.desyncs == 1
    assert w.tags == [i for i in range(100) if i != 10]


def test_a_sequence_number_out_of_step_is_a_desync():
    a = [B.scsi_response(i, sn=(i, 1000 + i, 1064 + i)) for i in range(20)]
    a[7] = B.scsi_response(7, sn=(7, 0x5A5A5A5A, 0x5A5A5A5A + 64))
    w = Walk(W.Iscsi(to_target=False))
    w.s.start(ISN)
    w.feed([((ISN + 1) % W.SEQ_MOD, b"".join(a))])
    assert w.s.counters.desyncs == 1 and 7 not in w.tags and len(w.tags) == 19


def test_the_sink_saying_the_walk_is_off_is_a_desync():
    rs = b"".join(B.scsi_response(i) for i in range(10))
    w = Walk(W.Iscsi(to_target=False), refuse={4})
    w.s.start(ISN)
    w.feed([((ISN + 1) % W.SEQ_MOD, rs)])
    assert w.s.counters.desyncs == 1
    assert w.tags == [0, 1, 2, 3, 5, 6, 7, 8, 9]


def test_tls_at_a_streams_start_is_not_measurable_and_no_desync():
    hello = bytes([22, 3, 1, 0, 200]) + os.urandom(200)
    w = Walk(W.NvmeTcp(to_controller=True))
    w.s.start(ISN)
    w.feed([((ISN + 1) % W.SEQ_MOD, hello)] + [(i * 1000, os.urandom(1000)) for i in range(5)])
    assert w.reasons == [W.TLS] and w.s.state == F.UNMEASURABLE
    assert w.s.counters.desyncs == 0 and not w.pdus


def test_another_protocol_on_the_port_is_not_measurable():
    rnd = random.Random(7)
    w = Walk(W.Iscsi(to_target=True))
    w.s.start(ISN)
    seq = (ISN + 1) % W.SEQ_MOD
    for _ in range(400):
        data = b"GET /x HTTP/1.1\r\n" + rnd.randbytes(1400)
        w.s.feed(seq, data, 0.0)
        seq = (seq + len(data)) % W.SEQ_MOD
    assert w.reasons == [W.UNPARSED]
    assert w.s.counters.desyncs == 0 and not w.pdus


@pytest.mark.parametrize("seed", range(3))
def test_random_bytes_take_no_header(seed):
    rnd = random.Random(seed)
    w = Walk(W.Iscsi(to_target=bool(seed % 2)))
    w.feed([(i * 65536, rnd.randbytes(65536)) for i in range(3)])
    assert not w.pdus and w.held is None


def test_out_of_sync_time_and_bytes():
    stream, _ = _iscsi_reads(20, size=2000)
    segs = _segments(stream, [1448] * 100, ISN + 1)
    w = Walk(W.Iscsi(to_target=False))
    w.s.start(ISN)
    for k, (seq, data) in enumerate(segs[:5] + segs[9:]):
        w.s.feed(seq, data, float(k))
    c = w.s.counters
    assert c.out_of_sync_bytes >= 4 * 1448  # the gap
    assert w.s.state == F.SYNCED and 0 < w.s.out_of_sync_s(100.0) < 3
