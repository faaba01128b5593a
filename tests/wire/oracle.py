"""The wire sensor against Wireshark: the corpus's captures, cut and damaged, both walked.

Wireshark (tshark, Debian's package) is the reference: its iSCSI and NVMe/TCP
dissectors match each command to its completion (iscsi.request_frame with
iscsi.time on the PDU that completes it, the SCSI CDB's opcode after it;
nvme.cmd_pkt on the CQE, the command's nvme.cmd.opc in its own frame).
Those are Wireshark's timed reads and writes: (connection, tag, the
command's frame time, the completion's). The tracker (bridge/tracker.py)
walks the same frames and reports its own through Tracker.on_io; a read
matches when the connection and tag are the same and both times agree
within TOLERANCE_S.

What the tracker could know
    From a cut (start_at): an IO whose command is in a frame after the one
    the cut falls in (the walk cannot know a command it never saw).
    After damage: an IO whose command and completion frames were neither
    dropped nor flipped (Wireshark on the damaged capture is compared as
    well: tshark_ios of the damaged pcap).

Damage (damage(), seeded): a fraction of the payloads with one byte flipped,
of the frames dropped, of the adjacent pairs of frames swapped.

Only the standard library and tshark; the frames' Ethernet, IP and TCP are
read here (not by the sensor's decoder), so that both sides see the capture
as it is.
"""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from santhrottle.bridge.conns import Connection, ConnKey
from santhrottle.bridge.pdu import READ, WRITE
from santhrottle.bridge.tracker import Tracker
from tests.wire.digests import readable_data_digests
from tests.wire.pcaps import (  # noqa: F401  (the tests' names)
    STORAGE_PORTS,
    Flow,
    Frame,
    conn_key,
    esp_of,
    flow_of,
    read_pcap,
    write_pcap,
)

TOLERANCE_S = 10e-6
SCSI_READS = {0x08, 0x28, 0x88, 0xA8}
SCSI_WRITES = {0x0A, 0x2A, 0x8A, 0xAA}
NVME_OPS = {0x02: READ, 0x01: WRITE}


@dataclass(frozen=True)
class Io:
    conn: ConnKey
    tag: int
    op: int
    start: float
    end: float
    frames: tuple[int, int] = field(default=(-1, -1), compare=False)  # Wireshark's: the
    # command's and the completion's frames (original indices)
    # Wireshark's: every frame the command's and the completion's PDUs were reassembled
    # from (a completion's header may be frames before its last byte)
    span: frozenset[int] = field(default=frozenset(), compare=False)


# ---------------------------------------------------------------- Wireshark
@dataclass
class Reference:
    """What Wireshark shows of a capture: its timed IOs, and per connection the names
    its login (InitiatorName, TargetName) or connect (HOSTNQN, SUBNQN) carried, with
    the frame of that login request."""

    ios: list[Io]
    names: dict[ConnKey, tuple[str, str, int]]  # (target, initiator, frame index)
    # the frames (indices) in which Wireshark read an iSCSI or NVMe/TCP PDU: where it
    # vouches for what is there (it loses a stream's framing at times, and reads
    # nothing of it until the stream's end)
    dissected: set[int] = field(default_factory=set)


def reference_of(frames: list[Frame], linktype: int = 1) -> Reference:
    """Wireshark's view of frames (reference()), its iSCSI data digests first made
    readable to it (digests.py: Wireshark 4.0 reads none)."""
    readable = readable_data_digests(frames)
    with tempfile.TemporaryDirectory() as tmp:
        pcap = Path(tmp) / "capture.pcap"
        write_pcap(pcap, readable, linktype)
        return reference(pcap, readable)


def tshark_ios(pcap: Path, frames: list[Frame]) -> list[Io]:
    """Wireshark's timed reads and writes in pcap (frames: the same capture, read here,
    for the connections and the frames' times)."""
    return reference(pcap, frames).ios


