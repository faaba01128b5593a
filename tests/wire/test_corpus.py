"""The Python wire sensor against Wireshark on real captures (tests/fixtures/wire/corpus/).

Per capture (made in the lab by vagrant/experiments/wire_corpus.py with the real
initiators and targets; and the lab bridge's own, lab-wire.pcap.gz), with tshark as
the reference (oracle.py):

  * from the SYN: at least SYNC_SHARE of Wireshark's timed reads and of its timed writes
    matched (same connection and tag, both times within 10 us), no read Wireshark does
    not have, and the names of every login and connect Wireshark shows;
  * from OFFSETS random byte offsets in the first quarter of the capture (the sensor
    starts there, mid-PDU): SYNC_SHARE of the reads whose command comes after the
    cut, and the names of the logins after it; from each connection's login request,
    no SYN before it: its names;
  * after seeded damage -- DAMAGE's flipped bytes, dropped frames, swapped pairs, each
    and all at once: DAMAGED_SHARE of the reads Wireshark times in the damaged capture,
    and of those of the clean one none of whose PDUs' frames (as Wireshark reassembled them)
    was hit;
    every stream back in sync within RESYNC_SEGMENTS segments that start with a header
    after its last damaged one.

Other captures (any pcap or pcapng of Ethernet, Linux cooked or raw IP frames) are held
to the same figures instead of the corpus with SANTHROTTLE_WIRE_CAPTURES=file-or-folder[:...]
(`SANTHROTTLE_WIRE_CAPTURES=~/pcaps make test-fuzz`, or pytest tests/wire; as root the
kernel's counts too: tests/privileged/test_bridge_corpus.py).

The fuzz tier (`make test-fuzz`, and `make test`); not the unit tier's fast loop.
"""

from __future__ import annotations

import os
import random
import shutil
from functools import cache
from pathlib import Path

import pytest

from santhrottle.bridge.pdu import READ, WRITE
from santhrottle.bridge.protocols import TLS, UNPARSED_BYTES
from tests.wire import oracle as O

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
SUFFIXES = (".pcap.gz", ".pcapng.gz", ".pcap", ".pcapng")
CORPUS = [
    *sorted(p for p in (FIXTURES / "corpus").glob("wire-*") if p.name.endswith(SUFFIXES)),
    FIXTURES / "lab-wire.pcap.gz",
]


def _captures(spec: str | None) -> list[Path]:
    """SANTHROTTLE_WIRE_CAPTURES (files and folders, os.pathsep between them): other
    captures to hold the sensor to the same figures, instead of the corpus (any pcap
    or pcapng of Ethernet, Linux cooked or raw IP frames: oracle.read_pcap)."""
    if not spec:
        return CORPUS
    out: list[Path] = []
    for part in spec.split(os.pathsep):
        p = Path(part)
        out += sorted(q for q in p.iterdir() if q.name.endswith(SUFFIXES)) if p.is_dir() else [p]
    return out


CAPTURES = _captures(os.environ.get("SANTHROTTLE_WIRE_CAPTURES"))
SYNC_SHARE = 0.99
DAMAGED_SHARE = 0.95
RESYNC_SEGMENTS = 2
OFFSETS = 20
SEED = 20261128
DAMAGE = {
    "flip": {"flip": 0.01},
    "drop": {"drop": 0.05},
    "swap": {"swap": 0.02},
    "all": {"flip": 0.01, "drop": 0.05, "swap": 0.02},
}

pytestmark = [
    pytest.mark.fuzz,
    pytest.mark.skipif(
        shutil.which("tshark") is None,
        reason="tshark (Debian: tshark) is not installed: make setup",
    ),
]


def capture_name(p: Path) -> str:
    for suffix in SUFFIXES:
        if p.name.endswith(suffix):
            return p.name.removesuffix(suffix)
    return p.name


@cache
def _capture(path: Path) -> tuple[int, tuple[O.Frame, ...], O.Reference]:
    linktype, frames = O.read_pcap(path)
    return linktype, tuple(frames), O.reference_of(frames, linktype)


def _reference(frames: list[O.Frame], linktype: int) -> O.Reference:
    return O.reference_of(frames, linktype)


@pytest.fixture(params=CAPTURES, ids=capture_name)
def capture(request: pytest.FixtureRequest) -> tuple[str, int, list[O.Frame], O.Reference]:
    path = request.param
    if not path.exists():
        pytest.skip(f"{path} is missing (make lab-wire-corpus)")
    linktype, frames, ref = _capture(path)
    return capture_name(path), linktype, list(frames), ref


def test_the_corpus_is_there() -> None:
    """The captures the issue names (vagrant/experiments/wire_corpus.py's cases)."""
    have = {capture_name(p) for p in CORPUS}
    for case in ("iscsi-digests", "iscsi-r2t", "iscsi-immediate", "iscsi-unsolicited",
                 "iscsi-small-segments", "nvme-plain", "nvme-digests", "unmeasurable"):  # fmt: skip
        assert f"wire-{case}" in have, f"no capture wire-{case}.pcap.gz (make lab-wire-corpus)"
    total = sum(p.stat().st_size for p in CORPUS)
    assert total < 8 << 20, f"the corpus is {total:,} bytes"


def test_from_the_syn(capture) -> None:  # type: ignore[no-untyped-def]
    name, _, frames, ref = capture
    run = O.walk(frames)
    for op in (READ, WRITE):
        score = O.score(ref.ios, run.ios, op)
        assert score.share >= SYNC_SHARE, f"{name} {'reads' if op == READ else 'writes'}: {score}"
    reads = O.score(ref.ios, run.ios, READ, vouched=ref.dissected)
    assert reads.extra == 0, f"{name}: reads Wireshark does not time: {reads}"
    for conn, (target, initiator, _) in ref.names.items():
        got = run.names.get(conn, ("", ""))
        assert got == (target, initiator), f"{name} {conn}: {got}"


