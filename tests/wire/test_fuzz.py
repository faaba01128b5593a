"""The wire sensor's law under hostile and mangled traffic: it never raises, and what it
holds stays within its bounds.

  * The corpus's captures (test_corpus.CAPTURES) mangled far beyond test_corpus's
    damage, seeded: many bytes flipped in a fifth of the payloads, a tenth of the
    frames dropped, a tenth duplicated (retransmissions), a twentieth of the pairs
    swapped, payloads cut short; walked whole and from a cut.
  * Segments built to make the walk search again and again (a valid pair of headers,
    then a stray byte, many times over in one segment): at most MAX_SEARCHES searches a
    segment (the kernel's bound), the rest of the segment given up and counted.
  * Segments of headers that are believable but claim long data segments, on many
    connections: each a provisional header at most, retracted when its successor is
    not there.

Bounds checked after each run: a carry and a held PDU's body at most MAX_CARRY_BYTES,
the commands in flight counted right, at most MAX_VOLUMES_PER_CONN volumes per
connection, and the memory the tracker holds (tracemalloc) within MEMORY_BOUND_BYTES.
"""

from __future__ import annotations

import random
import tracemalloc

import pytest

from santhrottle.bridge import belief, protocols
from santhrottle.bridge import tracker as T
from tests.unit import storage_pdus as B
from tests.wire import oracle as O
from tests.wire.test_corpus import CAPTURES, SEED, capture_name

# what a tracker may hold after a capture: its connections (a few dozen here) with their
# carries, held bodies, commands and names, the streams' state
MEMORY_BOUND_BYTES = 16 << 20
TGT = "10.0.0.9"

pytestmark = pytest.mark.fuzz


def mangle(frames: list[O.Frame], seed: int) -> list[O.Frame]:
    """The frames, mangled (module header)."""
    rnd = random.Random(seed)
    out: list[O.Frame] = []
    for fr in frames:
        if rnd.random() < 0.10:
            continue
        f = O.flow_of(fr.data)
        data = bytearray(fr.data)
        if f is not None and f.payload_end > f.payload_at:
            if rnd.random() < 0.20:
                for _ in range(rnd.randrange(1, 16)):
                    data[rnd.randrange(f.payload_at, f.payload_end)] = rnd.randrange(256)
            if rnd.random() < 0.05:  # cut short (the IP length left as it was)
                data = data[: rnd.randrange(f.payload_at, f.payload_end)]
        out.append(O.Frame(fr.ts, bytes(data), fr.index))
        if rnd.random() < 0.10:
            out.append(O.Frame(fr.ts, bytes(data), fr.index))
    for i in range(len(out) - 1):
        if rnd.random() < 0.05:
            out[i], out[i + 1] = out[i + 1], out[i]
    return out


def check_bounds(tr: T.Tracker) -> None:
    assert len(tr.conns) <= T.MAX_CONNS
    assert len(tr.orphans) <= T.MAX_CONNS
    held = sum(len(c.inflight) for c in tr.conns.values())
    assert tr.inflight_total == held + sum(len(x) for x in tr.orphans.values())
    for c in tr.conns.values():
        assert len(c.volumes) <= T.MAX_VOLUMES_PER_CONN
        assert len(c.units) <= T.MAX_VOLUMES_PER_CONN
        for st in (c.to_target, c.to_initiator):
            assert len(st.carry) <= belief.MAX_CARRY_BYTES
            if st.held is not None:
                assert len(st.held[1]) <= belief.MAX_CARRY_BYTES


@pytest.mark.parametrize("path", CAPTURES, ids=capture_name)
def test_mangled_captures(path) -> None:  # type: ignore[no-untyped-def]
    if not path.exists():
        pytest.skip(f"{path} is missing (make lab-wire-corpus)")
    _, frames = O.read_pcap(path)
    for k in range(3):
        mangled = mangle(frames, SEED + k)
        tracemalloc.start()
        try:
            cut = O.cut_at(mangled, k * 7919) if k else (mangled, None)
            run = O.walk(*cut)
            held, _peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        check_bounds(run.tracker)
        assert held < MEMORY_BOUND_BYTES, f"{path.name} mangled {k}: {held:,} bytes held"


def test_searches_per_segment_are_bounded(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A segment that makes the walk search again and again: MAX_SEARCHES, then the rest
    given up (the walk LOST, counted in truncated)."""
    calls = []
    search = protocols.search
    monkeypatch.setattr(protocols, "search", lambda *a: calls.append(1) or search(*a))
    pair = B.scsi_read(1, lun=0) + B.scsi_read(2, lun=0)
    segment = (pair + b"\x00") * 200
    tr = T.Tracker()
    ini, sport = "10.5.0.2", 42000
    tr.segment(0.0, ini, sport, TGT, 3260, 999, b"", syn=True)
    seq = 1000
    for k in range(20):
        calls.clear()
        tr.segment(1.0 + k, ini, sport, TGT, 3260, seq, segment)
        seq += len(segment)
        assert len(calls) <= belief.MAX_SEARCHES, f"segment {k}: {len(calls)} searches"
    (conn,) = tr.conns.values()
    assert conn.to_target.counters.truncated >= 1
    check_bounds(tr)


def test_believable_headers_that_lie() -> None:
    """Segments of headers that keep every rule but claim long data segments: at most
    one provisional header a segment, each retracted; nothing completed, nothing held
    beyond the bounds."""
    rnd = random.Random(SEED)
    tr = T.Tracker()
    for k in range(2000):
        ini, sport = f"10.6.{k % 50}.2", 43000 + k % 50
        parts = []
        for _ in range(rnd.randrange(1, 40)):
            parts.append(B.scsi_write(rnd.randrange(1 << 32), lun=0, nbytes=8192)[:48])
            parts.append(rnd.randbytes(rnd.randrange(0, 64)))
        payload = b"".join(parts)
        to_target = k % 3 != 0
        if to_target:
            tr.segment(k * 1e-3, ini, sport, TGT, 3260, rnd.randrange(1 << 32), payload)
        else:
            resp = b"".join(B.scsi_response(rnd.randrange(1 << 32)) for _ in range(5))
            tr.segment(k * 1e-3, TGT, 3260, ini, sport, rnd.randrange(1 << 32), resp)
    check_bounds(tr)
    walks = [st.counters for c in tr.conns.values() for st in (c.to_target, c.to_initiator)]
    assert sum(w.retracted for w in walks) > 0
    assert tr.counters.completions == 0
