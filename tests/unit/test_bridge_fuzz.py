"""The Python wire sensor under adversarial input: malformed and hostile segments on the
storage ports must never raise, and what the tracker holds stays within its bounds.

Seeded (reproducible). What is fed, >= 100,000 segments in all:
  * random bytes on 3260 and 4420, both directions, random sequence numbers;
  * headers that lie: iSCSI data segment lengths up to 2^24 - 1, AHS lengths, NVMe plen
    below hlen or in the gigabytes, pdo past plen; headers cut at every length;
  * tag reuse: the same ITT and CID sent again before any completion;
  * retransmissions, overlaps and gaps of a valid stream;
  * more connections than MAX_CONNS; more commands that never complete than
    MAX_INFLIGHT (distinct tags, 64 KiB segments of back-to-back SCSI Commands; at the
    real bound, a million and one, in `make bench`).
What the tracker holds is counted against its bounds; `make bench` measures its memory.
"""

from __future__ import annotations

import random
import struct

import pytest

from santhrottle.bridge import tracker as T
from tests.unit import storage_pdus as B

pytestmark = pytest.mark.fuzz  # corpus runs

TGT = "10.0.0.9"
SEGMENTS = 100_000


def _feed_random(tr: T.Tracker, rnd: random.Random, n: int) -> None:
    for i in range(n):
        port = rnd.choice((3260, 4420))
        ini = f"10.1.{rnd.randrange(4)}.{rnd.randrange(1, 250)}"
        sport = rnd.randrange(1024, 65535)
        kind = i % 5
        if kind == 0:  # random bytes
            payload = rnd.randbytes(rnd.randrange(1, 1500))
        elif kind == 1:  # an iSCSI header that lies about its lengths, cut anywhere
            bhs = bytearray(B.scsi_read(rnd.randrange(1 << 32), lun=rnd.randrange(256)))
            bhs[4] = rnd.randrange(256)  # AHS words
            bhs[5:8] = rnd.randrange(1 << 24).to_bytes(3, "big")
            payload = bytes(bhs[: rnd.randrange(1, 49)]) + rnd.randbytes(rnd.randrange(64))
        elif kind == 2:  # an NVMe header with a lying plen / pdo
            pdu = bytearray(B.capsule_cmd(rnd.randrange(1 << 16), nsid=rnd.randrange(1 << 32)))
            struct.pack_into("<I", pdu, 4, rnd.choice((0, 7, 71, 1 << 30, rnd.randrange(1 << 32))))
            pdu[3] = rnd.randrange(256)
            payload = bytes(pdu[: rnd.randrange(1, len(pdu) + 1)])
        elif kind == 3:  # tag reuse: the same command twice, no completion
            payload = B.scsi_write(7, lun=1, nbytes=512) * 2 + B.capsule_cmd(7) * 2
        else:  # a completion nobody asked for
            payload = B.data_in(rnd.randrange(1 << 32), b"x" * 64) + B.capsule_resp(5)
        to_target = rnd.random() < 0.5
        src, sp, dst, dp = (ini, sport, TGT, port) if to_target else (TGT, port, ini, sport)
        tr.segment(i * 1e-4, src, sp, dst, dp, rnd.randrange(1 << 32), payload,
                   syn=rnd.random() < 0.01, fin_or_rst=rnd.random() < 0.01)  # fmt: skip


def _feed_stream_faults(tr: T.Tracker, rnd: random.Random, n: int) -> None:
    """A valid session whose segments come duplicated, overlapping, out of order, lost."""
    ini, sport = "10.2.0.2", 40000
    tr.segment(0.0, ini, sport, TGT, 3260, 999, b"", syn=True)
    stream = b"".join(B.scsi_read(k, lun=0) for k in range(n))
    seq, pos, t = 1000, 0, 1.0
    while pos < len(stream):
        cut = rnd.randrange(1, 200)
        back = rnd.choice((0, 0, 0, rnd.randrange(0, 100)))  # a retransmission's overlap
        start = max(0, pos - back)
        if rnd.random() > 0.02:  # 2 % lost
            tr.segment(t, ini, sport, TGT, 3260, seq + start, stream[start : pos + cut])
        pos += cut
        t += 1e-5


def test_hostile_segments_never_raise_and_the_state_stays_bounded(capsys):
    rnd = random.Random(20261126)
    tr = T.Tracker()
    _feed_random(tr, rnd, SEGMENTS)
    _feed_stream_faults(tr, rnd, 20_000)
    # more connections than the bound, each with a command in flight
    for k in range(T.MAX_CONNS + 500):
        ini = f"10.3.{k >> 8 & 255}.{k & 255}"
        tr.segment(5.0, ini, 1000 + k % 50000, TGT, 3260, 1, B.scsi_read(1, lun=0))
    assert len(tr.conns) <= T.MAX_CONNS
    assert tr.counters.evicted >= 500
    total = sum(len(c.inflight) for c in tr.conns.values())
    total += sum(len(x) for x in tr.orphans.values())  # those of connections ended
    assert total == tr.inflight_total, "the running count is the sum"
    held = [*(c.inflight for c in tr.conns.values()), *tr.orphans.values()]
    named = sum(c.volume is not None for x in held for c in x.values())
    assert sum(tr.busy.outstanding.values()) == named, "a volume is busy while in flight"
    assert len(tr.orphans) <= T.MAX_CONNS
    assert all(len(c.volumes) <= T.MAX_VOLUMES_PER_CONN for c in tr.conns.values())
    with capsys.disabled():
        print(f"\nwire fuzz: {SEGMENTS:,} random segments + faults + {T.MAX_CONNS + 500:,} "
              f"connections: {tr.counters}")  # fmt: skip


def test_commands_that_never_complete_are_bounded(monkeypatch):
    """MAX_INFLIGHT + 1 commands, none completed: the oldest makes way. At the real
    bound (2^20) this is `make bench`'s (tests/bench/bench_wire.py, fuzz); here the
    bound is lowered to keep the unit tier quick."""
    monkeypatch.setattr(T, "MAX_INFLIGHT", 50_000)
    tr = T.Tracker()
    ini, sport = "10.4.0.2", 41000
    tr.segment(0.0, ini, sport, TGT, 3260, 999, b"", syn=True)
    per_segment = 65536 // 48
    want = T.MAX_INFLIGHT + 1
    seq, itt = 1000, 1
    while itt <= want:
        n = min(per_segment, want - itt + 1)
        payload = b"".join(B.scsi_read(itt + k, lun=0) for k in range(n))
        tr.segment(1.0, ini, sport, TGT, 3260, seq, payload)  # t fixed: no ageing
        seq += len(payload)
        itt += n
    (conn,) = tr.conns.values()
    assert tr.counters.commands == want
    assert len(conn.inflight) == T.MAX_INFLIGHT == tr.inflight_total
    assert tr.counters.evicted == 1, "the millionth-and-one took the oldest one's place"
    assert 1 not in conn.inflight and want in conn.inflight
    # the sweep ages them all out once they are old
    tr.segment(1.0 + T.INFLIGHT_MAX_S + 1, ini, sport, TGT, 3260, seq, b"", fin_or_rst=False)
    assert tr.inflight_total == 0 and tr.counters.aged == T.MAX_INFLIGHT
    assert not tr.busy.outstanding and not tr.busy.since, "nothing left busy"