def test_from_any_byte(capture) -> None:  # type: ignore[no-untyped-def]
    name, _, frames, ref = capture
    total = O.payload_bytes(frames)
    rnd = random.Random(f"{SEED}-{name}")
    worst: list[tuple[float, int, O.Score]] = []
    for _ in range(OFFSETS):
        offset = rnd.randrange(total // 4)
        rest, cut = O.cut_at(frames, offset)
        run = O.walk(rest, cut)
        start = rest[0].ts
        score = O.score(ref.ios, run.ios, READ, lambda io, t=start: io.start > t)
        worst.append((score.share, offset, score))
        after = {c: v for c, v in ref.names.items() if v[2] > rest[0].index}
        for conn, (target, initiator, _) in after.items():
            got = run.names.get(conn, ("", ""))
            assert got == (target, initiator), f"{name} from byte {offset}, {conn}: {got}"
    share, offset, score = min(worst, key=lambda w: w[0])
    assert share >= SYNC_SHARE, f"{name} from byte {offset}: {score}"


def test_from_a_login(capture) -> None:  # type: ignore[no-untyped-def]
    """The capture starting at a connection's login request, no SYN before it: the
    login's names, and the reads after it."""
    name, _, frames, ref = capture
    pos, starts = 0, {}
    for fr in frames:
        f = O.flow_of(fr.data)
        n = f.payload_end - f.payload_at if f is not None else 0
        key = O.conn_key(f) if n and f is not None else None
        # where a login request's header starts (its text may come in later frames)
        if key is not None and key[1] and fr.data[f.payload_at] & 0x3F == 0x03:  # type: ignore[union-attr]
            starts.setdefault(key[0], pos)
        pos += n
    for conn, (target, initiator, _) in ref.names.items():
        if conn not in starts:
            continue  # an NVMe connect
        rest, cut = O.cut_at(frames, starts[conn])
        run = O.walk(rest, cut)
        assert run.names.get(conn) == (target, initiator), f"{name} from {conn}'s login"
        t = rest[0].ts
        score = O.score(ref.ios, run.ios, READ, lambda io, t=t: io.start > t)
        assert score.share >= SYNC_SHARE, f"{name} from {conn}'s login: {score}"


@pytest.mark.parametrize("kind", DAMAGE)
def test_after_damage(capture, kind: str) -> None:  # type: ignore[no-untyped-def]
    name, linktype, frames, ref = capture
    damaged, hit = O.damage(frames, SEED, **DAMAGE[kind])
    run = O.walk(damaged)
    theirs = _reference(damaged, linktype)
    score = O.score(theirs.ios, run.ios, READ)
    assert score.share >= DAMAGED_SHARE, f"{name} {kind}, Wireshark on the damage: {score}"
    clean = O.score(ref.ios, run.ios, READ, lambda io: not io.span & hit)
    assert clean.share >= DAMAGED_SHARE, f"{name} {kind}, the clean capture's: {clean}"
    starts = O.walk(frames).header_starts
    late = [(k, n) for k, n in O.resync_delays(frames, damaged, hit, run, starts)
            if n is None or n > RESYNC_SEGMENTS]  # fmt: skip
    assert not late, f"{name} {kind}: streams not back in sync in {RESYNC_SEGMENTS}: {late}"


# the unmeasurable capture's servers (vagrant/experiments/wire_corpus.py: EXTRA_ADDR): TLS
# on the NVMe/TCP port, HTTP on the iSCSI port
NOT_STORAGE_ADDR = "10.0.0.51"


def test_not_measurable(capture) -> None:  # type: ignore[no-untyped-def]
    """A connection Wireshark times IOs on is measurable, from the SYN and cut; one that
    is not storage traffic (the unmeasurable capture's TLS and HTTP) is found not
    measurable, with no desync counted and no IO, from the SYN and from a cut."""
    name, _, frames, ref = capture
    timed = {io.conn for io in ref.ios}
    rnd = random.Random(f"{SEED}-{name}-unmeasurable")
    cuts = [None, rnd.randrange(O.payload_bytes(frames) // 4)]
    for offset in cuts:
        run = O.walk(frames) if offset is None else O.walk(*O.cut_at(frames, offset))
        where = "from the SYN" if offset is None else f"from byte {offset}"
        for conn, (reason, desyncs) in run.conns.items():
            if conn in timed:
                assert not reason, f"{name} {where} {conn}: not measurable ({reason})"
            if conn[2] == NOT_STORAGE_ADDR:
                big = sum(
                    f.payload_end - f.payload_at
                    for f in map(O.flow_of, (fr.data for fr in frames))
                    if f is not None and NOT_STORAGE_ADDR in (f.src, f.dst)
                    and conn[1] in (f.sport, f.dport)
                )  # fmt: skip
                assert reason or big < UNPARSED_BYTES, f"{name} {where} {conn}: measured"
                assert not desyncs, f"{name} {where} {conn}: {desyncs} desyncs"
                assert not [io for io in run.ios if io.conn == conn]
    if name == "wire-unmeasurable":
        run = O.walk(frames)
        seen = {c[3]: r for c, (r, _) in run.conns.items() if c[2] == NOT_STORAGE_ADDR}
        assert seen.get(4420) == TLS and seen.get(3260), f"{name}: {seen}"
        # the iSCSI session inside IPsec: each direction's security association
        esp = [r for r in run.tracker.sync_rows(frames[-1].ts) if r.direction == "esp"]
        assert len(esp) == 2 and all(r.state == "not measurable" for r in esp), esp