def reference(pcap: Path, frames: list[Frame]) -> Reference:
    """Wireshark's view of pcap (module header)."""
    if shutil.which("tshark") is None:
        raise FileNotFoundError("tshark (Debian: tshark) is not installed")
    cmd = ["tshark", "-n", "-r", str(pcap), "-T", "pdml", "-J", "iscsi scsi nvme-tcp nvme"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    ios: list[Io] = []
    names: dict[ConnKey, tuple[str, str, int]] = {}
    dissected: set[int] = set()
    spans = _spans(pcap, frames)
    nvme_cmds: dict[tuple[int, int], int] = {}  # (frame, cid) -> opcode
    nvme_done: list[tuple[int, int, int]] = []  # (frame, cid, command frame)
    for packet in _packets(proc.stdout):
        num = int(packet.find("proto[@name='geninfo']/field[@name='num']").get("show"))  # type: ignore[union-attr]
        pending: tuple[int, int] | None = None  # an iSCSI completion: (tag, request frame)
        nvme_qid = -1  # the queue of the NVMe/TCP PDU being read (0: the admin queue)
        for proto in packet.findall("proto"):
            name = proto.get("name")
            f = {x.get("name"): x.get("show") for x in proto.iter("field")}
            if name in ("iscsi", "nvme-tcp"):
                dissected.add(frames[num - 1].index)
            if name == "iscsi":
                pending = None
                if "iscsi.time" in f and "iscsi.request_frame" in f:
                    pending = (int(f["iscsi.initiatortasktag"], 16), int(f["iscsi.request_frame"]))
                if f.get("iscsi.opcode") == "0x03":  # a login request: its names
                    said = dict(
                        x.get("show", "").partition("=")[::2]
                        for x in proto.iter("field")
                        if x.get("name") == "iscsi.keyvalue"
                    )
                    _name(names, frames, num - 1, said.get("TargetName", ""),
                          said.get("InitiatorName", ""))  # fmt: skip
            elif name == "scsi" and pending is not None and "scsi_sbc.opcode" in f:
                op = int(f["scsi_sbc.opcode"], 16)
                kind = READ if op in SCSI_READS else WRITE if op in SCSI_WRITES else 0
                if kind:
                    ios.append(_io(frames, pending[1] - 1, num - 1, pending[0], kind, spans))
                pending = None
            elif name == "nvme-tcp":
                nvme_qid = int(f.get("nvme-tcp.cmd.qid", "-1"), 0)
                done = f.get("nvme-tcp.cmd_pkt"), f.get("nvme-tcp.cmd.cid")
                # a C2HData with SUCCESS: the read's completion (no CapsuleResp follows)
                ok = f.get("nvme-tcp.flags.pdu.data_success") == "1"
                if f.get("nvme-tcp.type") == "7" and ok and done[0] and done[1]:
                    nvme_done.append((num, int(done[1], 16), int(done[0])))
            elif name == "nvme":
                if "nvme.fabrics.cmd.connect.data.subnqn" in f:
                    _name(
                        names,
                        frames,
                        num - 1,
                        f["nvme.fabrics.cmd.connect.data.subnqn"],
                        f.get("nvme.fabrics.cmd.connect.data.hostnqn", ""),
                    )
                if "nvme.cmd.opc" in f and "nvme.cmd.cid" in f and nvme_qid != 0:  # not admin
                    nvme_cmds[num, int(f["nvme.cmd.cid"], 16)] = int(f["nvme.cmd.opc"], 16)
                if "nvme.cqe.cid" in f and "nvme.cmd_pkt" in f:
                    nvme_done.append((num, int(f["nvme.cqe.cid"], 16), int(f["nvme.cmd_pkt"])))
        packet.clear()
    proc.wait()
    for num, cid, cmd_frame in nvme_done:
        kind = NVME_OPS.get(nvme_cmds.get((cmd_frame, cid), -1), 0)
        if kind:
            ios.append(_io(frames, cmd_frame - 1, num - 1, cid, kind, spans))
    return Reference(_first_completions(ios), names, dissected)


def _first_completions(ios: list[Io]) -> list[Io]:
    """Wireshark's IOs, each command completed once: a later completion Wireshark gives
    the same command frame (its tag's, after a hole in the capture: the PDU of a command
    the capture lost) is not that command's."""
    seen: set[tuple[ConnKey, int, int]] = set()
    out = []
    for io in sorted(ios, key=lambda io: io.frames[1]):
        key = (io.conn, io.tag, io.frames[0])
        if key not in seen:
            seen.add(key)
            out.append(io)
    return out


def _spans(pcap: Path, frames: list[Frame]) -> dict[int, set[int]]:
    """Frame (0-based) -> the frames (indices) of the TCP segments Wireshark reassembled
    its PDUs from."""
    fields = ["-E", "occurrence=a", "-E", "aggregator=,", "-e", "frame.number", "-e", "tcp.segment"]
    cmd = ["tshark", "-n", "-r", str(pcap), "-Y", "tcp.segment", "-T", "fields", *fields]
    out: dict[int, set[int]] = {}
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    for line in text.splitlines():
        num, _, segs = line.partition("\t")
        i = int(num) - 1
        out[i] = {frames[int(x) - 1].index for x in segs.split(",") if x} | {frames[i].index}
    return out


def _name(names, frames, i, target, initiator) -> None:  # type: ignore[no-untyped-def]
    """A login's or connect's names, for its connection (the first login names it)."""
    f = flow_of(frames[i].data)
    key = conn_key(f) if f is not None else None
    if key is not None and (target or initiator):
        t, n, _ = names.get(key[0], ("", "", i))
        names.setdefault(key[0], (target or t, initiator or n, frames[i].index))


def _packets(stream) -> Iterator[ET.Element]:  # type: ignore[no-untyped-def]
    for event, elem in ET.iterparse(stream, events=("end",)):
        if event == "end" and elem.tag == "packet":
            yield elem


def _io(frames: list[Frame], cmd_i: int, done_i: int, tag: int, op: int,  # type: ignore[no-untyped-def]
        spans) -> Io:  # fmt: skip
    f = flow_of(frames[done_i].data)
    assert f is not None
    key = conn_key(f)
    assert key is not None
    cmd, done = frames[cmd_i], frames[done_i]
    span = frozenset(spans.get(cmd_i, {cmd.index}) | spans.get(done_i, {done.index}))
    return Io(key[0], tag, op, cmd.ts, done.ts, (cmd.index, done.index), span)


# ---------------------------------------------------------------- the tracker
@dataclass
class Run:
    """A tracker's walk over frames: its IOs, and per frame (by its original index)
    the state of the walk of the segment's direction after it."""

    ios: list[Io] = field(default_factory=list)
    state_after: dict[int, int] = field(default_factory=dict)
    tracker: Tracker = field(default_factory=Tracker)
    # per connection the names the tracker had for it (before it forgot it)
    names: dict[ConnKey, tuple[str, str]] = field(default_factory=dict)
    # the frames (original indices) whose payload starts where the walk, in sync, had
    # its next header
    header_starts: set[int] = field(default_factory=set)
    # per connection: why it is not measurable ("" when it is), and its walks' desyncs
    conns: dict[ConnKey, tuple[str, int]] = field(default_factory=dict)


def walk(frames: list[Frame], cut: tuple[int, int] | None = None, learn_logins: bool = True) -> Run:
    """The tracker over frames; cut: (frame, payload bytes) -- that frame's first bytes
    are not seen (the sensor starts there); learn_logins: Tracker's."""
    run = Run(tracker=Tracker(learn_logins=learn_logins))
    tr = run.tracker
    when: dict[float, int] = {}  # a frame's time -> its index (a command's frame)
    now = [-1]  # the frame being walked (a completion's)
    tr.on_io = lambda k, tag, op, s, e: run.ios.append(
        Io(k, tag, op, s, e, (when.get(s, -1), now[0]))
    )
    forget = tr._forget

    def note(key: ConnKey, c: Connection) -> None:
        if c.target or c.initiator_name:
            run.names[key] = (c.target, c.initiator_name)
        was = run.conns.get(key, ("", 0))
        desyncs = c.to_target.counters.desyncs + c.to_initiator.counters.desyncs
        run.conns[key] = (c.unmeasurable or was[0], desyncs + was[1])

    def forgetting(key: ConnKey, keep: bool = False) -> None:  # its names, before they go
        c = tr.conns.get(key)
        if c is not None:
            note(key, c)
        forget(key, keep)

    tr._forget = forgetting  # type: ignore[method-assign]
    for i, fr in enumerate(frames):
        f = flow_of(fr.data)
        if f is None:
            esp = esp_of(fr.data)
            if esp is not None:
                tr.encrypted(fr.ts, *esp)
            continue
        when.setdefault(fr.ts, fr.index)
        now[0] = fr.index
        seq, start = f.seq, f.payload_at
        if cut is not None and i == cut[0]:
            start = min(f.payload_end, start + cut[1])
            seq = (seq + start - f.payload_at) & 0xFFFFFFFF
        payload = memoryview(fr.data)[start : f.payload_end]
        syn = bool(f.flags & 0x02) and (cut is None or i != cut[0])
        key = conn_key(f)
        if key is not None and payload and key[0] in tr.conns:
            c = tr.conns[key[0]]
            st = c.to_target if key[1] else c.to_initiator
            if st.state == 0 and st.pdu_seq == seq and not st.carry and st.expect_seq == seq:
                run.header_starts.add(fr.index)
        tr.segment(fr.ts, f.src, f.sport, f.dst, f.dport, seq, payload, syn,
                   bool(f.flags & 0x05))  # fmt: skip
        if key is not None and key[0] in tr.conns:
            c = tr.conns[key[0]]
            run.state_after[fr.index] = (c.to_target if key[1] else c.to_initiator).state
    for key, c in tr.conns.items():
        note(key, c)
    return run


def cut_at(frames: list[Frame], offset: int) -> tuple[list[Frame], tuple[int, int]]:
    """The capture from its offset-th payload byte on (storage segments' payloads in
    capture order): the frames from the one holding that byte, and the cut."""
    pos = 0
    for i, fr in enumerate(frames):
        f = flow_of(fr.data)
        n = f.payload_end - f.payload_at if f is not None else 0
        if n and pos + n > offset:
            return frames[i:], (0, offset - pos)
        pos += n
    return [], (0, 0)


def cut_frames(frames: list[Frame], offset: int) -> list[Frame]:
    """cut_at() as frames to replay: the first one's payload cut, its sequence number and
    IP length set to match (the sensor never sees a SYN there)."""
    rest, (_, k) = cut_at(frames, offset)
    if not rest:
        return []
    first = rest[0]
    f = flow_of(first.data)
    assert f is not None
    data = bytearray(first.data[: f.payload_at] + first.data[f.payload_at + k :])
    ip = 14
    et = struct.unpack_from("!H", data, 12)[0]
    while et in (0x8100, 0x88A8):
        et, ip = struct.unpack_from("!H", data, ip + 2)[0], ip + 4
    if et == 0x0800:
        struct.pack_into("!H", data, ip + 2, struct.unpack_from("!H", data, ip + 2)[0] - k)
        t = ip + (data[ip] & 15) * 4
    else:
        struct.pack_into("!H", data, ip + 4, struct.unpack_from("!H", data, ip + 4)[0] - k)
        t = ip + 40
    struct.pack_into("!I", data, t + 4, (f.seq + k) & 0xFFFFFFFF)
    data[t + 13] &= ~0x02  # no SYN
    return [Frame(first.ts, bytes(data), first.index), *rest[1:]]


def payload_bytes(frames: list[Frame]) -> int:
    total = 0
    for fr in frames:
        f = flow_of(fr.data)
        if f is not None:
            total += f.payload_end - f.payload_at
    return total


def damage(
    frames: list[Frame], seed: int, flip: float = 0.0, drop: float = 0.0, swap: float = 0.0
) -> tuple[list[Frame], set[int]]:
    """The frames with damage (module header); the original indices of the frames
    damaged (flipped, dropped, or swapped)."""
    rnd = random.Random(seed)
    hit: set[int] = set()
    out = []
    for fr in frames:
        if drop and rnd.random() < drop:
            hit.add(fr.index)
            continue
        f = flow_of(fr.data)
        if flip and f is not None and f.payload_end > f.payload_at and rnd.random() < flip:
            at = rnd.randrange(f.payload_at, f.payload_end)
            data = bytearray(fr.data)
            data[at] ^= rnd.randrange(1, 256)
            fr = Frame(fr.ts, bytes(data), fr.index)
            hit.add(fr.index)
        out.append(fr)
    if swap:
        i = 0
        while i + 1 < len(out):
            if rnd.random() < swap:
                out[i], out[i + 1] = out[i + 1], out[i]
                hit.update((out[i].index, out[i + 1].index))
                i += 2
            else:
                i += 1
    return out, hit


# ---------------------------------------------------------------- comparing
@dataclass
class Score:
    expected: int  # Wireshark's IOs the tracker could know
    matched: int  # of those, the tracker's (same connection and tag, times within TOLERANCE_S)
    extra: int  # the tracker's IOs Wireshark does not have

    @property
    def share(self) -> float:
        return self.matched / self.expected if self.expected else 1.0

    def __str__(self) -> str:
        return f"{self.matched}/{self.expected} ({self.share:.2%}), {self.extra} extra"


def score(reference: list[Io], got: list[Io], op: int, knowable=lambda io: True,  # type: ignore[no-untyped-def]
          vouched: set[int] | None = None) -> Score:  # fmt: skip
    """How many of reference's IOs of op (those knowable) got has; extra: got's that
    reference has not (those completed in vouched frames, when given)."""
    mine: dict[tuple[ConnKey, int], list[Io]] = {}
    for io in got:
        if io.op == op:
            mine.setdefault((io.conn, io.tag), []).append(io)
    want = [io for io in reference if io.op == op and knowable(io)]
    matched = 0
    used: set[int] = set()
    for io in want:
        for cand in mine.get((io.conn, io.tag), ()):
            if id(cand) in used:
                continue
            if abs(cand.start - io.start) <= TOLERANCE_S and abs(cand.end - io.end) <= TOLERANCE_S:
                matched += 1
                used.add(id(cand))
                break
    ref = {(io.conn, io.tag, round(io.start, 5), round(io.end, 5)) for io in reference}
    extra = sum(1 for io in got if io.op == op
                and (vouched is None or io.frames[1] in vouched)
                and (io.conn, io.tag, round(io.start, 5), round(io.end, 5)) not in ref)  # fmt: skip
    return Score(len(want), matched, extra)


def streams(frames: list[Frame]) -> dict[tuple[ConnKey, bool], list[Frame]]:
    """The storage segments with payload of each connection direction, in capture order."""
    out: dict[tuple[ConnKey, bool], list[Frame]] = {}
    for fr in frames:
        f = flow_of(fr.data)
        key = conn_key(f) if f is not None else None
        if key is not None and f is not None and f.payload_end > f.payload_at:
            out.setdefault(key, []).append(fr)
    return out


def resync_delays(
    original: list[Frame], damaged: list[Frame], hit: set[int], run: Run, starts: set[int]
) -> list[tuple[tuple[ConnKey, bool], int | None]]:
    """Per connection direction with damage: after its last damaged segment (flipped,
    swapped, or the one after a segment dropped), how many segments that start with a
    header (starts: from a clean walk) it took to be in sync (None: not in sync by the
    capture's end; streams with fewer than 2 such segments after the damage are left
    out)."""
    before = {k: [fr.index for fr in v] for k, v in streams(original).items()}
    out = []
    for key, segs in streams(damaged).items():
        orig = before.get(key, [])
        place = {i: n for n, i in enumerate(orig)}
        seen = {fr.index for fr in segs}
        last = None
        for pos, fr in enumerate(segs):
            at = place.get(fr.index, -1)
            dropped_before = at > 0 and orig[at - 1] not in seen
            if fr.index in hit or dropped_before:
                last = pos
        if last is None:
            continue
        after = [fr.index for fr in segs[last + 1 :] if fr.index in starts]
        if len(after) < 2:
            continue
        took = next((n for n, i in enumerate(after, 1) if run.state_after.get(i) == 0), None)
        out.append((key, took))
    return out
